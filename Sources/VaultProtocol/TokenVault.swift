import Glibc

/// Facts shared by the daemon and every client.
public enum TokenVault {
    public static let version = "0.1.0"
    public static let protocolVersion = 1
    /// The longest request or reply line, newline excluded (docs/protocol.md, Framing: 65,536 bytes).
    public static let maximumLineBytes = 65_536

    /// The socket path: `explicit` (a `--socket` flag), else `TOKENVAULT_SOCKET`,
    /// else `$XDG_RUNTIME_DIR/tokenvault/vaultd.sock`.
    public static func socketPath(explicit: String?) throws(VaultError) -> String {
        if let explicit, !explicit.isEmpty { return explicit }
        if let value = Self.environment("TOKENVAULT_SOCKET") { return value }
        guard let runtime = Self.environment("XDG_RUNTIME_DIR") else {
            throw VaultError.noRuntimeDirectory
        }
        return runtime + "/tokenvault/vaultd.sock"
    }

    /// A non-empty environment variable, or nil.
    public static func environment(_ name: String) -> String? {
        guard let raw = getenv(name) else { return nil }
        let value = String(cString: raw)
        return value.isEmpty ? nil : value
    }
}
