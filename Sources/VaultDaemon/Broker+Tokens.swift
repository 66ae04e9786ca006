import Logging
import VaultCrypto
import VaultJSON
import VaultOIDC
package import VaultProtocol
package import VaultServer
import VaultStore

/// Capped, jittered exponential backoff after the issuer could not be reached.
struct Backoff: Sendable {
    var failures = 0
    /// No refresh is tried before this wall-clock second.
    var notBefore: Double = 0

    static let base: Double = 1
    static let cap: Double = 60

    mutating func fail(now: Double, retryAfter: Int?) {
        self.failures += 1
        let exponential = min(Self.cap, Self.base * Double(1 << min(self.failures - 1, 10)))
        let jittered = exponential * Double.random(in: 0.5...1.0)
        self.notBefore = now + max(jittered, Double(min(max(retryAfter ?? 0, 0), 3600)))
    }
}

/// One refresh of one scope set, numbered so that it removes only itself
/// from the account's table when it ends.
struct Refresh: Sendable {
    let serial: Int
    let task: Task<Result<CachedToken, VaultError>, Never>
}

extension Broker {
    /// Lifetime assumed when the issuer sends no `expires_in`.
    static let assumedLifetime = 300

    /// `token`: from memory when the cached token lives at least `minTTL` more
    /// seconds, else from exactly one refresh per account and scope set.
    /// `admitted`: the account the gate admitted the caller to; another
    /// account of the name since is not served.
    package func token(_ request: TokenRequest, for peer: Peer, admitted: Admitted) async throws(VaultError) -> TokenResult {
        try await self.cachedToken(request, admitted: admitted).result(now: self.clock.now())
    }

    /// `token`'s token, with the DPoP key it is bound to (nil: a bearer token).
    func boundToken(_ request: TokenRequest, admitted: Admitted) async throws(VaultError) -> (TokenResult, DPoPKey?) {
        let token = try await self.cachedToken(request, admitted: admitted)
        return (token.result(now: self.clock.now()), token.dpop)
    }

    private func cachedToken(_ request: TokenRequest, admitted: Admitted) async throws(VaultError) -> CachedToken {
        let name = request.account
        let account = try self.admittedAccount(name, admitted)
        let scopes = request.scopes ?? account.configuration.scopes
        let key = TokenCache.key(scopes)
        let now = self.clock.now()
        let cachedToken = self.cache.token(account: name, key: key)
        if !request.forceRefresh, let cached = cachedToken, cached.expiresAt - now >= Double(request.minTTL) {
            if self.cache.claimRefreshAhead(account: name, key: key, now: now) {
                self.refreshAhead(name, scopes: request.scopes)
            }
            return cached
        }
        try self.checkSignedIn(name)
        if let wait = self.accounts[name].map({ $0.backoff.notBefore - now }), wait > 0 {
            if let cached = cachedToken, cached.expiresAt > now { return cached }
            throw VaultError.idpUnavailable(name, reason: "the last attempt failed", retryAfter: wait)
        }
        let refresh = self.accounts[name]?.refreshing[key]?.task ?? self.startRefresh(name, key: key, scopes: request.scopes)
        self.accounts[name]?.waiting += 1
        // A caller whose connection closed stops waiting; the refresh runs on for the others.
        let outcome = await refresh.valueUnlessCancelled()
        self.accounts[name]?.waiting -= 1
        guard let outcome else { throw VaultError.cancelled }
        let later = self.clock.now()
        switch outcome {
        case .success(let token):
            return token
        case .failure(let error) where error.code == .idpUnavailable:
            if let cached = self.cache.token(account: name, key: key), cached.expiresAt > later {
                return cached
            }
            throw error
        case .failure(let error):
            throw error
        }
    }

    /// How many callers wait on a refresh of `account` now; tests wait on
    /// this condition instead of on time.
    package func waitingCallers(account: String) -> Int {
        self.accounts[account]?.waiting ?? 0
    }

    /// Whether a refresh of `account` is under way (one asked for ahead of
    /// expiry has no caller waiting on it); for tests.
    package func isRefreshing(account: String) -> Bool {
        !(self.accounts[account]?.refreshing.isEmpty ?? true)
    }

    /// How many refreshes `account` keeps a handle on: only those under way;
    /// for tests.
    package func heldRefreshes(account: String) -> Int {
        guard let account = self.accounts[account] else { return 0 }
        var serials = Set(account.refreshing.values.map(\.serial))
        if let spending = account.spending { serials.insert(spending.serial) }
        return serials.count
    }

