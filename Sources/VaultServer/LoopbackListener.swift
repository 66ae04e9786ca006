import FoundationEssentials
package import Glibc
package import NIOCore
package import NIOHTTP1
import NIOPosix
import Synchronization
import VaultProtocol

/// The redirect listener of a browser sign-in (RFC 8252 §7.3): HTTP on
/// 127.0.0.1 only, on a free port or the account's fixed one, opened just
/// before the authorization request and closed after the one answer that
/// counts. Only `GET` of the callback path is answered (other paths 404,
/// other methods 405); its query goes to `handle`, whose verdict becomes
/// the short page the browser shows. Any local user can connect, so each
/// connection has `requestDeadline` to send its request, at most
/// `maximumConnections` are held (more are closed at once), and `close()`
/// closes every one of them.
package final class LoopbackListener: Sendable {
    /// What the browser is told, and whether the listener's work is done.
    package struct Verdict: Sendable {
        package var status: HTTPResponseStatus
        package var title: String
        package var message: String
        package var done: Bool

        package init(status: HTTPResponseStatus, title: String, message: String, done: Bool) {
            self.status = status
            self.title = title
            self.message = message
            self.done = done
        }
    }

    package typealias Handler = @Sendable ([String: String]) async -> Verdict
    /// Runs the handler's work off the event loop (the daemon's chores).
    package typealias Run = @Sendable (@escaping @Sendable () async -> Void) -> Void

    package let redirectURI: String
    private let channel: any Channel
    private let connections: Connections

    private init(redirectURI: String, channel: any Channel, connections: Connections) {
        self.redirectURI = redirectURI
        self.channel = channel
        self.connections = connections
    }

    /// Binds 127.0.0.1 (or [::1] for such a fixed URI) and returns at once.
    /// `fixed` is a loopback `http` URI whose port the issuer matches exactly.
    package static func start(
        fixed: String?,
        requestDeadline: TimeAmount = .seconds(5),
        maximumConnections: Int = 16,
        run: @escaping Run,
        handle: @escaping Handler
    ) async throws -> LoopbackListener {
        var host = "127.0.0.1"
        var port = 0
        var path = "/callback"
        if let fixed {
            guard let components = URLComponents(string: fixed), components.scheme == "http",
                let fixedHost = components.host, Loopback.isAddress(fixedHost)
            else {
                throw ListenerError("the account's redirect_uri must be http://127.0.0.1:PORT/PATH")
            }
            host = Loopback.isIPv6(fixedHost) ? "::1" : "127.0.0.1"
            port = components.port ?? 80
            path = components.path.isEmpty ? "/" : components.path
        }
        let expectedPath = path
        let connections = Connections(maximum: maximumConnections)
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 8)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                // A failed future makes NIO close the connection at once: one
                // of another user (who could hold every slot for the sign-in's
                // life), or one over the cap.
                if let peer = channel.remoteAddress, let local = channel.localAddress,
                    let uid = TCPOwner.uid(of: peer, connectedTo: local), uid != getuid()
                {
                    return channel.eventLoop.makeFailedFuture(ListenerError("another user's connection"))
                }
                guard connections.admit(channel) else { return channel.eventLoop.makeFailedFuture(ListenerError("full")) }
                let deadline = channel.eventLoop.scheduleTask(in: requestDeadline) { channel.close(promise: nil) }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(
                        CallbackHandler(path: expectedPath, deadline: deadline, run: run, handle: handle) {
                            connections.answering(channel)
                        }
                    )
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.bind(host: host, port: port).get()
        } catch {
            throw ListenerError("cannot listen on \(host):\(port) for the browser's answer (\(error)); is another sign-in running?")
        }
        guard let bound = channel.localAddress?.port else {
            try? await channel.close()
            throw ListenerError("the loopback listener has no port")
        }
        let uri = fixed ?? "http://127.0.0.1:\(bound)\(path)"
        return LoopbackListener(redirectURI: uri, channel: channel, connections: connections)
    }

    /// A redirect URI on a port of 127.0.0.1 free now, for a client that
    /// registers the one URI it will listen on from then on (issuers match
    /// it exactly, port included, as Glewlwyd does). The port is below the
    /// kernel's range for outgoing connections (`ip_local_port_range`), so
    /// no connection of another program takes it by chance before a
    /// sign-in listens there. Nil when no port is free.
    package static func freeRedirectURI() -> String? {
        for _ in 0..<100 {
            let port = Int.random(in: 20000..<32000)
            guard let address = try? SocketAddress(ipAddress: "127.0.0.1", port: port) else { return nil }
            let fd = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { return nil }
            let bound = address.withSockAddr { Glibc.bind(fd, $0, socklen_t($1)) }
            Glibc.close(fd)
            if bound == 0 { return "http://127.0.0.1:\(port)/callback" }
        }
        return nil
    }

    /// Stops listening and closes every connection still open, but for
    /// one being answered: it closes once its page is sent.
    package func close() {
        self.channel.close(promise: nil)
        for connection in self.connections.closeAll() { connection.close(promise: nil) }
    }

    /// Connections accepted and not yet closed.
    package var openConnections: Int { self.connections.count }

    struct ListenerError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    /// The accepted connections, for the cap and for `close()`.
    private final class Connections: Sendable {
        private let maximum: Int
        /// The open connections, and whether each is being answered.
        private let state = Mutex<(closed: Bool, open: [ObjectIdentifier: (channel: any Channel, answering: Bool)])>((false, [:]))

        init(maximum: Int) { self.maximum = maximum }

        func admit(_ channel: any Channel) -> Bool {
            let id = ObjectIdentifier(channel)
            let admitted = self.state.withLock { state in
                guard !state.closed, state.open.count < self.maximum else { return false }
                state.open[id] = (channel, false)
                return true
            }
            if admitted { channel.closeFuture.whenComplete { _ in self.state.withLock { _ = $0.open.removeValue(forKey: id) } } }
            return admitted
        }

        /// A whole request came in: its answer is on its way, and the connection closes after.
        func answering(_ channel: any Channel) {
            self.state.withLock { $0.open[ObjectIdentifier(channel)]?.answering = true }
        }

        func closeAll() -> [any Channel] {
            self.state.withLock { state in
                state.closed = true
                return state.open.values.filter { !$0.answering }.map(\.channel)
            }
        }

        var count: Int { self.state.withLock { $0.open.count } }
    }
}

