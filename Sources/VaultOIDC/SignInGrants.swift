import FoundationEssentials
import NIOHTTP1
public import VaultCrypto
import VaultJSON

/// One authorization request (RFC 6749 §4.1, RFC 7636, RFC 8252): the URL to
/// open and what the answer must match. The verifier never leaves here.
public struct AuthorizationRequest: Sendable {
    public let url: String
    public let redirectURI: String
    public let state: String
    public let nonce: String
    let verifier: SecretBytes
}

/// The device authorization response (RFC 8628 §3.2).
public struct DeviceAuthorization: Sendable {
    public var deviceCode: SecretBytes
    public var userCode: String
    public var verificationURI: String
    public var verificationURIComplete: String?
    public var expiresIn: Int
    public var interval: Int
}

extension DeviceAuthorization {
    /// Reads a device authorization answer (RFC 8628 §3.2), numbers bounded (IssuerNumber).
    static func parse(status: UInt, body: [UInt8], retryAfter: Int?) throws(ProviderError) -> DeviceAuthorization {
        guard status == 200 else {
            if status == 429 || status >= 500 {
                throw .unavailable(reason: "device authorization answered HTTP \(status)", retryAfterSeconds: retryAfter)
            }
            let failure = try? JSONDecoder().decode(JSONValue.self, from: Data(body))
            let error = failure?["error"]?.stringValue.map(TokenResponseParser.clean) ?? "http_\(status)"
            throw .rejected(error: error, description: failure?["error_description"]?.stringValue.map(TokenResponseParser.clean))
        }
        guard let document = try? JSONDecoder().decode(JSONValue.self, from: Data(body)),
            let deviceCode = document["device_code"]?.stringValue,
            let userCode = document["user_code"]?.stringValue,
            let verificationURI = (document["verification_uri"] ?? document["verification_url"])?.stringValue
        else {
            throw .unavailable(reason: "the device authorization answer is not valid", retryAfterSeconds: nil)
        }
        do {
            return DeviceAuthorization(
                deviceCode: try SecretBytes(utf8: deviceCode),
                userCode: TokenResponseParser.clean(userCode),
                verificationURI: verificationURI,
                verificationURIComplete: document["verification_uri_complete"]?.stringValue,
                expiresIn: IssuerNumber.bounded(document["expires_in"], IssuerNumber.lifetimes) ?? 1800,
                interval: IssuerNumber.bounded(document["interval"], IssuerNumber.intervals) ?? 5
            )
        } catch {
            throw .unavailable(reason: "out of guarded memory", retryAfterSeconds: nil)
        }
    }
}

extension OIDCClient {
    // MARK: Authorization code + PKCE

    /// Builds an authorization request with PKCE S256, `state` and `nonce`.
    /// When the issuer takes only pushed requests (RFC 9126: discovery's
    /// `require_pushed_authorization_requests`), it is pushed first, the
    /// client authenticated as at the token endpoint, and the URL carries
    /// only `client_id` and the `request_uri` the issuer answered: neither
    /// the challenge nor the redirect URI pass through the browser.
    public func authorizationRequest(
        metadata: ProviderMetadata,
        client: ClientCredentials,
        redirectURI: String,
        scopes: [String],
        loginHint: String? = nil,
        dpopThumbprint: String? = nil
    ) async throws(ProviderError) -> AuthorizationRequest {
        let clientID = client.clientID
        guard let endpoint = metadata.authorizationEndpoint else {
            throw .rejected(error: "unsupported", description: "the issuer has no authorization endpoint")
        }
        let verifierText: String
        let challenge: String
        let state: String
        let nonce: String
        do {
            verifierText = Base64URL.encode(try randomBytes(32))
            challenge = Base64URL.encode(try sha256(Array(verifierText.utf8)))
            state = Base64URL.encode(try randomBytes(32))
            nonce = Base64URL.encode(try randomBytes(16))
        } catch {
            throw .unavailable(reason: "no randomness", retryAfterSeconds: nil)
        }
        var fields = [
            ("response_type", "code"), ("client_id", clientID), ("redirect_uri", redirectURI),
            ("scope", scopes.joined(separator: " ")), ("state", state), ("nonce", nonce),
            ("code_challenge", challenge), ("code_challenge_method", "S256"),
        ]
        if let loginHint { fields.append(("login_hint", loginHint)) }
        // RFC 9449 §10: the code is bound to the key that will redeem it.
        if let dpopThumbprint { fields.append(("dpop_jkt", dpopThumbprint)) }
        var query = String(decoding: FormEncoding.encode(fields), as: UTF8.self)
        let verifier: SecretBytes
        do {
            verifier = try SecretBytes(utf8: verifierText)
        } catch {
            throw .unavailable(reason: "out of guarded memory", retryAfterSeconds: nil)
        }
        if metadata.requirePushedAuthorizationRequests == true {
            // `authenticated` names the client itself, in the form or by Basic.
            let pushed = try await self.push(fields.filter { $0.0 != "client_id" }, client: client, metadata: metadata)
            query = String(decoding: FormEncoding.encode([("client_id", clientID), ("request_uri", pushed)]), as: UTF8.self)
        }
        return AuthorizationRequest(
            url: endpoint + (endpoint.contains("?") ? "&" : "?") + query,
            redirectURI: redirectURI,
            state: state,
            nonce: nonce,
            verifier: verifier
        )
    }

