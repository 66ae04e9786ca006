import Logging
import VaultCrypto
import VaultOIDC
import VaultProtocol
import VaultServer

/// What leaves a door of the vault once the gate has admitted it: an
/// access token, a DPoP proof with the token it pairs with, a resource
/// server's nonce recorded. The main socket's `Dispatcher` and a share's
/// `ShareDoor` both serve these through one; `grant` says which door it is
/// (nil: the main socket). A cached token is answered at once, on the
/// connection's event loop; a refresh is `.pending`.
struct TokenDoor: Sendable {
    let broker: Broker
    let cache: TokenCache
    let chores: Chores
    let clock: any WallClock
    let logger: Logger
    let grant: ShareGrant?

    func token(_ token: TokenRequest, _ admitted: Admitted, _ id: RequestID?, _ peer: Peer) -> Reply {
        guard !token.forceRefresh else { return later(id) { () throws(VaultError) in try await self.releaseToken(token, peer, admitted) } }
        // The hot path: a cached token is answered here, on the event loop.
        switch self.cache.lookup(account: token.account, identity: admitted.identity, scopes: token.scopes, minTTL: token.minTTL, now: self.clock.now()) {
        case .hit(let result, _, let refreshAhead):
            if refreshAhead { self.refreshAhead(token) }
            switch Gate.release(result, of: token.account, through: self.grant, policy: self.cache.policy(of:)) {
            case .success(let released):
                self.audit(token.account, peer)
                return .ready(Response(id: id, released))
            case .failure(let error):
                return .ready(Response(id: id, error: error))
            }
        case .miss:
            if let refused = self.shareMayNotRefresh(token) { return .ready(Response(id: id, error: refused)) }
            return later(id) { () throws(VaultError) in try await self.releaseToken(token, peer, admitted) }
        }
    }

    func proof(_ ask: DPoPProofRequest, _ admitted: Admitted, _ id: RequestID?, _ peer: Peer) -> Reply {
        let token = ask.token
        guard !token.forceRefresh else { return later(id) { () throws(VaultError) in try await self.proveFresh(ask, peer, admitted) } }
        // As `token`: a cached token's proof is made here, on the event loop.
        switch self.cache.lookup(account: token.account, identity: admitted.identity, scopes: token.scopes, minTTL: token.minTTL, now: self.clock.now()) {
        case .hit(let result, let key, let refreshAhead):
            if refreshAhead { self.refreshAhead(token) }
            do throws(VaultError) {
                return .ready(Response(id: id, try self.prove(ask, result, key, peer)))
            } catch {
                return .ready(Response(id: id, error: error))
            }
        case .miss:
            if let refused = self.shareMayNotRefresh(token) { return .ready(Response(id: id, error: refused)) }
            return later(id) { () throws(VaultError) in try await self.proveFresh(ask, peer, admitted) }
        }
    }

    /// A resource server's nonce for `account`'s proofs at `origin`: a
    /// share's stays with the share, the user's with the account.
    func nonce(_ nonce: String, origin: String, _ admitted: Admitted, _ id: RequestID?) -> Reply {
        if let grant = self.grant {
            // The gate admitted the account shared.
            grant.ledger.record(nonce, origin: origin, account: admitted.account)
        } else if !self.cache.recordNonce(nonce, origin: origin, account: admitted.account, identity: admitted.identity) {
            return .ready(Response(id: id, error: .unknownAccount(admitted.account)))
        }
        return .ready(Response(id: id, EmptyResult()))
    }

    private func releaseToken(_ request: TokenRequest, _ peer: Peer, _ admitted: Admitted) async throws(VaultError) -> TokenResult {
        let token = try await self.broker.token(request, for: peer, admitted: admitted)
        let result = try Gate.release(token, of: request.account, through: self.grant, policy: self.cache.policy(of:)).get()
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
        self.chores.soon { await broker.refreshAhead(token.account, scopes: token.scopes) }
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
        let cache = self.cache
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
        // An autoclosure, as the token's audit line: nothing is built when the level drops the line.
        self.logger.info("dpop proof made", metadata: Self.auditMetadata(account, peer, share: self.grant?.id, target: ask.target))
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

    private static func auditMetadata(_ account: String, _ peer: Peer, share: String?, target: DPoPTarget? = nil) -> Logger.Metadata {
        var metadata = peer.auditMetadata
        metadata["account"] = "\(account)"
        if let share { metadata["share"] = "\(share)" }
        if let target {
            metadata["htm"] = "\(target.method)"
            metadata["origin"] = "\(target.origin)"
        }
        return metadata
    }
}

/// A reply that runs `body` off the event loop, its error in the reply.
func later(_ id: RequestID?, _ body: @escaping @Sendable () async throws(VaultError) -> any ResultPayload) -> Reply {
    .pending {
        do throws(VaultError) {
            return Response(id: id, try await body())
        } catch {
            return Response(id: id, error: error)
        }
    }
}
