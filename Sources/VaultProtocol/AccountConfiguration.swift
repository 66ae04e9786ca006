/// What the daemon knows about an account that is not secret: it is written
/// to `$XDG_CONFIG_HOME/tokenvault/accounts.json` and shown on the wire.
public struct AccountConfiguration: Hashable, Codable, Sendable {
    public var name: String
    /// The account's identity, made by vaultd when the account is added and
    /// never reused: a name can be removed and added again for another
    /// issuer or client, and what was granted to the old one (a share) must
    /// not reach the new one. Nil only before vaultd has given it one.
    public var identity: String?
    public var issuer: String
    public var clientID: String
    public var scopes: [String]
    /// Executable paths that may use this account; empty means every process of the user.
    public var allowedClients: [String]
    /// Whether `refresh_token` may hand the refresh token to an allowed client.
    public var releaseRefreshToken: Bool
    /// A fixed loopback redirect URI, for issuers that match the port exactly.
    public var redirectURI: String?
    /// After this percentage of an access token's lifetime, a caller's use
    /// of it starts a refresh in the background (100: only at expiry).
    public var refreshAhead: Int
    /// Whether the account's grants are bound to a DPoP key (RFC 9449).
    public var dpop: DPoPMode
    /// Where `clientID` came from.
    public var registration: ClientRegistrationKind

    public static let defaultRefreshAhead = 80

    public init(
        name: String,
        issuer: String,
        clientID: String,
        scopes: [String],
        allowedClients: [String] = [],
        releaseRefreshToken: Bool = false,
        redirectURI: String? = nil,
        refreshAhead: Int = Self.defaultRefreshAhead,
        dpop: DPoPMode = .auto,
        registration: ClientRegistrationKind = .manual
    ) {
        self.name = name
        self.issuer = issuer
        self.clientID = clientID
        self.scopes = scopes
        self.allowedClients = allowedClients
        self.releaseRefreshToken = releaseRefreshToken
        self.redirectURI = redirectURI
        self.refreshAhead = refreshAhead
        self.dpop = dpop
        self.registration = registration
    }

    enum CodingKeys: String, CodingKey {
        case name, issuer, scopes, dpop, registration
        case identity
        case clientID = "client_id"
        case allowedClients = "allowed_clients"
        case releaseRefreshToken = "release_refresh_token"
        case redirectURI = "redirect_uri"
        case refreshAhead = "refresh_ahead"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.name = try c.decode(String.self, forKey: .name)
        self.identity = try c.decodeIfPresent(String.self, forKey: .identity)
        self.issuer = try c.decode(String.self, forKey: .issuer)
        // Empty: none given, for `account.add` to register one.
        self.clientID = try c.decodeIfPresent(String.self, forKey: .clientID) ?? ""
        self.scopes = try c.decodeIfPresent([String].self, forKey: .scopes) ?? []
        self.allowedClients = try c.decodeIfPresent([String].self, forKey: .allowedClients) ?? []
        self.releaseRefreshToken = try c.decodeIfPresent(Bool.self, forKey: .releaseRefreshToken) ?? false
        self.redirectURI = try c.decodeIfPresent(String.self, forKey: .redirectURI)
        self.refreshAhead = try c.decodeIfPresent(Int.self, forKey: .refreshAhead) ?? Self.defaultRefreshAhead
        self.dpop = try c.decodeIfPresent(DPoPMode.self, forKey: .dpop) ?? .auto
        self.registration = try c.decodeIfPresent(ClientRegistrationKind.self, forKey: .registration) ?? .manual
    }
}

/// Where an account's client id came from: `account.add`'s `client_id`
/// (`manual`), or a registration vaultd made at the issuer (`dynamic`,
/// RFC 7591), which `account.remove` deletes.
public enum ClientRegistrationKind: String, Codable, Sendable, CaseIterable {
    case manual
    case dynamic
}

/// An account's `dpop`: when its grants are bound to a key of the vault.
public enum DPoPMode: String, Codable, Sendable, CaseIterable {
    /// When the issuer's discovery offers an algorithm the vault makes keys for.
    case auto
    /// Always: a sign-in the issuer does not bind keeps nothing.
    case required
    /// Never: bearer tokens.
    case off
}
