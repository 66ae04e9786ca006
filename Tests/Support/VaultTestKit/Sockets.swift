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
