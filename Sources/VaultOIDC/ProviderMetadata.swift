/// The parts of an OpenID Provider's discovery document tokenvault uses.
public struct ProviderMetadata: Hashable, Sendable, Codable {
    public var issuer: String
    public var authorizationEndpoint: String?
    public var tokenEndpoint: String
    public var userinfoEndpoint: String?
    public var jwksURI: String?
    public var revocationEndpoint: String?
    public var endSessionEndpoint: String?
    public var deviceAuthorizationEndpoint: String?
    public var introspectionEndpoint: String?
    /// Where a client registers itself (RFC 7591 §3; OpenID Connect
    /// Dynamic Client Registration): nil, the issuer takes none.
    public var registrationEndpoint: String?
    /// Where an authorization request is pushed (RFC 9126 §5), and whether
    /// the issuer takes no other kind.
    public var pushedAuthorizationRequestEndpoint: String?
    public var requirePushedAuthorizationRequests: Bool?
    public var tokenEndpointAuthMethodsSupported: [String]?
    /// The algorithms the issuer takes DPoP proofs in (RFC 9449 §5.1); nil:
    /// the issuer does not do DPoP.
    public var dpopSigningAlgValuesSupported: [String]?

    public init(issuer: String, tokenEndpoint: String) {
        self.issuer = issuer
        self.tokenEndpoint = tokenEndpoint
    }

    enum CodingKeys: String, CodingKey {
        case issuer
        case authorizationEndpoint = "authorization_endpoint"
        case tokenEndpoint = "token_endpoint"
        case userinfoEndpoint = "userinfo_endpoint"
        case jwksURI = "jwks_uri"
        case revocationEndpoint = "revocation_endpoint"
        case endSessionEndpoint = "end_session_endpoint"
        case deviceAuthorizationEndpoint = "device_authorization_endpoint"
        case introspectionEndpoint = "introspection_endpoint"
        case registrationEndpoint = "registration_endpoint"
        case pushedAuthorizationRequestEndpoint = "pushed_authorization_request_endpoint"
        case requirePushedAuthorizationRequests = "require_pushed_authorization_requests"
        case tokenEndpointAuthMethodsSupported = "token_endpoint_auth_methods_supported"
        case dpopSigningAlgValuesSupported = "dpop_signing_alg_values_supported"
    }

    /// Every endpoint tokenvault may call, for the https-or-loopback check.
    var endpoints: [String] {
        [self.tokenEndpoint] + [
            self.authorizationEndpoint, self.userinfoEndpoint, self.jwksURI, self.revocationEndpoint,
            self.endSessionEndpoint, self.deviceAuthorizationEndpoint, self.introspectionEndpoint, self.registrationEndpoint,
            self.pushedAuthorizationRequestEndpoint,
        ].compactMap { $0 }
    }

    /// Whether OpenID discovery left out an endpoint tokenvault uses that
    /// OAuth 2.0 authorization server metadata (RFC 8414) may name.
    var lacksOAuthEndpoints: Bool {
        self.revocationEndpoint == nil || self.deviceAuthorizationEndpoint == nil
    }

    /// Fills those endpoints in from `other`, where this has none.
    mutating func complete(from other: AuthorizationServerMetadata) {
        self.revocationEndpoint = self.revocationEndpoint ?? other.revocationEndpoint
        self.deviceAuthorizationEndpoint = self.deviceAuthorizationEndpoint ?? other.deviceAuthorizationEndpoint
        self.introspectionEndpoint = self.introspectionEndpoint ?? other.introspectionEndpoint
    }
}

/// What tokenvault reads of OAuth 2.0 authorization server metadata (RFC 8414 §2).
struct AuthorizationServerMetadata: Decodable {
    var issuer: String
    var revocationEndpoint: String?
    var deviceAuthorizationEndpoint: String?
    var introspectionEndpoint: String?

    enum CodingKeys: String, CodingKey {
        case issuer
        case revocationEndpoint = "revocation_endpoint"
        case deviceAuthorizationEndpoint = "device_authorization_endpoint"
        case introspectionEndpoint = "introspection_endpoint"
    }

    /// Where an issuer's metadata is (RFC 8414 §3.1): the well-known segment
    /// inserted before the issuer's path, then, as OpenID discovery does it,
    /// after it. One URL when the issuer has no path.
    static func urls(for issuer: String) -> [String] {
        let base = issuer.hasSuffix("/") ? String(issuer.dropLast()) : issuer
        let wellKnown = "/.well-known/oauth-authorization-server"
        let appended = base + wellKnown
        guard let scheme = base.firstRange(of: "://") else { return [appended] }
        let pathStart = base[scheme.upperBound...].firstIndex(of: "/") ?? base.endIndex
        let inserted = String(base[..<pathStart]) + wellKnown + String(base[pathStart...])
        return inserted == appended ? [appended] : [inserted, appended]
    }
}
