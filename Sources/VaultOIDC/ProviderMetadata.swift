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
    public var tokenEndpointAuthMethodsSupported: [String]?

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
        case tokenEndpointAuthMethodsSupported = "token_endpoint_auth_methods_supported"
    }

    /// Every endpoint tokenvault may call, for the https-or-loopback check.
    var endpoints: [String] {
        [self.tokenEndpoint] + [
            self.authorizationEndpoint, self.userinfoEndpoint, self.jwksURI, self.revocationEndpoint,
            self.endSessionEndpoint, self.deviceAuthorizationEndpoint,
        ].compactMap { $0 }
    }
}
