import Glibc
import VaultProtocol

/// How tokenvault's command-line programs (vaultctl, vaultctl-notify) write.
///
/// stdout carries results only (a token, a list); everything else goes to stderr.
/// Lines are for terminals: their control characters are escaped, since most
/// of what they say came from vaultd or an issuer (names, addresses, claims,
/// error descriptions). Only `verbatim` writes text as it is.
public enum Output {
    public static func line(_ text: String) {
        Self.write(1, text.escaped(for: .terminal) + "\n")
    }

    /// One line as it is: JSON (escaped already) or the token a command was asked for.
    public static func verbatim(_ text: String) {
        Self.write(1, text + "\n")
    }

    public static func error(_ message: String) {
        Self.write(2, "vaultctl: error: \(message.escaped(for: .terminal))\n")
    }

    /// A line for the person at the terminal (what to do next, what happened).
    public static func note(_ text: String) {
        Self.write(2, text.escaped(for: .terminal) + "\n")
    }

    /// Text for stderr as it is: a progress line redrawn after `\r`, a QR code.
    public static func toStderr(_ text: String) {
        Self.write(2, text)
    }

    public static func toStderr(_ bytes: [UInt8]) {
        Self.write(2, bytes)
    }

    private static func write(_ fd: Int32, _ text: String) {
        Self.write(fd, Array(text.utf8))
    }

    private static func write(_ fd: Int32, _ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress?.advanced(by: offset), $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return }
            offset += n
        }
    }
}
