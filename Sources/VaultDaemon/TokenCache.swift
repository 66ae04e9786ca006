import Synchronization
import VaultCrypto
package import VaultOIDC
package import VaultProtocol
import VaultServer

/// Access tokens in memory, per account and scope set, readable without a
/// hop to the broker: a cached token is answered on the connection's event
/// loop. The broker is the only writer.
package final class TokenCache: Sendable {
    private let state = Mutex<[String: Entry]>([:])

    struct Entry {
        var policy: AccountPolicy
        var defaultKey: String
        var tokens: [String: CachedToken] = [:]
        /// Tokens a refresh replaced, which may still be in a client's hands
        /// and live at the issuer: a sign-out revokes them too. The newest
        /// `retiredPerAccount`, and only while they live.
        var retired: [CachedToken] = []
        /// Resource servers' DPoP nonces for the user's own proofs.
        var nonces = ResourceNonces()
    }
    /// The most replaced access tokens kept per account for a sign-out to revoke.
    static let retiredPerAccount = 16

    package enum Lookup {
        /// A token to answer with, and the DPoP key it is bound to (nil: a
        /// bearer token); `refreshAhead` is true for the one caller that
        /// finds it past its refresh-ahead point first.
        case hit(TokenResult, dpop: DPoPKey?, refreshAhead: Bool)
        case miss
    }

    init() {}

    /// A token that lives at least `minTTL` more seconds, if one is cached
    /// (whether the caller may have it is the gate's to say).
    /// `identity`: the account the gate admitted the caller to.
    package func lookup(account: String, identity: String?, scopes: [String]?, minTTL: Int, now: Double) -> Lookup {
        self.state.withLock { entries in
            guard let entry = entries[account], entry.policy.identity == identity else { return .miss }
            let key = scopes.map(Self.key) ?? entry.defaultKey
            guard let token = entry.tokens[key], token.expiresAt - now >= Double(minTTL) else { return .miss }
            let due = !token.refreshAheadClaimed && now >= token.refreshAt
            if due { entries[account]?.tokens[key]?.refreshAheadClaimed = true }
            return .hit(token.result(now: now), dpop: token.dpop, refreshAhead: due)
        }
    }

    /// True once per cached token: for the first caller to find it past its
    /// refresh-ahead point.
    func claimRefreshAhead(account: String, key: String, now: Double) -> Bool {
        self.state.withLock { entries in
            guard let token = entries[account]?.tokens[key], !token.refreshAheadClaimed, now >= token.refreshAt else {
                return false
            }
            entries[account]?.tokens[key]?.refreshAheadClaimed = true
            return true
        }
    }

    func token(account: String, key: String?) -> CachedToken? {
        self.state.withLock { entries in
            guard let entry = entries[account] else { return nil }
            return entry.tokens[key ?? entry.defaultKey]
        }
    }

    func configure(_ configuration: AccountConfiguration) {
        self.state.withLock { entries in
            let entry = entries[configuration.name]
            entries[configuration.name] = Entry(
                policy: AccountPolicy(configuration),
                defaultKey: Self.key(configuration.scopes),
                tokens: entry?.tokens ?? [:],
                nonces: entry?.nonces ?? ResourceNonces()
            )
        }
    }

    /// What the gate needs to know of the account of that name now; nil when there is none.
    package func policy(of account: String) -> AccountPolicy? {
        self.state.withLock { $0[account]?.policy }
    }

    /// The names of every account now.
    package var accounts: [String] {
        self.state.withLock { Array($0.keys) }
    }

    /// The identity of the account of that name now; nil when there is none.
    package func identity(of account: String) -> String? {
        self.policy(of: account)?.identity
    }

    func store(_ token: CachedToken, account: String, key: String) {
        self.state.withLock { entries in
            guard var entry = entries[account] else { return }
            // The default scope set's key is the entry's own: one copy, not two.
            let key = key == entry.defaultKey ? entry.defaultKey : key
            if let replaced = entry.tokens[key] {
                entry.retired.removeAll { $0.expiresAt <= token.issuedAt }
                if entry.retired.count >= Self.retiredPerAccount { entry.retired.removeFirst() }
                entry.retired.append(replaced)
            }
            entry.tokens[key] = token
            entries[account] = entry
        }
    }

    /// Records a resource server's nonce for `account`'s later proofs to
    /// `origin`; false when there is no such account (by identity).
    package func recordNonce(_ nonce: String, origin: String, account: String, identity: String?) -> Bool {
        self.state.withLock { entries in
            guard let entry = entries[account], entry.policy.identity == identity else { return false }
            entries[account]?.nonces.record(nonce, origin: origin)
            return true
        }
    }

    /// The nonce a resource server at `origin` last gave for `account`.
    func nonce(account: String, origin: String) -> String? {
        self.state.withLock { entries in entries[account]?.nonces.nonce(origin: origin) }
    }

    /// The access tokens cached for `account` that live past `now`, newest
    /// first: what a sign-out revokes at the issuer.
    func liveTokens(account: String, now: Double) -> [SecretBytes] {
        self.state.withLock { entries in
            guard let entry = entries[account] else { return [] }
            return (Array(entry.tokens.values) + entry.retired)
                .filter { $0.expiresAt > now }
                .sorted { $0.expiresAt > $1.expiresAt }
                .map(\.accessToken)
        }
    }

    func clearTokens(account: String) {
        self.state.withLock { entries in
            entries[account]?.tokens = [:]
            entries[account]?.retired = []
        }
    }

    func remove(account: String) {
        self.state.withLock { $0[account] = nil }
    }

    /// The cache key of a scope set: order and repeats do not matter.
    static func key(_ scopes: [String]) -> String {
        Set(scopes).sorted().joined(separator: " ")
    }
}

