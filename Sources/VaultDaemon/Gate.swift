import Logging
import Synchronization
package import VaultProtocol
package import VaultServer

/// What a door of the vault grants. The main socket is the user's own door
/// and grants what the user asks; a share grants named accounts (by
/// identity, so an account removed and added again under the same name is
/// not shared), each within a set of scopes.
package struct ShareGrant: Sendable {
    package struct Account: Sendable {
        /// The account's identity when it was shared.
        package let identity: String
        /// The scopes a token through the share may carry: the share's
        /// `scopes`, else the account's configured scopes.
        package let scopes: [String]

        package init(identity: String, scopes: [String]) {
            self.identity = identity
            self.scopes = scopes
        }
    }

    package let id: String
    package let accounts: [String: Account]
    /// The scopes the share was opened with; nil: each account's own.
    package let scopes: [String]?
    /// Whether the share makes DPoP proofs (`dpop.proof`, `dpop.nonce`).
    package let dpop: Bool
    /// When the share ends, on the clock nobody can set (`WallClock.uptime`);
    /// nil: at `share.close` or when vaultd stops.
    package let deadline: Double?
    /// What the share's clients changed, kept with the share.
    let ledger = ShareLedger()

    package init(id: String, accounts: [String: Account], scopes: [String]?, dpop: Bool, deadline: Double?) {
        self.id = id
        self.accounts = accounts
        self.scopes = scopes
        self.dpop = dpop
        self.deadline = deadline
    }

    /// Whether the share is past its ttl at `uptime`.
    func hasExpired(at uptime: Double) -> Bool {
        self.deadline.map { uptime >= $0 } ?? false
    }
}

/// What a share's clients may change in the vault, kept with the share and
/// gone with it, so no share reaches what the user's own clients use: the
/// resource servers' DPoP nonces they recorded (the user's proofs never
/// carry them), and the scope sets they made the vault refresh for
/// (bounded, so a share cannot spend the refresh token once per subset of
/// its scopes).
final class ShareLedger: Sendable {
    private struct State {
        /// By account.
        var nonces: [String: ResourceNonces] = [:]
        /// By account: the cache keys of the scope sets it asked for.
        var scopeSets: [String: Set<String>] = [:]
    }

    /// Scope sets a share may have the vault refresh for, per account.
    static let scopeSetsPerAccount = 4

    private let state = Mutex(State())

    func record(_ nonce: String, origin: String, account: String) {
        self.state.withLock { $0.nonces[account, default: ResourceNonces()].record(nonce, origin: origin) }
    }

    func nonce(account: String, origin: String) -> String? {
        self.state.withLock { $0.nonces[account]?.nonce(origin: origin) }
    }

    /// Whether a refresh of the scope set `key` for `account` may be asked
    /// through this share: one of the first `scopeSetsPerAccount` it asked.
    func mayRefresh(account: String, key: String) -> Bool {
        self.state.withLock { state in
            var sets = state.scopeSets[account] ?? []
            if sets.contains(key) { return true }
            guard sets.count < Self.scopeSetsPerAccount else { return false }
            sets.insert(key)
            state.scopeSets[account] = sets
            return true
        }
    }
}

/// What the gate let a request be, and the account it admitted the caller
/// to: the dispatcher runs `command`, and the broker's paths that hand out
/// a token, a proof, claims or the refresh token require `account`.
package struct Admission: Sendable {
    package let command: Command
    /// Nil when the command names no account.
    package let account: Admitted?
}

/// The gate's word that a caller may be served an account, as the account
/// was when the gate looked. Only the gate makes one, so a path that hands
/// out a token cannot be called without the gate having been asked.
package struct Admitted: Sendable {
    package let account: String
    /// The account's identity then; nil when there was no account of that
    /// name, and then no account that takes the name later is served.
    package let identity: String?

    fileprivate init(account: String, identity: String?) {
        self.account = account
        self.identity = identity
    }
}

