import Glibc

/// Who is on the other end of a connection, from SO_PEERCRED at accept time.
public struct Peer: Sendable, Hashable, CustomStringConvertible {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32
    /// `/proc/PID/exe` of the peer when it could be read.
    public var executable: String?

    public init(pid: Int32, uid: UInt32, gid: UInt32, executable: String?) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self.executable = executable
    }

    /// The peer with its executable read from /proc.
    init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.init(pid: pid, uid: uid, gid: gid, executable: Self.executable(of: pid))
    }

    public var description: String { "pid \(self.pid) uid \(self.uid) exe \(self.executable ?? "?")" }

    static func executable(of pid: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/\(pid)/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
