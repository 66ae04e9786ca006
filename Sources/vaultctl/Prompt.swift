import ArgumentParser
import Glibc
import VaultCrypto

/// Reads secrets without echo from the terminal, or one line from stdin when
/// stdin is not a terminal (scripts). Never from argv.
enum Prompt {
    static func secret(_ prompt: String) throws -> SecretBytes {
        var bytes: [UInt8] = []
        defer { bytes.secureZero() }
        if isatty(0) == 1 {
            let tty = open("/dev/tty", O_RDWR | O_CLOEXEC)
            let fd = tty >= 0 ? tty : 0
            defer { if tty >= 0 { close(tty) } }
            _ = prompt.withCString { write(fd, $0, strlen($0)) }
            var saved = termios()
            let hasTerminal = tcgetattr(fd, &saved) == 0
            if hasTerminal {
                var quiet = saved
                quiet.c_lflag &= ~tcflag_t(ECHO)
                tcsetattr(fd, TCSAFLUSH, &quiet)
            }
            bytes = Self.readLine(fd)
            if hasTerminal {
                tcsetattr(fd, TCSAFLUSH, &saved)
                _ = write(fd, "\n", 1)
            }
        } else {
            bytes = Self.readLine(0)
        }
        guard !bytes.isEmpty else {
            throw ValidationError("no secret was given")
        }
        return try SecretBytes(copying: bytes)
    }

    /// Bytes up to a newline or end of input, byte by byte so nothing past
    /// the line is consumed.
    private static func readLine(_ fd: Int32) -> [UInt8] {
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while read(fd, &byte, 1) == 1 {
            if byte == 0x0A { break }
            line.append(byte)
        }
        if line.last == 0x0D { line.removeLast() }
        byte = 0
        return line
    }
}
