import CLibSecret
import Dispatch
public import NIOPosix
import Synchronization
public import VaultCrypto
public import VaultProtocol

/// The `keyring` backend: one Secret Service item per account in the default
/// collection (gnome-keyring's `login`, or KeePassXC's or KWallet's), with the
/// attributes `application=tokenvault`, `account=NAME` and the label
/// `tokenvault: NAME`. The secret is the account's record (the same encoding
/// the file backend seals), stored as `application/octet-stream`.
///
/// Every call runs on the I/O thread pool, never on an event loop or the
/// cooperative pool, and carries a `GCancellable` that a timer cancels after
/// `timeout`: a Secret Service that hangs costs one call `timeout`, never the
/// daemon. Secrets cross D-Bus encrypted (libsecret's DH session) and sit
/// only in libsecret's wiped, non-pageable memory and in `SecretBytes`.
///
/// `isLocked` is what the Secret Service said last (or `lock()`): the
/// property cannot block on D-Bus. `checkLocked()` asks.
public final class KeyringStore: SecretStore {
    public let backend = Backend.keyring

    /// How long any one call may take before it is given up.
    public static let defaultTimeout: Duration = .seconds(2)
    /// How long `unlock` waits for a person to answer the keyring's prompt.
    public static let defaultUnlockTimeout: Duration = .seconds(60)

    static let application = "tokenvault"
    static let contentType = "application/octet-stream"

    public let timeout: Duration
    public let unlockTimeout: Duration
    private let threadPool: NIOThreadPool
    private let services = ServiceCache()
    private let state: Mutex<State>

    private struct State {
        /// `lock()` was called: refuse everything until `unlock`.
        var held = false
        /// The default collection was locked when last asked.
        var collectionLocked = false
        /// Why the Secret Service could not be reached when last asked by
        /// `checkLocked` (no session bus, nothing owning its name); nil once
        /// any call has succeeded.
        var unreachable: String?
    }

    /// Talks to no one yet: the first call connects to the session bus
    /// (`$DBUS_SESSION_BUS_ADDRESS`) and the Secret Service on it
    /// (`org.freedesktop.secrets`; libsecret honours `$SECRET_SERVICE_BUS_NAME`).
    public init(
        timeout: Duration = KeyringStore.defaultTimeout,
        unlockTimeout: Duration = KeyringStore.defaultUnlockTimeout,
        threadPool: NIOThreadPool = .singleton
    ) {
        self.timeout = timeout
        self.unlockTimeout = unlockTimeout
        self.threadPool = threadPool
        self.state = Mutex(State())
    }

    /// Also true while the Secret Service is out of reach (`unreachable`):
    /// either way the secrets cannot be read until `unlock` succeeds.
    public var isLocked: Bool { self.state.withLock { $0.held || $0.collectionLocked || $0.unreachable != nil } }

    /// Why the Secret Service could not be reached when `checkLocked` (or
    /// `unlock`) last asked, until a call succeeds.
    public var unreachable: String? { self.state.withLock { $0.unreachable } }

    /// The keyring keeps no binding: its items are the desktop's, readable by
    /// the user's programs through the Secret Service anyway; an item is found by name.
    public func load(_ owner: RecordOwner) async throws(StoreError) -> AccountSecrets? {
        let account = owner.name
        return try await self.perform { (call) throws(StoreError) -> AccountSecrets? in
            let lib = call.lib
            guard let collection = try call.defaultCollection() else { return nil }
            defer { lib.g_object_unref(collection) }
            try call.requireUnlocked(collection)
            let list = try call.items(in: collection, account: account, loadSecrets: true)
            defer { call.freeList(list) }
            let newest = KeyringCall.elements(list).max { lib.secret_item_get_modified($0) < lib.secret_item_get_modified($1) }
            guard let newest else { return nil }
            // A locked item's secret does not load.
            guard let value = lib.secret_item_get_secret(newest) else { throw call.locked() }
            defer { lib.secret_value_unref(UnsafeMutableRawPointer(value)) }
            var length: gsize = 0
            guard let bytes = lib.secret_value_get(value, &length) else {
                throw StoreError(.corrupt, "the keyring item of '\(account)' holds no secret")
            }
            let plaintext: SecretBytes
            do {
                plaintext = try SecretBytes(copying: UnsafeRawBufferPointer(start: bytes, count: Int(length)))
            } catch {
                throw StoreError(.io, "could not allocate guarded memory for a record")
            }
            do throws(StoreError) {
                return try AccountSecrets(decoding: plaintext)
            } catch {
                throw StoreError(.corrupt, "the keyring item of '\(account)' is not a tokenvault record: \(error.message)")
            }
        }
    }

