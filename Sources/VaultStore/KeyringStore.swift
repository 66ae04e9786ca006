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

    public func load(_ account: String) async throws(StoreError) -> AccountSecrets? {
        try await self.perform { (call) throws(StoreError) -> AccountSecrets? in
            guard let collection = try call.defaultCollection() else { return nil }
            defer { g_object_unref(collection) }
            try call.requireUnlocked(collection)
            let list = try call.items(in: collection, account: account, loadSecrets: true)
            defer { tv_object_list_free(list) }
            let newest = KeyringCall.elements(list).max { secret_item_get_modified($0) < secret_item_get_modified($1) }
            guard let newest else { return nil }
            // A locked item's secret does not load.
            guard let value = secret_item_get_secret(newest) else { throw call.locked() }
            defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
            var length: gsize = 0
            guard let bytes = secret_value_get(value, &length) else {
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

    public func save(_ secrets: AccountSecrets, for account: String) async throws(StoreError) {
        try await self.perform { (call) throws(StoreError) in
            guard let collection = try call.defaultCollection() else { throw KeyringCall.noDefaultCollection }
            defer { g_object_unref(collection) }
            try call.requireUnlocked(collection)
            let plaintext = try secrets.encoded()
            // Copied into libsecret's non-pageable memory, wiped when freed.
            let value = plaintext.withUnsafeBytes { bytes in
                secret_value_new(bytes.baseAddress?.assumingMemoryBound(to: gchar.self), bytes.count, Self.contentType)
            }
            guard let value else { throw StoreError(.io, "could not hand the record of '\(account)' to libsecret") }
            defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
            let attributes = tv_account_attributes(Self.application, account)
            defer { g_hash_table_unref(attributes) }
            var error: UnsafeMutablePointer<GError>?
            let item = secret_item_create_sync(
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
                if let item { g_object_unref(item) }
                throw call.failure(error, "store the secrets of '\(account)'")
            }
            guard let item else { throw StoreError(.unavailable, "the Secret Service stored no item for '\(account)'") }
            defer { g_object_unref(item) }
            // One item per account: drop others that match (an older item
            // made by another tool, without our schema name, is not replaced).
            let kept = String(cString: tv_object_path(item))
            let list = try call.items(in: collection, account: account, loadSecrets: false)
            defer { tv_object_list_free(list) }
            for other in KeyringCall.elements(list) where String(cString: tv_object_path(other)) != kept {
                try call.delete(other, account: account)
            }
        }
    }

    public func remove(_ account: String) async throws(StoreError) -> Bool {
        try await self.perform { (call) throws(StoreError) -> Bool in
            guard let collection = try call.defaultCollection() else { return false }
            defer { g_object_unref(collection) }
            try call.requireUnlocked(collection)
            let list = try call.items(in: collection, account: account, loadSecrets: false)
            defer { tv_object_list_free(list) }
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
            guard let collection = try call.defaultCollection() else { throw KeyringCall.noDefaultCollection }
            defer { g_object_unref(collection) }
            guard secret_collection_get_locked(collection) != 0 else {
                call.observedLocked = false
                return
            }
            let objects = g_list_append(nil, UnsafeMutableRawPointer(collection))
            defer { g_list_free(objects) }
            var error: UnsafeMutablePointer<GError>?
            let unlocked = secret_service_unlock_sync(call.service, objects, call.cancellable, nil, &error)
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
                defer { g_object_unref(collection) }
                let locked = secret_collection_get_locked(collection) != 0
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
                    defer { g_object_unref(collection) }
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
    fileprivate var nanoseconds: Int {
        let (seconds, attoseconds) = self.components
        return Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
    }

    fileprivate var milliseconds: Int { self.nanoseconds / 1_000_000 }
}

/// One conversation with the Secret Service, on one thread of the pool, from
/// connecting to freeing the last object. Its own GLib main context is the
/// thread's default for the whole call, so the signal subscriptions of the
/// collection and item proxies it makes land there and are drained and freed
/// with it, not queued forever on the global default context, which no one
/// runs in this process.
private final class KeyringCall {
    let service: UnsafeMutablePointer<SecretService>
    let cancellable: UnsafeMutablePointer<GCancellable>
    let timeoutError: StoreError
    /// Whether the default collection was seen locked (nil: not looked at).
    var observedLocked: Bool?

    private init(
        service: UnsafeMutablePointer<SecretService>,
        cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) {
        self.service = service
        self.cancellable = cancellable
        self.timeoutError = timeoutError
    }

    static let noDefaultCollection = StoreError(
        .unavailable,
        "the Secret Service has no default keyring; create one (for example in Seahorse) or choose --backend file"
    )

    /// Runs `body` within `timeout`. A call that fails on a kept service
    /// (the keyring may have restarted and forgotten its session) is tried
    /// once more on a new one, within the same deadline.
    static func run<T>(
        services: ServiceCache,
        timeout: Duration,
        timeoutError: StoreError,
        _ body: (KeyringCall) throws(StoreError) -> T
    ) -> (Result<T, StoreError>, Bool?) {
        let context = g_main_context_new()
        g_main_context_push_thread_default(context)
        defer {
            // Runs what freeing the proxies queued (their subscriptions' clean-up).
            while g_main_context_iteration(context, 0) != 0 {}
            g_main_context_pop_thread_default(context)
            g_main_context_unref(context)
        }
        let timer = CancelTimer()
        let work = DispatchWorkItem { [timer] in timer.cancel() }
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(timeout.nanoseconds), execute: work)
        defer { work.cancel() }

        while true {
            let service: CachedService
            let fresh: Bool
            do {
                try SessionBus.connect(timer.cancellable, timeoutError: timeoutError)
                (service, fresh) = try services.service(timer.cancellable, timeoutError: timeoutError)
            } catch {
                return (.failure(error), nil)
            }
            let call = KeyringCall(service: service.service, cancellable: timer.cancellable, timeoutError: timeoutError)
            do {
                let value = try body(call)
                return (.success(value), call.observedLocked)
            } catch {
                let timedOut = g_cancellable_is_cancelled(timer.cancellable) != 0
                if error.kind == .unavailable && !fresh && !timedOut {
                    services.discard(service)
                    continue
                }
                if error.kind == .locked && call.observedLocked == nil { call.observedLocked = true }
                return (.failure(error), call.observedLocked)
            }
        }
    }

    /// The collection behind the `default` alias, or nil when there is none.
    func defaultCollection() throws(StoreError) -> UnsafeMutablePointer<SecretCollection>? {
        var error: UnsafeMutablePointer<GError>?
        let collection = secret_collection_for_alias_sync(
            self.service, "default", SECRET_COLLECTION_NONE, self.cancellable, &error
        )
        if let error {
            if let collection { g_object_unref(collection) }
            throw self.failure(error, "find the default keyring")
        }
        return collection
    }

    /// A locked collection answers searches as if it were empty: ask first.
    func requireUnlocked(_ collection: UnsafeMutablePointer<SecretCollection>) throws(StoreError) {
        let locked = secret_collection_get_locked(collection) != 0
        self.observedLocked = locked
        if locked { throw self.locked() }
    }

    func locked() -> StoreError {
        self.observedLocked = true
        return StoreError(
            .locked,
            "the keyring's default collection is locked (it unlocks in the desktop session, for example in Seahorse)"
        )
    }

    /// The account's items in `collection`; free with `tv_object_list_free`.
    func items(
        in collection: UnsafeMutablePointer<SecretCollection>,
        account: String,
        loadSecrets: Bool
    ) throws(StoreError) -> UnsafeMutablePointer<GList>? {
        let attributes = tv_account_attributes(KeyringStore.application, account)
        defer { g_hash_table_unref(attributes) }
        var error: UnsafeMutablePointer<GError>?
        let list = secret_collection_search_sync(
            collection,
            tv_account_schema(),
            attributes,
            tv_search_flags(loadSecrets ? 1 : 0),
            self.cancellable,
            &error
        )
        if let error {
            tv_object_list_free(list)
            throw self.failure(error, "search the keyring for '\(account)'")
        }
        return list
    }

    func delete(_ item: UnsafeMutablePointer<SecretItem>, account: String) throws(StoreError) {
        var error: UnsafeMutablePointer<GError>?
        _ = secret_item_delete_sync(item, self.cancellable, &error)
        if let error { throw self.failure(error, "delete the keyring item of '\(account)'") }
    }

    static func elements(_ list: UnsafeMutablePointer<GList>?) -> [UnsafeMutablePointer<SecretItem>] {
        var items: [UnsafeMutablePointer<SecretItem>] = []
        var node = list
        while let current = node {
            if let data = current.pointee.data { items.append(data.assumingMemoryBound(to: SecretItem.self)) }
            node = current.pointee.next
        }
        return items
    }

    func failure(_ error: UnsafeMutablePointer<GError>, _ doing: String) -> StoreError {
        if tv_error_is_locked(error) != 0 {
            g_error_free(error)
            return self.locked()
        }
        return Self.failure(error, doing, cancellable: self.cancellable, timeoutError: self.timeoutError)
    }

    /// A StoreError for a GError, which it frees. GError messages name D-Bus
    /// objects and errors, never secrets.
    static func failure(
        _ error: UnsafeMutablePointer<GError>,
        _ doing: String,
        cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) -> StoreError {
        defer { g_error_free(error) }
        // Only the timer cancels.
        if g_cancellable_is_cancelled(cancellable) != 0 { return timeoutError }
        let message = error.pointee.message.map { String(cString: $0) } ?? "unknown error"
        return StoreError(
            .unavailable,
            "the Secret Service could not \(doing): \(message)\(KeyringStore.advice)"
        )
    }
}

/// A SecretService proxy with its transfer session, kept between calls: a
/// new one costs a Diffie-Hellman exchange, most of a call's time. The
/// proxy's own signal subscriptions (its properties, its name's owner) go to
/// a main context of its own, which each call drains before use; a proxy
/// whose name has changed owner (the keyring restarted) is replaced.
private final class ServiceCache: Sendable {
    private let held = Mutex<CachedService?>(nil)

    init() {}

    fileprivate func service(
        _ cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) throws(StoreError) -> (CachedService, fresh: Bool) {
        if let kept = self.held.withLock({ $0 }) {
            if kept.isCurrent { return (kept, false) }
            self.discard(kept)
        }
        let opened = try CachedService.open(cancellable, timeoutError: timeoutError)
        let replaced = self.held.withLock { (held) -> CachedService? in
            let previous = held
            held = opened
            return previous
        }
        _ = replaced  // released here, outside the lock
        return (opened, true)
    }

    fileprivate func discard(_ service: CachedService) {
        let dropped = self.held.withLock { (held) -> CachedService? in
            guard held === service else { return nil }
            held = nil
            return service
        }
        _ = dropped
    }
}

/// `@unchecked Sendable`: libsecret's proxies may be used from several
/// threads; the context is only iterated by the thread that acquires it.
private final class CachedService: @unchecked Sendable {
    let service: UnsafeMutablePointer<SecretService>
    private let context: OpaquePointer
    private let owner: String

    private init(service: UnsafeMutablePointer<SecretService>, context: OpaquePointer, owner: String) {
        self.service = service
        self.context = context
        self.owner = owner
    }

    deinit {
        g_object_unref(self.service)
        Self.drain(self.context)
        g_main_context_unref(self.context)
    }

    static func open(
        _ cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) throws(StoreError) -> CachedService {
        let context = g_main_context_new()!
        g_main_context_push_thread_default(context)
        var error: UnsafeMutablePointer<GError>?
        let service = secret_service_open_sync(
            secret_service_get_type(),
            nil,  // libsecret 0.20.5 ignores a name here; it reads $SECRET_SERVICE_BUS_NAME
            SECRET_SERVICE_NONE,  // the transfer session opens with the first secret, then stays
            cancellable,
            &error
        )
        g_main_context_pop_thread_default(context)
        guard let service, error == nil else {
            if let service { g_object_unref(service) }
            Self.drain(context)
            g_main_context_unref(context)
            guard let error else { throw StoreError(.unavailable, "the Secret Service could not be reached") }
            throw KeyringCall.failure(error, "be reached", cancellable: cancellable, timeoutError: timeoutError)
        }
        let owner = tv_proxy_name_owner(service)
        defer { g_free(owner) }
        return CachedService(service: service, context: context, owner: owner.map { String(cString: $0) } ?? "")
    }

    /// Whether the same process still owns the Secret Service's name, after
    /// running what the bus told the proxy meanwhile.
    var isCurrent: Bool {
        Self.drain(self.context)
        guard let owner = tv_proxy_name_owner(self.service) else { return false }
        defer { g_free(owner) }
        return !self.owner.isEmpty && String(cString: owner) == self.owner
    }

    /// Runs what is pending on the context, unless another thread is at it.
    private static func drain(_ context: OpaquePointer) {
        guard g_main_context_acquire(context) != 0 else { return }
        while g_main_context_iteration(context, 0) != 0 {}
        g_main_context_release(context)
    }
}

/// Owns one GCancellable; the timer's closure keeps it alive until it has run
/// or been dropped.
private final class CancelTimer: @unchecked Sendable {
    // g_cancellable_cancel is thread-safe; the pointer itself never changes.
    let cancellable: UnsafeMutablePointer<GCancellable>

    init() { self.cancellable = g_cancellable_new() }

    deinit { g_object_unref(self.cancellable) }

    func cancel() { g_cancellable_cancel(self.cancellable) }
}

/// The process's session bus connection, held for the life of the process.
/// GLib keeps only a weak reference to its shared connection: without this
/// one, each call, whose objects all go at its end, would connect again. It
/// also turns off GLib's default of raising SIGTERM when the bus goes away,
/// so a lost bus is an `.unavailable` error and the daemon decides.
private enum SessionBus {
    /// The held connection's address (0: none). Kept as an integer: a
    /// pointer is not Sendable, and only this file's code turns it back.
    private static let held = Mutex<Int>(0)

    static func connect(_ cancellable: UnsafeMutablePointer<GCancellable>, timeoutError: StoreError) throws(StoreError) {
        for _ in 0..<2 {
            var error: UnsafeMutablePointer<GError>?
            let connection = g_bus_get_sync(G_BUS_TYPE_SESSION, cancellable, &error)
            if let error {
                if let connection { g_object_unref(UnsafeMutableRawPointer(connection)) }
                throw KeyringCall.failure(error, "be reached", cancellable: cancellable, timeoutError: timeoutError)
            }
            guard let connection else { throw StoreError(.unavailable, "the session bus could not be reached") }
            g_dbus_connection_set_exit_on_close(connection, 0)
            let address = Int(bitPattern: connection)
            let open = g_dbus_connection_is_closed(connection) == 0
            // Which reference to drop: the new one when this connection is
            // already held, else the one held before (or, when closed, both).
            let drop: Int = Self.held.withLock { held in
                if open {
                    if held == address { return address }
                    let previous = held
                    held = address
                    return previous
                }
                // Closed (the bus went away): let go of it, so GLib connects
                // afresh. Another call may hold it a moment longer; then the
                // next call will.
                guard held == address else { return 0 }
                held = 0
                return address
            }
            if let stale = OpaquePointer(bitPattern: drop) { g_object_unref(UnsafeMutableRawPointer(stale)) }
            if open { return }
            g_object_unref(UnsafeMutableRawPointer(connection))
        }
        throw StoreError(
            .unavailable,
            "the connection to the session bus has closed\(KeyringStore.advice)"
        )
    }
}
