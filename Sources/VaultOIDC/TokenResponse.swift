public import VaultCrypto

/// A successful answer from the token endpoint, tokens already in guarded memory.
public struct TokenResponse: Sendable {
    public var accessToken: SecretBytes
    /// `Bearer` however the issuer spelled it.
    public var tokenType: String
    /// Seconds; nil when the issuer did not say.
    public var expiresIn: Int?
    /// Present when the issuer rotated the refresh token.
    public var refreshToken: SecretBytes?
    public var idToken: SecretBytes?
    /// The granted scope, when the issuer said.
    public var scope: String?

    public init(
        accessToken: SecretBytes,
        tokenType: String = "Bearer",
        expiresIn: Int? = nil,
        refreshToken: SecretBytes? = nil,
        idToken: SecretBytes? = nil,
        scope: String? = nil
    ) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresIn = expiresIn
        self.refreshToken = refreshToken
        self.idToken = idToken
        self.scope = scope
    }
}

/// The client as the issuer knows it.
public struct ClientCredentials: Sendable {
    public var clientID: String
    public var secret: SecretBytes?
    /// The grant's DPoP key: every token-endpoint request of the grant
    /// carries a proof made with it (RFC 9449 §5).
    public var dpop: DPoPKey?

    public init(clientID: String, secret: SecretBytes?, dpop: DPoPKey? = nil) {
        self.clientID = clientID
        self.secret = secret
        self.dpop = dpop
    }
}

/// A 200 from the token endpoint: the refresh token it carried, kept
/// whatever else it held (a refresh spent the one it sent), and its tokens
/// or why none of them may be served.
public struct TokenAnswer: Sendable {
    public var refreshToken: SecretBytes?
    public var tokens: Result<TokenResponse, ProviderError>

    public init(refreshToken: SecretBytes?, tokens: Result<TokenResponse, ProviderError>) {
        self.refreshToken = refreshToken
        self.tokens = tokens
    }

    /// The tokens, for a caller that keeps nothing of a refused answer
    /// (a sign-in): its refresh token is wiped then.
    public func served() throws(ProviderError) -> TokenResponse {
        switch self.tokens {
        case .success(let response):
            return response
        case .failure(let error):
            self.refreshToken?.wipe()
            throw error
        }
    }
}
