public import VaultCrypto
public import VaultJSON

/// `token`: an access token and when it expires. The only reply that carries
/// a token; it is encoded from guarded memory at the last moment.
public struct TokenResult: ResultPayload {
    public var accessToken: SecretBytes
    public var tokenType: String
    public var expiresAt: Int64
    public var expiresIn: Int64
    public var scope: String

    public init(accessToken: SecretBytes, tokenType: String, expiresAt: Int64, expiresIn: Int64, scope: String) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresAt = expiresAt
        self.expiresIn = expiresIn
        self.scope = scope
    }

    enum CodingKeys: String, CodingKey {
        case scope
        case accessToken = "access_token"
        case tokenType = "token_type"
        case expiresAt = "expires_at"
        case expiresIn = "expires_in"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.accessToken = try SecretBytes(utf8: try c.decode(String.self, forKey: .accessToken))
        self.tokenType = try c.decode(String.self, forKey: .tokenType)
        self.expiresAt = try c.decode(Int64.self, forKey: .expiresAt)
        self.expiresIn = try c.decode(Int64.self, forKey: .expiresIn)
        self.scope = try c.decodeIfPresent(String.self, forKey: .scope) ?? ""
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(self.accessToken.unsafeString(), forKey: .accessToken)
        try c.encode(self.tokenType, forKey: .tokenType)
        try c.encode(self.expiresAt, forKey: .expiresAt)
        try c.encode(self.expiresIn, forKey: .expiresIn)
        try c.encode(self.scope, forKey: .scope)
    }
}

/// `refresh_token`: the account's refresh token, released to a trusted
/// companion (MSAL's `returnRefreshToken`).
public struct RefreshTokenResult: ResultPayload {
    public var refreshToken: SecretBytes

    public init(refreshToken: SecretBytes) {
        self.refreshToken = refreshToken
    }

    enum CodingKeys: String, CodingKey {
        case refreshToken = "refresh_token"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.refreshToken = try SecretBytes(utf8: try c.decode(String.self, forKey: .refreshToken))
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(self.refreshToken.unsafeString(), forKey: .refreshToken)
    }
}

/// `claims`: the claims of the account's last validated ID token.
public struct ClaimsResult: ResultPayload {
    public var claims: JSONValue

    public init(claims: JSONValue) {
        self.claims = claims
    }
}

/// `userinfo`: the issuer's userinfo document, fetched with a fresh access token.
public struct UserinfoResult: ResultPayload {
    public var userinfo: JSONValue

    public init(userinfo: JSONValue) {
        self.userinfo = userinfo
    }
}

/// `token`'s request fields.
public struct TokenRequest: Sendable, Equatable {
    public var account: String
    /// Nil: the account's own scopes.
    public var scopes: [String]?
    /// Serve from memory only when the token lives at least this many more seconds.
    public var minTTL: Int
    public var forceRefresh: Bool

    public static let defaultMinTTL = 60
    /// What `min_ttl` may be, in seconds: up to a day.
    public static let minTTLRange = 0...86_400
    /// The words for a `min_ttl` out of range, on the wire and on vaultctl's command line.
    public static let minTTLRule = "'min_ttl' is a number of seconds from 0 to 86400"

    public init(account: String, scopes: [String]? = nil, minTTL: Int = Self.defaultMinTTL, forceRefresh: Bool = false) {
        self.account = account
        self.scopes = scopes
        self.minTTL = minTTL
        self.forceRefresh = forceRefresh
    }
}
