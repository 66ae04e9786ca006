import Synchronization
import VaultCrypto
public import VaultProtocol

/// Access tokens in memory, per account and scope set, readable without a
/// hop to the broker: a cached token is answered on the connection's event
/// loop. The broker is the only writer.
public final class TokenCache: Sendable {
    private let state = Mutex<[String: Entry]>([:])

    struct Entry {
        var allowedClients: [String]
        var defaultKey: String
        var tokens: [String: CachedToken] = [:]
    }

    public enum Lookup {
        case hit(TokenResult)
        case forbidden
        case miss
    }

    init() {}

    /// A token that lives at least `minTTL` more seconds, if one is cached and
    /// the caller may have it.
    public func lookup(account: String, scopes: [String]?, minTTL: Int, peer: Peer, now: Double) -> Lookup {
        self.state.withLock { entries in
            guard let entry = entries[account] else { return .miss }
            if !entry.allowedClients.isEmpty && !entry.allowedClients.contains(peer.executable ?? "") {
                return .forbidden
            }
            let key = scopes.map(Self.key) ?? entry.defaultKey
            guard let token = entry.tokens[key], token.expiresAt - now >= Double(minTTL) else { return .miss }
            return .hit(token.result(now: now))
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
            let tokens = entries[configuration.name]?.tokens ?? [:]
            entries[configuration.name] = Entry(
                allowedClients: configuration.allowedClients,
                defaultKey: Self.key(configuration.scopes),
                tokens: tokens
            )
        }
    }

    func store(_ token: CachedToken, account: String, key: String) {
        self.state.withLock { $0[account]?.tokens[key] = token }
    }

    func clearTokens(account: String) {
        self.state.withLock { $0[account]?.tokens = [:] }
    }

    func remove(account: String) {
        self.state.withLock { $0[account] = nil }
    }

    /// The cache key of a scope set: order and repeats do not matter.
    static func key(_ scopes: [String]) -> String {
        Set(scopes).sorted().joined(separator: " ")
    }
}

/// An access token in memory, with the wall-clock second it expires.
struct CachedToken: Sendable {
    var accessToken: SecretBytes
    var expiresAt: Double
    var scope: String

    func result(now: Double) -> TokenResult {
        TokenResult(
            accessToken: self.accessToken,
            tokenType: "Bearer",
            expiresAt: Int64(self.expiresAt),
            expiresIn: max(0, Int64(self.expiresAt - now)),
            scope: self.scope
        )
    }
}
