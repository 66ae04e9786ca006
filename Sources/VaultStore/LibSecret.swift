import CLibSecret
import Glibc
import Synchronization

/// libsecret, and the GLib, GObject and GIO functions the keyring backend
/// calls, loaded with `dlopen` the first time the backend talks to a Secret
/// Service (as Chromium's LibsecretLoader does). vaultd links none of them:
/// a daemon whose secrets are in the sealed file maps no libsecret, gio,
/// gobject, glib or what they need (libgcrypt, libmount, libselinux, ...),
/// runs none of their constructors and has no GLib worker thread: 3.1 to
/// 3.8 MB less resident memory for an idle release build, one thread less.
///
/// `lib.g_object_unref(x)` calls the function looked up under that name
/// (shim.h lists them, with their C types).
@dynamicMemberLookup
struct LibSecret: @unchecked Sendable {
    /// libsecret-1's soname (Debian's libsecret-1-0).
    static let soname = "libsecret-1.so.0"

    /// Filled once and never changed or freed: `@unchecked Sendable`.
    let table: UnsafePointer<TVLibSecret>

    subscript<Function>(dynamicMember function: KeyPath<TVLibSecret, Function>) -> Function {
        self.table.pointee[keyPath: function]
    }

    /// nil until the first load, then its result for the life of the
    /// process, a failure included (a library is not installed while
    /// vaultd runs, and GLib cannot be unloaded anyway).
    private static let loaded = Mutex<Result<LibSecret, StoreError>?>(nil)

    /// Whether libsecret has been loaded (or failed to load).
    static var isLoaded: Bool { Self.loaded.withLock { $0 != nil } }

    /// libsecret, loaded by the first caller; the others wait for it.
    static func shared() throws(StoreError) -> LibSecret {
        try Self.loaded.withLock { loaded in
            if let loaded { return loaded }
            let result = Self.load(Self.soname)
            loaded = result
            return result
        }.get()
    }

    /// Loads `library` and looks up every function vaultd calls; a name
    /// here so that a test can ask for one that is not installed.
    static func load(_ library: String) -> Result<LibSecret, StoreError> {
        // RTLD_LOCAL: GLib's symbols stay out of the global scope (nothing
        // else in vaultd should resolve against them).
        guard let handle = dlopen(library, RTLD_NOW | RTLD_LOCAL) else {
            let reason = dlerror().map { String(cString: $0) } ?? "it could not be loaded"
            return .failure(Self.missing(library, reason))
        }
        let table = UnsafeMutablePointer<TVLibSecret>.allocate(capacity: 1)
        if let absent = tv_libsecret_resolve(handle, table) {
            // The handle stays open: GLib's libraries do not unload.
            table.deallocate()
            return .failure(Self.missing(library, "it has no function \(String(cString: absent))"))
        }
        return .success(LibSecret(table: UnsafePointer(table)))
    }

    private static func missing(_ library: String, _ reason: String) -> StoreError {
        StoreError(
            .unavailable,
            "the keyring backend needs \(library): \(reason); install libsecret (Debian: libsecret-1-0) or choose --backend file"
        )
    }
}