    /// Pushes an authorization request's parameters (RFC 9126 §2): the
    /// `request_uri` the issuer answers with (§2.2), 1 to 1,024 visible
    /// ASCII characters, else why not.
    private func push(_ fields: [(String, String)], client: ClientCredentials, metadata: ProviderMetadata) async throws(ProviderError) -> String {
        guard let endpoint = metadata.pushedAuthorizationRequestEndpoint else {
            throw .untrusted(reason: "the issuer requires pushed authorization requests and names no endpoint for them")
        }
        var (body, headers) = self.authenticated(fields.map { ($0.0, $0.1 as any FormValue) }, client: client, metadata: metadata)
        defer { body.secureZero() }
        var reply = try await self.send(url: endpoint, method: .POST, headers: headers, body: body)
        defer { reply.body.secureZero() }
        struct Pushed: Decodable {
            var requestURI: String
            enum CodingKeys: String, CodingKey { case requestURI = "request_uri" }
        }
        guard reply.status == 201 || reply.status == 200 else {
            if let rejection = TokenResponseParser.rejection(in: reply.body) { throw rejection }
            throw .rejected(error: "invalid_request", description: "the issuer answered the pushed request with HTTP \(reply.status)")
        }
        guard let pushed = try? JSONDecoder().decode(Pushed.self, from: Data(reply.body)),
            (1...1024).contains(pushed.requestURI.utf8.count), pushed.requestURI.utf8.allSatisfy({ (0x21...0x7E).contains($0) })
        else {
            throw .untrusted(reason: "the issuer's answer to a pushed request has no request_uri of 1 to 1024 visible ASCII characters")
        }
        return pushed.requestURI
    }