    public func save(_ secrets: AccountSecrets, for owner: RecordOwner) async throws(StoreError) {
        let account = owner.name
        try await self.perform { (call) throws(StoreError) in
            let lib = call.lib
            guard let collection = try call.defaultCollection() else { throw KeyringCall.noDefaultCollection }
            defer { lib.g_object_unref(collection) }
            try call.requireUnlocked(collection)
            let plaintext = try secrets.encoded()
            // Copied into libsecret's non-pageable memory, wiped when freed.
            let value = plaintext.withUnsafeBytes { bytes in
                lib.secret_value_new(bytes.baseAddress?.assumingMemoryBound(to: gchar.self), bytes.count, Self.contentType)
            }
            guard let value else { throw StoreError(.io, "could not hand the record of '\(account)' to libsecret") }
            defer { lib.secret_value_unref(UnsafeMutableRawPointer(value)) }
            let attributes = call.attributes(account)
            defer { lib.g_hash_table_unref(attributes) }
            var error: UnsafeMutablePointer<GError>?
            let item = lib.secret_item_create_sync(
                collection,
                tv_account_schema(),
                attributes,
                "tokenvault: \(account)",
                value,
                SECRET_ITEM_CREATE_REPLACE,
                call.cancellable,
                &error
            )
            if let error {
                if let item { lib.g_object_unref(item) }
                throw call.failure(error, "store the secrets of '\(account)'")
            }
            guard let item else { throw StoreError(.unavailable, "the Secret Service stored no item for '\(account)'") }
            defer { lib.g_object_unref(item) }
            // One item per account: drop others that match (an older item
            // made by another tool, without our schema name, is not replaced).
            let kept = call.objectPath(item)
            let list = try call.items(in: collection, account: account, loadSecrets: false)
            defer { call.freeList(list) }
            for other in KeyringCall.elements(list) where call.objectPath(other) != kept {
                try call.delete(other, account: account)
            }
        }
    }

    public func remove(_ account: String) async throws(StoreError) -> Bool {
        try await self.perform { (call) throws(StoreError) -> Bool in
            guard let collection = try call.defaultCollection() else { return false }
            defer { call.lib.g_object_unref(collection) }
            try call.requireUnlocked(collection)
            let list = try call.items(in: collection, account: account, loadSecrets: false)
            defer { call.freeList(list) }
            let items = KeyringCall.elements(list)
            for item in items {
                try call.delete(item, account: account)
            }
            return !items.isEmpty
        }
    }

    /// Stops handing out or taking secrets until `unlock`. The user's keyring
    /// itself stays as it is: locking it would lock every other application.
    public func lock() async {
        self.state.withLock { $0.held = true }
    }

    /// Ends `lock()`, then unlocks the default collection if it is locked:
    /// the Secret Service asks the person in the desktop session (the
    /// passphrase is not used; the keyring's own prompt takes the password).
    /// Without a desktop to show the prompt this fails with `.locked`.
    public func unlock(passphrase: SecretBytes?) async throws(StoreError) {
        self.state.withLock { $0.held = false }
        guard try await self.checkLocked() else { return }
        let noAnswer = StoreError(
            .locked,
            "no one answered the keyring's unlock prompt within \(Self.describe(self.unlockTimeout)); "
                + "unlock the keyring in your desktop session and retry"
        )
        try await self.perform(timeout: self.unlockTimeout, timeoutError: noAnswer) { (call) throws(StoreError) in
            let lib = call.lib
            guard let collection = try call.defaultCollection() else { throw KeyringCall.noDefaultCollection }
            defer { lib.g_object_unref(collection) }
            guard lib.secret_collection_get_locked(collection) != 0 else {
                call.observedLocked = false
                return
            }
            let objects = lib.g_list_append(nil, UnsafeMutableRawPointer(collection))
            defer { lib.g_list_free(objects) }
            var error: UnsafeMutablePointer<GError>?
            let unlocked = lib.secret_service_unlock_sync(call.service, objects, call.cancellable, nil, &error)
            if let error { throw call.failure(error, "unlock the default keyring") }
            guard unlocked > 0 else {
                call.observedLocked = true
                throw StoreError(
                    .locked,
                    "the keyring's default collection stayed locked (its unlock prompt was dismissed or could not be shown); "
                        + "unlock it in your desktop session, for example in Seahorse, and retry"
                )
            }
            call.observedLocked = false
        }
    }