/// The one gate every way out of the vault passes through: the dispatcher
/// asks it what a request may be before anything runs (`admit`) and whether
/// a token may leave through this door (`release`). It decides from the
/// door (the main socket, or a share's grant), the caller (its executable,
/// read at accept; its uid was checked there), the account (by identity)
/// and what is asked; no door, and nothing behind it, decides again. On the
/// main socket of an account without `allowed_clients` both are a lookup and
/// a branch, so the cached-token path stays on the event loop.
///
/// Every door:
/// - `token`, `dpop.proof`, `dpop.nonce`, `claims`, `userinfo` and
///   `subscribe` (to named accounts) of an account with `allowed_clients`
///   only for a program on that list; `refresh_token` only where the
///   account has `release_refresh_token` and the program is on its
///   (non-empty) list.
///
/// A share, besides:
/// - only `hello`, `status`, `token` and `subscribe`, and `dpop.proof` and
///   `dpop.nonce` when it was opened with `dpop`; everything else is
///   `forbidden`;
/// - only its accounts, and only while each is the account that was shared
///   (its identity); any other name is refused with the same message whether
///   it exists or not;
/// - `token` within the granted scopes: none asked means all of them; a
///   wider ask is `forbidden`; `force_refresh` is `forbidden` and `min_ttl`
///   is held to the default, so a share cannot make the vault spend its
///   refresh token at will;
/// - a token whose `scope`, as the issuer answered it, is wider than granted
///   is `forbidden`, whatever was asked (issuers may ignore `scope` on a
///   refresh, RFC 6749 §6);
/// - `dpop.proof` by the same rules as `token`, for the token it pairs with;
/// - `subscribe` to accounts outside the share is `forbidden`;
/// - nothing after its ttl, on the clock nobody can set;
/// - `dpop.nonce` records for the share's own proofs only; the scope sets
///   a share may have the vault refresh for are bounded (`ShareLedger`);
/// - `status` shows its accounts and `locked`, nothing of the backend.
package enum Gate {
    /// What `command` from `peer` may be through the door `grant` (nil: the
    /// main socket), and the account it was admitted to. `policy` tells what
    /// is known of the account of a name now; the account the command names
    /// is read once, so the admission and the identity it carries agree.
    package static func admit(
        _ command: Command,
        from peer: Peer,
        through grant: ShareGrant?,
        uptime: @autoclosure () -> Double,
        accounts: @autoclosure () -> [String],
        policy: (String) -> AccountPolicy?
    ) -> Result<Admission, VaultError> {
        let named = Self.account(of: command)
        let namedPolicy = named.flatMap(policy)
        let policy = { (name: String) in name == named ? namedPolicy : policy(name) }
        let admitted = named.map { Admitted(account: $0, identity: namedPolicy?.identity) }
        return Self.command(command, from: peer, through: grant, uptime: uptime(), accounts: accounts(), policy: policy)
            .map { Admission(command: $0, account: admitted) }
    }

    /// A request through a door, as both doors ask it: its decoding error,
    /// or what the gate admits it to over `cache`; a refresh token withheld
    /// is an audit line.
    static func admit(
        _ request: Request,
        from peer: Peer,
        through grant: ShareGrant?,
        uptime: @autoclosure () -> Double,
        cache: TokenCache,
        logger: Logger
    ) -> Result<Admission, VaultError> {
        switch request.command {
        case .failure(let error):
            logger.debug("request refused", metadata: ["code": "\(error.code)", "peer": "\(peer.pid)"])
            return .failure(error)
        case .success(let command):
            let admission = Self.admit(command, from: peer, through: grant, uptime: uptime(), accounts: cache.accounts, policy: cache.policy(of:))
            if case .failure = admission, case .refreshToken(let account) = command {
                logger.notice("refresh token withheld", metadata: peer.auditMetadata.merging(["account": "\(account)"]) { $1 })
            }
            return admission
        }
    }

    /// The main socket's gate, as its dispatcher asks it, over `cache`: for
    /// a program that calls the broker without a socket (the tests).
    package static func admit(_ command: Command, from peer: Peer, cache: TokenCache) -> Result<Admission, VaultError> {
        Self.admit(command, from: peer, through: nil, uptime: 0, accounts: cache.accounts, policy: cache.policy(of:))
    }

    /// The account a command names, which the gate admits the caller to.
    static func account(of command: Command) -> String? {
        switch command {
        case .token(let request): request.account
        case .dpopProof(let request): request.token.account
        case .claims(let name), .userinfo(let name), .refreshToken(let name), .dpopNonce(let name, _, _): name
        default: nil
        }
    }

    private static func command(
        _ command: Command,
        from peer: Peer,
        through grant: ShareGrant?,
        uptime: @autoclosure () -> Double,
        accounts: @autoclosure () -> [String],
        policy: (String) -> AccountPolicy?
    ) -> Result<Command, VaultError> {
        if let grant {
            // Every request, on the clock nobody can set: a share ends at its
            // ttl whenever the chore that closes it runs.
            guard !grant.hasExpired(at: uptime()) else { return .failure(.shareExpired) }
            switch Self.narrow(command, to: grant, policy: policy) {
            case .success(let narrowed):
                return Self.callerMay(narrowed, peer, policy)
            case .failure(let error):
                return .failure(error)
            }
        }
        if case .subscribe(nil) = command {
            // Every account, as far as the caller may use them: those whose
            // `allowed_clients` leave it out are not heard of.
            let names = accounts()
            let mayUse = names.filter { policy($0)?.allows(peer) ?? true }
            if mayUse.count < names.count { return .success(.subscribe(accounts: mayUse.sorted())) }
        }
        return Self.callerMay(command, peer, policy)
    }

    /// The account policy of every door: `allowed_clients`, and who may have the refresh token.
    private static func callerMay(_ command: Command, _ peer: Peer, _ policy: (String) -> AccountPolicy?) -> Result<Command, VaultError> {
        switch command {
        case .token(let request):
            guard let account = policy(request.account), !account.allows(peer) else { return .success(command) }
            return .failure(.forbidden(request.account))
        case .dpopProof(let request):
            guard let account = policy(request.token.account), !account.allows(peer) else { return .success(command) }
            return .failure(.forbidden(request.token.account))
        case .claims(let name), .userinfo(let name), .dpopNonce(let name, _, _):
            guard let account = policy(name), !account.allows(peer) else { return .success(command) }
            return .failure(.forbidden(name))
        case .subscribe(let names?):
            for name in names {
                guard let account = policy(name), !account.allows(peer) else { continue }
                return .failure(.forbidden(name))
            }
            return .success(command)
        case .refreshToken(let name):
            guard let account = policy(name) else { return .success(command) }
            guard account.releasesRefreshToken else { return .failure(.refreshTokenNotReleased(name)) }
            guard !account.allowedClients.isEmpty, account.allows(peer) else { return .failure(.refreshTokenNotForThisProgram(name)) }
            return .success(command)
        default:
            return .success(command)
        }
    }

    /// What a share's grant lets `command` be.
    private static func narrow(_ command: Command, to grant: ShareGrant, policy: (String) -> AccountPolicy?) -> Result<Command, VaultError> {
        func shared(_ name: String) -> ShareGrant.Account? {
            guard let account = grant.accounts[name], policy(name)?.identity == account.identity else { return nil }
            return account
        }
        switch command {
        case .hello, .status:
            return .success(command)
        case .token(let token):
            return Self.narrow(token, shared(token.account)).map(Command.token)
        case .dpopProof(var proof):
            guard grant.dpop else { return .failure(.shareMakesNoProofs) }
            switch Self.narrow(proof.token, shared(proof.token.account)) {
            case .success(let token):
                proof.token = token
                return .success(.dpopProof(proof))
            case .failure(let error):
                return .failure(error)
            }
        case .dpopNonce(let name, _, _):
            guard grant.dpop else { return .failure(.shareMakesNoProofs) }
            guard shared(name) != nil else { return .failure(.notShared(name)) }
            return .success(command)
        case .subscribe(let accounts):
            let names = accounts ?? grant.accounts.keys.sorted()
            for name in names where shared(name) == nil { return .failure(.notShared(name)) }
            return .success(.subscribe(accounts: Array(Set(names)).sorted()))
        default:
            return .failure(.shareServesOnly)
        }
    }

    /// A token request through a share, for the account it shares (nil: not shared).
    private static func narrow(_ token: TokenRequest, _ account: ShareGrant.Account?) -> Result<TokenRequest, VaultError> {
        guard let account else { return .failure(.notShared(token.account)) }
        guard !token.forceRefresh else { return .failure(.shareCannotForceRefresh) }
        var token = token
        token.minTTL = min(token.minTTL, TokenRequest.defaultMinTTL)
        if let asked = token.scopes {
            guard Set(asked).isSubset(of: account.scopes) else { return .failure(.beyondShareScopes(account.scopes)) }
        } else {
            token.scopes = account.scopes
        }
        return .success(token)
    }

    /// Whether the token `result` for `account` may leave through the door.
    /// The account's identity is checked again: the account may have been
    /// removed (and another added under its name) while the token was got;
    /// identities are never reused, so the same one means the same account.
    static func release(
        _ result: TokenResult,
        of account: String,
        through grant: ShareGrant?,
        policy: (String) -> AccountPolicy?
    ) -> Result<TokenResult, VaultError> {
        guard let grant else { return .success(result) }
        guard let shared = grant.accounts[account], policy(account)?.identity == shared.identity else {
            return .failure(.notShared(account))
        }
        let served = result.scope.split(separator: " ").map(String.init)
        guard Set(served).isSubset(of: shared.scopes) else {
            return .failure(.widerThanShared(account, granted: shared.scopes))
        }
        return .success(result)
    }

    /// What of `status` a share may show: its own accounts, while each is
    /// the account shared, and whether the vault is locked; nothing of where
    /// or how the secrets rest, nor of the client the account signs in as.
    static func visible(_ status: StatusResult, through grant: ShareGrant, policy: (String) -> AccountPolicy?) -> StatusResult {
        var visible = StatusResult(backend: nil, locked: status.locked, keySource: nil, accounts: status.accounts)
        visible.accounts.removeAll { row in
            guard let shared = grant.accounts[row.name] else { return true }
            return policy(row.name)?.identity != shared.identity
        }
        for index in visible.accounts.indices {
            visible.accounts[index].clientID = nil
            visible.accounts[index].registration = nil
        }
        return visible
    }
}