    /// A token in use has passed its refresh-ahead point: refresh it in the
    /// background so that no caller waits on the issuer. Nothing starts when
    /// a refresh of that scope set runs, the issuer asked us to wait, or the
    /// account cannot refresh.
    func refreshAhead(_ name: String, scopes: [String]?) {
        guard let account = self.accounts[name] else { return }
        let key = TokenCache.key(scopes ?? account.configuration.scopes)
        guard account.refreshing[key] == nil, account.secrets.refreshToken != nil, !account.needsReauth,
            !self.isLocked, account.backoff.notBefore <= self.clock.now()
        else { return }
        self.logger.debug("refreshing ahead of expiry", metadata: ["account": "\(name)"])
        _ = self.startRefresh(name, key: key, scopes: scopes)
    }

    /// Starts the refresh of one scope set. It spends the refresh token only
    /// once every earlier refresh of the account has ended, with the newest
    /// token then, and it runs to its end (storing a rotated token) even if
    /// every caller has gone.
    private func startRefresh(_ name: String, key: String, scopes: [String]?) -> Task<Result<CachedToken, VaultError>, Never> {
        let previous = self.accounts[name]?.spending?.task
        let generation = self.accounts[name]?.generation ?? 0
        self.refreshSerial += 1
        let serial = self.refreshSerial
        let scope = scopes.map { $0.joined(separator: " ") }
        let task = Task {
            _ = await previous?.value
            let outcome = await self.refresh(name, key: key, scope: scope, generation: generation)
            // A finished refresh is let go: a task kept after its end keeps
            // the memory its frames used (about 20 KB), one per account.
            if self.accounts[name]?.refreshing[key]?.serial == serial {
                self.accounts[name]?.refreshing[key] = nil
                // An emptied table keeps its storage: let it go too.
                if self.accounts[name]?.refreshing.isEmpty == true { self.accounts[name]?.refreshing = [:] }
            }
            if self.accounts[name]?.spending?.serial == serial { self.accounts[name]?.spending = nil }
            self.heapTrim.soon()
            return outcome
        }
        let refresh = Refresh(serial: serial, task: task)
        self.accounts[name]?.refreshing[key] = refresh
        self.accounts[name]?.spending = refresh
        return task
    }

    /// `refresh_token`: hands the refresh token itself to a companion, only
    /// where the account says `release_refresh_token` and only to a program
    /// in its `allowed_clients`. Every release is an audit line (who, when,
    /// which account; never the token).
    /// Whether the caller may have it is the gate's to say (`Gate`), before
    /// this runs; `admitted` is the account it admitted the caller to.
    package func releaseRefreshToken(account name: String, for peer: Peer, admitted: Admitted) throws(VaultError) -> RefreshTokenResult {
        _ = try self.admittedAccount(name, admitted)
        try self.checkSignedIn(name)
        guard let refreshToken = self.accounts[name]?.secrets.refreshToken else {
            throw VaultError.notSignedIn(name)
        }
        self.logger.notice("refresh token released", metadata: peer.auditMetadata.merging(["account": "\(name)"]) { $1 })
        // A copy of its own: a sign-out meanwhile wipes the account's in place.
        let released: SecretBytes
        do {
            released = try refreshToken.withUnsafeBytes { bytes throws(SodiumError) in try SecretBytes(copying: bytes) }
        } catch {
            throw VaultError.outOfGuardedMemory
        }
        return RefreshTokenResult(refreshToken: released)
    }

    /// `claims`: the account's last validated ID token.
    package func claims(account name: String, for peer: Peer, admitted: Admitted) throws(VaultError) -> ClaimsResult {
        let account = try self.admittedAccount(name, admitted)
        try self.checkSignedIn(name)
        guard let claims = account.claims?.value else {
            throw VaultError.noIDTokenYet(name)
        }
        return ClaimsResult(claims: claims)
    }

    /// `userinfo`: the issuer's userinfo, fetched with a fresh access token.
    package func userinfo(account name: String, for peer: Peer, admitted: Admitted) async throws(VaultError) -> UserinfoResult {
        let (token, key) = try await self.boundToken(TokenRequest(account: name), admitted: admitted)
        guard let configuration = self.accounts[name]?.configuration else { throw VaultError.unknownAccount(name) }
        let client = ClientCredentials(clientID: configuration.clientID, secret: nil, dpop: key)
        do {
            let metadata = try await self.oidc.metadata(for: configuration.issuer, now: self.clock.now())
            return UserinfoResult(userinfo: try await self.oidc.userinfo(accessToken: token.accessToken, client: client, metadata: metadata))
        } catch {
            throw VaultError(error, account: name)
        }
    }

    // MARK: The refresh

