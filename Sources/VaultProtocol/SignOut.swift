/// `signout`: one account, or every account.
public enum SignOutTarget: Sendable, Equatable {
    case account(String)
    case all
}

/// What `signout` did for one account's copies of its tokens.
public struct SignOutReceipt: Codable, Sendable, Equatable {
    public var name: String
    public var revoked: Revocation
    /// Why revocation failed, when it did.
    public var reason: String?
    /// Every place a secret was removed from.
    public var wiped: [SecretPlace]
    /// Where to end the browser session the issuer may still hold.
    public var endSessionURL: String?
    /// The access tokens the vault had handed out and that were still live,
    /// revoked at the issuer; the rest (no revocation endpoint, a failure)
    /// are named in `reason`.
    public var accessTokensRevoked: Int

    public init(
        name: String,
        revoked: Revocation,
        reason: String? = nil,
        wiped: [SecretPlace],
        endSessionURL: String? = nil,
        accessTokensRevoked: Int = 0
    ) {
        self.name = name
        self.revoked = revoked
        self.reason = reason
        self.wiped = wiped
        self.endSessionURL = endSessionURL
        self.accessTokensRevoked = accessTokensRevoked
    }

    enum CodingKeys: String, CodingKey {
        case name, revoked, reason, wiped
        case endSessionURL = "end_session_url"
        case accessTokensRevoked = "access_tokens_revoked"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.name = try c.decode(String.self, forKey: .name)
        self.revoked = try c.decode(Revocation.self, forKey: .revoked)
        self.reason = try c.decodeIfPresent(String.self, forKey: .reason)
        self.wiped = try c.decode([SecretPlace].self, forKey: .wiped)
        self.endSessionURL = try c.decodeIfPresent(String.self, forKey: .endSessionURL)
        // A vaultd from before access tokens were revoked says nothing of them.
        self.accessTokensRevoked = try c.decodeIfPresent(Int.self, forKey: .accessTokensRevoked) ?? 0
    }
}

/// `signout`'s result: a receipt per account, and how many subscribers were told.
public struct SignOutResult: ResultPayload, Equatable {
    public var accounts: [SignOutReceipt]
    /// Subscribers told `signed_out`, added up over the accounts.
    public var notified: Int

    public init(accounts: [SignOutReceipt], notified: Int) {
        self.accounts = accounts
        self.notified = notified
    }
}

/// `migrate`: where the secrets were and are, and which accounts moved.
public struct MigrationResult: ResultPayload, Equatable {
    public var from: Backend
    public var to: Backend
    public var moved: [String]

    public init(from: Backend, to: Backend, moved: [String]) {
        self.from = from
        self.to = to
        self.moved = moved
    }
}
