public import Glibc

/// A Unix socket's address, filled in one place for vaultd, its clients and
/// systemd's notify socket: a path that does not fit is refused, never cut
/// short (a cut path names another socket). For systemd's `NOTIFY_SOCKET`
/// only, a leading `@` names an abstract socket (its first byte NUL).
public struct UnixAddress: Sendable {
    private var address = sockaddr_un()
    private let length: socklen_t

    /// Nil when `path` is empty or does not fit in `sun_path` with its NUL.
    /// `abstractAt`: a leading `@` names an abstract socket.
    public init?(_ path: String, abstractAt: Bool = false) {
        var bytes = Array(path.utf8)
        let abstract = abstractAt && bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: self.address.sun_path)
        guard !bytes.isEmpty, bytes.count < capacity else { return nil }
        self.address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &self.address.sun_path) { $0.copyBytes(from: bytes) }
        // A path's length counts its NUL; an abstract name's is exactly its bytes.
        self.length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (abstract ? 0 : 1))
    }

    /// Calls `body` with the address as `connect`, `bind` and `sendto` take it.
    public func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws -> R) rethrows -> R {
        var address = self.address
        return try withUnsafePointer(to: &address) {
            try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { try body($0, self.length) }
        }
    }
}