    /// One refresh against the issuer. The rotated refresh token is written to
    /// the store before anyone sees the new access token; a refresh token that
    /// may have been spent is never sent again from here (no retry loop).
    /// After every suspension it checks that the account is still the same
    /// sign-in (`generation`); if not, it keeps nothing and revokes what the
    /// issuer rotated.
    private func refresh(_ name: String, key: String, scope: String?, generation: Int) async -> Result<CachedToken, VaultError> {
        guard self.accounts[name]?.generation == generation else { return .failure(VaultError.signedOutMeanwhile(name)) }
        do {
            try self.checkSignedIn(name)
        } catch {
            return .failure(error)
        }
        guard let account = self.accounts[name], let refreshToken = account.secrets.refreshToken else {
            return .failure(VaultError.notSignedIn(name))
        }
        // An earlier refresh of another scope set may have just failed.
        let wait = account.backoff.notBefore - self.clock.now()
        guard wait <= 0 else { return .failure(VaultError.idpUnavailable(name, reason: "the last attempt failed", retryAfter: wait)) }
        let configuration = account.configuration
        let proofKey = account.secrets.dpop
        let client = ClientCredentials(clientID: configuration.clientID, secret: account.secrets.clientSecret, dpop: proofKey)
        let answer: TokenAnswer
        let metadata: ProviderMetadata
        do {
            metadata = try await self.oidc.metadata(for: configuration.issuer, now: self.clock.now())
            answer = try await self.oidc.refresh(refreshToken, scope: scope, client: client, metadata: metadata)
        } catch {
            return .failure(self.failed(name, generation: generation, error))
        }
        // An answer whose tokens may not be served still rotated the refresh
        // token: the rotation is kept below, and only then is it refused.
        let response = try? answer.tokens.get()
        let rotated = answer.refreshToken.flatMap { $0 == refreshToken ? nil : $0 }
        guard self.accounts[name]?.generation == generation else {
            return .failure(self.discard(name, rotated: rotated, accessToken: response?.accessToken, client: client, metadata: metadata))
        }
        let now = self.clock.now()
        if let rotated {
            // Memory follows the issuer at once: the old token is spent either way.
            self.accounts[name]?.secrets.refreshToken = rotated
        }
        // An ID token is validated before anything of it is kept or sent: a
        // refused one is neither stored, nor shown by `claims`, nor used as
        // an `id_token_hint`. A refreshed one must name the same subject
        // (OIDC Core §12.2; `iss` and `aud` are checked against the account's).
        var validated: StoredClaims?
        var refused: VaultError?
        if let idToken = response?.idToken {
            do throws(ProviderError) {
                let claims = try await self.oidc.validateIDToken(
                    idToken,
                    clientID: configuration.clientID,
                    nonce: nil,
                    metadata: metadata,
                    now: now
                )
                if let subject = account.claims?.value?["sub"]?.stringValue, claims["sub"]?.stringValue != subject {
                    throw .untrusted(reason: "the refreshed ID token names another subject than the signed-in one")
                }
                validated = StoredClaims(claims, of: idToken)
            } catch {
                self.logger.warning("ID token refused", metadata: ["account": "\(name)", "reason": "\(error)"])
                refused = VaultError(error, account: name)
            }
            guard self.accounts[name]?.generation == generation else {
                return .failure(self.discard(name, rotated: rotated, accessToken: response?.accessToken, client: client, metadata: metadata))
            }
        }
        if let validated, let idToken = response?.idToken {
            self.accounts[name]?.claims = validated
            // Written with a rotated refresh token; else kept in memory until the next write.
            if rotated != nil || self.accounts[name]?.secrets.idToken == nil { self.accounts[name]?.secrets.idToken = idToken }
        }
        if rotated != nil {
            let secrets = self.accounts[name]?.secrets ?? AccountSecrets()
            let owner = self.owner(of: name)
            do {
                try await self.stored { store throws(StoreError) in try await store.save(secrets, for: owner) }
                self.saved(name)
            } catch {
                self.logger.error("rotated refresh token not saved", metadata: ["account": "\(name)", "reason": "\(error.message)"])
                self.notSaved(name, error)
                return .failure(VaultError.rotatedNotSaved(name, error))
            }
            // A sign-out meanwhile removed it again after this save (the store keeps their order).
            guard self.accounts[name]?.generation == generation else {
                return .failure(self.discard(name, rotated: rotated, accessToken: response?.accessToken, client: client, metadata: metadata))
            }
        }
        let served: TokenResponse
        do {
            served = try answer.tokens.get()
        } catch {
            return .failure(self.failed(name, generation: generation, error))
        }
        if let refused { return .failure(refused) }
        let token = CachedToken(
            accessToken: served.accessToken,
            issuedAt: now,
            lifetime: served.expiresIn ?? Self.assumedLifetime,
            // An issuer that names no scope granted what was asked (RFC 6749
            // §5.1), but issuers may ignore a narrowed `scope` on a refresh
            // (§6): the token is taken to carry the whole grant then, so a
            // share of fewer scopes never hands it on.
            scope: served.scope ?? configuration.scopes.joined(separator: " "),
            refreshAhead: configuration.refreshAhead,
            dpop: served.tokenType == "DPoP" ? proofKey : nil
        )
        self.cache.store(token, account: name, key: key)
        self.accounts[name]?.backoff = Backoff()
        var event = Event(.tokenRefreshed, account: name)
        event.expiresAt = Seconds.int64(token.expiresAt)
        self.events.emit(event)
        self.logger.info(
            "token refreshed",
            metadata: ["account": "\(name)", "rotated": "\(rotated != nil)", "expires_in": "\(served.expiresIn ?? -1)"]
        )
        return .success(token)
    }

