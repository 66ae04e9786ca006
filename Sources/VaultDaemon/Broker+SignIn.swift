import Logging
import VaultCrypto
import VaultJSON
public import VaultOIDC
public import VaultProtocol
import VaultStore

/// What a sign-in flow needs to know of its account.
public struct SignInAccount: Sendable {
    public var configuration: AccountConfiguration
    public var client: ClientCredentials
    /// The account's sign-in when the flow started: a sign-out, lock or
    /// other sign-in since fences the flow's completion.
    var generation: Int
}

extension Broker {
    /// The account a flow signs in to; refused while the vault is locked,
    /// since the new refresh token could not be stored.
    func signInAccount(_ name: String) throws(VaultError) -> SignInAccount {
        guard let account = self.accounts[name] else { throw VaultError.unknownAccount(name) }
        try self.requireUnlocked()
        return SignInAccount(
            configuration: account.configuration,
            client: ClientCredentials(clientID: account.configuration.clientID, secret: account.secrets.clientSecret),
            generation: account.generation
        )
    }

    /// The issuer's metadata, with issuer errors as wire errors.
    func metadata(for account: SignInAccount) async throws(VaultError) -> ProviderMetadata {
        do {
            return try await self.oidc.metadata(for: account.configuration.issuer, now: self.clock.now())
        } catch {
            throw VaultError(error, account: account.configuration.name)
        }
    }

    /// Ends a successful sign-in: validates the ID token (with the flow's
    /// nonce), stores the refresh token durably, replaces whatever the
    /// account held, caches the access token and tells subscribers.
    /// Returns the username from the validated ID token. A sign-in whose
    /// account was signed out, locked or signed in otherwise since the flow
    /// started (`generation`) keeps nothing, and its refresh token is revoked.
    func completeSignIn(
        _ name: String,
        generation: Int,
        response: TokenResponse,
        nonce: String?,
        metadata: ProviderMetadata
    ) async throws(VaultError) -> String? {
        guard let account = self.accounts[name] else { throw VaultError.unknownAccount(name) }
        let configuration = account.configuration
        let client = ClientCredentials(clientID: configuration.clientID, secret: account.secrets.clientSecret)
        guard account.generation == generation else {
            throw self.discard(name, rotated: response.refreshToken, client: client, metadata: metadata)
        }
        guard let refreshToken = response.refreshToken else {
            throw VaultError(
                .idpError,
                "the issuer of '\(name)' sent no refresh token; add the offline_access scope to the account",
                error: "no_refresh_token"
            )
        }
        let now = self.clock.now()
        var claims: JSONValue?
        if let idToken = response.idToken {
            do {
                claims = try await self.oidc.validateIDToken(
                    idToken,
                    clientID: configuration.clientID,
                    nonce: nonce,
                    metadata: metadata,
                    now: now
                )
            } catch {
                self.logger.warning("ID token refused at sign-in", metadata: ["account": "\(name)", "reason": "\(error)"])
                throw VaultError(error, account: name)
            }
        }
        guard self.accounts[name] != nil else { throw VaultError.unknownAccount(name) }
        guard self.accounts[name]?.generation == generation else {
            throw self.discard(name, rotated: refreshToken, client: client, metadata: metadata)
        }
        let clientSecret = self.accounts[name]?.secrets.clientSecret
        let secrets = AccountSecrets(refreshToken: refreshToken, clientSecret: clientSecret, idToken: response.idToken)
        do {
            try await self.stored { store throws(StoreError) in try await store.save(secrets, for: name) }
        } catch {
            self.logger.error("signed-in refresh token not saved", metadata: ["account": "\(name)", "reason": "\(error.message)"])
            throw VaultError(error)
        }
        // A sign-out meanwhile removed it again after this save (the store keeps their order).
        guard self.accounts[name]?.generation == generation else {
            throw self.discard(name, rotated: refreshToken, client: client, metadata: metadata)
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
            refreshAhead: configuration.refreshAhead
        )
        self.cache.store(token, account: name, key: TokenCache.key(configuration.scopes))
        let username = self.accounts[name]?.username
        self.logger.info("signed in", metadata: ["account": "\(name)"])
        var event = Event(.signedIn, account: name)
        event.username = username
        self.events.emit(event)
        return username
    }
}
