import CLibSecret
import Dispatch
import Glibc
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
    let lib: LibSecret
    let service: UnsafeMutablePointer<SecretService>
    let cancellable: UnsafeMutablePointer<GCancellable>
    let timeoutError: StoreError
    /// Whether the default collection was seen locked (nil: not looked at).
    var observedLocked: Bool?

    private init(
        lib: LibSecret,
        service: UnsafeMutablePointer<SecretService>,
        cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) {
        self.lib = lib
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
    /// once more on a new one, within the same deadline. The first call
    /// loads libsecret, unless there is no session bus to find a Secret
    /// Service on.
    static func run<T>(
        services: ServiceCache,
        timeout: Duration,
        timeoutError: StoreError,
        _ body: (KeyringCall) throws(StoreError) -> T
    ) -> (Result<T, StoreError>, Bool?) {
        let lib: LibSecret
        do {
            if !LibSecret.isLoaded, let absence = SessionBus.absence() {
                // What GLib would answer: loading it would not help.
                return (.failure(StoreError(.unavailable, "the Secret Service could not be reached: \(absence)\(KeyringStore.advice)")), nil)
            }
            lib = try LibSecret.shared()
        } catch {
            return (.failure(error), nil)
        }
        let context = lib.g_main_context_new()
        lib.g_main_context_push_thread_default(context)
        defer {
            // Runs what freeing the proxies queued (their subscriptions' clean-up).
            while lib.g_main_context_iteration(context, 0) != 0 {}
            lib.g_main_context_pop_thread_default(context)
            lib.g_main_context_unref(context)
        }
        let timer = CancelTimer(lib)
        let work = DispatchWorkItem { [timer] in timer.cancel() }
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(timeout.nanoseconds), execute: work)
        defer { work.cancel() }

        while true {
            let service: CachedService
            let fresh: Bool
            do {
                try SessionBus.connect(lib, timer.cancellable, timeoutError: timeoutError)
                (service, fresh) = try services.service(lib, timer.cancellable, timeoutError: timeoutError)
            } catch {
                return (.failure(error), nil)
            }
            let call = KeyringCall(lib: lib, service: service.service, cancellable: timer.cancellable, timeoutError: timeoutError)
            do {
                let value = try body(call)
                return (.success(value), call.observedLocked)
            } catch {
                let timedOut = lib.g_cancellable_is_cancelled(timer.cancellable) != 0
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
        let collection = self.lib.secret_collection_for_alias_sync(
            self.service, "default", SECRET_COLLECTION_NONE, self.cancellable, &error
        )
        if let error {
            if let collection { self.lib.g_object_unref(collection) }
            throw self.failure(error, "find the default keyring")
        }
        return collection
    }

    /// A locked collection answers searches as if it were empty: ask first.
    func requireUnlocked(_ collection: UnsafeMutablePointer<SecretCollection>) throws(StoreError) {
        let locked = self.lib.secret_collection_get_locked(collection) != 0
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

    /// The account's items in `collection`; free with `freeList`.
    func items(
        in collection: UnsafeMutablePointer<SecretCollection>,
        account: String,
        loadSecrets: Bool
    ) throws(StoreError) -> UnsafeMutablePointer<GList>? {
        let attributes = self.attributes(account)
        defer { self.lib.g_hash_table_unref(attributes) }
        var error: UnsafeMutablePointer<GError>?
        let list = self.lib.secret_collection_search_sync(
            collection,
            tv_account_schema(),
            attributes,
            tv_search_flags(loadSecrets ? 1 : 0),
            self.cancellable,
            &error
        )
        if let error {
            self.freeList(list)
            throw self.failure(error, "search the keyring for '\(account)'")
        }
        return list
    }

    /// The attributes of the account's item; free with g_hash_table_unref.
    func attributes(_ account: String) -> OpaquePointer? {
        tv_account_attributes(self.lib.table, KeyringStore.application, account)
    }

    /// Frees a list of objects libsecret returned, and the objects.
    func freeList(_ list: UnsafeMutablePointer<GList>?) {
        tv_object_list_free(self.lib.table, list)
    }

    /// The D-Bus object path of an item (a proxy).
    func objectPath(_ item: UnsafeMutablePointer<SecretItem>) -> String {
        String(cString: tv_object_path(self.lib.table, item))
    }

    func delete(_ item: UnsafeMutablePointer<SecretItem>, account: String) throws(StoreError) {
        var error: UnsafeMutablePointer<GError>?
        _ = self.lib.secret_item_delete_sync(item, self.cancellable, &error)
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
        if tv_error_is_locked(self.lib.table, error) != 0 {
            self.lib.g_error_free(error)
            return self.locked()
        }
        return Self.failure(self.lib, error, doing, cancellable: self.cancellable, timeoutError: self.timeoutError)
    }

    /// A StoreError for a GError, which it frees. GError messages name D-Bus
    /// objects and errors, never secrets.
    static func failure(
        _ lib: LibSecret,
        _ error: UnsafeMutablePointer<GError>,
        _ doing: String,
        cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) -> StoreError {
        defer { lib.g_error_free(error) }
        // Only the timer cancels.
        if lib.g_cancellable_is_cancelled(cancellable) != 0 { return timeoutError }
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
        _ lib: LibSecret,
        _ cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) throws(StoreError) -> (CachedService, fresh: Bool) {
        if let kept = self.held.withLock({ $0 }) {
            if kept.isCurrent { return (kept, false) }
            self.discard(kept)
        }
        let opened = try CachedService.open(lib, cancellable, timeoutError: timeoutError)
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
    private let lib: LibSecret
    private let context: OpaquePointer
    private let owner: String

    private init(lib: LibSecret, service: UnsafeMutablePointer<SecretService>, context: OpaquePointer, owner: String) {
        self.lib = lib
        self.service = service
        self.context = context
        self.owner = owner
    }

    deinit {
        self.lib.g_object_unref(self.service)
        Self.drain(self.lib, self.context)
        self.lib.g_main_context_unref(self.context)
    }

    static func open(
        _ lib: LibSecret,
        _ cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) throws(StoreError) -> CachedService {
        let context = lib.g_main_context_new()!
        lib.g_main_context_push_thread_default(context)
        var error: UnsafeMutablePointer<GError>?
        let service = lib.secret_service_open_sync(
            lib.secret_service_get_type(),
            nil,  // libsecret 0.20.5 ignores a name here; it reads $SECRET_SERVICE_BUS_NAME
            SECRET_SERVICE_NONE,  // the transfer session opens with the first secret, then stays
            cancellable,
            &error
        )
        lib.g_main_context_pop_thread_default(context)
        guard let service, error == nil else {
            if let service { lib.g_object_unref(service) }
            Self.drain(lib, context)
            lib.g_main_context_unref(context)
            guard let error else { throw StoreError(.unavailable, "the Secret Service could not be reached") }
            throw KeyringCall.failure(lib, error, "be reached", cancellable: cancellable, timeoutError: timeoutError)
        }
        let owner = tv_proxy_name_owner(lib.table, service)
        defer { lib.g_free(owner) }
        return CachedService(lib: lib, service: service, context: context, owner: owner.map { String(cString: $0) } ?? "")
    }

    /// Whether the same process still owns the Secret Service's name, after
    /// running what the bus told the proxy meanwhile.
    var isCurrent: Bool {
        Self.drain(self.lib, self.context)
        guard let owner = tv_proxy_name_owner(self.lib.table, self.service) else { return false }
        defer { self.lib.g_free(owner) }
        return !self.owner.isEmpty && String(cString: owner) == self.owner
    }

    /// Runs what is pending on the context, unless another thread is at it.
    private static func drain(_ lib: LibSecret, _ context: OpaquePointer) {
        guard lib.g_main_context_acquire(context) != 0 else { return }
        while lib.g_main_context_iteration(context, 0) != 0 {}
        lib.g_main_context_release(context)
    }
}

/// Owns one GCancellable; the timer's closure keeps it alive until it has run
/// or been dropped.
final class CancelTimer: @unchecked Sendable {
    // g_cancellable_cancel is thread-safe; the pointer itself never changes.
    let cancellable: UnsafeMutablePointer<GCancellable>
    private let lib: LibSecret

    init(_ lib: LibSecret) {
        self.lib = lib
        self.cancellable = lib.g_cancellable_new()!
    }

    deinit { self.lib.g_object_unref(self.cancellable) }

    func cancel() { self.lib.g_cancellable_cancel(self.cancellable) }
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

    static func connect(
        _ lib: LibSecret,
        _ cancellable: UnsafeMutablePointer<GCancellable>,
        timeoutError: StoreError
    ) throws(StoreError) {
        for _ in 0..<2 {
            var error: UnsafeMutablePointer<GError>?
            let connection = lib.g_bus_get_sync(G_BUS_TYPE_SESSION, cancellable, &error)
            if let error {
                if let connection { lib.g_object_unref(UnsafeMutableRawPointer(connection)) }
                throw KeyringCall.failure(lib, error, "be reached", cancellable: cancellable, timeoutError: timeoutError)
            }
            guard let connection else { throw StoreError(.unavailable, "the session bus could not be reached") }
            lib.g_dbus_connection_set_exit_on_close(connection, 0)
            let address = Int(bitPattern: connection)
            let open = lib.g_dbus_connection_is_closed(connection) == 0
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
            if let stale = OpaquePointer(bitPattern: drop) { lib.g_object_unref(UnsafeMutableRawPointer(stale)) }
            if open { return }
            lib.g_object_unref(UnsafeMutableRawPointer(connection))
        }
        throw StoreError(
            .unavailable,
            "the connection to the session bus has closed\(KeyringStore.advice)"
        )
    }

    /// Why GLib would find no session bus, in GLib's words, when that is
    /// plain without GLib; nil when there may be one (only GLib can tell).
    /// Read as GLib reads them: `$DBUS_SESSION_BUS_ADDRESS`, else
    /// `$XDG_RUNTIME_DIR/bus`, else a bus `dbus-launch` would start on the
    /// X11 `$DISPLAY`. A headless login (SSH, a server's systemd --user
    /// without dbus-user-session) then never loads libsecret.
    static func absence(_ environment: (String) -> String? = { getenv($0).map { String(cString: $0) } }) -> String? {
        guard let address = environment("DBUS_SESSION_BUS_ADDRESS") else {
            // GLib then tries $XDG_RUNTIME_DIR/bus, and autolaunches only under X11.
            guard let runtime = Self.runtimeFolder(environment),
                access(runtime + "/bus", F_OK) != 0, environment("DISPLAY") == nil
            else { return nil }
            return "Cannot autolaunch D-Bus without X11 $DISPLAY"
        }
        // One address, a Unix socket by path (`unix:path=P`, maybe with a
        // guid), and no file there: GLib's connect fails with ENOENT.
        guard !address.contains(";"), address.hasPrefix("unix:") else { return nil }
        var path: String?
        for pair in address.dropFirst("unix:".count).split(separator: ",", omittingEmptySubsequences: false) {
            guard let equals = pair.firstIndex(of: "=") else { return nil }
            switch pair[..<equals] {
            case "path": path = Self.unescape(pair[pair.index(after: equals)...])
            case "guid": continue
            default: return nil  // abstract, tmpdir, runtime, ...: GLib's business
            }
        }
        guard let path, !path.isEmpty else { return nil }
        var status = stat()
        guard stat(path, &status) != 0, errno == ENOENT else { return nil }
        return "Could not connect: No such file or directory"
    }

    /// GLib's g_get_user_runtime_dir(): $XDG_RUNTIME_DIR, else the user's
    /// cache folder ($XDG_CACHE_HOME, else ~/.cache). nil when it cannot be
    /// told without GLib (a relative path, no home).
    private static func runtimeFolder(_ environment: (String) -> String?) -> String? {
        if let runtime = environment("XDG_RUNTIME_DIR"), !runtime.isEmpty {
            return runtime.hasPrefix("/") ? runtime : nil
        }
        if let cache = environment("XDG_CACHE_HOME"), !cache.isEmpty {
            return cache.hasPrefix("/") ? cache : nil
        }
        guard let home = environment("HOME"), home.hasPrefix("/") else { return nil }
        return home + "/.cache"
    }

    /// A D-Bus address value: `%XX` stands for the byte XX.
    private static func unescape(_ value: Substring) -> String? {
        var bytes: [UInt8] = []
        var rest = Array(value.utf8)[...]
        while let byte = rest.popFirst() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard rest.count >= 2, let hex = UInt8(String(decoding: rest.prefix(2), as: UTF8.self), radix: 16) else { return nil }
            bytes.append(hex)
            rest = rest.dropFirst(2)
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}