/// One browser connection: a GET of the redirect path with the answer in its query.
private final class CallbackHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let path: String
    let deadline: Scheduled<Void>
    /// The answer is worked out as a chore of the vault's.
    let run: LoopbackListener.Run
    let handle: LoopbackListener.Handler
    let answering: @Sendable () -> Void

    init(
        path: String,
        deadline: Scheduled<Void>,
        run: @escaping LoopbackListener.Run,
        handle: @escaping LoopbackListener.Handler,
        answering: @escaping @Sendable () -> Void
    ) {
        self.path = path
        self.deadline = deadline
        self.run = run
        self.handle = handle
        self.answering = answering
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(let head) = self.unwrapInboundIn(data) else { return }
        let channel = context.channel
        guard let components = URLComponents(string: "http://loopback" + head.uri), components.path == self.path else {
            Self.respond(
                channel,
                LoopbackListener.Verdict(status: .notFound, title: "Not found", message: "Nothing here.", done: false)
            )
            return
        }
        guard head.method == .GET else {
            Self.respond(
                channel,
                LoopbackListener.Verdict(status: .methodNotAllowed, title: "Not allowed", message: "Only GET.", done: false)
            )
            return
        }
        // The request is in: its answer may take as long as redeeming the code,
        // and the flow's end (which this answer may bring) does not cut it.
        self.deadline.cancel()
        self.answering()
        var query: [String: String] = [:]
        for item in components.queryItems ?? [] where query[item.name] == nil {
            query[item.name] = item.value ?? ""
        }
        let handle = self.handle
        let answer = query
        self.run {
            let verdict = await handle(answer)
            Self.respond(channel, verdict)
        }
    }

    private static func respond(_ channel: any Channel, _ verdict: LoopbackListener.Verdict) {
        let html = """
            <!doctype html>
            <html><head><meta charset="utf-8"><title>tokenvault: \(verdict.title.escapingHTML)</title></head>
            <body style="font-family: sans-serif; margin: 3em"><h1>\(verdict.title.escapingHTML)</h1>
            <p>\(verdict.message.escapingHTML)</p></body></html>

            """
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/html; charset=utf-8")
        headers.add(name: "Content-Length", value: String(html.utf8.count))
        headers.add(name: "Cache-Control", value: "no-store")
        headers.add(name: "Connection", value: "close")
        if verdict.status == .methodNotAllowed { headers.add(name: "Allow", value: "GET") }
        let head = HTTPResponseHead(version: .http1_1, status: verdict.status, headers: headers)
        channel.write(HTTPServerResponsePart.head(head), promise: nil)
        channel.write(HTTPServerResponsePart.body(.byteBuffer(channel.allocator.buffer(string: html))), promise: nil)
        channel.writeAndFlush(HTTPServerResponsePart.end(nil)).whenComplete { _ in
            channel.close(promise: nil)
        }
    }
}

/// Who owns the other end of a loopback TCP connection. SO_PEERCRED is for
/// Unix sockets only, but both ends of a loopback connection are this
/// machine's sockets, and /proc/net/tcp (tcp6) lists each with its owner:
/// the peer's socket is the row whose local address is the peer's and whose
/// remote address is ours.
package enum TCPOwner {
    /// The peer's uid, or nil when no row names it (it closed meanwhile, or
    /// lives in another network namespace).
    package static func uid(of peer: SocketAddress, connectedTo local: SocketAddress) -> uid_t? {
        guard let peerText = Self.procText(peer), let localText = Self.procText(local) else { return nil }
        let table = peerText.count > 13 ? "/proc/net/tcp6" : "/proc/net/tcp"
        guard let file = fopen(table, "r") else { return nil }
        defer { fclose(file) }
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(line) }
        while getline(&line, &capacity, file) > 0, let line {
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...
            let fields = String(cString: line).split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count > 7, fields[1] == peerText, fields[2] == localText else { continue }
            return uid_t(fields[7])
        }
        return nil
    }

    /// An address as /proc/net/tcp prints it: the address's 32-bit words
    /// each in host (little-endian) byte order, in hex, then `:` and the port.
    package static func procText(_ address: SocketAddress) -> String? {
        guard let port = address.port else { return nil }
        let bytes: [UInt8]
        switch address {
        // The address bytes within Linux's sockaddr_in (after family and
        // port) and sockaddr_in6 (after family, port and flow info).
        case .v4(let v4):
            bytes = withUnsafeBytes(of: v4.address) { Array($0[4..<8]) }
        case .v6(let v6):
            bytes = withUnsafeBytes(of: v6.address) { Array($0[8..<24]) }
        default:
            return nil
        }
        var text = ""
        for word in stride(from: 0, to: bytes.count, by: 4) {
            for byte in bytes[word..<word + 4].reversed() { text += Self.hex(byte) }
        }
        return text + ":" + Self.hex(UInt8(port >> 8)) + Self.hex(UInt8(port & 0xFF))
    }

    private static func hex(_ byte: UInt8) -> String {
        let digits = Array("0123456789ABCDEF")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]])
    }
}
