public import AsyncHTTPClient
import FoundationEssentials
import JWTKit
public import Logging
public import NIOCore
import NIOHTTP1
public import VaultCrypto
public import VaultProtocol

/// The identity-provider client: discovery, the refresh grant, userinfo and
/// ID-token validation. Knows nothing of sockets or accounts.
///
/// Every call has a deadline and every body is read with a cap. Issuers must
/// be https, except on loopback (RFC 8252).
public actor OIDCClient {
    public struct Configuration: Sendable {
        /// The whole of one HTTP exchange, connection to last byte.
        public var timeout: TimeAmount = .seconds(15)
        /// A revocation at sign-out: the user waits on it, and everything
        /// local is wiped whatever it answers.
        public var revocationTimeout: TimeAmount = .seconds(5)
        /// Bodies larger than this are refused, not buffered.
        public var maximumBodyBytes = 1 << 20
        /// How long a discovery document is trusted before it is fetched again.
        public var discoveryLifetime: Double = 3600
        /// Allowed clock difference when checking `exp` and `iat`.
        public var leeway: Double = 60

        public init() {}
    }

    private let http: HTTPClient
    let configuration: Configuration
    private let logger: Logger
    private var discovered: [String: (metadata: ProviderMetadata, fetchedAt: Double)] = [:]
    private var keySets: [String: KeySet] = [:]

    /// An issuer's signing keys, and their `kid`s: jwt-kit falls back to a
    /// default key for an unknown `kid`, so the lookup is done here.
    private struct KeySet {
        var keys: JWTKeyCollection
        var kids: Set<String>
    }

    public init(http: HTTPClient = .shared, configuration: Configuration = Configuration(), logger: Logger) {
        self.http = http
        self.configuration = configuration
        self.logger = logger
    }

    // MARK: Discovery

    /// The issuer's metadata, from cache or `/.well-known/openid-configuration`.
    /// The document's `issuer` must equal `issuer` exactly (OIDC Discovery §4.3).
    public func metadata(for issuer: String, now: Double) async throws(ProviderError) -> ProviderMetadata {
        if let cached = self.discovered[issuer], now - cached.fetchedAt < self.configuration.discoveryLifetime {
            return cached.metadata
        }
        try Self.requireSecure(issuer)
        let base = issuer.hasSuffix("/") ? String(issuer.dropLast()) : issuer
        let reply = try await self.send(url: base + "/.well-known/openid-configuration", method: .GET)
        guard reply.status == 200 else {
            throw .unavailable(reason: "discovery answered HTTP \(reply.status)", retryAfterSeconds: nil)
        }
        let metadata: ProviderMetadata
        do {
            metadata = try JSONDecoder().decode(ProviderMetadata.self, from: Data(reply.body))
        } catch {
            throw .unavailable(reason: "the discovery document is not valid", retryAfterSeconds: nil)
        }
        guard metadata.issuer == issuer else {
            throw .untrusted(reason: "the discovery document names another issuer")
        }
        for endpoint in metadata.endpoints { try Self.requireSecure(endpoint) }
        self.discovered[issuer] = (metadata, now)
        return metadata
    }

    /// Forgets cached discovery (after the issuer's endpoints failed, say).
    public func forget(issuer: String) {
        self.discovered[issuer] = nil
    }

    // MARK: Grants

    /// The refresh-token grant (RFC 6749 §6). `scope` narrows the request; nil asks for the original grant.
    public func refresh(
        _ refreshToken: SecretBytes,
        scope: String?,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> TokenResponse {
        var fields = [("grant_type", "refresh_token"), ("refresh_token", refreshToken.unsafeString())]
        if let scope { fields.append(("scope", scope)) }
        return try await self.token(fields: fields, client: client, metadata: metadata)
    }

    /// A POST to the token endpoint with client authentication.
    public func token(
        fields: [(String, String)],
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> TokenResponse {
        var (body, headers) = self.authenticated(fields, client: client, metadata: metadata)
        defer { body.secureZero() }
        let reply = try await self.send(url: metadata.tokenEndpoint, method: .POST, headers: headers, body: body)
        return try TokenResponseParser.parse(status: reply.status, body: reply.body, retryAfter: reply.retryAfter)
    }

    /// A form body with client authentication (RFC 6749 §2.3.1): HTTP Basic
    /// when the client has a secret and the issuer accepts it, else the
    /// secret in the body; a public client sends only `client_id`.
    nonisolated func authenticated(
        _ fields: [(String, String)],
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) -> (body: [UInt8], headers: HTTPHeaders) {
        var fields = fields
        var headers = HTTPHeaders()
        if let secret = client.secret {
            let methods = metadata.tokenEndpointAuthMethodsSupported ?? ["client_secret_basic"]
            if methods.contains("client_secret_basic") || !methods.contains("client_secret_post") {
                let pair = FormEncoding.escape(client.clientID) + ":" + FormEncoding.escape(secret.unsafeString())
                headers.add(name: "Authorization", value: "Basic " + Data(pair.utf8).base64EncodedString())
            } else {
                fields.append(("client_id", client.clientID))
                fields.append(("client_secret", secret.unsafeString()))
            }
        } else {
            fields.append(("client_id", client.clientID))
        }
        headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        return (FormEncoding.encode(fields), headers)
    }

    // MARK: Userinfo

    /// The userinfo document for `accessToken`, as the issuer wrote it.
    public func userinfo(accessToken: SecretBytes, metadata: ProviderMetadata) async throws(ProviderError) -> JSONValue {
        guard let endpoint = metadata.userinfoEndpoint else {
            throw .rejected(error: "unsupported", description: "the issuer has no userinfo endpoint")
        }
        var headers = HTTPHeaders()
        headers.add(name: "Authorization", value: "Bearer " + accessToken.unsafeString())
        let reply = try await self.send(url: endpoint, method: .GET, headers: headers)
        switch reply.status {
        case 200:
            guard let document = try? JSONDecoder().decode(JSONValue.self, from: Data(reply.body)),
                case .object = document
            else {
                throw .unavailable(reason: "the userinfo document is not valid JSON", retryAfterSeconds: nil)
            }
            return document
        case 401, 403:
            throw .rejected(error: "invalid_token", description: "the issuer refused the access token at userinfo")
        default:
            throw .unavailable(reason: "userinfo answered HTTP \(reply.status)", retryAfterSeconds: nil)
        }
    }

    // MARK: ID tokens

    /// Validates an ID token (OIDC Core §3.1.3.7): signature with the issuer's
    /// JWKS (fetched again once when the `kid` is unknown), `iss`, `aud`,
    /// `azp`, `exp`, `iat`, and `nonce` when one was sent. Returns its claims.
    public func validateIDToken(
        _ idToken: SecretBytes,
        clientID: String,
        nonce: String?,
        metadata: ProviderMetadata,
        now: Double
    ) async throws(ProviderError) -> JSONValue {
        let token = idToken.unsafeString()
        var keySet = try await self.keySet(for: metadata, refetch: false)
        if let kid = IDTokenReader.header(of: token)?["kid"]?.stringValue, !keySet.kids.contains(kid) {
            // A key the issuer rotated in since the last fetch: fetch once more.
            keySet = try await self.keySet(for: metadata, refetch: true)
            guard keySet.kids.contains(kid) else {
                throw .untrusted(reason: "the ID token is signed with a key the issuer does not publish")
            }
        }
        let payload: IDTokenPayload
        do {
            payload = try await keySet.keys.verify(token, as: IDTokenPayload.self)
        } catch {
            throw .untrusted(reason: "the ID token's signature does not verify")
        }
        guard payload.iss.value == metadata.issuer else {
            throw .untrusted(reason: "the ID token names another issuer")
        }
        guard payload.aud.value.contains(clientID) else {
            throw .untrusted(reason: "the ID token is not for this client")
        }
        if payload.aud.value.count > 1, let azp = payload.azp, azp != clientID {
            throw .untrusted(reason: "the ID token was issued to another party")
        }
        guard payload.exp.value.timeIntervalSince1970 + self.configuration.leeway > now else {
            throw .untrusted(reason: "the ID token has expired")
        }
        guard payload.iat.value.timeIntervalSince1970 - self.configuration.leeway <= now else {
            throw .untrusted(reason: "the ID token was issued in the future")
        }
        if let nonce, payload.nonce != nonce {
            throw .untrusted(reason: "the ID token's nonce does not match")
        }
        guard let claims = IDTokenReader.claims(of: token) else {
            throw .untrusted(reason: "the ID token's claims are not readable")
        }
        return claims
    }

    private func keySet(for metadata: ProviderMetadata, refetch: Bool) async throws(ProviderError) -> KeySet {
        if !refetch, let keySet = self.keySets[metadata.issuer] { return keySet }
        guard let uri = metadata.jwksURI else {
            throw .untrusted(reason: "the issuer publishes no signing keys (jwks_uri)")
        }
        let reply = try await self.send(url: uri, method: .GET)
        guard reply.status == 200 else {
            throw .unavailable(reason: "the JWKS answered HTTP \(reply.status)", retryAfterSeconds: nil)
        }
        var keySet = KeySet(keys: JWTKeyCollection(), kids: [])
        do {
            let jwks = try JSONDecoder().decode(JWKS.self, from: Data(reply.body))
            for jwk in jwks.keys {
                // A key this library cannot use (another algorithm, encryption) is skipped, not fatal.
                guard let kid = jwk.keyIdentifier, (try? await keySet.keys.add(jwk: jwk)) != nil else { continue }
                keySet.kids.insert(kid.string)
            }
        } catch {
            throw .unavailable(reason: "the JWKS is not valid", retryAfterSeconds: nil)
        }
        self.keySets[metadata.issuer] = keySet
        return keySet
    }

    // MARK: HTTP

    struct Reply {
        var status: UInt
        var body: [UInt8]
        var retryAfter: Int?
    }

    func send(
        url: String,
        method: HTTPMethod,
        headers: HTTPHeaders = HTTPHeaders(),
        body: [UInt8]? = nil,
        timeout: TimeAmount? = nil
    ) async throws(ProviderError) -> Reply {
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers = headers
        request.headers.add(name: "Accept", value: "application/json")
        if let body { request.body = .bytes(ByteBuffer(bytes: body)) }
        do {
            let response = try await self.http.execute(request, timeout: timeout ?? self.configuration.timeout, logger: nil)
            var buffer = try await response.body.collect(upTo: self.configuration.maximumBodyBytes)
            let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
            buffer.withUnsafeMutableReadableBytes { secureZero($0) }
            let retryAfter = response.headers.first(name: "Retry-After").flatMap { Int($0) }
            return Reply(status: response.status.code, body: bytes, retryAfter: retryAfter)
        } catch is NIOTooManyBytesError {
            self.logger.debug("issuer answer over the limit", metadata: ["url": "\(Self.redacted(url))"])
            throw .unavailable(
                reason: "the issuer's answer is over the \(self.configuration.maximumBodyBytes >> 10) KiB limit",
                retryAfterSeconds: nil
            )
        } catch {
            // The error's text may quote a body or a URL with a token: name its type only.
            self.logger.debug("issuer unreachable", metadata: ["url": "\(Self.redacted(url))", "error": "\(type(of: error))"])
            throw .unavailable(reason: "the issuer could not be reached (\(type(of: error)))", retryAfterSeconds: nil)
        }
    }

    private static func redacted(_ url: String) -> String {
        url.split(separator: "?", maxSplits: 1).first.map(String.init) ?? url
    }

    /// https, or http on loopback only (RFC 8252 §8.3).
    static func requireSecure(_ url: String) throws(ProviderError) {
        guard let parsed = URL(string: url), let scheme = parsed.scheme, let host = parsed.host else {
            throw .untrusted(reason: "an issuer URL is not valid")
        }
        let loopback = ["127.0.0.1", "::1", "[::1]", "localhost"].contains(host)
        guard scheme == "https" || (scheme == "http" && loopback) else {
            throw .untrusted(reason: "the issuer uses plain http off loopback")
        }
    }
}
