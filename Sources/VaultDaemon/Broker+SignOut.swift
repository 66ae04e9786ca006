import Logging
import VaultCrypto
import VaultOIDC
package import VaultProtocol
import VaultStore

extension Broker {
    /// What a sign-out took out of the vault, kept to revoke at the issuer
    /// once every local copy is gone.
    struct Wipe: Sendable {
        var name: String
        var configuration: AccountConfiguration
        var secrets: AccountSecrets
        var wiped: [SecretPlace]
        /// Copies that could not be removed, in words.
        var failures: [String] = []
        var notified: Int
        /// The refresh that was spending the refresh token when the sign-out
        /// came: revocation waits for it, so the issuer never sees the token
        /// presented after it was revoked (the refresh, fenced, revokes what
        /// it got in turn).
        var spending: Task<Result<CachedToken, VaultError>, Never>?
        /// The access tokens handed out that still live, newest first: the
        /// issuer revokes them too, for resources that ask it (RFC 7662).
        var accessTokens: [SecretBytes] = []
    }

    /// The most access tokens one sign-out revokes, all at once: the newest
    /// of those cached (one per scope set) and those a refresh replaced
    /// (`TokenCache.retiredPerAccount`); the rest are named in the reason.
    static let accessTokensRevokedAtMost = 16

    /// Signs an account out everywhere (docs/protocol.md, Sign-out):
    /// its secrets and tokens leave memory and every store that holds them,
    /// subscribers are told, and only then is the refresh token revoked at
    /// the issuer, so a slow issuer never keeps a token alive here.
    /// A revocation that fails still wipes, and says so. The account's
    /// sign-ins in progress are the caller's to end first (`SignIns.endFlows`);
    /// one that completes after is fenced by the account's generation.
    package func signOut(_ name: String) async throws(VaultError) -> (SignOutReceipt, notified: Int) {
        let wipe = try await self.wipe(name)
        let receipt = await self.revoke(wipe)
        if !wipe.failures.isEmpty {
            throw VaultError.signedOutNotWiped(name, wipe.failures)
        }
        return (receipt, wipe.notified)
    }

    /// `signout` for one account or all of them. With all, every account is
    /// wiped here before any issuer is called, the revocations run at once,
    /// and every account gets a row, whatever failed for the others.
    package func signOut(_ target: SignOutTarget) async throws(VaultError) -> SignOutResult {
        switch target {
        case .account(let name):
            let (receipt, notified) = try await self.signOut(name)
            return SignOutResult(accounts: [receipt], notified: notified)
        case .all:
            try self.requireUnlocked()
            var wipes: [Wipe] = []
            for name in self.accounts.keys.sorted() {
                guard let wipe = try? await self.wipe(name) else { continue }
                wipes.append(wipe)
            }
            let receipts = await withTaskGroup(of: (Int, SignOutReceipt).self) { group in
                for (index, wipe) in wipes.enumerated() {
                    group.addTask { (index, await self.revoke(wipe)) }
                }
                var receipts: [(Int, SignOutReceipt)] = []
                for await receipt in group { receipts.append(receipt) }
                return receipts.sorted { $0.0 < $1.0 }.map(\.1)
            }
            return SignOutResult(accounts: receipts, notified: wipes.reduce(0) { $0 + $1.notified })
        }
    }

    /// Everything local: memory first (nothing is served from here on, and
    /// every refresh or sign-in in flight is fenced), then every store that
    /// may hold a copy, then the subscribers. The client secret and the
    /// registration are the client's, not the user's: they stay in the
    /// configured store.
    private func wipe(_ name: String) async throws(VaultError) -> Wipe {
        guard let account = self.accounts[name] else { throw VaultError.unknownAccount(name) }
        try self.requireUnlocked()
        let secrets = account.secrets
        let spending = account.spending?.task
        let accessTokens = self.cache.liveTokens(account: name, now: self.clock.now())
        self.forgetSecrets(of: name)
        let kept = secrets.client
        if let kept { self.accounts[name]?.secrets = kept }
        var wipe = Wipe(
            name: name, configuration: account.configuration, secrets: secrets, wiped: [.memory], notified: 0, spending: spending,
            accessTokens: accessTokens
        )
        let configured = self.store.backend
        let owner = self.owner(of: name)
        for store in [self.store] + self.alsoWipe {
            let keep = store.backend == configured ? kept : nil
            do {
                let held = try await self.stored { _ throws(StoreError) -> Bool in
                    let held = try await store.load(name)
                    if let keep {
                        try await store.save(keep, for: owner)
                    } else if held != nil {
                        _ = try await store.remove(name)
                    }
                    return held.map { $0.refreshToken != nil || $0.idToken != nil || keep == nil } ?? false
                }
                if held { wipe.wiped.append(SecretPlace(store.backend)) }
            } catch {
                self.logger.error("secrets not removed", metadata: ["account": "\(name)", "backend": "\(store.backend.rawValue)", "reason": "\(error.message)"])
                wipe.failures.append("its \(store.backend.rawValue) copy could not be removed: \(error.message)")
            }
        }
        wipe.notified = self.events.emit(Event(.signedOut, account: name))
        return wipe
    }

