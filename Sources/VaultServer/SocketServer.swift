public import Logging
public import NIOCore
public import NIOPosix
import Glibc
import CVaultSystem
import Synchronization
import VaultProtocol

/// The Unix-socket face of the daemon: JSON lines in, JSON lines out.
///
/// Peers of another uid are closed at accept, before a byte is read. Each
/// line is at most 65,536 bytes; a longer one is answered `line_too_long`
/// and its connection closed. Requests on one connection are answered as
/// they finish, by `id`.
public final class SocketServer: Sendable {
    public struct Configuration: Sendable {
        public var path: String
        public var maximumConnections = 4096
        /// A connection that sends no whole line for this long, and has no
        /// request in flight and no subscription, is closed.
        public var idleTimeout: TimeAmount = .minutes(10)
        /// Bytes read and not yet decoded, across all connections, past which
        /// a connection that does not read its replies is closed.
        public var maximumHeldBytes = 32 << 20
        /// A listening socket handed over by systemd (socket activation);
        /// then `path` only names it, and systemd owns the file.
        public var inherited: CInt?

        public init(path: String) {
            self.path = path
        }
    }

    public let configuration: Configuration
    private let channel: any Channel
    private let logger: Logger

    /// Binds the socket and starts accepting; listening when it returns.
    public static func start(
        _ configuration: Configuration,
        handler: any RequestHandler,
        events: EventHub,
        observer: (any ConnectionObserver)? = nil,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger
    ) async throws -> SocketServer {
        if configuration.inherited == nil { try SocketPreparation.prepare(configuration.path) }
        let connections = ConnectionCount(maximumHeldBytes: configuration.maximumHeldBytes)
        let open = OpenChannels()
        let owner = getuid()
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .childChannelOption(.allowRemoteHalfClosure, value: false)
            // One read of at most 1 KiB per wake-up: the lines of one burst
            // are all the handler answers for a connection before the event
            // loop turns to the others, so a flood of pipelined requests on
            // many connections delays a new client by one short turn of each.
            .childChannelOption(.maxMessagesPerRead, value: 1)
            .childChannelOption(
                .recvAllocator,
                value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: ConnectionHandler.readBytes, maximum: ConnectionHandler.readBytes)
            )
            .childChannelInitializer { channel in
                open.add(channel)
                return Self.accept(
                    channel,
                    owner: owner,
                    configuration: configuration,
                    connections: connections,
                    handler: handler,
                    events: events,
                    observer: observer,
                    logger: logger
                )
            }
        if let inherited = configuration.inherited {
            let channel = try await bootstrap.withBoundSocket(inherited).get()
            logger.info("listening", metadata: ["socket": "\(configuration.path)", "activation": "systemd"])
            return SocketServer(configuration: configuration, channel: channel, connections: connections, open: open, made: nil, logger: logger)
        }
        // Until the chmod the socket has the umask's mode, which gives no
        // other user write access, so none can connect; SO_PEERCRED checks anyway.
        let channel = try await bootstrap.bind(unixDomainSocketPath: configuration.path).get()
        var info = stat()
        guard chmod(configuration.path, 0o600) == 0, lstat(configuration.path, &info) == 0 else {
            try? await channel.close()
            throw ServerError("cannot set mode 0600 on \(configuration.path)")
        }
        logger.info("listening", metadata: ["socket": "\(configuration.path)"])
        return SocketServer(
            configuration: configuration,
            channel: channel,
            connections: connections,
            open: open,
            made: SocketFile(device: UInt64(info.st_dev), inode: UInt64(info.st_ino)),
            logger: logger
        )
    }

    private let connections: ConnectionCount
    private let open: OpenChannels
    /// The socket file this server made (nil: systemd's), so that closing
    /// removes that file and never another put at its path since.
    private let made: SocketFile?

    private init(
        configuration: Configuration,
        channel: any Channel,
        connections: ConnectionCount,
        open: OpenChannels,
        made: SocketFile?,
        logger: Logger
    ) {
        self.configuration = configuration
        self.channel = channel
        self.connections = connections
        self.open = open
        self.made = made
        self.logger = logger
    }

    /// Closes every connection this server accepted (a share that ends).
    public func closeConnections() {
        self.open.closeAll()
    }

    /// Connections open now.
    public var openConnections: Int { self.connections.current }

    /// Requests being worked on now, across all connections.
    public var requestsInFlight: Int { self.connections.inFlight }

    /// Connections accepted so far, open or closed.
    public var connectionsAccepted: Int { self.connections.acceptedSoFar }

    /// Returns once no connection is open, or the task is cancelled.
    public func untilNoConnection() async {
        await self.connections.untilNoConnection()
    }

    /// Returns once no request is in flight, or the task is cancelled.
    public func untilNoRequest() async {
        await self.connections.untilNoRequest()
    }

    /// Stops accepting and removes the socket file it made (not systemd's,
    /// and not whatever another program put at the path since).
    public func close() async {
        try? await self.channel.close()
        if let made = self.made {
            var info = stat()
            if lstat(self.configuration.path, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK,
                UInt64(info.st_dev) == made.device, UInt64(info.st_ino) == made.inode
            {
                unlink(self.configuration.path)
            } else {
                self.logger.notice("socket file replaced by another; left in place", metadata: ["socket": "\(self.configuration.path)"])
            }
        }
        self.logger.info("socket closed", metadata: ["socket": "\(self.configuration.path)"])
    }

    private static func accept(
        _ channel: any Channel,
        owner: uid_t,
        configuration: Configuration,
        connections: ConnectionCount,
        handler: any RequestHandler,
        events: EventHub,
        observer: (any ConnectionObserver)?,
        logger: Logger
    ) -> EventLoopFuture<Void> {
        guard let provider = channel as? any SocketOptionProvider else {
            channel.close(promise: nil)
            return channel.eventLoop.makeFailedFuture(ServerError("no socket options on this channel"))
        }
        let credentials: EventLoopFuture<vault_peer_credentials> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET),
            name: SocketOptionName(SO_PEERCRED)
        )
        // The pidfd tells whether the peer's PID still names it once /proc is read.
        let pidfd: EventLoopFuture<CInt?> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET),
            name: SocketOptionName(VAULT_SO_PEERPIDFD)
        ).map { Optional($0) }.recover { _ in nil }
        return credentials.and(pidfd).flatMapThrowing { credentials, pidfd in
            defer { if let pidfd { Glibc.close(pidfd) } }
            guard credentials.uid == owner else {
                logger.warning("peer of another user refused", metadata: ["uid": "\(credentials.uid)", "pid": "\(credentials.pid)"])
                throw ServerError("peer refused")
            }
            let peer = Peer.identify(pid: credentials.pid, uid: credentials.uid, gid: credentials.gid, pidfd: pidfd)
            let admitted = connections.admit(limit: configuration.maximumConnections)
            let handler = ConnectionHandler(
                peer: peer,
                handler: handler,
                events: events,
                observer: observer,
                admitted: admitted,
                connections: connections,
                idleTimeout: configuration.idleTimeout,
                logger: logger
            )
            try channel.pipeline.syncOperations.addHandler(handler)
        }.flatMapErrorThrowing { error in
            // NIO leaves a channel whose initializer failed open: close it, or
            // the refused client hangs.
            channel.close(promise: nil)
            throw error
        }
    }
}

