package import Logging
import VaultOIDC
package import VaultProtocol
package import VaultServer

/// The protocol in one place: a decoded request and its peer in, a reply
/// out (the socket layer's `RequestHandler`). A cached token is answered at
/// once, on the connection's event loop; everything else is `.pending`.
package struct Dispatcher: RequestHandler {
    let broker: Broker
    package let signIns: SignIns
    package let shares: Shares
    let clock: any WallClock
    let logger: Logger
    /// Set on a share's socket: what it lets through.
    private(set) var grant: ShareGrant?

    package init(broker: Broker, signIns: SignIns, shares: Shares, clock: any WallClock = SystemClock(), logger: Logger) {
        self.broker = broker
        self.signIns = signIns
        self.shares = shares
        self.clock = clock
        self.logger = logger
    }

    /// The same dispatcher, for a share's socket.
    func restricted(to grant: ShareGrant) -> Dispatcher {
        var restricted = self
        restricted.grant = grant
        return restricted
    }

    package func handle(_ request: Request, from peer: Peer) -> Reply {
        let id = request.id
        var command: Command
        switch request.command {
        case .success(let value):
            command = value
        case .failure(let error):
            self.logger.debug("request refused", metadata: ["code": "\(error.code)", "peer": "\(peer.pid)"])
            return .ready(Response(id: id, error: error))
        }
        // The gate: what this door lets the request be, before anything runs.
        // The account named, read once: the gate admits the caller to this
        // account, and what runs after serves only this one (its identity).
        let cache = self.broker.cache
        let admitted: Admitted?
        switch Gate.admit(command, from: peer, through: self.grant, uptime: self.clock.uptime(), accounts: cache.accounts, policy: cache.policy(of:)) {
        case .success(let admission):
            command = admission.command
            admitted = admission.account
        case .failure(let error):
            if case .refreshToken(let account) = command {
                self.logger.notice("refresh token withheld", metadata: peer.auditMetadata.merging(["account": "\(account)"]) { $1 })
            }
            if let grant = self.grant, grant.hasExpired(at: self.clock.uptime()) {
                // Its chore runs on the wall clock, which may have been set back: end it now.
                let shares = self.shares
                self.broker.chores.soon { await shares.expire(grant.id) }
            }
            return .ready(Response(id: id, error: error))
        }
        if let grant = self.grant, case .status = command {
            return self.later(id) { () throws(VaultError) in
                Gate.visible(await self.broker.status(), through: grant, policy: cache.policy(of:))
            }
        }
        switch (command, admitted) {
        case (.hello, _):
            return .ready(Response(id: id, HelloResult()))
        case (.status, _):
            return self.later(id) { () throws(VaultError) in await self.broker.status() }
        case (.accountAdd(let addition), _):
            return self.later(id) { () throws(VaultError) in try await self.broker.add(addition) }
        case (.accountRemove(let name), _):
            // The broker ends the account's sign-ins first, as sign-out does;
            // then every share that holds the account ends.
            return self.later(id) { () throws(VaultError) in
                let identity = self.broker.cache.identity(of: name)
                let removed = try await self.broker.remove(name)
                if let identity { await self.shares.end(holding: identity) }
                return removed
            }
        case (.lock, _):
            return self.later(id) { () throws(VaultError) in
                await self.broker.lock()
                return EmptyResult()
            }
        case (.token(let token), let admitted?) where !token.forceRefresh:
            // The hot path: a cached token is answered here, on the event loop.
            switch cache.lookup(
                account: token.account,
                identity: admitted.identity,
                scopes: token.scopes,
                minTTL: token.minTTL,
                now: self.clock.now()
            ) {
            case .hit(let result, _, let refreshAhead):
                if refreshAhead { self.refreshAhead(token) }
                switch Gate.release(result, of: token.account, through: self.grant, policy: cache.policy(of:)) {
                case .success(let released):
                    self.audit(token.account, peer)
                    return .ready(Response(id: id, released))
                case .failure(let error):
                    return .ready(Response(id: id, error: error))
                }
            case .miss:
                if let refused = self.shareMayNotRefresh(token) { return .ready(Response(id: id, error: refused)) }
                return self.later(id) { () throws(VaultError) in try await self.releaseToken(token, peer, admitted) }
            }
        case (.token(let token), let admitted?):
            return self.later(id) { () throws(VaultError) in try await self.releaseToken(token, peer, admitted) }
        case (.dpopProof(let ask), let admitted?) where !ask.token.forceRefresh:
            // As `token`: a cached token's proof is made here, on the event loop.
            let token = ask.token
            switch cache.lookup(account: token.account, identity: admitted.identity, scopes: token.scopes, minTTL: token.minTTL, now: self.clock.now()) {
            case .hit(let result, let key, let refreshAhead):
                if refreshAhead { self.refreshAhead(token) }
                do throws(VaultError) {
                    return .ready(Response(id: id, try self.prove(ask, result, key, peer)))
                } catch {
                    return .ready(Response(id: id, error: error))
                }
            case .miss:
                if let refused = self.shareMayNotRefresh(token) { return .ready(Response(id: id, error: refused)) }
                return self.later(id) { () throws(VaultError) in try await self.proveFresh(ask, peer, admitted) }
            }
        case (.dpopProof(let ask), let admitted?):
            return self.later(id) { () throws(VaultError) in try await self.proveFresh(ask, peer, admitted) }
        case (.dpopNonce(let account, let origin, let nonce), let admitted?):
            if let grant = self.grant {
                // The gate admitted the account shared; its nonce stays with the share.
                grant.ledger.record(nonce, origin: origin, account: account)
            } else if !cache.recordNonce(nonce, origin: origin, account: account, identity: admitted.identity) {
                return .ready(Response(id: id, error: .unknownAccount(account)))
            }
            return .ready(Response(id: id, EmptyResult()))
        case (.claims(let account), let admitted?):
            return self.later(id) { () throws(VaultError) in try await self.broker.claims(account: account, for: peer, admitted: admitted) }
        case (.userinfo(let account), let admitted?):
            return self.later(id) { () throws(VaultError) in try await self.broker.userinfo(account: account, for: peer, admitted: admitted) }
        case (.signinStart(let start), _):
            return self.later(id) { () throws(VaultError) in try await self.signIns.start(start) }
        case (.signinSubmitCode(let flow, let code), _):
            return self.later(id) { () throws(VaultError) in try await self.signIns.submitCode(flow: flow, code: code) }
        case (.signinResendCode(let flow), _):
            return self.later(id) { () throws(VaultError) in try await self.signIns.resendCode(flow: flow) }
        case (.signinSubmitPassword(let flow, let password), _):
            return self.later(id) { () throws(VaultError) in
                try await self.signIns.submitPassword(flow: flow, password: password)
            }
        case (.signinWait(let flow, let timeoutMs), _):
            return self.later(id) { () throws(VaultError) in try await self.signIns.wait(flow: flow, timeoutMs: timeoutMs) }
        case (.signinCancel(let flow), _):
            return self.later(id) { () throws(VaultError) in try await self.signIns.cancel(flow: flow) }
        case (.refreshToken(let account), let admitted?):
            return self.later(id) { () throws(VaultError) in
                try await self.broker.releaseRefreshToken(account: account, for: peer, admitted: admitted)
            }
        case (.shareOpen(let open), _):
            return self.later(id) { () throws(VaultError) in
                let known = try await self.broker.configurations(open.accounts)
                return try await self.shares.open(open, accounts: known)
            }
        case (.shareList, _):
            return self.later(id) { () throws(VaultError) in await self.shares.list() }
        case (.shareClose(let target), _):
            return self.later(id) { () throws(VaultError) in try await self.shares.close(target) }
        case (.migrate(let target), _):
            return self.later(id) { () throws(VaultError) in try await self.broker.migrate(to: target) }
        case (.signout(let target), _):
            return self.later(id) { () throws(VaultError) in try await self.broker.signOut(target) }
        case (.subscribe(let accounts), _):
            return .subscribe(Response(id: id, SubscribeResult(accounts: accounts)), accounts: accounts)
        case (.unlock(let passphrase), _):
            return self.later(id) { () throws(VaultError) in
                try await self.broker.unlock(passphrase: passphrase)
                return EmptyResult()
            }
        case (.token, nil), (.dpopProof, nil), (.dpopNonce, nil), (.claims, nil), (.userinfo, nil), (.refreshToken, nil):
            // The gate admits every command that names an account to it.
            return .ready(Response(id: id, error: .unknownAccount(Gate.account(of: command) ?? "")))
        }
    }

    private func releaseToken(_ request: TokenRequest, _ peer: Peer, _ admitted: Admitted) async throws(VaultError) -> TokenResult {
        let token = try await self.broker.token(request, for: peer, admitted: admitted)
        let result = try Gate.release(token, of: request.account, through: self.grant, policy: self.broker.cache.policy(of:)).get()
        self.audit(request.account, peer)
        return result
    }

    /// Why a share may not have the vault refresh `token`'s scope set (nil:
    /// it may); asked only when no cached token serves it.
    private func shareMayNotRefresh(_ token: TokenRequest) -> VaultError? {
        guard let grant = self.grant, let scopes = token.scopes else { return nil }
        guard grant.ledger.mayRefresh(account: token.account, key: TokenCache.key(scopes)) else {
            return .tooManyShareScopeSets(token.account, ShareLedger.scopeSetsPerAccount)
        }
        return nil
    }

    /// A token past its refresh-ahead point: its refresh starts in the background.
    private func refreshAhead(_ token: TokenRequest) {
        let broker = self.broker
        broker.chores.soon { await broker.refreshAhead(token.account, scopes: token.scopes) }
    }

    /// `dpop.proof` when no cached token serves it: the token as `token` gets it, then the proof.
    private func proveFresh(_ ask: DPoPProofRequest, _ peer: Peer, _ admitted: Admitted) async throws(VaultError) -> DPoPProofResult {
        let (result, key) = try await self.broker.boundToken(ask.token, admitted: admitted)
        return try self.prove(ask, result, key, peer)
    }

    /// The proof for `ask`, with the token `result` it pairs with, signed
    /// by the key the token is bound to, when the token may leave this door.
    private func prove(_ ask: DPoPProofRequest, _ result: TokenResult, _ key: DPoPKey?, _ peer: Peer) throws(VaultError) -> DPoPProofResult {
        let account = ask.token.account
        guard let key else { throw .notDPoPBound(account) }
        let cache = self.broker.cache
        let released = try Gate.release(result, of: account, through: self.grant, policy: cache.policy(of:)).get()
        // A share's proofs carry only the nonces recorded through it; the user's, only the user's.
        let nonce = self.grant.map { $0.ledger.nonce(account: account, origin: ask.target.origin) }
            ?? cache.nonce(account: account, origin: ask.target.origin)
        let proof: String
        do {
            proof = try key.proof(
                for: ask.target,
                issuedAt: DPoPKey.issuedAt(self.clock.now()),
                nonce: nonce,
                accessToken: released.accessToken
            )
        } catch {
            throw .proofNotMade
        }
        var metadata = Self.auditMetadata(account, peer, share: self.grant?.id)
        metadata["htm"] = "\(ask.target.method)"
        metadata["origin"] = "\(ask.target.origin)"
        self.logger.info("dpop proof made", metadata: metadata)
        return DPoPProofResult(
            proof: proof,
            accessToken: released.accessToken,
            expiresAt: released.expiresAt,
            expiresIn: released.expiresIn,
            scope: released.scope
        )
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
