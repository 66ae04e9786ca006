public import FoundationEssentials
import Glibc
public import VaultProtocol

/// A blocking connection to vaultd, one request at a time: what a command
/// line tool wants (no threads, no event loop, quick to start).
///
/// ```swift
/// let vault = try VaultConnection(path: TokenVault.socketPath(explicit: nil))
/// let status = try vault.call(.status, as: StatusResult.self)
/// ```
public final class VaultConnection {
    public let path: String
    private var fd: Int32
    private var buffer: [UInt8] = []
    private var nextID: Int64 = 1
    /// Replies longer than this are refused rather than buffered without bound.
    private static let maximumReplyBytes = 4 << 20

    /// Connects to the socket at `path`; fails with a sentence saying what to
    /// do, and with `forbidden` when its server runs as another user.
    public init(path: String) throws(VaultError) {
        self.path = path
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw VaultError.noSocket(Self.reason()) }
        guard let address = UnixAddress(path) else {
            close(fd)
            throw VaultError.socketPathTooLong(path)
        }
        let status = address.withSockaddr { connect(fd, $0, $1) }
        guard status == 0 else {
            let code = errno
            close(fd)
            switch code {
            case ENOENT, ECONNREFUSED:
                throw VaultError.notRunning(path)
            case EACCES, EPERM:
                throw VaultError.socketNotYours(path)
            default:
                throw VaultError.cannotConnect(path, String(cString: strerror(code)))
            }
        }
        do {
            try Self.checkServer(fd, path: path)
        } catch {
            close(fd)
            throw error
        }
        self.fd = fd
    }

    /// Checks, before a byte is sent, that the server on `fd` runs as this
    /// user (SO_PEERCRED): else whoever made a socket at `path` would be sent
    /// passwords, codes and refresh tokens.
    private static func checkServer(_ fd: Int32, path: String) throws(VaultError) {
        // struct ucred, which Glibc's module map leaves out (_GNU_SOURCE).
        var credentials: (pid: Int32, uid: UInt32, gid: UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout.size(ofValue: credentials))
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 else {
            throw VaultError.unknownServer(path, Self.reason())
        }
        let me = geteuid()
        guard credentials.uid == me else {
            throw VaultError.servedByAnotherUser(path, uid: credentials.uid, me: me)
        }
    }

    deinit {
        if self.fd >= 0 { close(self.fd) }
    }

    /// The socket, for poll(2) beside other descriptors (`vaultctl notify`).
    public var descriptor: Int32 { self.fd }

    /// Whether a whole line waits in memory, which poll(2) would not report.
    public var hasBufferedLine: Bool { self.buffer.contains(0x0A) }

    /// Hands the socket to another owner (the async client, the tests' raw
    /// line client).
    package func detach() -> Int32 {
        defer { self.fd = -1 }
        return self.fd
    }

    /// Sends `command` and returns the reply line: the raw JSON for `--json`,
    /// after checking that it succeeded.
    @discardableResult
    public func send(_ command: Command) throws(VaultError) -> Data {
        let id = RequestID.number(self.nextID)
        self.nextID += 1
        var line: Data
        do {
            line = try LineCodec.framed(Request(id: id, command: command))
        } catch {
            throw VaultError.requestNotEncoded
        }
        defer { line.resetBytes(in: 0..<line.count) }
        try self.writeAll(line)
        while true {
            let reply = try self.readLine()
            let head: ResponseHead
            do {
                head = try LineCodec.head(of: reply)
            } catch {
                throw VaultError.unreadableReply
            }
            if head.event != nil { continue }
            if let error = head.error { throw error }
            guard head.id == id || head.id == nil else { continue }
            return reply
        }
    }

    /// After `subscribe`: the next event line as vaultd wrote it, or nil when
    /// vaultd closed the stream (it stopped). A last line with an error
    /// (`overloaded`: this reader fell too far behind) is thrown.
    public func nextEvent() throws(VaultError) -> Data? {
        while true {
            let line: Data
            do {
                line = try self.readLine()
            } catch where error == VaultError.closedBeforeAnswering {
                return nil
            }
            let head: ResponseHead
            do {
                head = try LineCodec.head(of: line)
            } catch {
                throw VaultError.unreadableReply
            }
            if let error = head.error { throw error }
            if head.event != nil { return line }
        }
    }

    /// Sends `command` and decodes its result.
    public func call<P: ResultPayload>(_ command: Command, as type: P.Type) throws(VaultError) -> P {
        let reply = try self.send(command)
        do {
            return try LineCodec.payload(P.self, of: reply)
        } catch {
            throw VaultError.unreadableReply
        }
    }

    private func writeAll(_ data: Data) throws(VaultError) {
        var offset = 0
        while offset < data.count {
            let n = data.withUnsafeBytes { Glibc.send(self.fd, $0.baseAddress?.advanced(by: offset), $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw VaultError.closedWhileSending(Self.reason())
            }
            offset += n
        }
    }

    private func readLine() throws(VaultError) -> Data {
        while true {
            if let newline = self.buffer.firstIndex(of: 0x0A) {
                let line = Data(self.buffer[..<newline])
                self.buffer.removeSubrange(...newline)
                return line
            }
            guard self.buffer.count <= Self.maximumReplyBytes else {
                throw VaultError.lineTooLongFromVaultd(Self.maximumReplyBytes)
            }
            var n = 0
            // Not zeroed first: recv writes what it returns, and a fresh
            // vaultctl would touch four pages of heap for nothing.
            let chunk = [UInt8](unsafeUninitializedCapacity: 16 * 1024) { bytes, count in
                n = recv(self.fd, bytes.baseAddress, bytes.count, 0)
                count = Swift.max(n, 0)
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw VaultError.connectionLost(Self.reason())
            }
            if n == 0 { throw VaultError.closedBeforeAnswering }
            self.buffer.append(contentsOf: chunk)
        }
    }

    private static func reason() -> String { String(cString: strerror(errno)) }
}

extension ErrorCode {
    /// Client side only: the daemon could not be reached at all.
    public static let unavailable = ErrorCode(rawValue: "unavailable")
}