/// A file's place on disk: what tells one file from another put at the same path.
struct SocketFile: Sendable {
    let device: UInt64
    let inode: UInt64
}

/// The socket could not be set up; `description` says why and what to do.
public struct ServerError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The connections a server accepted and that are still open.
final class OpenChannels: Sendable {
    private let channels = Mutex<[ObjectIdentifier: any Channel]>([:])

    func add(_ channel: any Channel) {
        let key = ObjectIdentifier(channel)
        self.channels.withLock { $0[key] = channel }
        channel.closeFuture.whenComplete { _ in _ = self.channels.withLock { $0.removeValue(forKey: key) } }
    }

    func closeAll() {
        for channel in self.channels.withLock({ Array($0.values) }) { channel.close(promise: nil) }
    }
}

/// Open connections, counted so a flood of them is answered `overloaded`,
/// and requests in flight, counted so a stop can let them finish; each count
/// tells whoever waits for it when it falls to zero.
final class ConnectionCount: Sendable {
    private let count = Atomic<Int>(0)
    private let accepted = Atomic<Int>(0)
    private let requests = Atomic<Int>(0)
    private let held = Atomic<Int>(0)
    private let noConnection = ZeroWaiters()
    private let noRequest = ZeroWaiters()
    let maximumHeldBytes: Int

