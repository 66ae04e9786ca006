/// Whose secrets a record holds: the account's name, and what binds the
/// record to that account and nothing else (its identity, issuer and client
/// id). The sealed file seals the binding into the record's associated data
/// and keeps it beside the record, so a record moved to another account, or
/// read for an account whose issuer or client changed, is refused rather
/// than its refresh token sent where it was not issued.
public struct RecordOwner: Sendable, Hashable {
    public let name: String
    /// `identity NUL issuer NUL client id`; empty for an unbound record
    /// (one written before bindings, or by a caller that has none).
    public let binding: [UInt8]

    public init(name: String, identity: String, issuer: String, clientID: String) {
        self.name = name
        self.binding = Array(identity.utf8) + [0] + Array(issuer.utf8) + [0] + Array(clientID.utf8)
    }

    /// A record bound to no account's identity: it opens for any owner of the name.
    public init(unbound name: String) {
        self.name = name
        self.binding = []
    }
}

extension SecretStore {
    /// The secrets of the record named `account`, whatever it is bound to.
    public func load(_ account: String) async throws(StoreError) -> AccountSecrets? {
        try await self.load(RecordOwner(unbound: account))
    }

    /// Replaces the secrets of `account`, unbound.
    public func save(_ secrets: AccountSecrets, for account: String) async throws(StoreError) {
        try await self.save(secrets, for: RecordOwner(unbound: account))
    }
}
