import VaultProtocol
import VaultServer

/// What a door of the vault grants. The main socket is the user's own door
/// and grants what the user asks; a share grants named accounts (by
/// identity, so an account removed and added again under the same name is
/// not shared), each within a set of scopes.
public struct ShareGrant: Sendable {
    public struct Account: Sendable {
        /// The account's identity when it was shared.
        public let identity: String
        /// The scopes a token through the share may carry: the share's
        /// `scopes`, else the account's configured scopes.
        public let scopes: [String]
    }

    public let id: String
    public let accounts: [String: Account]
    /// The scopes the share was opened with; nil: each account's own.
    public let scopes: [String]?
    /// Whether the share makes DPoP proofs (`dpop.proof`, `dpop.nonce`).
    public let dpop: Bool
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
/// - `token`, `dpop.proof`, `dpop.nonce`, `claims` and `userinfo` of an
///   account with `allowed_clients` only for a program on that list; `refresh_token` only where the account
///   has `release_refresh_token` and the program is on its (non-empty) list.
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
/// - `subscribe` to accounts outside the share is `forbidden`.
enum Gate {
    /// What `command` from `peer` may be through the door `grant` (nil: the
    /// main socket). `policy` tells what is known of the account of a name now.
    static func admit(
        _ command: Command,
        from peer: Peer,
        through grant: ShareGrant?,
        policy: (String) -> AccountPolicy?
    ) -> Result<Command, VaultError> {
        if let grant {
            switch Self.narrow(command, to: grant, policy: policy) {
            case .success(let narrowed):
                return Self.callerMay(narrowed, peer, policy)
            case .failure(let error):
                return .failure(error)
            }
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

    /// The accounts of `status` a share may show: its own, while each is the account shared.
    static func visible(_ status: StatusResult, through grant: ShareGrant, policy: (String) -> AccountPolicy?) -> StatusResult {
        var status = status
        status.accounts.removeAll { row in
            guard let shared = grant.accounts[row.name] else { return true }
            return policy(row.name)?.identity != shared.identity
        }
        return status
    }
}
