package import Logging
package import VaultCrypto
import VaultJSON
package import VaultOIDC
package import VaultProtocol
package import VaultStore

/// Owns the accounts: their configuration, their secrets in memory, and the
/// store those secrets rest in. One actor, so every change to an account is
/// ordered; the store's blocking work runs on the I/O thread pool.
package actor Broker {
    var store: any SecretStore
    /// Other backends that may hold an account's secrets (left there by an
    /// earlier configuration): sign-out empties them too, `migrate` moves to one.
    var alsoWipe: [any SecretStore]
    /// Why the daemon uses the backend it does (for `status`).
    var backendReason: String?
    let directory: AccountDirectory
    let keySource: KeySource?
    let oidc: OIDCClient
    let clock: any WallClock
    let logger: Logger
    var accounts: [String: Account] = [:]
    /// Access tokens, readable from the event loops without this actor.
    nonisolated let cache: TokenCache
    /// Subscribers, told of sign-ins, refreshes and lost sessions.
    nonisolated let events: any EventSink
    /// Every read and write of secrets, in the order the broker asked for them.
    let storeQueue = SerialQueue()
    /// Every write of accounts.json, each of the configuration as it is then.
    let directoryWrites = SerialQueue()
    /// The work done later or beside a request, on `clock`: run by the daemon.
    nonisolated let chores: Chores
    /// Returns the heap's free pages after bursts of refreshes and account changes.
    nonisolated let heapTrim: HeapTrim
    /// Numbers each refresh, so a finished one removes only itself.
    var refreshSerial = 0
    /// The last generation handed out; generations are unique across
    /// accounts and their re-creations, so no two sign-ins share one.
    var lastGeneration = 0
    /// Accounts loaded without an identity were given one that accounts.json does not hold yet.
    var identitiesToSave = false
    /// Accounts whose secrets in memory are newer than the store's (a write
    /// failed), and why the last write failed: `status` shows it and writes
    /// them again, and so does the account's next write.
    var unsaved: Set<String> = []
    var storageError: String?
    /// Locks waiting for the refreshes in flight to end: no refresh starts
    /// and the vault answers as locked meanwhile.
    var locking = 0

    struct Account {
        var configuration: AccountConfiguration
        var secrets = AccountSecrets()
        var needsReauth = false
        /// Validated ID-token claims, from the last ID token the issuer sent.
        var claims: StoredClaims?
        /// The one refresh in flight per scope set; every caller awaits it.
        var refreshing: [String: Refresh] = [:]
        /// The last refresh to spend the refresh token; the next waits for it,
        /// so one refresh token is never sent twice, whatever the scope sets.
        var spending: Refresh?
        var backoff = Backoff()
        /// Callers awaiting a refresh of this account.
        var waiting = 0
        /// Renewed whenever secrets are replaced or dropped (sign-in, sign-out,
        /// lock), and new for an account added again under the same name:
        /// work that started before checks it after every suspension and,
        /// when it changed, keeps nothing of what it got.
        var generation: Int

        var username: String? { self.claims?.username }
    }

    package init(
        store: any SecretStore,
        alsoWipe: [any SecretStore] = [],
        backendReason: String? = nil,
        directory: AccountDirectory,
        keySource: KeySource?,
        oidc: OIDCClient,
        clock: any WallClock,
        cache: TokenCache,
        chores: Chores,
        heapTrim: HeapTrim,
        events: any EventSink,
        logger: Logger
    ) throws(VaultError) {
        self.store = store
        self.cache = cache
        self.events = events
        self.alsoWipe = alsoWipe
        self.backendReason = backendReason
        self.directory = directory
        self.keySource = keySource
        self.oidc = oidc
        self.clock = clock
        self.chores = chores
        self.heapTrim = heapTrim
        self.logger = logger
        var shared = SharedText()
        for loaded in try directory.load() {
            // What a neighbour could have written is held to the rules account.add holds a client to.
            try AccountValidation.validate(loaded, in: directory.path)
            var configuration = shared.share(loaded)
            if configuration.identity == nil {
                // An accounts.json from before identities: one is given now and written at the next save.
                configuration.identity = AccountValidation.newIdentity()
                self.identitiesToSave = true
            }
            self.lastGeneration += 1
            self.accounts[configuration.name] = Account(configuration: configuration, generation: self.lastGeneration)
            self.cache.configure(configuration)
        }
    }

    /// Loads every account's secrets into memory; a locked store loads nothing.
    package func start() async throws(VaultError) {
        if self.identitiesToSave {
            try await self.saveDirectory()
            self.identitiesToSave = false
        }
        guard !self.store.isLocked else {
            self.logger.notice("vault is locked; waiting for unlock")
            return
        }
        try await self.loadSecrets()
    }

    private func loadSecrets() async throws(VaultError) {
        for name in self.accounts.keys.sorted() {
            guard let generation = self.accounts[name]?.generation else { continue }
            let secrets: AccountSecrets?
            let owner = self.owner(of: name)
            do {
                secrets = try await self.stored { store throws(StoreError) in try await store.load(owner) }
            } catch where error.kind == .foreign {
                // Sealed for another account, issuer or client than accounts.json now names: left
                // as it is, and never sent to this one's issuer. A new sign-in replaces it.
                self.logger.warning("record not for this account; signed out", metadata: ["account": "\(name)", "reason": "\(error.message)"])
                continue
            } catch {
                throw VaultError(error)
            }
            // A sign-in or sign-out meanwhile knows better than what was read.
            guard self.accounts[name]?.generation == generation else { continue }
            self.accounts[name]?.secrets = secrets ?? AccountSecrets()
            self.accounts[name]?.claims = secrets?.idToken.flatMap(StoredClaims.init(storedIDToken:))
        }
        self.logger.info("secrets loaded", metadata: ["accounts": "\(self.accounts.count)"])
    }

    // MARK: Operations

    package func status() async -> StatusResult {
        await self.saveUnsaved()
        var reason = self.backendReason
        if let unreachable = self.keyringUnreachable {
            reason = (reason.map { $0 + "; " } ?? "") + "but the keyring cannot be reached: \(unreachable) (\(VaultError.keyringRemedy))"
        }
        return StatusResult(
            backend: self.store.backend,
            backendReason: reason,
            locked: self.isLocked,
            keySource: self.keySource?.name,
            accounts: self.accounts.values
                .sorted { $0.configuration.name < $1.configuration.name }
                .map { account in
                    AccountStatus(
                        name: account.configuration.name,
                        issuer: account.configuration.issuer,
                        signedIn: account.secrets.refreshToken != nil,
                        username: account.username,
                        accessTokenExpiresAt: self.cache.token(account: account.configuration.name, key: nil)
                            .map { Seconds.int64($0.expiresAt) },
                        needsReauth: account.needsReauth,
                        dpopJKT: account.secrets.dpop?.thumbprint,
                        clientID: account.configuration.clientID,
                        registration: account.configuration.registration
                    )
                },
            storageError: self.storageError
        )
    }

    /// Writes again the secrets a failed write left only in memory.
    func saveUnsaved() async {
        for name in self.unsaved.sorted() {
            guard let secrets = self.accounts[name]?.secrets, !self.store.isLocked else { continue }
            let owner = self.owner(of: name)
            do {
                try await self.stored { store throws(StoreError) in try await store.save(secrets, for: owner) }
                self.saved(name)
            } catch {
                self.notSaved(name, error)
                return
            }
        }
    }

    /// A write of `name`'s secrets failed: they stay in memory, and `status` says so.
    func notSaved(_ name: String, _ error: StoreError) {
        self.unsaved.insert(name)
        self.storageError = VaultError(error).message
    }

    /// A write of `name`'s secrets succeeded.
    func saved(_ name: String) {
        self.unsaved.remove(name)
        if self.unsaved.isEmpty { self.storageError = nil }
    }

    /// The configurations of the accounts `names`, for a share to bind to.
    func configurations(_ names: [String]) throws(VaultError) -> [AccountConfiguration] {
        var found: [AccountConfiguration] = []
        for name in names {
            guard let configuration = self.accounts[name]?.configuration else { throw VaultError.unknownAccount(name) }
            found.append(configuration)
        }
        return found
    }

    /// Adds an account. One that names no client id gets a client
    /// registered for it at its issuer (RFC 7591), kept as `dynamic`; the
    /// registration is deleted again if the account is not added after all.
    package func add(_ addition: AccountAddition) async throws(VaultError) -> AccountResult {
        var addition = addition
        // The client's word is never taken for where the client id came from.
        addition.configuration.registration = .manual
        guard addition.configuration.clientID.isEmpty else { return try await self.add(addition, registration: nil) }
        var named = addition.configuration
        named.clientID = "-"
        try AccountValidation.validate(named)
        guard self.accounts[named.name] == nil else { throw VaultError.accountExists(named.name) }
        let (registration, redirectURI) = try await self.register(addition)
        addition.configuration.clientID = registration.clientID
        addition.configuration.redirectURI = redirectURI
        addition.configuration.registration = .dynamic
        addition.clientSecret = registration.clientSecret
        do {
            return try await self.add(addition, registration: registration)
        } catch {
            if let token = registration.accessToken, let uri = registration.clientURI.flatMap({ try? SecretBytes(utf8: $0) }) {
                let name = named.name
                self.chores.finish { _ = await self.deleteRegistration(name, token: token, uri: uri) }
            }
            throw error
        }
    }

    private func add(_ addition: AccountAddition, registration: ClientRegistration?) async throws(VaultError) -> AccountResult {
        var shared = SharedText(self.accounts.values.lazy.map(\.configuration))
        var configuration = shared.share(addition.configuration)
        try AccountValidation.validate(configuration)
        // The identity is vaultd's to give, never the client's.
        configuration.identity = AccountValidation.newIdentity()
        let name = configuration.name
        guard self.accounts[name] == nil else {
            throw VaultError.accountExists(name)
        }
        var added = AccountSecrets(refreshToken: addition.refreshToken, clientSecret: addition.clientSecret)
        if let token = registration?.accessToken, let uri = registration?.clientURI {
            added.registrationAccessToken = token
            do {
                added.registrationClientURI = try SecretBytes(utf8: uri)
            } catch {
                throw VaultError.outOfGuardedMemory
            }
        }
        let secrets = added
        if !secrets.isEmpty { try self.requireUnlocked() }
        // Claim the name before the first suspension, so a concurrent add of
        // the same name fails instead of racing; the secrets are queued before
        // anything else can queue a removal of them.
        self.accounts[name] = Account(configuration: configuration, secrets: secrets, generation: self.newGeneration())
        self.cache.configure(configuration)
        let generation = self.accounts[name]?.generation
        let owner = self.owner(of: name)
        do throws(VaultError) {
            if !secrets.isEmpty {
                do {
                    try await self.stored { store throws(StoreError) in try await store.save(secrets, for: owner) }
                } catch {
                    throw VaultError(error)
                }
            }
            try await self.saveDirectory()
        } catch {
            if self.accounts[name]?.generation == generation {
                self.accounts[name] = nil
                self.cache.remove(account: name)
                if !secrets.isEmpty {
                    _ = try? await self.stored { store throws(StoreError) in try await store.remove(name) }
                }
                try? await self.saveDirectory()
            }
            throw error
        }
        self.logger.info(
            "account added",
            metadata: [
                "account": "\(name)",
                "client_secret": "\(secrets.clientSecret != nil)",
                "refresh_token": "\(secrets.refreshToken != nil)",
            ]
        )
        return AccountResult(
            account: configuration,
            hasClientSecret: secrets.clientSecret != nil,
            signedIn: secrets.refreshToken != nil
        )
    }

    /// Signs the account out (revoking its refresh token), then forgets it
    /// and whatever secret it still had (a client secret); last, a client
    /// vaultd registered for it is deleted at the issuer (RFC 7592). If that
    /// fails the account is removed all the same, and the answer says what
    /// is left at the issuer.
    package func remove(_ name: String) async throws(VaultError) -> RemovalResult {
        guard let removing = self.accounts[name]?.configuration else { throw VaultError.unknownAccount(name) }
        let registered = removing.registration
        var receipt = SignOutReceipt(name: name, revoked: .no, wiped: [.memory])
        if !self.store.isLocked {
            receipt = try await self.signOut(name).0
        }
        // Copies of their own: forgetting the account wipes its secrets in
        // place. Only this account's: another removal and an add under the
        // name while the sign-out waited leave another client's here.
        let held = self.accounts[name].flatMap { $0.configuration.identity == removing.identity ? $0.secrets : nil }
        let registration = held.flatMap { secrets -> (SecretBytes, SecretBytes)? in
            guard let token = secrets.registrationAccessToken, let uri = secrets.registrationClientURI else { return nil }
            guard let tokenCopy = try? token.withUnsafeBytes({ bytes throws(SodiumError) in try SecretBytes(copying: bytes) }),
                let uriCopy = try? uri.withUnsafeBytes({ bytes throws(SodiumError) in try SecretBytes(copying: bytes) })
            else { return nil }
            return (tokenCopy, uriCopy)
        }
        self.forgetSecrets(of: name)
        var wiped = Set(receipt.wiped)
        for store in [self.store] + self.alsoWipe {
            do {
                if try await self.stored({ _ throws(StoreError) in try await store.remove(name) }) {
                    wiped.insert(SecretPlace(store.backend))
                }
            } catch {
                throw VaultError(error)
            }
        }
        self.accounts[name] = nil
        self.cache.remove(account: name)
        try await self.saveDirectory()
        let places = SecretPlace.allCases.filter(wiped.contains)
        self.logger.info("account removed", metadata: ["account": "\(name)", "wiped": "\(places)"])
        var result = RemovalResult(account: name, wiped: places, revoked: receipt.revoked)
        if registered == .dynamic {
            if let (token, uri) = registration {
                result.registrationLeft = await self.deleteRegistration(name, token: token, uri: uri)
            } else {
                result.registrationLeft = self.store.isLocked
                    ? "the client registered for it stays at the issuer (the vault is locked: its registration token could not be read)"
                    : "the client registered for it stays at the issuer (the issuer gave no registration token to delete it with)"
            }
            result.registrationDeleted = result.registrationLeft == nil
        }
        return result
    }

    /// Drops the key and every secret from memory. A refresh at the issuer
    /// now has spent the refresh token it sent: the lock waits for it (and
    /// every refresh queued behind it), so the rotation it brings is sealed
    /// before the key goes, and the token read again at `unlock` is the live
    /// one. No refresh starts meanwhile (`requireUnlocked`); the wait is
    /// bounded by the issuer timeout of each.
    package func lock() async {
        self.locking += 1
        while let spending = self.accounts.values.lazy.compactMap(\.spending).first {
            _ = await spending.task.value
            // Its task clears `spending` as it ends; one forgotten meanwhile is not waited for again.
            for (name, account) in self.accounts where account.spending?.serial == spending.serial {
                self.accounts[name]?.spending = nil
            }
        }
        await self.store.lock()
        self.locking -= 1
        for name in self.accounts.keys { self.forgetSecrets(of: name) }
        self.logger.notice("vault locked; secrets dropped from memory")
    }

    package func unlock(passphrase: SecretBytes?) async throws(VaultError) {
        do {
            try await self.store.unlock(passphrase: passphrase)
        } catch {
            self.logger.notice("unlock refused", metadata: ["reason": "\(error.kind)"])
            throw VaultError(error)
        }
        self.logger.notice("vault unlocked")
        try await self.loadSecrets()
    }

    // MARK: Helpers

    /// Drops an account's secrets and every token minted from them, and
    /// fences whatever is in flight for them: refreshes and sign-ins that
    /// started before keep nothing of what they get.
    func forgetSecrets(of name: String) {
        guard var account = self.accounts[name] else { return }
        account.secrets = AccountSecrets()
        account.claims = nil
        account.needsReauth = false
        account.backoff = Backoff()
        account.generation = self.newGeneration()
        self.saved(name)
        account.refreshing = [:]
        account.spending = nil
        self.accounts[name] = account
        self.cache.clearTokens(account: name)
    }

    /// Who `name`'s record belongs to: the account's identity, issuer and client.
    func owner(of name: String) -> RecordOwner {
        guard let configuration = self.accounts[name]?.configuration, let identity = configuration.identity else {
            return RecordOwner(unbound: name)
        }
        return RecordOwner(name: name, identity: identity, issuer: configuration.issuer, clientID: configuration.clientID)
    }

    func newGeneration() -> Int {
        self.lastGeneration += 1
        return self.lastGeneration
    }

    /// Runs `body` on the store in use when its turn comes, after every
    /// store operation asked for before it.
    func stored<T: Sendable>(
        _ body: @escaping @Sendable (any SecretStore) async throws(StoreError) -> T
    ) async throws(StoreError) -> T {
        let task = self.storeQueue.enqueue { () async -> Result<T, StoreError> in
            let store = await self.store
            do throws(StoreError) {
                return .success(try await body(store))
            } catch {
                return .failure(error)
            }
        }
        return try await task.value.get()
    }

    /// Writes accounts.json as it stands when its turn comes, after every
    /// earlier write: the last write on disk always holds the latest state.
    func saveDirectory() async throws(VaultError) {
        let task = self.directoryWrites.enqueue { () async -> Result<Void, VaultError> in
            await self.writeDirectory()
        }
        defer { self.heapTrim.soon() }
        try await task.value.get()
    }

    private func writeDirectory() async -> Result<Void, VaultError> {
        do throws(VaultError) {
            try await self.directory.save(self.accounts.values.map(\.configuration), backend: self.store.backend)
            return .success(())
        } catch {
            return .failure(error)
        }
    }

    /// Why the keyring that holds the secrets cannot be reached, while it cannot.
    var keyringUnreachable: String? { (self.store as? KeyringStore)?.unreachable }

    /// Why the configured store cannot read or write: a locked vault, or a
    /// keyring out of reach.
    var lockedError: VaultError { self.keyringUnreachable.map(VaultError.keyringUnreachable) ?? .vaultLocked }

    /// The one lock check: throws `locked` while the configured store cannot
    /// read or write.
    func requireUnlocked() throws(VaultError) {
        if self.isLocked { throw self.lockedError }
    }

    /// The configured store is locked, or a `lock` is on its way.
    var isLocked: Bool { self.store.isLocked || self.locking > 0 }
}
