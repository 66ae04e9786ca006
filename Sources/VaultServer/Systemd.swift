import Glibc
import VaultProtocol

/// The little of systemd's protocol vaultd speaks, without libsystemd:
/// socket activation (sd_listen_fds) and state notification (sd_notify).
public enum Systemd {
    /// The listening socket systemd passed to this process, by its
    /// `FileDescriptorName=` (any single one when unnamed). The LISTEN_*
    /// variables are cleared, so no child inherits them.
    public static func inheritedSocket(named name: String) -> CInt? {
        defer {
            unsetenv("LISTEN_PID")
            unsetenv("LISTEN_FDS")
            unsetenv("LISTEN_FDNAMES")
        }
        guard let pid = TokenVault.environment("LISTEN_PID").flatMap(Int32.init), pid == getpid(),
            let count = TokenVault.environment("LISTEN_FDS").flatMap(Int.init), count >= 1
        else { return nil }
        let names = TokenVault.environment("LISTEN_FDNAMES")?.split(separator: ":", omittingEmptySubsequences: false).map(String.init)
        let index = names?.firstIndex(of: name) ?? (count == 1 ? 0 : nil)
        guard let index, index < count else { return nil }
        let fd = CInt(3 + index)
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        return fd
    }

    /// Sends `state` (`READY=1`, `STATUS=…`, `STOPPING=1`, `WATCHDOG=1`) to
    /// `$NOTIFY_SOCKET`; nothing when vaultd does not run under systemd. Never
    /// waits: when the service manager's queue is full the message is dropped,
    /// rather than blocking a thread of the concurrency pool, which left vaultd
    /// unable to stop.
    public static func notify(_ state: String) {
        guard let target = TokenVault.environment("NOTIFY_SOCKET"), !target.isEmpty else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        // A leading '@' names an abstract socket.
        guard let address = UnixAddress(target, abstractAt: true) else { return }
        let bytes = Array(state.utf8)
        _ = address.withSockaddr { address, length in
            bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT), address, length) }
        }
    }

    /// Half the watchdog interval systemd asks for (`WATCHDOG_USEC`), if it asks this process.
    public static var watchdogPing: Duration? {
        guard let usec = TokenVault.environment("WATCHDOG_USEC").flatMap(UInt64.init), usec > 0 else { return nil }
        if let pid = TokenVault.environment("WATCHDOG_PID").flatMap(Int32.init), pid != getpid() { return nil }
        return .microseconds(Int64(usec / 2))
    }
}