    /// The account was signed out, locked or signed in anew while a refresh
    /// or sign-in of the old session was out: keep nothing, and revoke the
    /// refresh token the issuer handed out meanwhile (and the access token
    /// that came with it), where it can.
    func discard(
        _ name: String,
        rotated: SecretBytes?,
        accessToken: SecretBytes? = nil,
        client: ClientCredentials,
        metadata: ProviderMetadata
    ) -> VaultError {
        if rotated != nil || accessToken != nil {
            self.logger.notice("tokens issued after sign-out are revoked", metadata: ["account": "\(name)"])
            let oidc = self.oidc
            // Finished even when vaultd stops now: nothing else holds them.
            self.chores.finish {
                await withTaskGroup(of: Void.self) { both in
                    if let rotated { both.addTask { _ = await oidc.revoke(refreshToken: rotated, client: client, metadata: metadata) } }
                    if let accessToken { both.addTask { _ = await oidc.revoke(accessToken: accessToken, client: client, metadata: metadata) } }
                }
            }
        }
        return VaultError.signedOutMeanwhile(name)
    }

    private func failed(_ name: String, generation: Int, _ error: ProviderError) -> VaultError {
        // Signed out (or in anew) meanwhile: the old token's fate says nothing of the account now.
        guard self.accounts[name]?.generation == generation else { return VaultError.signedOutMeanwhile(name) }
        switch error {
        case .invalidGrant:
            self.accounts[name]?.needsReauth = true
            self.cache.clearTokens(account: name)
            self.logger.notice("refresh token rejected; sign-in needed", metadata: ["account": "\(name)"])
            self.events.emit(Event(.reauthRequired, account: name))
        case .unavailable(let reason, let retryAfter):
            self.accounts[name]?.backoff.fail(now: self.clock.now(), retryAfter: retryAfter)
            self.logger.notice("issuer unavailable", metadata: ["account": "\(name)", "reason": "\(reason)"])
        case .rejected, .untrusted:
            self.logger.warning("issuer refused", metadata: ["account": "\(name)", "reason": "\(error)"])
        }
        var wire = VaultError(error, account: name)
        if wire.code == .idpUnavailable, let notBefore = self.accounts[name]?.backoff.notBefore {
            wire.retryAfterMs = Seconds.milliseconds(notBefore - self.clock.now())
        }
        return wire
    }

    // MARK: Rules

    private func checkSignedIn(_ name: String) throws(VaultError) {
        guard let account = self.accounts[name] else { throw VaultError.unknownAccount(name) }
        try self.requireUnlocked()
        if account.needsReauth { throw VaultError.reauthRequired(name) }
        guard account.secrets.refreshToken != nil else { throw VaultError.notSignedIn(name) }
    }

    /// The account `name`, while it is the one the gate admitted the caller
    /// to: not one removed since, nor one added under the name since (nor
    /// since the gate found no account of that name).
    private func admittedAccount(_ name: String, _ admitted: Admitted) throws(VaultError) -> Account {
        guard admitted.account == name, let account = self.accounts[name], let identity = account.configuration.identity,
            identity == admitted.identity
        else { throw VaultError.unknownAccount(name) }
        return account
    }
}


extension AccountSecrets {
    /// The grant's DPoP key; nil for a bearer grant (or a key of an
    /// algorithm this vaultd does not know).
    var dpop: DPoPKey? {
        self.dpopKey.flatMap { sealed in (try? DPoPKey(sealed: sealed)) ?? nil }
    }
}
