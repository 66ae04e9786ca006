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
    /// Whether `dpop.proof` and `dpop.nonce` pass through the share.
    public var dpop: Bool

    public init(accounts: [String], socket: String, ttl: Int? = nil, scopes: [String]? = nil, dpop: Bool = false) {
        self.accounts = accounts
        self.socket = socket
        self.ttl = ttl
        self.scopes = scopes
        self.dpop = dpop
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
    /// Whether the share makes DPoP proofs.
    public var dpop: Bool

    public init(share: String, socket: String, accounts: [String], scopes: [String]? = nil, expiresAt: Int64? = nil, dpop: Bool = false) {
        self.share = share
        self.socket = socket
        self.accounts = accounts
        self.scopes = scopes
        self.expiresAt = expiresAt
        self.dpop = dpop
    }

    enum CodingKeys: String, CodingKey {
        case share, socket, accounts, scopes, dpop
        case expiresAt = "expires_at"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.share = try c.decode(String.self, forKey: .share)
        self.socket = try c.decode(String.self, forKey: .socket)
        self.accounts = try c.decode([String].self, forKey: .accounts)
        self.scopes = try c.decodeIfPresent([String].self, forKey: .scopes)
        self.expiresAt = try c.decodeIfPresent(Int64.self, forKey: .expiresAt)
        self.dpop = try c.decodeIfPresent(Bool.self, forKey: .dpop) ?? false
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(self.share, forKey: .share)
        try c.encode(self.socket, forKey: .socket)
        try c.encode(self.accounts, forKey: .accounts)
        try c.encodeIfPresent(self.scopes, forKey: .scopes)
        try c.encode(self.expiresAt, forKey: .expiresAt)
        if self.dpop { try c.encode(true, forKey: .dpop) }
    }
}

/// `share.list`.
public struct ShareListResult: ResultPayload, Equatable {
    public var shares: [ShareResult]

    public init(shares: [ShareResult]) {
        self.shares = shares
    }
}