    /// The network part: RFC 7009 revocation and the end-session URL. Runs
    /// off the actor; the account is already wiped.
    private nonisolated func revoke(_ wipe: Wipe) async -> SignOutReceipt {
        let name = wipe.name
        var revoked = Revocation.no
        var reasons = wipe.failures
        var endSession: String?
        var accessTokensRevoked = 0
        let client = ClientCredentials(clientID: wipe.configuration.clientID, secret: wipe.secrets.clientSecret)
        if wipe.secrets.refreshToken != nil || !wipe.accessTokens.isEmpty {
            do {
                let metadata = try await self.oidc.metadata(for: wipe.configuration.issuer, now: self.clock.now())
                // The access tokens at once, beside the refresh token, which
                // waits for a refresh that was spending it.
                async let accessOutcome = self.revoke(accessTokens: wipe.accessTokens, client: client, metadata: metadata)
                if let refreshToken = wipe.secrets.refreshToken {
                    _ = await wipe.spending?.value
                    let outcome = await self.oidc.revoke(refreshToken: refreshToken, client: client, metadata: metadata)
                    revoked =
                        switch outcome.0 {
                        case .revoked: .yes
                        case .unsupported: .unsupported
                        case .failed: .failed
                        }
                    if let reason = outcome.reason { reasons.append(reason) }
                    endSession = self.oidc.endSessionURL(metadata: metadata, clientID: wipe.configuration.clientID, idToken: wipe.secrets.idToken)
                }
                let (count, reason) = await accessOutcome
                accessTokensRevoked = count
                if let reason { reasons.append(reason) }
            } catch {
                if wipe.secrets.refreshToken != nil { revoked = .failed }
                reasons.append(VaultError(error, account: name).message)
                if !wipe.accessTokens.isEmpty { reasons.append("\(wipe.accessTokens.count) access tokens were not revoked") }
            }
        }
        // Revoked, or tried: the refresh token and ID token are destroyed in
        // place, whoever still holds a copy of them (the client secret, the
        // application's, stays with the account).
        wipe.secrets.refreshToken?.wipe()
        wipe.secrets.idToken?.wipe()
        wipe.secrets.dpopKey?.wipe()
        self.logger.notice(
            "signed out",
            metadata: [
                "account": "\(name)", "revoked": "\(revoked.rawValue)", "access_tokens_revoked": "\(accessTokensRevoked)",
                "wiped": "\(wipe.wiped.map(\.rawValue))", "notified": "\(wipe.notified)",
            ]
        )
        return SignOutReceipt(
            name: name,
            revoked: revoked,
            reason: reasons.isEmpty ? nil : reasons.joined(separator: "; "),
            wiped: wipe.wiped,
            endSessionURL: endSession,
            accessTokensRevoked: accessTokensRevoked
        )
    }

    /// Revokes `tokens` (at most `accessTokensRevokedAtMost`, the newest)
    /// at once: how many the issuer took, and in words what is left live.
    private nonisolated func revoke(
        accessTokens tokens: [SecretBytes],
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) async -> (Int, reason: String?) {
        guard !tokens.isEmpty else { return (0, nil) }
        guard metadata.revocationEndpoint != nil else {
            return (0, "the issuer offers no revocation; \(tokens.count) access tokens live until they expire")
        }
        let tried = tokens.prefix(Self.accessTokensRevokedAtMost)
        let revoked = await withTaskGroup(of: Bool.self) { group in
            for token in tried {
                group.addTask { await self.oidc.revoke(accessToken: token, client: client, metadata: metadata).0 == .revoked }
            }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        let live = tokens.count - revoked
        guard live > 0 else { return (revoked, nil) }
        return (revoked, "\(live) of \(tokens.count) access tokens were not revoked and live until they expire")
    }
}
