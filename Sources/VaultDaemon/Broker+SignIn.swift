import Logging
import VaultCrypto
import VaultJSON
import VaultOIDC
import VaultProtocol
import VaultStore

/// What a sign-in flow needs of its account, captured once when the flow
/// starts and kept on the flow: the slice asks the broker nothing more until
/// it completes.
struct SignInContext: Sendable {
    var configuration: AccountConfiguration
    var client: ClientCredentials
    var metadata: ProviderMetadata
    /// The account's sign-in when the flow started: a sign-out, lock or
    /// other sign-in since fences the flow's completion.
    var generation: Int

    var name: String { self.configuration.name }
    var scope: String { self.configuration.scopes.joined(separator: " ") }
}

/// The broker as the sign-in slice sees it: two doors, one in and one out.
protocol SignInBroker: Actor {
    /// Everything a flow of `name` needs, or why it cannot start.
    func signInContext(_ name: String) async throws(VaultError) -> SignInContext
    /// Keeps what a flow got; returns the username from the ID token.
    func completeSignIn(_ context: SignInContext, response: TokenResponse, nonce: String?) async throws(VaultError) -> String?
}

extension Broker: SignInBroker {
    /// The sign-in context of an account: its configuration, client
    /// credentials, the issuer's metadata and the generation fence. Refused
    /// while the vault is locked, since the new refresh token could not be
    /// stored.
    func signInContext(_ name: String) async throws(VaultError) -> SignInContext {
        guard let account = self.accounts[name] else { throw VaultError.unknownAccount(name) }
        try self.requireUnlocked()
        let configuration = account.configuration
        var client = ClientCredentials(clientID: configuration.clientID, secret: account.secrets.clientSecret)
        // The fence is the account's as it was asked for; the metadata is fetched after.
        let generation = account.generation
        let metadata: ProviderMetadata
        do {
            metadata = try await self.oidc.metadata(for: configuration.issuer, now: self.clock.now())
        } catch {
            throw VaultError(error, account: name)
        }
        // The grant's DPoP key is made now, for every request of the sign-in.
        if configuration.dpop != .off {
            do {
                client.dpop = try DPoPKey.generate(supported: metadata.dpopSigningAlgValuesSupported ?? [])
            } catch {
                throw VaultError.outOfGuardedMemory
            }
            if client.dpop == nil, configuration.dpop == .required { throw VaultError.dpopNotOffered(name) }
        }
        return SignInContext(configuration: configuration, client: client, metadata: metadata, generation: generation)
    }

    /// Ends a successful sign-in: validates the ID token (with the flow's
    /// nonce), stores the refresh token durably, replaces whatever the
    /// account held, caches the access token and tells subscribers.
    /// Returns the username from the validated ID token. A sign-in whose
    /// account was signed out, locked or signed in otherwise since the flow
    /// started (`generation`) keeps nothing, and its refresh token is revoked.
    func completeSignIn(_ context: SignInContext, response: TokenResponse, nonce: String?) async throws(VaultError) -> String? {
        let name = context.name
        let generation = context.generation
        let metadata = context.metadata
        guard let account = self.accounts[name] else { throw VaultError.unknownAccount(name) }
        let configuration = account.configuration
        let client = ClientCredentials(clientID: configuration.clientID, secret: account.secrets.clientSecret)
        guard account.generation == generation else {
            throw self.fenced(name, rotated: response.refreshToken, client: client, metadata: metadata)
        }
        guard let refreshToken = response.refreshToken else {
            throw VaultError.noRefreshToken(name)
        }
        // The key is kept only when the issuer bound the tokens to it.
        let key = response.tokenType == "DPoP" ? context.client.dpop : nil
        if key == nil, configuration.dpop == .required {
            self.logger.warning("the issuer bound no key; the refresh token is revoked", metadata: ["account": "\(name)"])
            let oidc = self.oidc
            self.chores.finish { _ = await oidc.revoke(refreshToken: refreshToken, client: client, metadata: metadata) }
            throw VaultError.dpopNotBound(name)
        }
        let sealedKey: SecretBytes?
        do {
            sealedKey = try key?.sealed
        } catch {
            throw VaultError.outOfGuardedMemory
        }
        let now = self.clock.now()
        var claims: StoredClaims?
        if let idToken = response.idToken {
            do {
                let validated = try await self.oidc.validateIDToken(
                    idToken,
                    clientID: configuration.clientID,
                    nonce: nonce,
                    metadata: metadata,
                    now: now
                )
                claims = StoredClaims(validated, of: idToken)
            } catch {
                self.logger.warning("ID token refused at sign-in", metadata: ["account": "\(name)", "reason": "\(error)"])
                throw VaultError(error, account: name)
            }
        }
        guard self.accounts[name] != nil else { throw VaultError.unknownAccount(name) }
        guard self.accounts[name]?.generation == generation else {
            throw self.fenced(name, rotated: refreshToken, client: client, metadata: metadata)
        }
        var signedIn = self.accounts[name]?.secrets.client ?? AccountSecrets()
        signedIn.refreshToken = refreshToken
        signedIn.idToken = response.idToken
        signedIn.dpopKey = sealedKey
        let secrets = signedIn
        do {
            let owner = self.owner(of: name)
            try await self.stored { store throws(StoreError) in try await store.save(secrets, for: owner) }
        } catch {
            self.logger.error("signed-in refresh token not saved", metadata: ["account": "\(name)", "reason": "\(error.message)"])
            throw VaultError(error)
        }
        // A sign-out meanwhile removed it again after this save (the store keeps their order).
        guard self.accounts[name]?.generation == generation else {
            throw self.fenced(name, rotated: refreshToken, client: client, metadata: metadata)
        }
        // Whatever the account held before is replaced, with every token minted from it.
        self.forgetSecrets(of: name)
        self.accounts[name]?.secrets = secrets
        self.accounts[name]?.claims = claims
        let token = CachedToken(
            accessToken: response.accessToken,
            issuedAt: now,
            lifetime: response.expiresIn ?? Self.assumedLifetime,
            scope: response.scope ?? configuration.scopes.joined(separator: " "),
            refreshAhead: configuration.refreshAhead,
            dpop: key
        )
        self.cache.store(token, account: name, key: TokenCache.key(configuration.scopes))
        let username = self.accounts[name]?.username
        self.logger.info("signed in", metadata: ["account": "\(name)"])
        var event = Event(.signedIn, account: name)
        event.username = username
        self.events.emit(event)
        return username
    }

    /// A sign-in fenced by its generation keeps nothing and revokes the
    /// refresh token it got; when the vault was locked since, it says so.
    private func fenced(_ name: String, rotated: SecretBytes?, client: ClientCredentials, metadata: ProviderMetadata) -> VaultError {
        let error = self.discard(name, rotated: rotated, client: client, metadata: metadata)
        return self.store.isLocked ? self.lockedError : error
    }
}
