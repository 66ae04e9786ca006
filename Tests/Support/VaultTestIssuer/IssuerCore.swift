import JWTKit
import NIOCore
import NIOHTTP1
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// An ES256 signing key and its `kid`.
struct SigningKey: Sendable {
    let kid: String
    let key: ES256PrivateKey

    static func generate(prefix: String) -> SigningKey {
        SigningKey(kid: RandomToken.make(prefix: prefix, byteCount: 8), key: ES256PrivateKey())
    }
}

/// The claims of the ID tokens the issuer mints.
struct IDTokenClaims: JWTPayload {
    var iss: String
    var sub: String
    var aud: String
    var exp: Int
    var iat: Int
    var email: String
    var preferredUsername: String
    var nonce: String?

    enum CodingKeys: String, CodingKey {
        case iss, sub, aud, exp, iat, email, nonce
        case preferredUsername = "preferred_username"
    }

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// A successful token response still waiting for its ID token to be signed
/// (JWTKit signing is `async`, so it happens off the event loop).
struct PendingTokenResponse: Sendable {
    var fields: [(String, JSONValue)]
    var claims: IDTokenClaims?
    var signingKey: SigningKey
    /// Sent unsigned, with `alg: none`, as a forger would.
    var unsigned = false
    /// Extra response headers (e.g. native auth's echoed `client-request-id`).
    var extraHeaders: [(String, String)] = []

