import Glibc

/// Why a store could not do what was asked. `message` is a sentence for a
/// person: it names files and errno values, never secret bytes.
public struct StoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Kind: Hashable, Sendable {
        /// The key is not loaded (passphrase vault before `unlock`, or after `lock`).
        case locked
        /// The passphrase or key does not open the vault (or its header was altered).
        case wrongKey
        /// The file is truncated, altered or otherwise unreadable; it is left untouched.
        case corrupt
        /// Not a tokenvault file, or a format this version does not know.
        case foreign
        /// A system call failed for another reason than the two below.
        case io
        /// No space left on the file system (ENOSPC, EDQUOT).
        case noSpace
        /// Not permitted: the file or its folder cannot be written (EACCES, EPERM, EROFS).
        case denied
        /// The backend cannot be reached (no Secret Service, D-Bus error).
        case unavailable
        /// The key file or credential is missing or malformed.
        case keySource
    }

    public var kind: Kind
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { self.message }
}

extension StoreError {
    /// A failed system call on `path`: its kind by `errno` (read before
    /// anything else runs), so a full disk and a read-only folder are told
    /// apart from other failures.
    public static func system(_ message: String, errno code: Int32) -> StoreError {
        switch code {
        case ENOSPC, EDQUOT: StoreError(.noSpace, message)
        case EACCES, EPERM, EROFS: StoreError(.denied, message)
        default: StoreError(.io, message)
        }
    }
}
