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
    public let shares: Shares
    let clock: any WallClock
    let logger: Logger
    /// Set on a share's socket: what it lets through.
    private(set) var grant: ShareGrant?

    public init(broker: Broker, clock: any WallClock = SystemClock(), logger: Logger) {
        self.broker = broker
        self.signIns = SignIns(broker: broker, clock: clock, logger: logger)
        self.shares = Shares(clock: clock, logger: logger)
        self.clock = clock
        self.logger = logger
    }

    /// The same dispatcher, for a share's socket.
    func restricted(to grant: ShareGrant) -> Dispatcher {
        var restricted = self
        restricted.grant = grant
        return restricted
    }

    public func handle(_ request: Request, from peer: Peer) -> Reply {
        let id = request.id
        var command: Command
        switch request.command {
        case .success(let value):
            command = value
        case .failure(let error):
            self.logger.debug("request refused", metadata: ["code": "\(error.code)", "peer": "\(peer.pid)"])
            return .ready(Response(id: id, error: error))
        }
        if let grant = self.grant {
            switch Self.narrow(command, to: grant) {
            case .success(let narrowed): command = narrowed
            case .failure(let error): return .ready(Response(id: id, error: error))
            }
            if case .status = command {
                return self.later(id) { () throws(VaultError) in
                    var status = await self.broker.status()
                    status.accounts.removeAll { !grant.accounts.contains($0.name) }
                    return status
                }
            }
        }
        switch command {
        case .hello:
            return .ready(Response(id: id, HelloResult()))
        case .status:
            return self.later(id) { () throws(VaultError) in await self.broker.status() }
        case .accountAdd(let addition):
            return self.later(id) { () throws(VaultError) in try await self.broker.add(addition) }
        case .accountRemove(let name):
            // The broker ends the account's sign-ins first, as sign-out does.
            return self.later(id) { () throws(VaultError) in try await self.broker.remove(name) }
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
            case .hit(let result, let refreshAhead):
                if refreshAhead {
                    let broker = self.broker
                    Task { await broker.refreshAhead(token.account, scopes: token.scopes) }
                }
                self.audit(token.account, peer)
                return .ready(Response(id: id, result))
            case .forbidden:
                return .ready(Response(id: id, error: VaultError.forbidden(token.account)))
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
        case .shareOpen(let open):
            return self.later(id) { () throws(VaultError) in
                let known = Set(await self.broker.status().accounts.map(\.name))
                return try await self.shares.open(open, known: known, dispatcher: self)
            }
        case .shareList:
            return self.later(id) { () throws(VaultError) in await self.shares.list() }
        case .shareClose(let target):
            return self.later(id) { () throws(VaultError) in try await self.shares.close(target) }
        case .migrate(let target):
            return self.later(id) { () throws(VaultError) in try await self.broker.migrate(to: target) }
        case .signout(let target):
            return self.later(id) { () throws(VaultError) in try await self.broker.signOut(target) }
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
    /// program, through which share; never the token.
    private func audit(_ account: String, _ peer: Peer) {
        // An autoclosure: nothing is built when the level drops the line.
        self.logger.info("token released", metadata: Self.auditMetadata(account, peer, share: self.grant?.id))
    }

    private static func auditMetadata(_ account: String, _ peer: Peer, share: String?) -> Logger.Metadata {
        var metadata = peer.auditMetadata
        metadata["account"] = "\(account)"
        if let share { metadata["share"] = "\(share)" }
        return metadata
    }

    /// What a share's socket lets through, narrowed to the share: a token of
    /// its accounts within its scopes, its accounts' events, hello and
    /// status. Anything else is `forbidden`, and an account outside the share
    /// is refused the same way whether it exists or not.
    static func narrow(_ command: Command, to grant: ShareGrant) -> Result<Command, VaultError> {
        switch command {
        case .hello, .status:
            return .success(command)
        case .token(var token):
            guard grant.accounts.contains(token.account) else { return .failure(Self.notShared(token.account)) }
            if let scopes = grant.scopes {
                if let asked = token.scopes {
                    guard Set(asked).isSubset(of: scopes) else {
                        return .failure(VaultError(.forbidden, "this share serves only the scopes \(scopes.joined(separator: " "))"))
                    }
                } else {
                    token.scopes = scopes
                }
            }
            return .success(.token(token))
        case .subscribe(let accounts):
            let wanted = accounts.map { grant.accounts.intersection($0) } ?? grant.accounts
            return .success(.subscribe(accounts: wanted.sorted()))
        default:
            return .failure(VaultError(.forbidden, "a shared socket serves only hello, status, token and subscribe"))
        }
    }

    static func notShared(_ account: String) -> VaultError {
        VaultError(.forbidden, "this shared socket does not serve '\(account)'")
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