    func render() async -> IssuerReply {
        var fields = self.fields
        if let claims {
            if unsigned {
                let header = IssuerState.base64URL(Array(#"{"alg":"none","typ":"JWT"}"#.utf8))
                let payload = IssuerState.base64URL(Array((try? JSONEncoder().encode(claims)) ?? Data()))
                fields.append(("id_token", .string(header + "." + payload + ".")))
                return .json(.ok, .object(fields), headers: IssuerReply.noStore + extraHeaders)
            }
            do {
                let kid = JWKIdentifier(string: signingKey.kid)
                let keys = JWTKeyCollection()
                await keys.add(ecdsa: signingKey.key, kid: kid)
                let jwt = try await keys.sign(claims, kid: kid)
                fields.append(("id_token", .string(jwt)))
            } catch {
                return .oauthError(
                    .internalServerError, "server_error", "could not sign the ID token: \(error)", headers: extraHeaders
                )
            }
        }
        return .json(.ok, .object(fields), headers: IssuerReply.noStore + extraHeaders)
    }
}

/// What the HTTP handler should do with a request.
enum IssuerAction: Sendable {
    /// Write this reply now.
    case reply(IssuerReply)
    /// Run the token grant now (``IssuerCore/processToken(_:)``).
    case processToken
    /// Run the token grant after this many milliseconds.
    case processTokenAfter(milliseconds: Int)
    /// Sign the ID token of this response (off the event loop), then write it.
    case sign(PendingTokenResponse)
    /// The request was parked behind the gate; the release closure will run it.
    case held
    /// Write the head of this reply at once, then its body a byte every so many milliseconds.
    case trickle(IssuerReply, everyMilliseconds: Int)
    /// Never answer.
    case hang
    /// Drop the connection without answering.
    case reset
}

/// The outcome of the real token grant logic.
enum TokenOutcome: Sendable {
    case reply(IssuerReply)
    case sign(PendingTokenResponse)
}

struct ClientRecord: Sendable {
    /// `nil` for a public client.
    var secret: String?
}

struct RefreshRecord: Sendable {
    enum Status: Sendable { case active, rotated, revoked }
    var subject: String
    var email: String
    var scope: [String]
    /// If set, only this client may use the token.
    var clientID: String?
    var family: String
    var status: Status
}

struct AccessRecord: Sendable {
    var subject: String
    var email: String
    var expiresAt: Double
}

/// All mutable issuer state, guarded by one mutex.
struct IssuerState: Sendable {
    var issuer: String = ""
    var stopped = false

    var clients: [String: ClientRecord] = [
        TestIssuer.clientID: ClientRecord(secret: nil),
        TestIssuer.confidentialClientID: ClientRecord(secret: TestIssuer.clientSecret),
    ]

    var accessTokenLifetime: Int
    var rotateRefreshTokens: Bool
    var includeExpiresIn = true
    var tokenTypeSpelling = "Bearer"
    var idTokenIssuerOverride: String?
    /// Discovery lies: names another issuer, or sends the token endpoint elsewhere.
    var discoveryIssuerOverride: String?
    var discoveryTokenEndpointOverride: String?
    /// The revocation endpoint is named only by OAuth metadata (RFC 8414), which names this issuer.
    var revocationOnlyInOAuthMetadata = false
    /// Discovery names no device authorization endpoint (RFC 8628 is not offered).
    var withoutDeviceEndpoint = false
    var oauthMetadataIssuerOverride: String?
    var idTokenAudienceOverride: String?
    var signWithUnknownKey = false
    /// ID tokens minted from now on carry this `sub` instead of the user's.
    var idTokenSubjectOverride: String?
    /// ID tokens minted from now on are unsigned (`alg: none`).
    var unsignedIDTokens = false
    /// Token answers from now on carry this `scope`, whatever was granted or asked.
    var answeredScopeOverride: String?
    /// JSON text sent as every token answer's `scope` (a list, `null`, `""`); "" leaves it out.
    var answeredScopeJSON: String?
    /// JSON text sent as every token answer's `access_token`, which is still recorded as issued.
    var answeredAccessTokenJSON: String?
    var behaviour: TokenBehaviour = .normal
    /// Per-path answers that replace the normal one (``EndpointFault``).
    var faults: [String: EndpointFault] = [:]
    /// JSON text sent as every token answer's `expires_in`, instead of the lifetime.
    var expiresInOverride: String?
    /// The `Cache-Control` header of `/jwks` answers.
    var jwksCacheControl: String?
    /// Requests received, and request body bytes received, by path.
    var requestsByPath: [String: Int] = [:]
    var bodyBytesByPath: [String: Int] = [:]

    var signingKey: SigningKey
    let unknownKey: SigningKey

    var refreshTokens: [String: RefreshRecord] = [:]
    var accessTokens: [String: AccessRecord] = [:]
    var heldRequests: [@Sendable () -> Void] = []
    /// Paths whose requests are held until the gate opens, whatever they are.
    var pausedPaths: Set<String> = []
    /// Refresh tokens presented again after they were rotated.
    var reusedRefreshTokens = 0
    var connections: [ObjectIdentifier: any Channel] = [:]
    /// Entra native authentication users, flows and knobs (NativeAuth.swift).
    var native = NativeAuthState()

    var refreshCount = 0
    var lastClientAuthentication: String?
    var lastRequestedScope: String?
    var jwksFetchCount = 0
    var discoveryFetchCount = 0
    var revocationCount = 0
    var issuedAccessTokens = 0

    init(accessTokenLifetime: Int, rotateRefreshTokens: Bool) {
        self.accessTokenLifetime = accessTokenLifetime
        self.rotateRefreshTokens = rotateRefreshTokens
        self.signingKey = SigningKey.generate(prefix: "key-")
        self.unknownKey = SigningKey.generate(prefix: "unknown-")
    }

    mutating func revokeFamily(_ family: String) {
        for (token, record) in refreshTokens where record.family == family {
            refreshTokens[token]?.status = .revoked
        }
    }
}

/// The issuer's logic: routing, OAuth/OIDC semantics and fault injection. Thread-safe.
final class IssuerCore: Sendable {
    static let maxBodyBytes = 64 * 1024

    let state: Mutex<IssuerState>

    init(accessTokenLifetime: Int, rotateRefreshTokens: Bool) {
        self.state = Mutex(IssuerState(accessTokenLifetime: accessTokenLifetime, rotateRefreshTokens: rotateRefreshTokens))
    }

    static func now() -> Double { Date().timeIntervalSince1970 }

    // MARK: Routing

    /// Parks `request` when its path is paused; `release` answers it later.
    func holdIfPaused(_ request: IssuerRequest, release: @escaping @Sendable () -> Void) -> Bool {
        self.state.withLock { s in
            guard s.pausedPaths.contains(request.path) else { return false }
            s.heldRequests.append(release)
            return true
        }
    }

    /// Decides what to do with `request`. `makeRelease` is only called (under the state lock)
    /// when the request is parked behind the gate; the closure it returns must answer the request.
    func handle(_ request: IssuerRequest, makeRelease: () -> @Sendable () -> Void) -> IssuerAction {
        let fault = state.withLock { s in
            s.requestsByPath[request.path, default: 0] += 1
            s.bodyBytesByPath[request.path, default: 0] += request.body.count
            return s.faults[request.path]
        }
        switch fault {
        case .answer(let status, let headers, let body)?:
            var reply = IssuerReply.raw(HTTPResponseStatus(statusCode: status), body: body, headers: IssuerReply.noStore)
            reply.headers += headers.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
            return .reply(reply)
        case .trickle(let body, let milliseconds)?:
            return .trickle(.raw(.ok, body: body, headers: IssuerReply.noStore), everyMilliseconds: milliseconds)
        case nil:
            break
        }
        switch request.path {
        case "/.well-known/openid-configuration":
            guard request.method == .GET else { return .reply(Self.methodNotAllowed("GET")) }
            return .reply(self.discovery())
        case "/.well-known/oauth-authorization-server":
            guard request.method == .GET else { return .reply(Self.methodNotAllowed("GET")) }
            return .reply(self.oauthMetadata())
        case "/jwks":
            guard request.method == .GET else { return .reply(Self.methodNotAllowed("GET")) }
            return .reply(self.jwks())
        case "/token":
            guard request.method == .POST else { return .reply(Self.methodNotAllowed("POST")) }
            return self.planToken(request, makeRelease: makeRelease)
        case "/userinfo":
            guard request.method == .GET || request.method == .POST else {
                return .reply(Self.methodNotAllowed("GET, POST"))
            }
            return .reply(self.userinfo(request))
        case "/revoke":
            guard request.method == .POST else { return .reply(Self.methodNotAllowed("POST")) }
            return .reply(self.revoke(request))
        case NativeAuthPath.initiate, NativeAuthPath.challenge, NativeAuthPath.token:
            guard request.method == .POST else { return .reply(Self.methodNotAllowed("POST")) }
            return self.handleNative(request, makeRelease: makeRelease)
        default:
            return .reply(.oauthError(.notFound, "not_found", "no such endpoint: \(request.path)"))
        }
    }

    static func methodNotAllowed(_ allow: String) -> IssuerReply {
        .oauthError(.methodNotAllowed, "invalid_request", "method not allowed", headers: [("Allow", allow)])
    }

    // MARK: Discovery and keys

    func discovery() -> IssuerReply {
        let (issuer, named, tokenEndpoint, withRevocation, withDevice) = state.withLock { s in
            s.discoveryFetchCount += 1
            return (
                s.issuer, s.discoveryIssuerOverride ?? s.issuer, s.discoveryTokenEndpointOverride ?? s.issuer + "/oauth2/v2.0/token",
                !s.revocationOnlyInOAuthMetadata, !s.withoutDeviceEndpoint
            )
        }
        let authMethods: JSONValue = .array([.string("client_secret_basic"), .string("client_secret_post"), .string("none")])
        let doc: JSONValue = .object([
            ("issuer", .string(named)),
            ("authorization_endpoint", .string(issuer + "/authorize")),
            ("token_endpoint", .string(tokenEndpoint)),
            ("userinfo_endpoint", .string(issuer + "/userinfo")),
            ("jwks_uri", .string(issuer + "/jwks")),
            ("revocation_endpoint", withRevocation ? .string(issuer + "/revoke") : .null),
            ("end_session_endpoint", .string(issuer + "/logout")),
            ("device_authorization_endpoint", withDevice ? .string(issuer + "/device") : .null),
            ("response_types_supported", .array([.string("code")])),
            ("subject_types_supported", .array([.string("public")])),
            ("id_token_signing_alg_values_supported", .array([.string("ES256")])),
            ("token_endpoint_auth_methods_supported", authMethods),
            ("revocation_endpoint_auth_methods_supported", authMethods),
            (
                "grant_types_supported",
                .array([
                    .string("authorization_code"), .string("refresh_token"),
                    .string("urn:ietf:params:oauth:grant-type:device_code"),
                ])
            ),
            ("scopes_supported", .array(["openid", "profile", "email", "offline_access"].map { .string($0) })),
            (
                "claims_supported",
                .array(["sub", "iss", "aud", "exp", "iat", "email", "preferred_username", "name", "nonce"].map { .string($0) })
            ),
            ("code_challenge_methods_supported", .array([.string("S256")])),
        ])
        return .json(.ok, doc)
    }

    /// RFC 8414 metadata, served only while the revocation endpoint is left out of discovery.
    func oauthMetadata() -> IssuerReply {
        let (issuer, named, served) = state.withLock { s in
            (s.issuer, s.oauthMetadataIssuerOverride ?? s.issuer, s.revocationOnlyInOAuthMetadata)
        }
        guard served else { return .oauthError(.notFound, "not_found", "no such endpoint") }
        return .json(
            .ok,
            .object([
                ("issuer", .string(named)), ("token_endpoint", .string(issuer + "/oauth2/v2.0/token")),
                ("revocation_endpoint", .string(issuer + "/revoke")),
            ])
        )
    }

    func jwks() -> IssuerReply {
        let (key, cacheControl) = state.withLock { s in
            s.jwksFetchCount += 1
            return (s.signingKey, s.jwksCacheControl)
        }
        var keys: [JSONValue] = []
        if let parameters = key.key.publicKey.parameters {
            keys.append(
                .object([
                    ("kty", .string("EC")),
                    ("crv", .string("P-256")),
                    ("x", .string(parameters.x)),
                    ("y", .string(parameters.y)),
                    ("kid", .string(key.kid)),
                    ("alg", .string("ES256")),
                    ("use", .string("sig")),
                ])
            )
        }
        return .json(.ok, .object([("keys", .array(keys))]), headers: cacheControl.map { [("Cache-Control", $0)] } ?? [])
    }

    // MARK: Token endpoint

    static func isFormEncoded(_ headers: HTTPHeaders) -> Bool {
        guard let contentType = headers.first(name: "Content-Type") else { return false }
        let mediaType = contentType.split(separator: ";", maxSplits: 1).first ?? ""
        return trimSpaces(mediaType).lowercased() == "application/x-www-form-urlencoded"
    }

    /// `s` without leading and trailing spaces and tabs.
    static func trimSpaces(_ s: some StringProtocol) -> String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let first = s.firstIndex(where: { !isSpace($0) }), let last = s.lastIndex(where: { !isSpace($0) }) else {
            return ""
        }
        return String(s[first...last])
    }

    /// The `Authorization` header split into (lowercased scheme, credentials), if any.
    static func authorization(_ headers: HTTPHeaders) -> (scheme: String, credentials: String)? {
        guard let value = headers.first(name: "Authorization") else { return nil }
        let trimmed = trimSpaces(value)
        guard let space = trimmed.firstIndex(of: " ") else { return (trimmed.lowercased(), "") }
        return (
            String(trimmed[..<space]).lowercased(),
            trimSpaces(trimmed[trimmed.index(after: space)...])
        )
    }

    /// Which client authentication method a token request used: "basic", "post" or "none".
    static func clientAuthenticationMethod(_ headers: HTTPHeaders, form: [String: String]?) -> String {
        if authorization(headers)?.scheme == "basic" { return "basic" }
        if form?["client_secret"] != nil { return "post" }
        return "none"
    }

    /// Records arrival statistics and applies the configured ``TokenBehaviour``.
    func planToken(_ request: IssuerRequest, makeRelease: () -> @Sendable () -> Void) -> IssuerAction {
        let form = Self.isFormEncoded(request.headers) ? try? FormCoding.parse(request.body) : nil
        let method = Self.clientAuthenticationMethod(request.headers, form: form)
        return state.withLock { s -> IssuerAction in
            s.lastClientAuthentication = method
            if let form, form["grant_type"] == "refresh_token" {
                s.refreshCount += 1
                s.lastRequestedScope = form["scope"]
            }
            switch s.behaviour {
            case .normal:
                return .processToken
            case .delay(let milliseconds):
                return .processTokenAfter(milliseconds: milliseconds)
            case .hang:
                return .hang
            case .status(let code, let body):
                return .reply(.raw(HTTPResponseStatus(statusCode: code), body: body, headers: IssuerReply.noStore))
            case .malformedJSON:
                return .reply(.raw(.ok, body: "{\"access_token\": ", headers: IssuerReply.noStore))
            case .temporarilyUnavailable:
                return .reply(
                    .oauthError(.badRequest, "temporarily_unavailable", "the authorization server is temporarily unavailable")
                )
            case .invalidGrant:
                return .reply(.oauthError(.badRequest, "invalid_grant", "the refresh token is invalid, expired or revoked"))
            case .emptyBody400:
                return .reply(IssuerReply(status: .badRequest, headers: IssuerReply.noStore))
            case .tooManyRequests(let retryAfterSeconds):
                return .reply(
                    .oauthError(
                        .tooManyRequests, "too_many_requests", "slow down",
                        headers: [("Retry-After", String(retryAfterSeconds))]
                    )
                )
            case .resetConnection:
                return .reset
            case .gate:
                s.heldRequests.append(makeRelease())
                return .held
            }
        }
    }

    private enum ClientAuthResult {
        case authenticated(clientID: String)
        case failed(IssuerReply)
    }

    private static func invalidClient(_ description: String, basic: Bool) -> IssuerReply {
        .oauthError(
            .unauthorized, "invalid_client", description,
            headers: basic ? [("WWW-Authenticate", "Basic realm=\"test-issuer\"")] : []
        )
    }

    /// RFC 6749 §2.3.1 client authentication against the registered clients.
    /// Public clients are accepted with any (or no) secret; confidential clients need the right one.
    private static func authenticateClient(
        _ headers: HTTPHeaders,
        form: [String: String],
        clients: [String: ClientRecord]
    ) -> ClientAuthResult {
        var clientID: String
        var secret: String?
        var basic = false
        if let auth = authorization(headers), auth.scheme == "basic" {
            basic = true
            guard let decoded = Data(base64Encoded: auth.credentials),
                let colon = decoded.firstIndex(of: UInt8(ascii: ":")),
                let id = try? FormCoding.decodeComponent(decoded[decoded.startIndex..<colon]),
                let password = try? FormCoding.decodeComponent(decoded[decoded.index(after: colon)...])
            else {
                return .failed(invalidClient("malformed HTTP Basic credentials", basic: true))
            }
            if form["client_secret"] != nil {
                return .failed(.oauthError(.badRequest, "invalid_request", "more than one client authentication method used"))
            }
            if let bodyID = form["client_id"], bodyID != id {
                return .failed(.oauthError(.badRequest, "invalid_request", "client_id does not match the Authorization header"))
            }
            clientID = id
            secret = password
        } else {
            guard let id = form["client_id"] else {
                return .failed(invalidClient("client authentication required (no client_id)", basic: false))
            }
            clientID = id
            secret = form["client_secret"]
        }
        guard let client = clients[clientID] else {
            return .failed(invalidClient("unknown client", basic: basic))
        }
        if let expected = client.secret {
            guard let secret else {
                return .failed(invalidClient("client authentication required for a confidential client", basic: basic))
            }
            guard secret == expected else {
                return .failed(invalidClient("client authentication failed", basic: basic))
            }
        }
        return .authenticated(clientID: clientID)
    }

    private enum FormResult {
        case success([String: String])
        case failure(IssuerReply)
    }

    private static func parseForm(_ request: IssuerRequest) -> FormResult {
        guard isFormEncoded(request.headers) else {
            return .failure(
                .oauthError(.badRequest, "invalid_request", "Content-Type must be application/x-www-form-urlencoded")
            )
        }
        do {
            return .success(try FormCoding.parse(request.body))
        } catch FormDecodingError.duplicateParameter(let name) {
            return .failure(.oauthError(.badRequest, "invalid_request", "parameter '\(name)' given more than once"))
        } catch {
            return .failure(.oauthError(.badRequest, "invalid_request", "malformed form body"))
        }
    }

    /// The real `POST /token` logic (RFC 6749 §6 refresh grant).
    func processToken(_ request: IssuerRequest) -> TokenOutcome {
        let form: [String: String]
        switch Self.parseForm(request) {
        case .success(let parsed): form = parsed
        case .failure(let reply): return .reply(reply)
        }
        let now = Self.now()
        return state.withLock { s -> TokenOutcome in
            let clientID: String
            switch Self.authenticateClient(request.headers, form: form, clients: s.clients) {
            case .authenticated(let id): clientID = id
            case .failed(let reply): return .reply(reply)
            }
            guard let grantType = form["grant_type"] else {
                return .reply(.oauthError(.badRequest, "invalid_request", "missing grant_type"))
            }
            guard grantType == "refresh_token" else {
                return .reply(
                    .oauthError(.badRequest, "unsupported_grant_type", "grant type '\(grantType)' is not supported")
                )
            }
            guard let presented = form["refresh_token"] else {
                return .reply(.oauthError(.badRequest, "invalid_request", "missing refresh_token"))
            }
            guard let record = s.refreshTokens[presented] else {
                return .reply(.oauthError(.badRequest, "invalid_grant", "unknown refresh token"))
            }
            switch record.status {
            case .active:
                break
            case .revoked:
                return .reply(.oauthError(.badRequest, "invalid_grant", "refresh token revoked"))
            case .rotated:
                s.reusedRefreshTokens += 1
                s.revokeFamily(record.family)
                return .reply(
                    .oauthError(.badRequest, "invalid_grant", "refresh token reuse detected; token family revoked")
                )
            }
            if let boundClient = record.clientID, boundClient != clientID {
                return .reply(.oauthError(.badRequest, "invalid_grant", "refresh token was issued to another client"))
            }
            var scope = record.scope
            if let requested = form["scope"] {
                let requestedScopes = requested.split(separator: " ").map(String.init)
                guard !requestedScopes.isEmpty, requestedScopes.allSatisfy(record.scope.contains) else {
                    return .reply(
                        .oauthError(.badRequest, "invalid_scope", "requested scope exceeds the scope originally granted")
                    )
                }
                scope = requestedScopes
            }

            let lifetime = s.accessTokenLifetime
            let accessToken = RandomToken.make(prefix: "at-")
            s.accessTokens[accessToken] = AccessRecord(
                subject: record.subject,
                email: record.email,
                expiresAt: now + Double(lifetime)
            )
            s.issuedAccessTokens += 1

            var fields: [(String, JSONValue)] = [
                ("access_token", s.answeredAccessTokenJSON.map { .raw($0) } ?? .string(accessToken)),
                ("token_type", .string(s.tokenTypeSpelling)),
            ]
            if s.includeExpiresIn { fields.append(("expires_in", s.expiresInOverride.map { .raw($0) } ?? .int(lifetime))) }
            if s.rotateRefreshTokens {
                s.refreshTokens[presented]?.status = .rotated
                let next = RandomToken.make(prefix: "rt-")
                var successor = record
                successor.status = .active
                s.refreshTokens[next] = successor
                fields.append(("refresh_token", .string(next)))
            }
            switch s.answeredScopeJSON {
            case "": break
            case let raw?: fields.append(("scope", .raw(raw)))
            case nil: fields.append(("scope", .string(s.answeredScopeOverride ?? scope.joined(separator: " "))))
            }

            var claims: IDTokenClaims?
            if scope.contains("openid") {
                let issuedAt = Int(now)
                claims = IDTokenClaims(
                    iss: s.idTokenIssuerOverride ?? s.issuer,
                    sub: s.idTokenSubjectOverride ?? record.subject,
                    aud: s.idTokenAudienceOverride ?? clientID,
                    exp: issuedAt + lifetime,
                    iat: issuedAt,
                    email: record.email,
                    preferredUsername: record.subject,
                    nonce: nil
                )
            }
            return .sign(
                PendingTokenResponse(
                    fields: fields,
                    claims: claims,
                    signingKey: s.signWithUnknownKey ? s.unknownKey : s.signingKey,
                    unsigned: s.unsignedIDTokens
                )
            )
        }
    }

    // MARK: Userinfo and revocation

    func userinfo(_ request: IssuerRequest) -> IssuerReply {
        let now = Self.now()
        let invalid = IssuerReply.oauthError(
            .unauthorized, "invalid_token", "the access token is missing, unknown or expired",
            headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")]
        )
        guard let auth = Self.authorization(request.headers), auth.scheme == "bearer", !auth.credentials.isEmpty else {
            return invalid
        }
        let record = state.withLock { s in s.accessTokens[auth.credentials] }
        guard let record, record.expiresAt > now else { return invalid }
        return .json(
            .ok,
            .object([
                ("sub", .string(record.subject)),
                ("email", .string(record.email)),
                ("preferred_username", .string(record.subject)),
                ("name", .string(record.subject.prefix(1).uppercased() + record.subject.dropFirst())),
            ])
        )
    }

    /// RFC 7009 token revocation: always 200 once the client is authenticated.
    func revoke(_ request: IssuerRequest) -> IssuerReply {
        let form: [String: String]
        switch Self.parseForm(request) {
        case .success(let parsed): form = parsed
        case .failure(let reply): return reply
        }
        return state.withLock { s -> IssuerReply in
            switch Self.authenticateClient(request.headers, form: form, clients: s.clients) {
            case .authenticated: break
            case .failed(let reply): return reply
            }
            guard let token = form["token"] else {
                return .oauthError(.badRequest, "invalid_request", "missing token")
            }
            if let record = s.refreshTokens[token] {
                s.revokeFamily(record.family)
            } else {
                s.accessTokens[token] = nil
            }
            s.revocationCount += 1
            return IssuerReply(status: .ok, headers: IssuerReply.noStore)
        }
    }
}
