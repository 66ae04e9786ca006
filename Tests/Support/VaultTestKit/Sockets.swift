import Glibc
import VaultProtocol

/// Binds `fd` to the Unix socket `path` through the one `UnixAddress` that
/// vaultd and its clients use. Returns bind's status: 0, or -1 with errno set
/// (-1 with EINVAL too when `path` does not fit).
public func bind(_ fd: Int32, unixPath path: String) -> Int32 {
    guard let address = UnixAddress(path) else {
        errno = EINVAL
        return -1
    }
    return address.withSockaddr { Glibc.bind(fd, $0, $1) }
}

/// Sends `bytes` as one datagram to the Unix socket `path`; sendto's status.
public func send(_ fd: Int32, _ bytes: [UInt8], toUnixPath path: String, flags: Int32 = 0) -> Int {
    guard let address = UnixAddress(path) else {
        errno = EINVAL
        return -1
    }
    return address.withSockaddr { to, length in
        bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, flags, to, length) }
    }
}

/// A TCP connection to 127.0.0.1 that sent some bytes and waits.
package final class HeldConnection: @unchecked Sendable {
    package let fd: Int32

    package init(port: Int, send text: String) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let status = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard status == 0 else {
            close(fd)
            throw ToolFailure(message: "cannot connect to port \(port)")
        }
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        self.fd = fd
        _ = Array(text.utf8).withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    deinit { close(self.fd) }

    /// Whether the other end closed (end of stream or reset), asked without blocking.
    package var isClosed: Bool {
        var byte: UInt8 = 0
        let n = recv(self.fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
    }
}

/// Sends `request` to 127.0.0.1:`port` and returns the whole answer ("" when it cannot connect).
package func exchange(_ port: Int, _ request: String) -> String {
    guard let connection = try? HeldConnection(port: port, send: request) else { return "" }
    var answer: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = recv(connection.fd, &chunk, chunk.count, 0)
        if n <= 0 { break }
        answer += chunk[0..<n]
    }
    return String(decoding: answer, as: UTF8.self)
}