    /// Redeems an authorization code with the request's PKCE verifier.
    public func exchangeCode(
        _ code: String,
        for request: AuthorizationRequest,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> TokenResponse {
        let fields: [(String, any FormValue)] = [
            ("grant_type", "authorization_code"), ("code", code), ("redirect_uri", request.redirectURI),
            ("code_verifier", request.verifier),
        ]
        return try await self.token(fields: fields, client: client, metadata: metadata)
    }

    // MARK: Password grant

    /// The resource-owner password grant (RFC 6749 §4.3), where an issuer allows it.
    public func passwordGrant(
        username: String,
        password: SecretBytes,
        scope: String,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> TokenResponse {
        let fields: [(String, any FormValue)] = [
            ("grant_type", "password"), ("username", username), ("password", password),
            ("scope", scope),
        ]
        return try await self.token(fields: fields, client: client, metadata: metadata)
    }

    // MARK: Device authorization grant

    /// Asks for a device code (RFC 8628 §3.1).
    public func deviceAuthorization(
        scope: String,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> DeviceAuthorization {
        guard let endpoint = metadata.deviceAuthorizationEndpoint else {
            throw .rejected(error: "unsupported", description: "the issuer has no device authorization endpoint")
        }
        let (body, headers) = self.authenticated([("scope", scope)], client: client, metadata: metadata)
        let reply = try await self.send(url: endpoint, method: .POST, headers: headers, body: body)
        return try DeviceAuthorization.parse(status: reply.status, body: reply.body, retryAfter: reply.retryAfter)
    }

    /// One poll of the token endpoint for a device code (RFC 8628 §3.4).
    /// `authorization_pending`, `slow_down`, `access_denied` and
    /// `expired_token` come back as `.rejected` with that error.
    public func pollDevice(
        _ device: DeviceAuthorization,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> TokenResponse {
        let fields: [(String, any FormValue)] = [
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
            ("device_code", device.deviceCode),
        ]
        return try await self.token(fields: fields, client: client, metadata: metadata)
    }
}

/// Base64url without padding (RFC 4648 §5), as PKCE and OAuth values use it.
enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// RFC 4648 §5, without padding; byte by byte (a DPoP proof encodes four
    /// of these per request, and Foundation's Character-wise path cost more
    /// than the signature).
    static func encode(_ bytes: [UInt8]) -> String {
        let alphabet = Self.alphabet
        var out = [UInt8]()
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= bytes.count {
            let chunk = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            out.append(alphabet[Int(chunk >> 18 & 63)])
            out.append(alphabet[Int(chunk >> 12 & 63)])
            out.append(alphabet[Int(chunk >> 6 & 63)])
            out.append(alphabet[Int(chunk & 63)])
            index += 3
        }
        let rest = bytes.count - index
        if rest > 0 {
            let chunk = UInt32(bytes[index]) << 16 | (rest == 2 ? UInt32(bytes[index + 1]) << 8 : 0)
            out.append(alphabet[Int(chunk >> 18 & 63)])
            out.append(alphabet[Int(chunk >> 12 & 63)])
            if rest == 2 { out.append(alphabet[Int(chunk >> 6 & 63)]) }
        }
        return String(decoding: out, as: UTF8.self)
    }
}

extension JSONValue {
    /// A number, or a number written as a string, within ±10¹² (error codes).
    var intValue: Int? {
        IssuerNumber.bounded(self, -1_000_000_000_000...1_000_000_000_000)
    }
}

/// What became of a revocation request (RFC 7009).
/// What an issuer made of a revocation request.
public enum RevocationOutcome: Sendable {
    /// The issuer answered 200: the token is dead.
    case revoked
    /// The issuer has no revocation endpoint.
    case unsupported
    /// The issuer could not be reached, or refused.
    case failed
}

extension OIDCClient {
    /// Revokes a refresh token at the issuer (RFC 7009 §2.1), with client
    /// authentication where the client has a secret.
    public func revoke(
        refreshToken: SecretBytes,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async -> (RevocationOutcome, reason: String?) {
        await self.revoke(refreshToken, hint: "refresh_token", client: client, metadata: metadata)
    }

    /// Revokes an access token at the issuer (RFC 7009 §2.1), so that a copy
    /// handed out before a sign-out stops opening resources that ask the issuer.
    public func revoke(
        accessToken: SecretBytes,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async -> (RevocationOutcome, reason: String?) {
        await self.revoke(accessToken, hint: "access_token", client: client, metadata: metadata)
    }

    private func revoke(
        _ token: SecretBytes,
        hint: String,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async -> (RevocationOutcome, reason: String?) {
        guard let endpoint = metadata.revocationEndpoint else { return (.unsupported, nil) }
        var (body, headers) = self.authenticated(
            [("token", token), ("token_type_hint", hint)],
            client: client,
            metadata: metadata
        )
        defer { body.secureZero() }
        do {
            let reply = try await self.send(
                url: endpoint, method: .POST, headers: headers, body: body, timeout: self.configuration.revocationTimeout
            )
            guard reply.status == 200 else { return (.failed, "the revocation endpoint answered HTTP \(reply.status)") }
            return (.revoked, nil)
        } catch {
            switch error {
            case .unavailable(let reason, _), .untrusted(let reason): return (.failed, reason)
            default: return (.failed, "\(error)")
            }
        }
    }

    /// The issuer's end-session URL (OpenID RP-Initiated Logout), for the
    /// browser session that sign-in may have left behind.
    public nonisolated func endSessionURL(metadata: ProviderMetadata, clientID: String, idToken: SecretBytes?) -> String? {
        guard let endpoint = metadata.endSessionEndpoint else { return nil }
        var fields: [(String, any FormValue)] = [("client_id", clientID)]
        if let idToken { fields.append(("id_token_hint", idToken)) }
        return endpoint + (endpoint.contains("?") ? "&" : "?") + String(decoding: FormEncoding.encode(fields), as: UTF8.self)
    }
}
