/// The fields of a successful reply; they sit beside `id` and `ok` on the line.
public protocol ResultPayload: Codable, Sendable {}

/// One reply line: `{"id":…,"ok":true,…fields}` or `{"id":…,"ok":false,"error":{…}}`.
public struct Response: Sendable, Encodable {
    public var id: RequestID?
    public var outcome: Result<any ResultPayload, VaultError>

    public init(id: RequestID?, _ payload: any ResultPayload) {
        self.id = id
        self.outcome = .success(payload)
    }

    public init(id: RequestID?, error: VaultError) {
        self.id = id
        self.outcome = .failure(error)
    }

    private enum Key: String, CodingKey {
        case id, ok, error
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Key.self)
        try container.encode(self.id, forKey: .id)
        switch self.outcome {
        case .success(let payload):
            try container.encode(true, forKey: .ok)
            try payload.encode(to: encoder)
        case .failure(let error):
            try container.encode(false, forKey: .ok)
            try container.encode(error, forKey: .error)
        }
    }
}

/// What a client reads first from every line: whose reply it is and whether
/// it succeeded. The result fields are then decoded from the same line.
public struct ResponseHead: Decodable, Sendable {
    public var id: RequestID?
    public var ok: Bool?
    public var error: VaultError?
    /// Set on event lines (after `subscribe`), which have no `id` and no `ok`.
    public var event: String?
}

/// `hello`.
public struct HelloResult: ResultPayload, Equatable {
    public var `protocol`: Int
    public var server: String
    public var version: String

    public init(protocol: Int = TokenVault.protocolVersion, server: String = "vaultd", version: String = TokenVault.version) {
        self.protocol = `protocol`
        self.server = server
        self.version = version
    }
}

/// `status`.
public struct StatusResult: ResultPayload, Equatable {
    /// Where the secrets rest; nil through a share, which is not told.
    public var backend: Backend?
    /// Why that backend: what `auto` found, or that it was asked for.
    public var backendReason: String?
    public var locked: Bool
    public var keySource: String?
    public var accounts: [AccountStatus]
    /// Why the vault's last write failed, while no write has succeeded since:
    /// the secrets it held are kept in memory and written at the next chance.
    public var storageError: String?

    public init(
        backend: Backend?,
        backendReason: String? = nil,
        locked: Bool,
        keySource: String?,
        accounts: [AccountStatus],
        storageError: String? = nil
    ) {
        self.backend = backend
        self.backendReason = backendReason
        self.locked = locked
        self.keySource = keySource
        self.accounts = accounts
        self.storageError = storageError
    }

    enum CodingKeys: String, CodingKey {
        case backend, locked, accounts
        case backendReason = "backend_reason"
        case keySource = "key_source"
        case storageError = "storage_error"
    }
}

/// One account in `status`.
public struct AccountStatus: Codable, Sendable, Equatable {
    public var name: String
    public var issuer: String
    public var signedIn: Bool
    public var username: String?
    public var accessTokenExpiresAt: Int64?
    public var needsReauth: Bool
    /// The RFC 7638 thumbprint of the key the grant is bound to (DPoP); nil for a bearer grant.
    public var dpopJKT: String?
    /// The client the account signs in as, and where its id came from;
    /// nil through a share, which shows neither.
    public var clientID: String?
    public var registration: ClientRegistrationKind?

    public init(
        name: String,
        issuer: String,
        signedIn: Bool,
        username: String? = nil,
        accessTokenExpiresAt: Int64? = nil,
        needsReauth: Bool = false,
        dpopJKT: String? = nil,
        clientID: String? = nil,
        registration: ClientRegistrationKind? = nil
    ) {
        self.name = name
        self.issuer = issuer
        self.signedIn = signedIn
        self.username = username
        self.accessTokenExpiresAt = accessTokenExpiresAt
        self.needsReauth = needsReauth
        self.dpopJKT = dpopJKT
        self.clientID = clientID
        self.registration = registration
    }

    enum CodingKeys: String, CodingKey {
        case name, issuer, username, registration
        case signedIn = "signed_in"
        case accessTokenExpiresAt = "access_token_expires_at"
        case needsReauth = "needs_reauth"
        case dpopJKT = "dpop_jkt"
        case clientID = "client_id"
    }

    /// Every field of the contract, `null` when unknown.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(self.name, forKey: .name)
        try c.encode(self.issuer, forKey: .issuer)
        try c.encode(self.signedIn, forKey: .signedIn)
        try c.encode(self.username, forKey: .username)
        try c.encode(self.accessTokenExpiresAt, forKey: .accessTokenExpiresAt)
        try c.encode(self.needsReauth, forKey: .needsReauth)
        try c.encode(self.dpopJKT, forKey: .dpopJKT)
        try c.encodeIfPresent(self.clientID, forKey: .clientID)
        try c.encodeIfPresent(self.registration, forKey: .registration)
    }
}

/// `account.add`: the account as stored (no secrets), and whether a client
/// secret and a refresh token were stored with it.
public struct AccountResult: ResultPayload, Equatable {
    public var account: AccountConfiguration
    public var hasClientSecret: Bool
    public var signedIn: Bool

    public init(account: AccountConfiguration, hasClientSecret: Bool, signedIn: Bool) {
        self.account = account
        self.hasClientSecret = hasClientSecret
        self.signedIn = signedIn
    }

    enum CodingKeys: String, CodingKey {
        case account
        case hasClientSecret = "has_client_secret"
        case signedIn = "signed_in"
    }
}

/// `account.remove`: which places the account's secrets were wiped from, and whether its refresh token was revoked.
public struct RemovalResult: ResultPayload, Equatable {
    public var account: String
    public var wiped: [SecretPlace]
    /// As in `signout`: whether the refresh token was revoked at the issuer.
    public var revoked: Revocation?
    /// For a client vaultd registered (RFC 7591): whether the registration
    /// was deleted at the issuer (RFC 7592), and when not, what is left there.
    public var registrationDeleted: Bool?
    public var registrationLeft: String?

    public init(account: String, wiped: [SecretPlace], revoked: Revocation? = nil, registrationDeleted: Bool? = nil, registrationLeft: String? = nil) {
        self.account = account
        self.wiped = wiped
        self.revoked = revoked
        self.registrationDeleted = registrationDeleted
        self.registrationLeft = registrationLeft
    }

    enum CodingKeys: String, CodingKey {
        case account, wiped, revoked
        case registrationDeleted = "registration_deleted"
        case registrationLeft = "registration_left"
    }
}

/// Operations whose success carries no fields (`lock`, `unlock`).
public struct EmptyResult: ResultPayload, Equatable {
    public init() {}
}
