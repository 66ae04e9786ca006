import VaultProtocol

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
}

/// The one gate every way out of the vault passes through: the dispatcher
/// asks it what a request may be before anything runs (`admit`) and whether
/// a token may leave through this door (`release`). No door decides for
/// itself. On the main socket both are a single branch, so the cached-token
/// path stays on the event loop with no work added.
///
/// A share's rules:
/// - only `hello`, `status`, `token` and `subscribe`; everything else is
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
/// - `subscribe` to accounts outside the share is `forbidden`.
enum Gate {
    /// What `command` may be through the door `grant` (nil: the main socket).
    /// `identity` tells the identity of the account of a name now.
    static func admit(
        _ command: Command,
        through grant: ShareGrant?,
        identity: (String) -> String?
    ) -> Result<Command, VaultError> {
        guard let grant else { return .success(command) }
        func shared(_ name: String) -> ShareGrant.Account? {
            guard let account = grant.accounts[name], identity(name) == account.identity else { return nil }
            return account
        }
        switch command {
        case .hello, .status:
            return .success(command)
        case .token(var token):
            guard let account = shared(token.account) else { return .failure(.notShared(token.account)) }
            guard !token.forceRefresh else { return .failure(.shareCannotForceRefresh) }
            token.minTTL = min(token.minTTL, TokenRequest.defaultMinTTL)
            if let asked = token.scopes {
                guard Set(asked).isSubset(of: account.scopes) else { return .failure(.beyondShareScopes(account.scopes)) }
            } else {
                token.scopes = account.scopes
            }
            return .success(.token(token))
        case .subscribe(let accounts):
            let names = accounts ?? grant.accounts.keys.sorted()
            for name in names where shared(name) == nil { return .failure(.notShared(name)) }
            return .success(.subscribe(accounts: Array(Set(names)).sorted()))
        default:
            return .failure(.shareServesOnly)
        }
    }

    /// Whether the token `result` for `account` may leave through the door.
    static func release(_ result: TokenResult, of account: String, through grant: ShareGrant?) -> Result<TokenResult, VaultError> {
        guard let grant else { return .success(result) }
        guard let granted = grant.accounts[account]?.scopes else { return .failure(.notShared(account)) }
        let served = result.scope.split(separator: " ").map(String.init)
        guard Set(served).isSubset(of: granted) else {
            return .failure(.widerThanShared(account, granted: granted))
        }
        return .success(result)
    }

    /// The accounts of `status` a share may show: its own, while each is the account shared.
    static func visible(_ status: StatusResult, through grant: ShareGrant, identity: (String) -> String?) -> StatusResult {
        var status = status
        status.accounts.removeAll { row in
            guard let shared = grant.accounts[row.name] else { return true }
            return identity(row.name) != shared.identity
        }
        return status
    }
}
