import NIOCore
import NIOHTTP1

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// One per connection. Aggregates a request (body ≤ 64 KiB), asks ``IssuerCore`` what to do,
/// and writes the reply. `HTTPServerPipelineHandler` (added by `configureHTTPServerPipeline`)
/// guarantees only one request per connection is in flight here at a time.
final class IssuerHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let core: IssuerCore
    private var head: HTTPRequestHead?
    private var body: [UInt8] = []
    private var oversized = false

    init(core: IssuerCore) {
        self.core = core
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch Self.unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            self.body = []
            self.oversized = false
        case .body(var buffer):
            guard !self.oversized else { return }
            if self.body.count + buffer.readableBytes > IssuerCore.maxBodyBytes {
                self.oversized = true
                self.body = []
            } else if let bytes = buffer.readBytes(length: buffer.readableBytes) {
                self.body += bytes
            }
        case .end:
            guard let head = self.head else { return }
            self.head = nil
            let body = self.body
            self.body = []
            if self.oversized {
                self.write(
                    .oauthError(.payloadTooLarge, "invalid_request", "request body exceeds 64 KiB"),
                    keepAlive: false,
                    context: context
                )
                return
            }
            let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
            let request = IssuerRequest(
                method: head.method,
                path: path,
                headers: head.headers,
                body: body,
                keepAlive: head.isKeepAlive
            )
            self.dispatch(request, context: context)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    private func dispatch(_ request: IssuerRequest, context: ChannelHandlerContext) {
        let paused = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let loop = context.eventLoop
        let held = self.core.holdIfPaused(request) {
            loop.execute {
                let (handler, context) = paused.value
                handler.dispatch(request, context: context)
            }
        }
        if held { return }
        let action = self.core.handle(request) {
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            let eventLoop = context.eventLoop
            return {
                eventLoop.execute {
                    let (handler, context) = bound.value
                    handler.runToken(request, context: context)
                }
            }
        }
        switch action {
        case .reply(let reply):
            self.write(reply, keepAlive: request.keepAlive, context: context)
        case .processToken:
            self.runToken(request, context: context)
        case .processTokenAfter(let milliseconds):
            context.eventLoop.assumeIsolated().scheduleTask(in: .milliseconds(Int64(max(0, milliseconds)))) {
                self.runToken(request, context: context)
            }
        case .sign(let pending):
            self.renderAndWrite(pending, keepAlive: request.keepAlive, context: context)
        case .trickle(let reply, let milliseconds):
            self.trickle(reply, every: .milliseconds(Int64(max(1, milliseconds))), context: context)
        case .held, .hang:
            break
        case .reset:
            Self.reset(context.channel)
        }
    }

    /// Runs the real grant logic, signing the ID token off the event loop if there is one.
    private func runToken(_ request: IssuerRequest, context: ChannelHandlerContext) {
        guard context.channel.isActive else { return }
        switch self.core.processToken(request) {
        case .reply(let reply):
            self.write(reply, keepAlive: request.keepAlive, context: context)
        case .sign(let pending):
            self.renderAndWrite(pending, keepAlive: request.keepAlive, context: context)
        }
    }

    /// Signs the ID token off the event loop, then writes the reply.
    private func renderAndWrite(_ pending: PendingTokenResponse, keepAlive: Bool, context: ChannelHandlerContext) {
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let eventLoop = context.eventLoop
        Task {
            let reply = await pending.render()
            eventLoop.execute {
                let (handler, context) = bound.value
                handler.write(reply, keepAlive: keepAlive, context: context)
            }
        }
    }

    private func write(_ reply: IssuerReply, keepAlive: Bool, context: ChannelHandlerContext) {
        guard context.channel.isActive else { return }
        var headers = HTTPHeaders()
        for (name, value) in reply.headers {
            headers.add(name: name, value: value)
        }
        headers.replaceOrAdd(name: "Content-Length", value: String(reply.body.count))
        headers.replaceOrAdd(name: "Connection", value: keepAlive ? "keep-alive" : "close")
        let head = HTTPResponseHead(version: .http1_1, status: reply.status, headers: headers)
        context.write(Self.wrapOutboundOut(.head(head)), promise: nil)
        if !reply.body.isEmpty {
            var buffer = context.channel.allocator.buffer(capacity: reply.body.count)
            buffer.writeBytes(reply.body)
            context.write(Self.wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        }
        let done = context.writeAndFlush(Self.wrapOutboundOut(.end(nil)))
        if !keepAlive {
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
    }

    /// The head at once, then the body a byte at a time; the connection closes after.
    private func trickle(_ reply: IssuerReply, every interval: TimeAmount, context: ChannelHandlerContext) {
        var headers = HTTPHeaders()
        for (name, value) in reply.headers { headers.add(name: name, value: value) }
        headers.replaceOrAdd(name: "Content-Length", value: String(reply.body.count))
        headers.replaceOrAdd(name: "Connection", value: "close")
        context.writeAndFlush(Self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: reply.status, headers: headers))), promise: nil)
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        func send(from index: Int) {
            let context = bound.value
            guard context.channel.isActive else { return }
            guard index < reply.body.count else {
                context.writeAndFlush(Self.wrapOutboundOut(.end(nil))).whenComplete { _ in bound.value.close(promise: nil) }
                return
            }
            var buffer = context.channel.allocator.buffer(capacity: 1)
            buffer.writeInteger(reply.body[index])
            context.writeAndFlush(Self.wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
            context.eventLoop.assumeIsolated().scheduleTask(in: interval) { send(from: index + 1) }
        }
        send(from: 0)
    }

    /// Closes `channel` without answering, with SO_LINGER 0 so the peer sees an RST where supported.
    private static func reset(_ channel: any Channel) {
        guard let provider = channel as? any SocketOptionProvider else {
            channel.close(promise: nil)
            return
        }
        provider.setSoLinger(linger(l_onoff: 1, l_linger: 0)).whenComplete { _ in
            channel.close(promise: nil)
        }
    }
}