    /// Asks the Secret Service whether the default collection is locked, and
    /// updates `isLocked`; when it cannot be reached, `isLocked` stays true
    /// and `unreachable` says why, until a call succeeds.
    public func checkLocked() async throws(StoreError) -> Bool {
        do throws(StoreError) {
            return try await self.perform(honouringLock: false) { (call) throws(StoreError) -> Bool in
                guard let collection = try call.defaultCollection() else { throw KeyringCall.noDefaultCollection }
                defer { call.lib.g_object_unref(collection) }
                let locked = call.lib.secret_collection_get_locked(collection) != 0
                call.observedLocked = locked
                return locked
            }
        } catch {
            if error.kind == .unavailable {
                // The cause alone: the advice on choosing a backend does not
                // help accounts whose secrets are in the keyring already.
                let cause = error.message.hasSuffix(Self.advice) ? String(error.message.dropLast(Self.advice.count)) : error.message
                self.state.withLock { $0.unreachable = cause }
            }
            throw error
        }
    }

    /// Whether a Secret Service answers within `timeout` with an unlocked
    /// default collection: the `auto` backend's test. `.locked` when it
    /// answers but the collection is locked, `.unavailable` otherwise.
    public static func probe(
        timeout: Duration = KeyringStore.defaultTimeout,
        threadPool: NIOThreadPool = .singleton
    ) async -> Result<Void, StoreError> {
        let timeoutError = Self.timeoutError(timeout)
        do {
            let (result, _) = try await Self.offload(threadPool) {
                KeyringCall.run(services: ServiceCache(), timeout: timeout, timeoutError: timeoutError) {
                    (call) throws(StoreError) in
                    guard let collection = try call.defaultCollection() else { throw KeyringCall.noDefaultCollection }
                    defer { call.lib.g_object_unref(collection) }
                    try call.requireUnlocked(collection)
                }
            }
            return result
        } catch {
            return .failure(error)
        }
    }

    /// Runs `body` against the Secret Service on the thread pool and records
    /// the lock state it saw.
    private func perform<T: Sendable>(
        honouringLock: Bool = true,
        timeout: Duration? = nil,
        timeoutError: StoreError? = nil,
        _ body: @escaping @Sendable (KeyringCall) throws(StoreError) -> T
    ) async throws(StoreError) -> T {
        if honouringLock && self.state.withLock({ $0.held }) {
            throw StoreError(.locked, "the vault is locked")
        }
        let timeout = timeout ?? self.timeout
        let services = self.services
        let timeoutError = timeoutError ?? Self.timeoutError(timeout)
        let (result, observedLocked) = try await Self.offload(self.threadPool) {
            KeyringCall.run(services: services, timeout: timeout, timeoutError: timeoutError, body)
        }
        self.state.withLock { state in
            if let observedLocked { state.collectionLocked = observedLocked }
            if case .success = result { state.unreachable = nil }
        }
        return try result.get()
    }

    private static func offload<T: Sendable>(
        _ threadPool: NIOThreadPool,
        _ body: @escaping @Sendable () -> T
    ) async throws(StoreError) -> T {
        do {
            return try await threadPool.runIfActive(body)
        } catch {
            throw StoreError(.unavailable, "the I/O thread pool has stopped")
        }
    }

    /// What ends the message of a Secret Service that cannot be reached.
    static let advice = "; run vaultd under a desktop session or choose --backend file"

    static func timeoutError(_ timeout: Duration) -> StoreError {
        StoreError(
            .unavailable,
            "the Secret Service did not answer within \(Self.describe(timeout))\(Self.advice)"
        )
    }

    /// "2 s", "0.5 s".
    static func describe(_ duration: Duration) -> String {
        let milliseconds = duration.milliseconds
        if milliseconds % 1000 == 0 { return "\(milliseconds / 1000) s" }
        return "\(Double(milliseconds) / 1000) s"
    }
}

extension Duration {
    var nanoseconds: Int {
        let (seconds, attoseconds) = self.components
        return Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
    }

    var milliseconds: Int { self.nanoseconds / 1_000_000 }
}
