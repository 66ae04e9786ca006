import Logging
import NIOCore
import VaultCrypto
import VaultProtocol

/// One client connection: splits what it reads into lines, asks the
/// request handler about each, writes the replies. Ready replies go out in order
/// and are flushed once per read burst; pending ones are written whenever
/// they finish.
///
/// What one connection can make the daemon hold is bounded. A line is
/// decoded only while fewer than `maximumUnwritten` of the connection's
/// replies and events wait for the kernel to take them, fewer than
/// `maximumPending` of its requests are being worked on, and its channel is
/// writable. Past that, bytes already read stay undecoded, and nothing more
/// is read, until the client catches up. Undecoded bytes count against a
/// budget shared by every connection (`ConnectionCount.maximumHeldBytes`): a
/// stalled connection that leaves the total over it is closed.
///
/// Other components (the event hub) write to a connection with
/// `channel.writeAndFlush`, which this handler counts like its own replies,
/// and end one with `ConnectionHandler.close(_:after:)`.
final class ConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Requests of one connection being worked on at once.
    static let maximumPending = 64
    /// Replies and events of one connection not yet taken by the kernel
    /// past which no more of its lines are decoded.
    static let maximumUnwritten = 8
    /// The most bytes taken from the socket at once.
    static let readBytes = 1024

    private let peer: Peer
    private let handler: any RequestHandler
    private let events: EventHub
    private let observer: (any ConnectionObserver)?
    private let admitted: Bool
    private let connections: ConnectionCount
    private let idleTimeout: TimeAmount
    private var logger: Logger
    private var needsFlush = false
    /// Set once the peer subscribed: events may come at any time, so the
    /// connection is not closed for being quiet.
    private var subscribed = false
    /// Requests of this connection still being worked on.
    private var pending = 0
    /// Their tasks, cancelled when the connection closes: no one is left to
    /// read their replies. (Work shared with others, a refresh, runs on.)
    private var tasks: [Int: Task<Void, Never>] = [:]
    private var nextTask = 0
    /// Writes handed to the channel and not yet completed.
    private var unwritten = 0
    /// Bytes read and not decoded yet: a partial line, or whole lines held
    /// while the connection is over its limits.
    private var inbound: ByteBuffer?
    /// How many of `inbound`'s bytes `connections` counts now.
    private var counted = 0
    /// A read was asked for while the connection was over its limits.
    private var readHeld = false
    private var draining = false
    /// When the last whole line was decoded: bytes that make no line are not activity.
    private var lastLine = NIODeadline.now()
    private var idleCheck: Scheduled<Void>?

    init(
        peer: Peer,
        handler: any RequestHandler,
        events: EventHub,
        observer: (any ConnectionObserver)?,
        admitted: Bool,
        connections: ConnectionCount,
        idleTimeout: TimeAmount,
        logger: Logger
    ) {
        self.peer = peer
        self.handler = handler
        self.events = events
        self.observer = observer
        self.admitted = admitted
        self.connections = connections
        self.idleTimeout = idleTimeout
        self.logger = logger
        self.logger[metadataKey: "peer_pid"] = "\(peer.pid)"
    }

    /// Writes `response` as the last line of `channel` and closes it once the
    /// line is written, or after `grace` when the peer does not take it.
    static func close(_ channel: any Channel, after response: Response, grace: TimeAmount = .seconds(1)) {
        let buffer = channel.allocator.line(for: response)
        let deadline = channel.eventLoop.scheduleTask(in: grace) { channel.close(promise: nil) }
        channel.writeAndFlush(buffer).whenComplete { _ in
            deadline.cancel()
            channel.close(promise: nil)
        }
    }

    func channelActive(context: ChannelHandlerContext) {
        guard self.admitted else {
            self.logger.warning("connection limit reached; refusing a connection")
            self.send(Response(id: nil, error: .tooManyConnections), context: context, flush: true)
            context.close(promise: nil)
            return
        }
        self.logger.debug("connection opened", metadata: self.peer.auditMetadata)
        self.scheduleIdleCheck(context: context, in: self.idleTimeout)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if self.subscribed { self.events.unsubscribe(context.channel) }
        for task in self.tasks.values { task.cancel() }
        self.tasks = [:]
        self.idleCheck?.cancel()
        self.inbound = nil
        self.countHeld()
        self.connections.release()
        // The connection's buffers leave holes in the heap: the observer gives them back.
        self.observer?.closed()
        self.logger.debug("connection closed")
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard self.admitted else { return }
        self.observer?.reading()
        var bytes = self.unwrapInboundIn(data)
        if self.inbound == nil {
            self.inbound = bytes
        } else {
            let read = bytes
            self.inbound!.discardReadBytes()
            self.inbound!.writeBuffer(&bytes)
            // Copied into `inbound`: the read's own buffer keeps nothing of it.
            read.withUnsafeReadableBytes { secureZero(UnsafeMutableRawBufferPointer(mutating: $0)) }
        }
        self.drain(context: context)
        if context.channel.isActive, self.inbound != nil, !self.mayDecode(context),
            self.connections.heldBytes > self.connections.maximumHeldBytes
        {
            self.logger.notice("closing a connection that does not read its replies: vaultd holds too much unread input")
            context.close(promise: nil)
        }
    }

    /// Decodes and answers the lines read so far, as far as the limits allow.
    private func drain(context: ChannelHandlerContext) {
        guard !self.draining else { return }
        self.draining = true
        defer {
            self.draining = false
            self.countHeld()
        }
        while context.channel.isActive, self.mayDecode(context), let buffer = self.inbound {
            guard let newline = buffer.readableBytesView.firstIndex(of: UInt8(ascii: "\n")) else {
                if buffer.readableBytes > TokenVault.maximumLineBytes { self.refuseLongLine(context: context) }
                return
            }
            let length = newline - buffer.readerIndex
            guard length <= TokenVault.maximumLineBytes else {
                self.refuseLongLine(context: context)
                return
            }
            let line = self.inbound!.readSlice(length: length)!
            self.inbound!.moveReaderIndex(forwardBy: 1)
            if self.inbound!.readableBytes == 0 { self.inbound = nil }
            self.lastLine = .now()
            self.handle(line, context: context)
            // Let the kernel take what it can, so a client that reads is never held up.
            if self.unwritten >= Self.maximumUnwritten { self.flushIfNeeded(context: context) }
        }
    }

    private func handle(_ line: ByteBuffer, context: ChannelHandlerContext) {
        // Decoded, the line is zeroed where it was read: it may carry a
        // password, a code or a refresh token, and its buffer is freed unwiped.
        let request = line.withUnsafeReadableBytes { bytes in
            defer { secureZero(UnsafeMutableRawBufferPointer(mutating: bytes)) }
            return LineCodec.request(from: bytes)
        }
        switch self.handler.handle(request, from: self.peer) {
        case .ready(let response):
            self.send(response, context: context, flush: false)
            self.needsFlush = true
        case .subscribe(let response, let accounts):
            // Subscribed before the reply is written: an event emitted in
            // between is written after the reply, never lost.
            self.subscribed = true
            self.events.subscribe(context.channel, accounts: accounts)
            self.logger.debug("subscribed", metadata: ["accounts": "\(accounts.map { "\($0.count)" } ?? "all")"])
            self.send(response, context: context, flush: true)
        case .pending(let work):
            let channel = context.channel
            let connections = self.connections
            let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
            let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
            connections.started()
            self.pending += 1
            let key = self.nextTask
            self.nextTask += 1
            // Removed on this event loop, so always after it is added below.
            self.tasks[key] = Task {
                let response = await work()
                channel.writeAndFlush(channel.allocator.line(for: response), promise: nil)
                channel.eventLoop.execute {
                    connections.finished()
                    handler.value.tasks[key] = nil
                    handler.value.pending -= 1
                    handler.value.resume(context: loopContext.value)
                }
            }
        }
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        context.write(data, promise: self.counted(promise, context: context))
    }

    /// `promise`, or a new one, that also keeps `unwritten` and resumes
    /// decoding once the write is done.
    private func counted(_ promise: EventLoopPromise<Void>?, context: ChannelHandlerContext) -> EventLoopPromise<Void> {
        let promise = promise ?? context.eventLoop.makePromise()
        self.unwritten += 1
        promise.futureResult.assumeIsolated().whenComplete { _ in
            self.unwritten -= 1
            self.resume(context: context)
        }
        return promise
    }

    func read(context: ChannelHandlerContext) {
        if self.mayDecode(context) {
            context.read()
        } else {
            self.readHeld = true
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        self.resume(context: context)
        context.fireChannelWritabilityChanged()
    }

    private func mayDecode(_ context: ChannelHandlerContext) -> Bool {
        context.channel.isWritable && self.pending < Self.maximumPending && self.unwritten < Self.maximumUnwritten
    }

    /// Back under the limits: answers the lines held, then reads again.
    private func resume(context: ChannelHandlerContext) {
        guard !self.draining, context.channel.isActive, self.mayDecode(context) else { return }
        self.drain(context: context)
        self.flushIfNeeded(context: context)
        guard self.readHeld, context.channel.isActive, self.mayDecode(context) else { return }
        self.readHeld = false
        context.read()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.flushIfNeeded(context: context)
        context.fireChannelReadComplete()
    }

    private func flushIfNeeded(context: ChannelHandlerContext) {
        guard self.needsFlush else { return }
        self.needsFlush = false
        context.flush()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.logger.debug("connection error", metadata: ["error": "\(type(of: error))"])
        context.close(promise: nil)
    }

    /// Closes the connection once it has sent no whole line for
    /// `idleTimeout`, unless it subscribed or waits for a reply.
    private func scheduleIdleCheck(context: ChannelHandlerContext, in delay: TimeAmount) {
        self.idleCheck = context.eventLoop.assumeIsolated().scheduleTask(in: delay) {
            guard context.channel.isActive else { return }
            let quiet = NIODeadline.now() - self.lastLine
            if self.subscribed || self.pending > 0 {
                self.scheduleIdleCheck(context: context, in: self.idleTimeout)
            } else if quiet < self.idleTimeout {
                self.scheduleIdleCheck(context: context, in: self.idleTimeout - quiet)
            } else {
                self.logger.debug("idle connection closed")
                context.close(promise: nil)
            }
        }
    }

    /// Tells `connections` how many bytes this connection holds undecoded now.
    private func countHeld() {
        let now = self.inbound?.readableBytes ?? 0
        if now != self.counted { self.connections.hold(now - self.counted) }
        self.counted = now
    }

    private func refuseLongLine(context: ChannelHandlerContext) {
        self.logger.notice("line over the limit; closing the connection")
        self.send(Response(id: nil, error: .lineTooLong), context: context, flush: true)
        context.close(promise: nil)
    }

    private func send(_ response: Response, context: ChannelHandlerContext, flush: Bool) {
        let buffer = context.channel.allocator.line(for: response)
        let promise = self.counted(nil, context: context)
        if flush {
            context.writeAndFlush(self.wrapOutboundOut(buffer), promise: promise)
        } else {
            context.write(self.wrapOutboundOut(buffer), promise: promise)
        }
    }
}
