import Glibc
public import Logging
import VaultProtocol

/// Who is on the other end of a connection, read once at accept, before a
/// byte of the connection is read: uid, gid and pid from SO_PEERCRED, the
/// executable from `/proc/PID/exe`, the systemd unit from `/proc/PID/cgroup`.
///
/// The executable and unit are kept only when the PID still named the
/// process that connected once they were read: the peer's pidfd
/// (SO_PEERPIDFD, Linux 6.5+) shows it still running, so its PID cannot have
/// been reused; without one, the process start time in `/proc/PID/stat` did
/// not change while they were read.
public struct Peer: Sendable, Hashable, CustomStringConvertible {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32
    /// `/proc/PID/exe` of the peer, as the peer's kernel names it; nil when it
    /// could not be read for certain. Raw: escape it before logging it (or log
    /// `auditMetadata`).
    public var executable: String?
    /// The systemd unit the peer ran in (`foo.service`, `app-bar.scope`), nil
    /// outside one. Raw, like `executable`.
    public var unit: String?

    public init(pid: Int32, uid: UInt32, gid: UInt32, executable: String?, unit: String? = nil) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self.executable = executable
        self.unit = unit
    }

    /// uid, pid, exe and unit, escaped for a log line: merge into every line
    /// that hands something out, e.g.
    /// `logger.info("token released", metadata: peer.auditMetadata.merging(["account": "\(name)"]) { $1 })`.
    public var auditMetadata: Logger.Metadata {
        [
            "uid": "\(self.uid)",
            "pid": "\(self.pid)",
            "exe": "\((self.executable ?? "?").escaped(for: .log))",
            "unit": "\((self.unit ?? "?").escaped(for: .log))",
        ]
    }

    public var description: String {
        "pid \(self.pid) uid \(self.uid) exe \((self.executable ?? "?").escaped(for: .log)) unit \((self.unit ?? "?").escaped(for: .log))"
    }

    /// The peer of a connection just accepted; `pidfd` is its SO_PEERPIDFD
    /// when the kernel gave one.
    static func identify(pid: Int32, uid: UInt32, gid: UInt32, pidfd: CInt?) -> Peer {
        // The kernel builds /proc/PID/stat afresh on every read: reading it
        // twice was most of what accepting a connection cost. A pidfd makes
        // it unnecessary.
        let started = pidfd == nil ? Self.startTime(of: pid) : nil
        let executable = Self.executable(of: pid)
        let cgroup = Self.read("/proc/\(pid)/cgroup")
        let unchanged =
            if let pidfd { Self.isRunning(pidfd) } else { started != nil && Self.startTime(of: pid) == started }
        guard unchanged else { return Peer(pid: pid, uid: uid, gid: gid, executable: nil) }
        return Peer(pid: pid, uid: uid, gid: gid, executable: executable, unit: cgroup.flatMap(Self.unit(inCgroup:)))
    }

    static func executable(of pid: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/\(pid)/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The unit in `/proc/PID/cgroup` text: the deepest `.service` or `.scope`
    /// in the systemd hierarchy (`name=systemd` on a hybrid set-up, else
    /// cgroup v2's `0::`), so a user unit wins over `user@UID.service`.
    /// Each line is `hierarchy:controllers:path`; fields are compared whole
    /// (a substring search would also bring in _StringProcessing's 400 KB of
    /// code, resident for the daemon's life).
    static func unit(inCgroup text: String) -> String? {
        let entries = text.split(separator: "\n")
            .map { $0.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false) }
            .filter { $0.count == 3 }
        let systemd = entries.first { $0[1] == "name=systemd" } ?? entries.first { $0[0] == "0" && $0[1].isEmpty }
        guard let path = systemd?[2] else { return nil }
        let unit = path.split(separator: "/").last { $0.hasSuffix(".service") || $0.hasSuffix(".scope") }
        return unit.map(String.init)
    }

    /// Field 22 of `/proc/PID/stat`: when the process started, in clock
    /// ticks since boot. Read after the last `)`, as the name may hold any byte.
    private static func startTime(of pid: Int32) -> UInt64? {
        guard let stat = Self.read("/proc/\(pid)/stat"), let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        return fields.count > 19 ? UInt64(fields[19]) : nil
    }

    /// True while the process behind `pidfd` has not exited.
    private static func isRunning(_ pidfd: CInt) -> Bool {
        var entry = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, 0) == 0
    }

    /// A small /proc file, or nil.
    private static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 1 << 16 {
            let n = Glibc.read(fd, &chunk, chunk.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
