import Logging
import VaultOIDC
package import VaultProtocol
package import VaultServer

/// The protocol of the main socket, the user's own door: a decoded request
/// and its peer in, a reply out (the socket layer's `RequestHandler`). The
/// gate admits the request first; tokens and proofs leave through
/// `TokenDoor`, a cached one at once on the connection's event loop;
/// everything else is `.pending`. A share's socket has its own door,
/// `ShareDoor`.
package struct Dispatcher: RequestHandler {
    let broker: Broker
    let cache: TokenCache
    let signIns: SignIns
    let shares: Shares
    let tokens: TokenDoor
    let clock: any WallClock
    let logger: Logger

    init(broker: Broker, cache: TokenCache, chores: Chores, signIns: SignIns, shares: Shares, clock: any WallClock, logger: Logger) {
        self.broker = broker
        self.cache = cache
        self.signIns = signIns
        self.shares = shares
        self.tokens = TokenDoor(broker: broker, cache: cache, chores: chores, clock: clock, logger: logger, grant: nil)
        self.clock = clock
        self.logger = logger
    }

    package func handle(_ request: Request, from peer: Peer) -> Reply {
        let id = request.id
        let command: Command
        let admitted: Admitted?
        switch Gate.admit(request, from: peer, through: nil, uptime: self.clock.uptime(), cache: self.cache, logger: self.logger) {
        case .success(let admission):
            command = admission.command
            admitted = admission.account
        case .failure(let error):
            return .ready(Response(id: id, error: error))
        }
        switch (command, admitted) {
        case (.hello, _):
            return .ready(Response(id: id, HelloResult()))
        case (.status, _):
            return later(id) { () throws(VaultError) in await self.broker.status() }
        case (.accountAdd(let addition), _):
            return later(id) { () throws(VaultError) in try await self.broker.add(addition) }
        case (.accountRemove(let name), _):
            // The account's sign-ins end first, as at sign-out;
            // then every share that holds the account ends.
            return later(id) { () throws(VaultError) in
                await self.signIns.endFlows(account: name)
                let identity = self.cache.identity(of: name)
                let removed = try await self.broker.remove(name)
                if let identity { await self.shares.end(holding: identity) }
                return removed
            }
        case (.lock, _):
            return later(id) { () throws(VaultError) in
                await self.broker.lock()
                return EmptyResult()
            }
        case (.token(let token), let admitted?):
            return self.tokens.token(token, admitted, id, peer)
        case (.dpopProof(let ask), let admitted?):
            return self.tokens.proof(ask, admitted, id, peer)
        case (.dpopNonce(_, let origin, let nonce), let admitted?):
            return self.tokens.nonce(nonce, origin: origin, admitted, id)
        case (.claims(let account), let admitted?):
            return later(id) { () throws(VaultError) in try await self.broker.claims(account: account, for: peer, admitted: admitted) }
        case (.userinfo(let account), let admitted?):
            return later(id) { () throws(VaultError) in try await self.broker.userinfo(account: account, for: peer, admitted: admitted) }
        case (.signinStart(let start), _):
            return later(id) { () throws(VaultError) in try await self.signIns.start(start) }
        case (.signinSubmitCode(let flow, let code), _):
            return later(id) { () throws(VaultError) in try await self.signIns.submitCode(flow: flow, code: code) }
        case (.signinResendCode(let flow), _):
            return later(id) { () throws(VaultError) in try await self.signIns.resendCode(flow: flow) }
        case (.signinSubmitPassword(let flow, let password), _):
            return later(id) { () throws(VaultError) in
                try await self.signIns.submitPassword(flow: flow, password: password)
            }
        case (.signinWait(let flow, let timeoutMs), _):
            return later(id) { () throws(VaultError) in try await self.signIns.wait(flow: flow, timeoutMs: timeoutMs) }
        case (.signinCancel(let flow), _):
            return later(id) { () throws(VaultError) in try await self.signIns.cancel(flow: flow) }
        case (.refreshToken(let account), let admitted?):
            return later(id) { () throws(VaultError) in
                try await self.broker.releaseRefreshToken(account: account, for: peer, admitted: admitted)
            }
        case (.shareOpen(let open), _):
            return later(id) { () throws(VaultError) in
                let known = try await self.broker.configurations(open.accounts)
                return try await self.shares.open(open, accounts: known)
            }
        case (.shareList, _):
            return later(id) { () throws(VaultError) in await self.shares.list() }
        case (.shareClose(let target), _):
            return later(id) { () throws(VaultError) in try await self.shares.close(target) }
        case (.migrate(let target), _):
            return later(id) { () throws(VaultError) in try await self.broker.migrate(to: target) }
        case (.signout(let target), _):
            return later(id) { () throws(VaultError) in
                // A sign-in in progress ends first, before any secret leaves.
                switch target {
                case .account(let name): await self.signIns.endFlows(account: name)
                case .all: await self.signIns.endFlows(account: nil)
                }
                return try await self.broker.signOut(target)
            }
        case (.subscribe(let accounts), _):
            return .subscribe(Response(id: id, SubscribeResult(accounts: accounts)), accounts: accounts)
        case (.unlock(let passphrase), _):
            return later(id) { () throws(VaultError) in
                try await self.broker.unlock(passphrase: passphrase)
                return EmptyResult()
            }
        case (.token, nil), (.dpopProof, nil), (.dpopNonce, nil), (.claims, nil), (.userinfo, nil), (.refreshToken, nil):
            // The gate admits every command that names an account to it.
            return .ready(Response(id: id, error: .unknownAccount(Gate.account(of: command) ?? "")))
        }
    }
}
