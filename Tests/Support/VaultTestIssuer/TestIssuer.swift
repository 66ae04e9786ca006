import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// A real HTTP/1.1 OpenID provider on `127.0.0.1:<ephemeral port>` for tests, with fault injection.
///
/// Endpoints: `GET /.well-known/openid-configuration`, `GET /jwks`, `POST /token`
/// (refresh grant only; discovery names `/oauth2/v2.0/token`, which takes it too), `GET|POST /userinfo`, `POST /revoke`, and the Microsoft Entra
/// native authentication V1 sign-in endpoints `POST /oauth2/v2.0/initiate`,
/// `POST /oauth2/v2.0/challenge` and `POST /oauth2/v2.0/token` (see ``addNativeUser(_:_:)``);
/// anything else is 404 (405 for a known path with the wrong method). ID tokens are ES256-signed.
///
/// Registered clients: ``clientID`` (public, no secret needed; a secret, if sent, is ignored)
/// and ``confidentialClientID`` with ``clientSecret`` (HTTP Basic or form post). More can be
/// added with ``registerClient(id:secret:)``.
///
/// All methods are thread-safe. Call ``stop()`` when done.
public final class TestIssuer: Sendable {
    /// The public client (no secret).
    public static let clientID = "test-client"
    /// The confidential client; authenticates with ``clientSecret``.
    public static let confidentialClientID = "test-confidential"
    /// The secret of ``confidentialClientID``.
    public static let clientSecret = "test-secret-123"

    /// `http://127.0.0.1:PORT`, no trailing slash; equal to the discovery document's `issuer`.
    public let issuer: String
    /// The TCP port the issuer listens on.
    public let port: Int

    private let core: IssuerCore
    private let serverChannel: any Channel

    private init(core: IssuerCore, serverChannel: any Channel, port: Int) {
        self.core = core
        self.serverChannel = serverChannel
        self.port = port
        self.issuer = "http://127.0.0.1:\(port)"
    }

