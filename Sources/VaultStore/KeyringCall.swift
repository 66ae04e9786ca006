import CLibSecret
import Dispatch
import Synchronization

// The Secret Service calls behind KeyringStore: one libsecret conversation
// per call on a pool thread, its cancellation timer, the cached service
// connection, and where the session bus is.

/// One conversation with the Secret Service, on one thread of the pool, from
/// connecting to freeing the last object. Its own GLib main context is the
/// thread's default for the whole call, so the signal subscriptions of the
/// collection and item proxies it makes land there and are drained and freed
/// with it, not queued forever on the global default context, which no one
/// runs in this process.
final class KeyringCall {
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
final class ServiceCache: Sendable {
    private let held = Mutex<CachedService?>(nil)

    init() {}

    func service(
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

    func discard(_ service: CachedService) {
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
final class CachedService: @unchecked Sendable {
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
final class CancelTimer: @unchecked Sendable {
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
enum SessionBus {
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
