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
        /// A system call failed (permissions, disk full, ...).
        case io
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