/// Resource servers' DPoP nonces (RFC 9449 §8) for one account's proofs,
/// the last of each origin, at most `maximum` of them, the oldest going
/// first: what a user's proofs carry, and separately what a share's do.
struct ResourceNonces: Sendable {
    static let maximum = 64
    /// Oldest first.
    private var list: [(origin: String, nonce: String)] = []

    mutating func record(_ nonce: String, origin: String) {
        self.list.removeAll { $0.origin == origin }
        if self.list.count >= Self.maximum { self.list.removeFirst() }
        self.list.append((origin, nonce))
    }

    func nonce(origin: String) -> String? {
        self.list.last { $0.origin == origin }?.nonce
    }
}

/// What the gate reads of an account, in one lock: which account it is,
/// and which programs may have what of it.
package struct AccountPolicy: Sendable {
    /// The account's identity (never reused).
    package let identity: String?
    /// Executable paths that may use the account; empty: every program of the user.
    package let allowedClients: [String]
    /// Whether `refresh_token` may hand the refresh token out.
    package let releasesRefreshToken: Bool

    package init(_ configuration: AccountConfiguration) {
        self.identity = configuration.identity
        self.allowedClients = configuration.allowedClients
        self.releasesRefreshToken = configuration.releaseRefreshToken
    }

    /// Whether `peer` may use the account.
    func allows(_ peer: Peer) -> Bool {
        self.allowedClients.isEmpty || peer.executable.map(self.allowedClients.contains) == true
    }
}

/// An access token in memory, with the wall-clock second it expires and
/// the one from which a caller's use of it starts a refresh in the background.
struct CachedToken: Sendable {
    var accessToken: SecretBytes
    var issuedAt: Double
    var expiresAt: Double
    var refreshAt: Double
    var refreshAheadClaimed = false
    var scope: String
    /// The DPoP key the token is bound to; nil: a bearer token.
    var dpop: DPoPKey?

    /// `lifetime` is the issuer's `expires_in` (clamped to 0 s to ten years);
    /// `refreshAhead` the percentage of it after which the token is renewed
    /// ahead of expiry (100: never ahead).
    init(accessToken: SecretBytes, issuedAt: Double, lifetime: Int, scope: String, refreshAhead: Int, dpop: DPoPKey? = nil) {
        let lifetime = Double(min(max(lifetime, 0), Seconds.maximumLifetime))
        self.accessToken = accessToken
        self.issuedAt = issuedAt
        self.expiresAt = issuedAt + lifetime
        self.refreshAt = issuedAt + lifetime * Double(min(max(refreshAhead, 1), 100)) / 100
        self.scope = scope
        self.dpop = dpop
    }

    func result(now: Double) -> TokenResult {
        TokenResult(
            accessToken: self.accessToken,
            tokenType: self.dpop == nil ? "Bearer" : "DPoP",
            expiresAt: Seconds.int64(self.expiresAt),
            expiresIn: max(0, Seconds.int64(self.expiresAt - now)),
            scope: self.scope
        )
    }
}

/// Conversions of times that never trap, whatever an issuer sent.
enum Seconds {
    /// Ten years: longer lifetimes are taken as this.
    static let maximumLifetime = 315_360_000

    /// Whole seconds, clamped to ±2^53 (NaN: 0).
    static func int64(_ seconds: Double) -> Int64 {
        guard !seconds.isNaN else { return 0 }
        return Int64(min(max(seconds, -9e15), 9e15).rounded(.down))
    }

    /// Milliseconds from seconds, clamped to 0...one day.
    static func milliseconds(_ seconds: Double) -> Int {
        guard !seconds.isNaN else { return 0 }
        return Int(min(max(seconds, 0), 86_400) * 1000)
    }
}
