import ArgumentParser
import Glibc
import VaultCrypto

/// Reads secrets without echo from the terminal, or one line from stdin when
/// stdin is not a terminal (scripts). Never from argv.
enum Prompt {
    /// Whether a person answers the prompts: stdin is a terminal.
    static var isInteractive: Bool { isatty(0) == 1 }

    static func secret(_ prompt: String) throws -> SecretBytes {
        guard let secret = try Self.secretLine(prompt), secret.count > 0 else {
            throw ValidationError("no secret was given")
        }
        return secret
    }

    /// One line without echo: from the terminal when stdin is one (after
    /// writing `prompt` to it), else the next line of stdin. Only the bytes
    /// `keep` accepts are kept. Nil at end of input, or when a signal
    /// (Ctrl-C) interrupted the read.
    static func secretLine(
        _ prompt: String,
        keeping keep: (UInt8) -> Bool = { _ in true }
    ) throws(SodiumError) -> SecretBytes? {
        var bytes: [UInt8]?
        defer { bytes?.secureZero() }
        if Self.isInteractive {
            bytes = Self.withTerminal { fd in
                Self.write(fd, prompt)
                var saved = termios()
                let hasTerminal = tcgetattr(fd, &saved) == 0
                if hasTerminal {
                    var quiet = saved
                    quiet.c_lflag &= ~tcflag_t(ECHO)
                    tcsetattr(fd, TCSAFLUSH, &quiet)
                }
                let line = Self.readLine(fd)
                if hasTerminal {
                    tcsetattr(fd, TCSAFLUSH, &saved)
                    Self.write(fd, "\n")
                }
                return line
            }
        } else {
            bytes = Self.readLine(0)
        }
        guard bytes != nil else { return nil }
        // In place, so no unwiped copy is left behind.
        bytes?.removeAll { !keep($0) }
        return try SecretBytes(copying: bytes ?? [])
    }

    /// One line with echo, for what is not secret (a username): from the
    /// terminal when stdin is one, else the next line of stdin. Nil at end of
    /// input or when a signal interrupted the read.
    static func line(_ prompt: String) -> String? {
        let bytes: [UInt8]?
        if Self.isInteractive {
            bytes = Self.withTerminal { fd in
                Self.write(fd, prompt)
                return Self.readLine(fd)
            }
        } else {
            bytes = Self.readLine(0)
        }
        return bytes.map { String(decoding: $0, as: UTF8.self) }
    }

    /// Runs `body` with /dev/tty open, or with stdin when it cannot be opened.
    private static func withTerminal<T>(_ body: (Int32) -> T) -> T {
        let tty = open("/dev/tty", O_RDWR | O_CLOEXEC)
        defer { if tty >= 0 { close(tty) } }
        return body(tty >= 0 ? tty : 0)
    }

    private static func write(_ fd: Int32, _ text: String) {
        _ = text.withCString { Glibc.write(fd, $0, strlen($0)) }
    }

    /// Bytes up to a newline or end of input, byte by byte so nothing past
    /// the line is consumed. Nil at end of input before any byte, or when the
    /// read fails or is interrupted (what was read so far is wiped).
    private static func readLine(_ fd: Int32) -> [UInt8]? {
        var line: [UInt8] = []
        // Room enough that appending never moves (and leaves behind) the bytes.
        line.reserveCapacity(4096)
        var byte: UInt8 = 0
        defer { byte = 0 }
        var ended = false
        while true {
            let n = read(fd, &byte, 1)
            if n < 0 {
                line.secureZero()
                return nil
            }
            if n == 0 { break }
            if byte == 0x0A {
                ended = true
                break
            }
            line.append(byte)
        }
        if !ended && line.isEmpty { return nil }
        if line.last == 0x0D { line.removeLast() }
        return line
    }
}
