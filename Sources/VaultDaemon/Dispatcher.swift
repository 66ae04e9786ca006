public import Logging
public import VaultProtocol

/// The protocol in one place: a decoded request and its peer in, a reply out.
///
/// A reply that needs no waiting is `.ready`, answered on the connection's
/// event loop at once; everything else is `.pending` and runs as its own task,
/// so one slow request never holds up the others on its connection.
public struct Dispatcher: Sendable {
    public enum Reply: Sendable {
        case ready(Response)
        case pending(@Sendable () async -> Response)
        /// Answer, then send the broker's events for `accounts` (nil: all) on this connection.
        case subscribe(Response, accounts: [String]?)
    }

    let broker: Broker
    public let signIns: SignIns
    let clock: any WallClock
    let logger: Logger

    public init(broker: Broker, clock: any WallClock = SystemClock(), logger: Logger) {
        self.broker = broker
        self.signIns = SignIns(broker: broker, clock: clock, logger: logger)
        self.clock = clock
        self.logger = logger
    }

    public func handle(_ request: Request, from peer: Peer) -> Reply {
        let id = request.id
        let command: Command
        switch request.command {
        case .success(let value):
            command = value
        case .failure(let error):
            self.logger.debug("request refused", metadata: ["code": "\(error.code)", "peer": "\(peer.pid)"])
            return .ready(Response(id: id, error: error))
        }
        switch command {
        case .hello:
            return .ready(Response(id: id, HelloResult()))
        case .status:
            return self.later(id) { () throws(VaultError) in await self.broker.status() }
        case .accountAdd(let addition):
            return self.later(id) { () throws(VaultError) in try await self.broker.add(addition) }
        case .accountRemove(let name):
            return self.later(id) { () throws(VaultError) in
                let removed = try await self.broker.remove(name)
                await self.signIns.cancelAll(account: name)
                return removed
            }
        case .lock:
            return self.later(id) { () throws(VaultError) in
                await self.broker.lock()
                return EmptyResult()
            }
        case .token(let token) where !token.forceRefresh:
            // The hot path: a cached token is answered here, on the event loop.
            switch self.broker.cache.lookup(
                account: token.account,
                scopes: token.scopes,
                minTTL: token.minTTL,
                peer: peer,
                now: self.clock.now()
            ) {
            case .hit(let result):
                self.audit(token.account, peer)
                return .ready(Response(id: id, result))
            case .forbidden:
                return .ready(Response(id: id, error: Broker.forbidden(token.account)))
            case .miss:
                return self.later(id) { () throws(VaultError) in try await self.releaseToken(token, peer) }
            }
        case .token(let token):
            return self.later(id) { () throws(VaultError) in try await self.releaseToken(token, peer) }
        case .claims(let account):
            return self.later(id) { () throws(VaultError) in try await self.broker.claims(account: account, for: peer) }
        case .userinfo(let account):
            return self.later(id) { () throws(VaultError) in try await self.broker.userinfo(account: account, for: peer) }
        case .signinStart(let start):
            return self.later(id) { () throws(VaultError) in try await self.signIns.start(start) }
        case .signinSubmitCode(let flow, let code):
            return self.later(id) { () throws(VaultError) in try await self.signIns.submitCode(flow: flow, code: code) }
        case .signinResendCode(let flow):
            return self.later(id) { () throws(VaultError) in try await self.signIns.resendCode(flow: flow) }
        case .signinSubmitPassword(let flow, let password):
            return self.later(id) { () throws(VaultError) in
                try await self.signIns.submitPassword(flow: flow, password: password)
            }
        case .signinWait(let flow, let timeoutMs):
            return self.later(id) { () throws(VaultError) in try await self.signIns.wait(flow: flow, timeoutMs: timeoutMs) }
        case .signinCancel(let flow):
            return self.later(id) { () throws(VaultError) in try await self.signIns.cancel(flow: flow) }
        case .refreshToken(let account):
            return self.later(id) { () throws(VaultError) in try await self.broker.releaseRefreshToken(account: account, for: peer) }
        case .migrate(let target):
            return self.later(id) { () throws(VaultError) in try await self.broker.migrate(to: target) }
        case .signout(let target):
            return self.later(id) { () throws(VaultError) in
                switch target {
                case .account(let name): await self.signIns.cancelAll(account: name)
                case .all: await self.signIns.cancelAll()
                }
                return try await self.broker.signOut(target)
            }
        case .subscribe(let accounts):
            return .subscribe(Response(id: id, SubscribeResult(accounts: accounts)), accounts: accounts)
        case .unlock(let passphrase):
            return self.later(id) { () throws(VaultError) in
                try await self.broker.unlock(passphrase: passphrase)
                return EmptyResult()
            }
        }
    }

    private func releaseToken(_ request: TokenRequest, _ peer: Peer) async throws(VaultError) -> TokenResult {
        let result = try await self.broker.token(request, for: peer)
        self.audit(request.account, peer)
        return result
    }

    /// One line per access token handed out: which account, to which
    /// program; never the token.
    private func audit(_ account: String, _ peer: Peer) {
        self.logger.info("token released", metadata: peer.auditMetadata.merging(["account": "\(account)"]) { $1 })
    }

    private func later(
        _ id: RequestID?,
        _ body: @escaping @Sendable () async throws(VaultError) -> any ResultPayload
    ) -> Reply {
        .pending {
            do throws(VaultError) {
                return Response(id: id, try await body())
            } catch {
                return Response(id: id, error: error)
            }
        }
    }
}
