import Logging
import NIOCore
import VaultProtocol

/// One client connection: decodes each line, asks the dispatcher, writes the
/// reply. Ready replies go out in order and are flushed once per read burst;
/// pending ones are written whenever they finish.
///
/// A client that does not read its replies, or that keeps more than
/// `maximumPending` requests waiting, is simply not read from until it
/// catches up: the daemon never buffers without bound on its behalf.
final class ConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Requests of one connection being worked on at once.
    static let maximumPending = 64

    private let peer: Peer
    private let dispatcher: Dispatcher
    private let admitted: Bool
    private let connections: ConnectionCount
    private var logger: Logger
    private var needsFlush = false
    /// Set once the peer subscribed: events may come at any time, so the
    /// connection is not closed for being quiet.
    private var subscribed = false
    /// Requests of this connection still being worked on.
    private var pending = 0
    /// A read was asked for while the connection was over its limits.
    private var readHeld = false

    init(peer: Peer, dispatcher: Dispatcher, admitted: Bool, connections: ConnectionCount, logger: Logger) {
        self.peer = peer
        self.dispatcher = dispatcher
        self.admitted = admitted
        self.connections = connections
        self.logger = logger
        self.logger[metadataKey: "peer_pid"] = "\(peer.pid)"
    }

    func channelActive(context: ChannelHandlerContext) {
        guard self.admitted else {
            self.logger.warning("connection limit reached; refusing a connection")
            let error = VaultError(.overloaded, "vaultd has too many open connections; try again shortly")
            self.send(Response(id: nil, error: error), context: context, flush: true)
            context.close(promise: nil)
            return
        }
        self.logger.debug("connection opened", metadata: self.peer.auditMetadata)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if self.subscribed { self.dispatcher.broker.events.unsubscribe(context.channel) }
        self.connections.release()
        self.logger.debug("connection closed")
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard self.admitted else { return }
        let line = self.unwrapInboundIn(data)
        guard line.readableBytes <= TokenVault.maximumLineBytes else {
            self.refuseLongLine(context: context)
            return
        }
        let request = line.withUnsafeReadableBytes { LineCodec.request(from: $0) }
        switch self.dispatcher.handle(request, from: self.peer) {
        case .ready(let response):
            self.send(response, context: context, flush: false)
            self.needsFlush = true
        case .subscribe(let response, let accounts):
            self.send(response, context: context, flush: true)
            self.subscribed = true
            self.dispatcher.broker.events.subscribe(context.channel, accounts: accounts)
        case .pending(let work):
            let channel = context.channel
            let connections = self.connections
            let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
            let loopContext = NIOLoopBound(context, eventLoop: context.eventLoop)
            connections.started()
            self.pending += 1
            Task {
                let response = await work()
                var buffer = channel.allocator.buffer(capacity: 256)
                buffer.writeBytes(LineCodec.line(for: response))
                buffer.writeInteger(UInt8(ascii: "\n"))
                channel.writeAndFlush(buffer, promise: nil)
                channel.eventLoop.execute {
                    connections.finished()
                    handler.value.pending -= 1
                    handler.value.resumeReadingIfHeld(context: loopContext.value)
                }
            }
        }
    }

    func read(context: ChannelHandlerContext) {
        if self.mayRead(context) {
            context.read()
        } else {
            self.readHeld = true
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        self.resumeReadingIfHeld(context: context)
        context.fireChannelWritabilityChanged()
    }

    private func mayRead(_ context: ChannelHandlerContext) -> Bool {
        context.channel.isWritable && self.pending < Self.maximumPending
    }

    private func resumeReadingIfHeld(context: ChannelHandlerContext) {
        guard self.readHeld, context.channel.isActive, self.mayRead(context) else { return }
        self.readHeld = false
        context.read()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if self.needsFlush {
            self.needsFlush = false
            context.flush()
        }
        context.fireChannelReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is ByteToMessageDecoderError.PayloadTooLargeError {
            self.refuseLongLine(context: context)
        } else {
            self.logger.debug("connection error", metadata: ["error": "\(type(of: error))"])
            context.close(promise: nil)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read, !self.subscribed, self.pending == 0 {
            self.logger.debug("idle connection closed")
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    private func refuseLongLine(context: ChannelHandlerContext) {
        self.logger.notice("line over the limit; closing the connection")
        let error = VaultError(.lineTooLong, "a request line is at most \(TokenVault.maximumLineBytes) bytes")
        self.send(Response(id: nil, error: error), context: context, flush: true)
        context.close(promise: nil)
    }

    private func send(_ response: Response, context: ChannelHandlerContext, flush: Bool) {
        var buffer = context.channel.allocator.buffer(capacity: 256)
        buffer.writeBytes(LineCodec.line(for: response))
        buffer.writeInteger(UInt8(ascii: "\n"))
        if flush {
            context.writeAndFlush(self.wrapOutboundOut(buffer), promise: nil)
        } else {
            context.write(self.wrapOutboundOut(buffer), promise: nil)
        }
    }
}
