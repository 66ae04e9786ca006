import Logging
package import VaultProtocol
package import VaultServer

/// A share's socket, as a door of its own: it holds the share's grant and
/// asks the gate with it, and serves only what a share may be asked
/// (`hello`, `status`, `token`, `subscribe`, and with `--dpop` `dpop.proof`
/// and `dpop.nonce`); it knows neither the shares nor the sign-ins.
package struct ShareDoor: RequestHandler {
    package let grant: ShareGrant
    let broker: Broker
    let cache: TokenCache
    let chores: Chores
    let tokens: TokenDoor
    let clock: any WallClock
    let logger: Logger
    /// Ends the share: the gate found it past its deadline.
    let expire: @Sendable () async -> Void

    init(
        grant: ShareGrant,
        broker: Broker,
        cache: TokenCache,
        chores: Chores,
        clock: any WallClock,
        logger: Logger,
        expire: @escaping @Sendable () async -> Void
    ) {
        self.grant = grant
        self.broker = broker
        self.cache = cache
        self.chores = chores
        self.tokens = TokenDoor(broker: broker, cache: cache, chores: chores, clock: clock, logger: logger, grant: grant)
        self.clock = clock
        self.logger = logger
        self.expire = expire
    }

    package func handle(_ request: Request, from peer: Peer) -> Reply {
        let id = request.id
        let grant = self.grant
        let command: Command
        let admitted: Admitted?
        switch Gate.admit(request, from: peer, through: grant, uptime: self.clock.uptime(), cache: self.cache, logger: self.logger) {
        case .success(let admission):
            command = admission.command
            admitted = admission.account
        case .failure(let error):
            if grant.hasExpired(at: self.clock.uptime()) {
                // Its chore runs on the wall clock, which may have been set back: end it now.
                self.chores.soon(self.expire)
            }
            return .ready(Response(id: id, error: error))
        }
        switch (command, admitted) {
        case (.hello, _):
            return .ready(Response(id: id, HelloResult()))
        case (.status, _):
            return later(id) { () throws(VaultError) in
                Gate.visible(await self.broker.status(), through: grant, policy: self.cache.policy(of:))
            }
        case (.token(let token), let admitted?):
            return self.tokens.token(token, admitted, id, peer)
        case (.dpopProof(let ask), let admitted?):
            return self.tokens.proof(ask, admitted, id, peer)
        case (.dpopNonce(_, let origin, let nonce), let admitted?):
            return self.tokens.nonce(nonce, origin: origin, admitted, id)
        case (.subscribe(let accounts), _):
            return .subscribe(Response(id: id, SubscribeResult(accounts: accounts)), accounts: accounts)
        default:
            // The gate lets nothing else through a share.
            return .ready(Response(id: id, error: .shareServesOnly))
        }
    }
}