    init(maximumHeldBytes: Int) {
        self.maximumHeldBytes = maximumHeldBytes
    }

    /// Bytes read and not yet decoded, by all connections.
    var heldBytes: Int { self.held.load(ordering: .relaxed) }

    func hold(_ delta: Int) {
        self.held.wrappingAdd(delta, ordering: .relaxed)
    }

    func admit(limit: Int) -> Bool {
        self.accepted.wrappingAdd(1, ordering: .relaxed)
        let now = self.count.wrappingAdd(1, ordering: .relaxed).newValue
        return now <= limit
    }

    func release() {
        if self.count.wrappingSubtract(1, ordering: .relaxed).newValue == 0 {
            self.noConnection.wake()
        }
    }

    func started() {
        self.requests.wrappingAdd(1, ordering: .relaxed)
    }

    func finished() {
        if self.requests.wrappingSubtract(1, ordering: .relaxed).newValue == 0 {
            self.noRequest.wake()
        }
    }

    var current: Int { self.count.load(ordering: .relaxed) }
    var inFlight: Int { self.requests.load(ordering: .relaxed) }
    /// Connections accepted so far, open or closed.
    var acceptedSoFar: Int { self.accepted.load(ordering: .relaxed) }

    /// Returns once no connection is open, or the task is cancelled.
    func untilNoConnection() async {
        await self.noConnection.wait { self.current == 0 }
    }

    /// Returns once no request is in flight, or the task is cancelled.
    func untilNoRequest() async {
        await self.noRequest.wait { self.inFlight == 0 }
    }
}

/// Tasks waiting for a count to fall to zero.
private final class ZeroWaiters: Sendable {
    private struct State {
        var next = 0
        var waiting: [Int: CheckedContinuation<Void, Never>] = [:]
    }

    private let state = Mutex(State())

    /// Returns at once when `isZero`, else at the next `wake` or cancellation.
    func wait(isZero: @Sendable () -> Bool) async {
        let ticket = self.state.withLock { state -> Int in
            state.next += 1
            return state.next
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                // Checked under the lock `wake` takes: a count that falls to
                // zero after this finds the continuation in place.
                let now = self.state.withLock { state -> Bool in
                    if isZero() || Task.isCancelled { return true }
                    state.waiting[ticket] = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            self.state.withLock { $0.waiting.removeValue(forKey: ticket) }?.resume()
        }
    }

    func wake() {
        let waiting = self.state.withLock { state in
            defer { state.waiting = [:] }
            return state.waiting.values
        }
        for continuation in waiting { continuation.resume() }
    }
}

/// One daemon per socket: refuse a live one, replace a stale one; and only
/// in a folder that no other user can change.
enum SocketPreparation {
    static func prepare(_ path: String) throws {
        guard path.utf8.count < 108 else {
            throw ServerError("the socket path \(path) is longer than the 107 bytes a Unix socket allows")
        }
        let folder = FilePaths.folder(of: path)
        try PrivateFolder.check(folder.hasPrefix("/") ? folder : Self.currentDirectory() + "/" + folder, role: "the socket's folder")
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFSOCK else {
            throw ServerError("\(path) exists and is not a socket; move it away or choose another --socket")
        }
        if Self.isLive(path) {
            throw ServerError("another vaultd is already listening on \(path)")
        }
        unlink(path)
    }

    /// vaultd's own working directory, for a relative `--socket`.
    private static func currentDirectory() -> String {
        guard let raw = getcwd(nil, 0) else { return "." }
        defer { free(raw) }
        return String(cString: raw)
    }

    /// True when something accepts connections on `path`.
    private static func isLive(_ path: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { Glibc.close(fd) }
        guard let address = UnixAddress(path) else { return false }
        return address.withSockaddr { connect(fd, $0, $1) } == 0
    }
}
