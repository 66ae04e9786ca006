/// `share.open`: an extra socket that serves only some accounts' tokens.
public struct ShareOpen: Sendable, Equatable {
    public var accounts: [String]
    /// Where the share's socket goes; its folder passes the same ownership
    /// rules as the main socket's.
    public var socket: String
    /// Seconds until the share ends by itself; nil: when vaultd stops.
    public var ttl: Int?
    /// The scopes a token through the share may carry; nil: the accounts' own.
    public var scopes: [String]?

    public init(accounts: [String], socket: String, ttl: Int? = nil, scopes: [String]? = nil) {
        self.accounts = accounts
        self.socket = socket
        self.ttl = ttl
        self.scopes = scopes
    }

    /// The longest a share lives: a week.
    public static let maximumTTL = 7 * 86_400
}

/// `share.close`: a share by its id, or by its socket path.
public enum ShareTarget: Sendable, Equatable {
    case id(String)
    case socket(String)
}

/// One share, as `share.open` and `share.list` answer it.
public struct ShareResult: ResultPayload, Equatable {
    public var share: String
    public var socket: String
    public var accounts: [String]
    public var scopes: [String]?
    /// Unix seconds; nil: the share lasts until vaultd stops.
    public var expiresAt: Int64?

    public init(share: String, socket: String, accounts: [String], scopes: [String]? = nil, expiresAt: Int64? = nil) {
        self.share = share
        self.socket = socket
        self.accounts = accounts
        self.scopes = scopes
        self.expiresAt = expiresAt
    }

    enum CodingKeys: String, CodingKey {
        case share, socket, accounts, scopes
        case expiresAt = "expires_at"
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(self.share, forKey: .share)
        try c.encode(self.socket, forKey: .socket)
        try c.encode(self.accounts, forKey: .accounts)
        try c.encodeIfPresent(self.scopes, forKey: .scopes)
        try c.encode(self.expiresAt, forKey: .expiresAt)
    }
}

/// `share.list`.
public struct ShareListResult: ResultPayload, Equatable {
    public var shares: [ShareResult]

    public init(shares: [ShareResult]) {
        self.shares = shares
    }
}
