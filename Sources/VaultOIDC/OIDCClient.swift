public import AsyncHTTPClient
import FoundationEssentials
import JWTKit
public import Logging
public import NIOCore
import NIOHTTP1
public import VaultCrypto
public import VaultJSON
import VaultProtocol

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
        /// How long an issuer's signing keys are trusted when its JWKS
        /// answer has no `Cache-Control: max-age`; a max-age is honoured
        /// within `minimumKeySetLifetime` … `maximumKeySetLifetime` (a
        /// `no-cache` issuer would have them fetched for every ID token).
        public var keySetLifetime: Double = 3600
        public var minimumKeySetLifetime: Double = 60
        public var maximumKeySetLifetime: Double = 86400

        public init() {}
    }

    private let http: HTTPClient
    let configuration: Configuration
    private let logger: Logger
    private var discovered: [String: (metadata: ProviderMetadata, fetchedAt: Double)] = [:]
    private var keySets: [String: KeySet] = [:]

    /// An issuer's signing keys, and their `kid`s: jwt-kit falls back to a
    /// default key for an unknown `kid`, so the lookup is done here. Kept
    /// until `expiresAt`, so a key the issuer withdrew stops validating.
    private struct KeySet {
        var keys: JWTKeyCollection
        var kids: Set<String>
        var expiresAt: Double
    }

    /// `http` must not follow redirects: make it with ``makeHTTPClient(eventLoopGroup:)``
    /// (and shut it down after the last call), or leave the default, one
    /// such client for the whole process that lives as long as it.
    public init(http: HTTPClient = OIDCClient.sharedHTTPClient, configuration: Configuration = Configuration(), logger: Logger) {
        self.http = http
        self.configuration = configuration
        self.logger = logger
    }

    /// An HTTP client for issuers: it never follows a redirect, so a
    /// refresh token, client secret, password or verifier goes only to the
    /// endpoint that discovery named (a 307 or 308 would resend the body,
    /// and could go from https to http). Its owner shuts it down.
    public static func makeHTTPClient(eventLoopGroup: any EventLoopGroup = HTTPClient.defaultEventLoopGroup) -> HTTPClient {
        var configuration = HTTPClient.Configuration()
        configuration.redirectConfiguration = .disallow
        configuration.timeout.connect = .seconds(10)
        return HTTPClient(eventLoopGroup: eventLoopGroup, configuration: configuration)
    }

    /// The process's issuer client, like `HTTPClient.shared` but without
    /// redirects; never shut down.
    public static let sharedHTTPClient = OIDCClient.makeHTTPClient()

    // MARK: Discovery

    /// The issuer's metadata, from cache or `/.well-known/openid-configuration`,
    /// completed from `/.well-known/oauth-authorization-server` (RFC 8414)
    /// where it names no revocation or device endpoint (within the
    /// revocation timeout: that document is optional). Each
    /// document's `issuer` must equal `issuer` exactly (OIDC Discovery §4.3, RFC 8414 §3.3).
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
        var metadata: ProviderMetadata
        do {
            metadata = try JSONDecoder().decode(ProviderMetadata.self, from: Data(reply.body))
        } catch {
            throw .unavailable(reason: "the discovery document is not valid", retryAfterSeconds: nil)
        }
        guard metadata.issuer == issuer else {
            throw .untrusted(reason: "the discovery document names another issuer")
        }
        if metadata.lacksOAuthEndpoints {
            // RFC 8414 metadata may name what OpenID discovery left out; it is
            // optional, so an issuer without it (or with a wrong one) is fine.
            for url in AuthorizationServerMetadata.urls(for: issuer) {
                let other = try? await self.send(url: url, method: .GET, timeout: self.configuration.revocationTimeout)
                guard let other, other.status == 200,
                    let document = try? JSONDecoder().decode(AuthorizationServerMetadata.self, from: Data(other.body)),
                    document.issuer == issuer
                else { continue }
                metadata.complete(from: document)
                break
            }
        }
        for endpoint in metadata.endpoints { try Self.requireSecure(endpoint, under: issuer) }
        self.discovered[issuer] = (metadata, now)
        return metadata
    }

    // MARK: Grants

    /// The refresh-token grant (RFC 6749 §6). `scope` narrows the request;
    /// nil asks for the original grant. A 200 is an answer even when its
    /// tokens may not be served: the refresh token it carries replaces the
    /// one sent, which the issuer has spent.
    public func refresh(
        _ refreshToken: SecretBytes,
        scope: String?,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> TokenAnswer {
        var fields: [(String, any FormValue)] = [("grant_type", "refresh_token"), ("refresh_token", refreshToken)]
        if let scope { fields.append(("scope", scope)) }
        return try await self.answer(fields: fields, client: client, metadata: metadata)
    }

    /// A POST to the token endpoint with client authentication; an answer
    /// whose tokens may not be served keeps nothing.
    public func token(
        fields: [(String, any FormValue)],
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> TokenResponse {
        try await self.answer(fields: fields, client: client, metadata: metadata).served()
    }

    private func answer(
        fields: [(String, any FormValue)],
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async throws(ProviderError) -> TokenAnswer {
        var (body, headers) = self.authenticated(fields, client: client, metadata: metadata)
        defer { body.secureZero() }
        guard let key = client.dpop else {
            var reply = try await self.send(url: metadata.tokenEndpoint, method: .POST, headers: headers, body: body)
            defer { reply.body.secureZero() }
            return try TokenResponseParser.answer(status: reply.status, body: &reply.body, retryAfter: reply.retryAfter)
        }
        // RFC 9449 §5 and §8: a proof for the token endpoint's URL as
        // discovery names it, with the issuer's nonce for this client when
        // it gave one; a `use_dpop_nonce` answer with a new nonce is tried
        // once more, with the same code or refresh token, which the issuer
        // did not spend on the first try.
        guard let target = DPoPTarget(method: "POST", url: metadata.tokenEndpoint) else {
            throw .untrusted(reason: "the token endpoint is not a URL a DPoP proof can name")
        }
        var retried = false
        while true {
            let (proved, sentNonce) = try self.proved(headers, target, key, clientID: client.clientID, accessToken: nil)
            var reply = try await self.send(url: metadata.tokenEndpoint, method: .POST, headers: proved, body: body)
            defer { reply.body.secureZero() }
            self.heard(reply, target, clientID: client.clientID)
            do {
                return try TokenResponseParser.answer(status: reply.status, body: &reply.body, retryAfter: reply.retryAfter, proved: true)
            } catch .rejected(error: "use_dpop_nonce", _) where !retried && reply.dpopNonce != nil && reply.dpopNonce != sentNonce {
                retried = true
            }
        }
    }

    /// Server nonces for DPoP proofs (RFC 9449 §8), by origin and client id:
    /// the last `DPoP-Nonce` each issuer sent, on any answer, 200s included.
    private var dpopNonces: [String: String] = [:]

    /// `headers` with a proof for `target` added, with the issuer's last
    /// nonce for this client; and that nonce, to tell a new one from it.
    private func proved(
        _ headers: HTTPHeaders,
        _ target: DPoPTarget,
        _ key: DPoPKey,
        clientID: String,
        accessToken: SecretBytes?
    ) throws(ProviderError) -> (HTTPHeaders, nonce: String?) {
        let nonce = self.dpopNonces[target.origin + " " + clientID]
        var proved = headers
        do {
            proved.add(name: "DPoP", value: try key.proof(for: target, issuedAt: Self.unixNow(), nonce: nonce, accessToken: accessToken))
        } catch {
            throw .unavailable(reason: "no DPoP proof could be made (\(type(of: error)))", retryAfterSeconds: nil)
        }
        return (proved, nonce)
    }

    /// Keeps the nonce an answer carried, for this client's next proofs to its origin.
    private func heard(_ reply: Reply, _ target: DPoPTarget, clientID: String) {
        guard let nonce = reply.dpopNonce else { return }
        let key = target.origin + " " + clientID
        if self.dpopNonces[key] == nil, self.dpopNonces.count >= 256 { self.dpopNonces.removeAll() }
        self.dpopNonces[key] = nonce
    }

    /// A proof's `iat` now (`DPoPKey.issuedAt`).
    static func unixNow() -> Int64 {
        DPoPKey.issuedAt(Date().timeIntervalSince1970)
    }

    /// A form body with client authentication (RFC 6749 §2.3.1): HTTP Basic
    /// when the client has a secret and the issuer accepts it, else the
    /// secret in the body; a public client sends only `client_id`.
    nonisolated func authenticated(
        _ fields: [(String, any FormValue)],
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
                fields.append(("client_secret", secret))
            }
        } else {
            fields.append(("client_id", client.clientID))
        }
        headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        return (FormEncoding.encode(fields), headers)
    }

    // MARK: Userinfo

    /// The userinfo document for `accessToken`, as the issuer wrote it.
    public func userinfo(accessToken: SecretBytes, client: ClientCredentials, metadata: ProviderMetadata) async throws(ProviderError) -> JSONValue {
        guard let endpoint = metadata.userinfoEndpoint else {
            throw .rejected(error: "unsupported", description: "the issuer has no userinfo endpoint")
        }
        var headers = HTTPHeaders()
        var reply: Reply
        if let key = client.dpop {
            // A DPoP-bound token goes with a proof (RFC 9449 §7), and once
            // more with the server's nonce when it asks for one (§9).
            guard let target = DPoPTarget(method: "GET", url: endpoint) else {
                throw .untrusted(reason: "the userinfo endpoint is not a URL a DPoP proof can name")
            }
            headers.add(name: "Authorization", value: "DPoP " + accessToken.unsafeString())
            var retried = false
            while true {
                let (proved, sentNonce) = try self.proved(headers, target, key, clientID: client.clientID, accessToken: accessToken)
                reply = try await self.send(url: endpoint, method: .GET, headers: proved)
                self.heard(reply, target, clientID: client.clientID)
                guard reply.status == 401, !retried, let nonce = reply.dpopNonce, nonce != sentNonce else { break }
                retried = true
            }
        } else {
            headers.add(name: "Authorization", value: "Bearer " + accessToken.unsafeString())
            reply = try await self.send(url: endpoint, method: .GET, headers: headers)
        }
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
        var keySet = try await self.keySet(for: metadata, refetch: false, now: now)
        if let kid = IDTokenReader.header(of: token)?["kid"]?.stringValue, !keySet.kids.contains(kid) {
            // A key the issuer rotated in since the last fetch: fetch once more.
            keySet = try await self.keySet(for: metadata, refetch: true, now: now)
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

    private func keySet(for metadata: ProviderMetadata, refetch: Bool, now: Double) async throws(ProviderError) -> KeySet {
        if !refetch, let keySet = self.keySets[metadata.issuer], now < keySet.expiresAt { return keySet }
        guard let uri = metadata.jwksURI else {
            throw .untrusted(reason: "the issuer publishes no signing keys (jwks_uri)")
        }
        let reply = try await self.send(url: uri, method: .GET)
        guard reply.status == 200 else {
            throw .unavailable(reason: "the JWKS answered HTTP \(reply.status)", retryAfterSeconds: nil)
        }
        let lifetime = reply.maxAge.map {
            min(max(Double($0), self.configuration.minimumKeySetLifetime), self.configuration.maximumKeySetLifetime)
        } ?? self.configuration.keySetLifetime
        var keySet = KeySet(keys: JWTKeyCollection(), kids: [], expiresAt: now + lifetime)
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

    struct Reply: Sendable {
        var status: UInt
        var body: [UInt8]
        var retryAfter: Int?
        /// `Cache-Control: max-age`, in seconds (bounded).
        var maxAge: Int?
        /// A redirect's `Location`.
        var location: String?
        /// The issuer's `DPoP-Nonce`, when it sent a well-formed one.
        var dpopNonce: String?
    }

    /// One exchange with the issuer. Its deadline covers everything, the
    /// body included: a body trickled a byte at a time is cut there, and the
    /// request cancelled (AsyncHTTPClient's own deadline ends at the head).
    /// A redirect is never followed: it is an answer that cannot be used.
    func send(
        url: String,
        method: HTTPMethod,
        headers: HTTPHeaders = HTTPHeaders(),
        body: [UInt8]? = nil,
        timeout: TimeAmount? = nil
    ) async throws(ProviderError) -> Reply {
        var outgoing = HTTPClientRequest(url: url)
        outgoing.method = method
        outgoing.headers = headers
        outgoing.headers.add(name: "Accept", value: "application/json")
        // The request's body buffer, kept to be wiped once the answer is in:
        // by then AsyncHTTPClient has written it and holds it no more.
        let sent = body.map { ByteBuffer(bytes: $0) }
        if let sent { outgoing.body = .bytes(sent) }
        let request = outgoing
        let timeout = timeout ?? self.configuration.timeout
        let deadline = NIODeadline.now() + timeout
        let (http, limit) = (self.http, self.configuration.maximumBodyBytes)
        var reply: Reply
        do {
            reply = try await withThrowingTaskGroup(of: Reply?.self) { group in
                group.addTask {
                    let response = try await http.execute(request, deadline: deadline, logger: nil)
                    if (300..<400).contains(response.status.code) {
                        // Nothing of a redirect's body is read; its Location is kept for the error.
                        return Reply(status: response.status.code, body: [], location: response.headers.first(name: "Location"))
                    }
                    let bytes = try await Self.read(response.body, upTo: limit)
                    // In place, not through a copy-on-write copy: no one reads it any more.
                    sent?.withUnsafeReadableBytes { secureZero(UnsafeMutableRawBufferPointer(mutating: $0)) }
                    return Reply(
                        status: response.status.code,
                        body: bytes,
                        retryAfter: IssuerNumber.retryAfter(response.headers.first(name: "Retry-After")),
                        maxAge: IssuerNumber.maxAge(response.headers[canonicalForm: "Cache-Control"]),
                        dpopNonce: DPoPNonce.valid(response.headers.first(name: "DPoP-Nonce"))
                    )
                }
                group.addTask {
                    try await Task.sleep(nanoseconds: UInt64(max(0, timeout.nanoseconds)))
                    return nil
                }
                defer { group.cancelAll() }
                guard let first = try await group.next(), let reply = first else { throw HTTPClientError.deadlineExceeded }
                return reply
            }
        } catch is NIOTooManyBytesError {
            self.logger.debug("issuer answer over the limit", metadata: ["url": "\(Self.redacted(url))"])
            throw .unavailable(
                reason: "the issuer's answer is over the \(self.configuration.maximumBodyBytes >> 10) KiB limit",
                retryAfterSeconds: nil
            )
        } catch let error as HTTPClientError where error == .deadlineExceeded {
            self.logger.debug("issuer too slow", metadata: ["url": "\(Self.redacted(url))"])
            throw .unavailable(reason: "the issuer did not answer within \(timeout.nanoseconds / 1_000_000_000) s", retryAfterSeconds: nil)
        } catch {
            // The error's text may quote a body or a URL with a token: name its type only.
            self.logger.debug("issuer unreachable", metadata: ["url": "\(Self.redacted(url))", "error": "\(type(of: error))"])
            throw .unavailable(reason: "the issuer could not be reached (\(type(of: error)))", retryAfterSeconds: nil)
        }
        // The body came out of a child task, whose own reference to it may be
        // let go only after this point: an in-place wipe by the caller would
        // then wipe a copy-on-write copy and free this one whole. So the
        // caller gets a copy of its own, and this one is wiped where it is.
        let shared = reply.body
        // From a pointer: `[UInt8](shared)` would share the storage, not copy it.
        reply.body = shared.withUnsafeBufferPointer { [UInt8]($0) }
        shared.withUnsafeBytes { secureZero(UnsafeMutableRawBufferPointer(mutating: $0)) }
        if (300..<400).contains(reply.status) {
            let location = Self.redacted(reply.location ?? "nowhere")
            self.logger.warning("issuer redirected; not followed", metadata: ["url": "\(Self.redacted(url))", "status": "\(reply.status)"])
            throw .untrusted(
                reason: "the issuer redirected (HTTP \(reply.status) to \(TokenResponseParser.clean(location))); tokenvault follows no redirect"
            )
        }
        return reply
    }

    /// The body, each chunk copied out and then wiped in place, not through
    /// a copy-on-write copy: a chunk is a slice of the connection's own read
    /// buffer, which nothing reads once it has been handed on. The array
    /// grows by doubling, each outgrown one wiped, so no copy is left behind
    /// and a body trickled a byte at a time costs no more than one sent whole.
    private static func read(_ body: HTTPClientResponse.Body, upTo limit: Int) async throws -> [UInt8] {
        var bytes: [UInt8] = []
        do {
            for try await chunk in body {
                let count = chunk.readableBytes
                let needed = bytes.count + count
                guard needed <= limit else {
                    chunk.withUnsafeReadableBytes { secureZero(UnsafeMutableRawBufferPointer(mutating: $0)) }
                    throw NIOTooManyBytesError(maxBytes: limit)
                }
                if needed > bytes.capacity {
                    var grown: [UInt8] = []
                    grown.reserveCapacity(min(limit, max(needed, 2 * bytes.capacity, 4096)))
                    grown += bytes
                    bytes.secureZero()
                    bytes = grown
                }
                chunk.withUnsafeReadableBytes { read in
                    bytes.append(contentsOf: read)
                    secureZero(UnsafeMutableRawBufferPointer(mutating: read))
                }
            }
        } catch {
            bytes.secureZero()
            throw error
        }
        return bytes
    }

    /// `url` without its query or fragment, which may carry a token.
    static func redacted(_ url: String) -> String {
        String(url.prefix { $0 != "?" && $0 != "#" })
    }

    /// https, or http on a loopback address only (RFC 8252 §8.3); an https
    /// issuer's endpoints are all https, so no token of its travels in clear.
    public static func requireSecure(_ url: String, under issuer: String? = nil) throws(ProviderError) {
        guard let parsed = URL(string: url), let scheme = parsed.scheme, let host = parsed.host else {
            throw .untrusted(reason: "an issuer URL is not valid")
        }
        guard scheme == "https" || (scheme == "http" && Loopback.isAddress(host)) else {
            throw .untrusted(reason: "the issuer uses plain http off loopback (a loopback issuer is named by 127.0.0.1 or [::1])")
        }
        if let issuer, issuer.hasPrefix("https:"), scheme != "https" {
            throw .untrusted(reason: "the https issuer names a plain http endpoint")
        }
    }
}
