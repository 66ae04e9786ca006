public import VaultCrypto
public import VaultProtocol

/// The secrets of one account: everything about it that must not be readable
/// at rest. Everything else (issuer, client id, scopes) is configuration.
public struct AccountSecrets: Sendable, Equatable {
    public var refreshToken: SecretBytes?
    public var clientSecret: SecretBytes?
    public var idToken: SecretBytes?
    /// The grant's DPoP key, as `DPoPKey.sealed` writes it (its algorithm,
    /// then its secret key): the refresh token is bound to it, so it rests
    /// and goes with the refresh token.
    public var dpopKey: SecretBytes?
    /// A client tokenvault registered for the account (RFC 7591): the bearer
    /// token and the client's URI that delete the registration (RFC 7592),
    /// kept until the account is removed, whatever sign-ins and sign-outs
    /// come between.
    public var registrationAccessToken: SecretBytes?
    public var registrationClientURI: SecretBytes?
    /// Fields of a newer tokenvault, by tag: kept, unread, and written back
    /// as they were, so an older vaultd that rewrites a record loses nothing.
    public var unknownFields: [UnknownField] = []

    public struct UnknownField: Sendable, Equatable {
        public var tag: UInt8
        public var value: SecretBytes
    }

    public init(
        refreshToken: SecretBytes? = nil,
        clientSecret: SecretBytes? = nil,
        idToken: SecretBytes? = nil,
        dpopKey: SecretBytes? = nil,
        registrationAccessToken: SecretBytes? = nil,
        registrationClientURI: SecretBytes? = nil
    ) {
        self.refreshToken = refreshToken
        self.clientSecret = clientSecret
        self.idToken = idToken
        self.dpopKey = dpopKey
        self.registrationAccessToken = registrationAccessToken
        self.registrationClientURI = registrationClientURI
    }

    /// The client's part, which stays with the account whoever signs in or
    /// out: the client secret and the registration; nil when there is none.
    public var client: AccountSecrets? {
        let client = AccountSecrets(
            clientSecret: self.clientSecret,
            registrationAccessToken: self.registrationAccessToken,
            registrationClientURI: self.registrationClientURI
        )
        return client.isEmpty ? nil : client
    }

    public var isEmpty: Bool {
        self.refreshToken == nil && self.clientSecret == nil && self.idToken == nil && self.dpopKey == nil
            && self.registrationAccessToken == nil && self.registrationClientURI == nil
    }
}

/// Where account secrets rest. Every method may block on disk or D-Bus, so
/// implementations run their work off the event loop and the cooperative pool.
public protocol SecretStore: Sendable {
    var backend: Backend { get }

    /// True while the store cannot read or write for want of a key.
    var isLocked: Bool { get }

    /// The account's secrets, or nil when the store holds none for it; a
    /// record bound to another owner of the name is `.foreign`.
    func load(_ owner: RecordOwner) async throws(StoreError) -> AccountSecrets?

    /// Replaces the account's secrets, durably, before returning, bound to `owner`.
    func save(_ secrets: AccountSecrets, for owner: RecordOwner) async throws(StoreError)

    /// Removes the account's secrets; true when there was something to remove.
    func remove(_ account: String) async throws(StoreError) -> Bool

    /// Forgets the key; later calls throw `.locked` until `unlock`.
    func lock() async

    /// Loads the key again: from `passphrase` for a passphrase vault, from its
    /// file for the others (where `passphrase` is ignored).
    func unlock(passphrase: SecretBytes?) async throws(StoreError)
}