    /// Starts an issuer on an ephemeral port of 127.0.0.1.
    /// - Parameters:
    ///   - accessTokenLifetime: seconds; used for `expires_in`, access token expiry and ID token `exp`.
    ///   - rotateRefreshTokens: whether each refresh returns a new refresh token and invalidates the old one.
    public static func start(accessTokenLifetime: Int = 3600, rotateRefreshTokens: Bool = false) async throws -> TestIssuer {
        let core = IssuerCore(accessTokenLifetime: accessTokenLifetime, rotateRefreshTokens: rotateRefreshTokens)
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(IssuerHTTPHandler(core: core))
                }.flatMap {
                    core.register(channel)
                }
            }
        let channel = try await bootstrap.bind(host: "127.0.0.1", port: 0).get()
        guard let port = channel.localAddress?.port else {
            try? await channel.close()
            throw TestIssuerError.noLocalPort
        }
        let issuer = TestIssuer(core: core, serverChannel: channel, port: port)
        core.state.withLock { $0.issuer = issuer.issuer }
        return issuer
    }

    /// Stops listening and closes every open connection (including hanging and gated ones).
    /// Idempotent.
    public func stop() async {
        let connections = core.state.withLock { s -> [any Channel] in
            s.stopped = true
            s.heldRequests = []
            let all = Array(s.connections.values)
            s.connections = [:]
            return all
        }
        try? await serverChannel.close()
        for connection in connections {
            try? await connection.close()
        }
    }

    // MARK: Clients and tokens

    /// Registers another client. `secret == nil` makes it a public client.
    public func registerClient(id: String, secret: String? = nil) {
        core.state.withLock { $0.clients[id] = ClientRecord(secret: secret) }
    }

    /// Mints a valid refresh token for `subject` (username); tests import it into the daemon.
    /// Each minted token starts its own rotation family.
    /// - Parameter clientID: if set, only that client may redeem the token (else `invalid_grant`);
    ///   `nil` (default) lets any registered client redeem it.
    public func mintRefreshToken(
        subject: String = "ada",
        email: String = "ada@example.org",
        scope: String = "openid profile email offline_access",
        clientID: String? = nil
    ) -> String {
        let token = RandomToken.make(prefix: "rt-")
        let record = RefreshRecord(
            subject: subject,
            email: email,
            scope: scope.split(separator: " ").map(String.init),
            clientID: clientID,
            family: RandomToken.make(prefix: "fam-", byteCount: 8),
            status: .active
        )
        core.state.withLock { $0.refreshTokens[token] = record }
        return token
    }

    /// Whether `refreshToken` would currently be accepted (not unknown, rotated away or revoked).
    /// Every refresh token this issuer has handed out, rotated ones included.
    public var issuedRefreshTokens: [String] { core.state.withLock { Array($0.refreshTokens.keys) } }

    public func isRefreshTokenActive(_ refreshToken: String) -> Bool {
        core.state.withLock { $0.refreshTokens[refreshToken]?.status == .active }
    }

    /// Every refresh token issued so far becomes invalid (→ `invalid_grant`). Access tokens stay valid.
    public func revokeAll() {
        core.state.withLock { s in
            for token in s.refreshTokens.keys {
                s.refreshTokens[token]?.status = .revoked
            }
        }
    }

    // MARK: Counters

    /// Number of `grant_type=refresh_token` requests received (all, including failed and injected faults).
    public var refreshCount: Int { core.state.withLock { $0.refreshCount } }

    /// `"basic"`, `"post"` or `"none"` for the last `POST /token` request (set on arrival).
    public var lastClientAuthentication: String? { core.state.withLock { $0.lastClientAuthentication } }

    /// The `scope` form field of the last refresh request (`nil` if it had none).
    public var lastRequestedScope: String? { core.state.withLock { $0.lastRequestedScope } }

    /// Number of `GET /jwks` requests.
    public var jwksFetchCount: Int { core.state.withLock { $0.jwksFetchCount } }

    /// Number of `GET /.well-known/openid-configuration` requests.
    public var discoveryFetchCount: Int { core.state.withLock { $0.discoveryFetchCount } }

    /// Number of successful (200, client authenticated) `POST /revoke` requests.
    public var revocationCount: Int { core.state.withLock { $0.revocationCount } }

    /// Number of access tokens issued.
    public var issuedAccessTokens: Int { core.state.withLock { $0.issuedAccessTokens } }

    /// Number of token requests currently held behind the gate.
    public var heldRequestCount: Int { core.state.withLock { $0.heldRequests.count } }

    /// The `kid` of the key that currently signs ID tokens and is served by `/jwks`.
    public var signingKeyID: String { core.state.withLock { $0.signingKey.kid } }

    // MARK: Behaviour

    /// How `POST /token` answers from now on; see ``TokenBehaviour``.
    /// Switching away from `.gate` does not release held requests; call ``openGate()``.
    public func setTokenBehaviour(_ behaviour: TokenBehaviour) {
        core.state.withLock { $0.behaviour = behaviour }
    }

    /// Releases every request held by `.gate` (they are then answered normally) and switches
    /// the behaviour back to `.normal` if it was `.gate`, so later requests pass.
    public func openGate() {
        let held = core.state.withLock { s -> [@Sendable () -> Void] in
            if s.behaviour == .gate { s.behaviour = .normal }
            s.pausedPaths = []
            let held = s.heldRequests
            s.heldRequests = []
            return held
        }
        for release in held { release() }
    }

    /// Holds every request to `path` (e.g. `/jwks`, `/revoke`) until
    /// ``openGate()``; held requests count in ``heldRequestCount``.
    public func pause(path: String) {
        core.state.withLock { _ = $0.pausedPaths.insert(path) }
    }

    /// Refresh answers from now on carry this JSON text as `access_token`
    /// (a string with CR/LF, a number); nil: a fresh token.
    public func setAnsweredAccessTokenJSON(_ rawJSON: String?) {
        core.state.withLock { $0.answeredAccessTokenJSON = rawJSON }
    }

    /// Refresh answers from now on carry this JSON text as `scope` (a list,
    /// `null`, `""`); "" leaves `scope` out; nil: the scope granted.
    public func setAnsweredScopeJSON(_ rawJSON: String?) {
        core.state.withLock { $0.answeredScopeJSON = rawJSON }
    }

    /// Whether an access token the issuer handed out still opens userinfo.
    public func isAccessTokenActive(_ accessToken: String) -> Bool {
        core.state.withLock { $0.accessTokens[accessToken] != nil }
    }

    /// Refresh tokens presented again after they were rotated (each one
    /// revoked its whole family, as reuse detection does).
    public var reusedRefreshTokens: Int { core.state.withLock { $0.reusedRefreshTokens } }

    /// Turns refresh token rotation on or off for future refreshes.
    public func setRotation(_ on: Bool) {
        core.state.withLock { $0.rotateRefreshTokens = on }
    }

    /// Lifetime in seconds of access tokens (and ID tokens) issued from now on. 0 or negative → already expired.
    public func setAccessTokenLifetime(_ seconds: Int) {
        core.state.withLock { $0.accessTokenLifetime = seconds }
    }

    /// Whether token responses include `expires_in` (default `true`).
    public func setIncludeExpiresIn(_ on: Bool) {
        core.state.withLock { $0.includeExpiresIn = on }
    }

    /// The `token_type` value sent in token responses (default `"Bearer"`).
    public func setTokenTypeSpelling(_ s: String) {
        core.state.withLock { $0.tokenTypeSpelling = s }
    }

    /// Overrides for ID tokens minted from now on. Each call replaces all three settings;
    /// call with no arguments to restore normal ID tokens.
    /// - Parameters:
    ///   - issuer: the `iss` claim instead of ``issuer``.
    ///   - audience: the `aud` claim instead of the requesting client's id.
    ///   - signWithUnknownKey: sign with a key (and `kid`) that `/jwks` never serves.
    public func setIDTokenOverrides(issuer: String? = nil, audience: String? = nil, signWithUnknownKey: Bool = false) {
        core.state.withLock { s in
            s.idTokenIssuerOverride = issuer
            s.idTokenAudienceOverride = audience
            s.signWithUnknownKey = signWithUnknownKey
        }
    }

    /// Faults of the ID tokens refreshes mint from now on; no arguments restores them.
    /// - Parameters:
    ///   - subject: the `sub` claim instead of the signed-in user's.
    ///   - unsigned: send them unsigned, `alg: none`, as a forger would.
    public func setIDTokenForgery(subject: String? = nil, unsigned: Bool = false) {
        core.state.withLock { s in
            s.idTokenSubjectOverride = subject
            s.unsignedIDTokens = unsigned
        }
    }

    /// The `scope` every refresh answer carries from now on, whatever was
    /// granted or asked (an issuer that ignores or widens `scope`); nil restores it.
    public func setAnsweredScope(_ scope: String?) {
        core.state.withLock { $0.answeredScopeOverride = scope }
    }

    /// Overrides for the discovery document served from now on; no arguments restores it.
    /// - Parameters:
    ///   - issuer: the `issuer` it names instead of ``issuer``.
    ///   - tokenEndpoint: where it says tokens are to be had.
    public func setDiscoveryOverrides(issuer: String? = nil, tokenEndpoint: String? = nil) {
        core.state.withLock { s in
            s.discoveryIssuerOverride = issuer
            s.discoveryTokenEndpointOverride = tokenEndpoint
        }
    }

    /// Whether discovery leaves the revocation endpoint out (`null`), and
    /// `/.well-known/oauth-authorization-server` (RFC 8414) names it instead,
    /// under `issuer` (this issuer's own by default).
    public func setRevocationOnlyInOAuthMetadata(_ on: Bool, issuer: String? = nil) {
        core.state.withLock { s in
            s.revocationOnlyInOAuthMetadata = on
            s.oauthMetadataIssuerOverride = issuer
        }
    }

    /// Whether discovery leaves the device authorization endpoint out.
    public func setDeviceEndpointOffered(_ offered: Bool) {
        core.state.withLock { $0.withoutDeviceEndpoint = !offered }
    }

    /// Replaces the signing key with a new ES256 key and a new `kid`; `/jwks` serves only the new one.
    public func rotateSigningKey() {
        let key = SigningKey.generate(prefix: "key-")
        core.state.withLock { $0.signingKey = key }
    }

    // MARK: Faults on any path

    /// What `path` (e.g. `/oauth2/v2.0/token`, `/revoke`, `/jwks`) answers from now on
    /// instead of its normal answer; nil restores it.
    public func setFault(_ fault: EndpointFault?, at path: String) {
        core.state.withLock { $0.faults[path] = fault }
    }

    /// Requests received at `path`, whatever was answered.
    public func requestCount(at path: String) -> Int {
        core.state.withLock { $0.requestsByPath[path] ?? 0 }
    }

    /// Request body bytes received at `path`.
    public func bodyBytesReceived(at path: String) -> Int {
        core.state.withLock { $0.bodyBytesByPath[path] ?? 0 }
    }

    /// JSON text (`"1e300"`, `"-5"`, `"\"NaN\""`) sent as `expires_in` in token answers
    /// from now on; nil sends the lifetime again.
    public func setExpiresInOverride(_ rawJSON: String?) {
        core.state.withLock { $0.expiresInOverride = rawJSON }
    }

    /// The `Cache-Control` header of `/jwks` answers from now on; nil sends none.
    public func setJWKSCacheControl(_ value: String?) {
        core.state.withLock { $0.jwksCacheControl = value }
    }

    /// The path of the token endpoint that discovery names.
    public static let tokenPath = "/oauth2/v2.0/token"

    // MARK: Entra native authentication

    /// The tenant id sent as `client_info.utid` by the native-auth token endpoint.
    public static let nativeTenantID = NativeAuthState.tenantID

    /// Adds (or reconfigures) a native-auth user. `username` is an e-mail address, matched
    /// case-insensitively; it becomes the ID token's `sub`, `email` and `preferred_username`.
    ///
    /// Sign-in uses `POST /oauth2/v2.0/initiate` → `POST /oauth2/v2.0/challenge` →
    /// `POST /oauth2/v2.0/token` (`grant_type=oob` or `password`). Every registered client
    /// (including ``clientID``) may use them. Unknown usernames get `400 user_not_found` (50034).
    public func addNativeUser(_ username: String, _ kind: NativeUser = .otp) {
        let key = NativeAuthState.key(username)
        core.state.withLock { s in
            if var user = s.native.users[key] {
                user.username = username
                user.kind = kind
                s.native.users[key] = user
            } else {
                s.native.users[key] = NativeUserRecord(
                    username: username,
                    kind: kind,
                    objectID: NativeAuthState.makeObjectID()
                )
            }
        }
    }

    /// The user's object id, sent as `client_info.uid` (MSAL's home account id is `uid.utid`,
    /// see ``nativeTenantID``); `nil` for an unknown user.
    public func nativeObjectID(for username: String) -> String? {
        core.state.withLock { $0.native.users[NativeAuthState.key(username)]?.objectID }
    }

    /// The last one-time code "e-mailed" to `username` by `/oauth2/v2.0/challenge`, or `nil` if none was sent.
    /// Only the code of the newest challenge is accepted; earlier ones get `invalid_oob_value`.
    public func lastCode(for username: String) -> String? {
        core.state.withLock { $0.native.users[NativeAuthState.key(username)]?.lastCode }
    }

    /// Number of one-time codes "e-mailed" to `username` (first sends and resends).
    public func codesSent(to username: String) -> Int {
        core.state.withLock { $0.native.users[NativeAuthState.key(username)]?.codesSent ?? 0 }
    }

    /// Native-auth knobs for codes and continuation tokens issued from now on. Each call replaces
    /// all three settings.
    /// - Parameters:
    ///   - codeLength: digits per one-time code (`code_length`; at least 1).
    ///   - maxAttempts: wrong codes accepted per continuation token; after that many, every submit
    ///     on that token answers `400 invalid_grant` without `suberror` (50053), even the right code.
    ///   - continuationTokenLifetime: seconds after which a continuation token answers
    ///     `400 expired_token` (552003). Applies to tokens already issued, too.
    public func setNativeAuth(codeLength: Int = 8, maxAttempts: Int = 5, continuationTokenLifetime: Int = 600) {
        core.state.withLock { s in
            s.native.codeLength = max(1, codeLength)
            s.native.maxAttempts = max(0, maxAttempts)
            s.native.continuationTokenLifetime = continuationTokenLifetime
        }
    }

    /// Every continuation token issued so far now answers `400 expired_token` (552003).
    /// Tokens issued later are not affected.
    public func expireNativeFlows() {
        core.state.withLock { s in
            for token in s.native.continuations.keys {
                s.native.continuations[token]?.expired = true
            }
        }
    }

    /// The next `POST` to any of the three native-auth paths (whatever its body, including a
    /// `refresh_token` grant on `/oauth2/v2.0/token`) answers with `fault` instead and changes no
    /// state; the one after is normal again. A later call replaces a fault not yet used.
    public func failNextNativeCall(_ fault: NativeFault) {
        core.state.withLock { $0.native.pendingFault = fault }
    }

    /// Number of `POST`s to `/oauth2/v2.0/initiate`, `/oauth2/v2.0/challenge` and `/oauth2/v2.0/token`
    /// (all, including failed ones, injected faults and refresh grants).
    public var nativeRequestCount: Int { core.state.withLock { $0.native.requestCount } }
}

/// Errors thrown by ``TestIssuer/start(accessTokenLifetime:rotateRefreshTokens:)``.
public enum TestIssuerError: Error, Sendable {
    /// The listening socket has no local port (should not happen).
    case noLocalPort
}

extension IssuerCore {
    /// Tracks a connection so ``TestIssuer/stop()`` can close it; closes it at once if already stopped.
    func register(_ channel: any Channel) -> EventLoopFuture<Void> {
        let id = ObjectIdentifier(channel)
        let accepted = state.withLock { s -> Bool in
            guard !s.stopped else { return false }
            s.connections[id] = channel
            return true
        }
        guard accepted else {
            return channel.close()
        }
        channel.closeFuture.whenComplete { [weak self] _ in
            _ = self?.state.withLock { $0.connections.removeValue(forKey: id) }
        }
        return channel.eventLoop.makeSucceededVoidFuture()
    }
}
