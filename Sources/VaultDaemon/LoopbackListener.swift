import FoundationEssentials
import NIOCore
import NIOHTTP1
import NIOPosix

/// The redirect listener of a browser sign-in (RFC 8252 §7.3): HTTP on
/// 127.0.0.1 only, on a free port or the account's fixed one, opened just
/// before the authorization request and closed after the one answer that
/// counts. Requests for other paths get 404; the answer's query goes to
/// `handle`, whose verdict becomes the short page the browser shows.
final class LoopbackListener: Sendable {
    /// What the browser is told, and whether the listener's work is done.
    struct Verdict: Sendable {
        var status: HTTPResponseStatus
        var title: String
        var message: String
        var done: Bool
    }

    typealias Handler = @Sendable ([String: String]) async -> Verdict

    let redirectURI: String
    private let channel: any Channel

    private init(redirectURI: String, channel: any Channel) {
        self.redirectURI = redirectURI
        self.channel = channel
    }

    /// Binds 127.0.0.1 (or [::1] for such a fixed URI) and returns at once.
    /// `fixed` is a loopback `http` URI whose port the issuer matches exactly.
    static func start(fixed: String?, handle: @escaping Handler) async throws -> LoopbackListener {
        var host = "127.0.0.1"
        var port = 0
        var path = "/callback"
        if let fixed {
            guard let components = URLComponents(string: fixed), components.scheme == "http",
                let fixedHost = components.host, ["127.0.0.1", "::1", "[::1]", "localhost"].contains(fixedHost)
            else {
                throw ListenerError("the account's redirect_uri must be http://127.0.0.1:PORT/PATH")
            }
            host = fixedHost.contains(":") ? "::1" : "127.0.0.1"
            port = components.port ?? 80
            path = components.path.isEmpty ? "/" : components.path
        }
        let expectedPath = path
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 8)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(CallbackHandler(path: expectedPath, handle: handle))
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
        return LoopbackListener(redirectURI: uri, channel: channel)
    }

    func close() {
        self.channel.close(promise: nil)
    }

    struct ListenerError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }
}

/// One browser connection: a GET of the redirect path with the answer in its query.
private final class CallbackHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let path: String
    let handle: LoopbackListener.Handler

    init(path: String, handle: @escaping LoopbackListener.Handler) {
        self.path = path
        self.handle = handle
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(let head) = self.unwrapInboundIn(data) else { return }
        let channel = context.channel
        guard head.method == .GET, let components = URLComponents(string: "http://loopback" + head.uri),
            components.path == self.path
        else {
            Self.respond(
                channel,
                LoopbackListener.Verdict(status: .notFound, title: "Not found", message: "Nothing here.", done: false)
            )
            return
        }
        var query: [String: String] = [:]
        for item in components.queryItems ?? [] where query[item.name] == nil {
            query[item.name] = item.value ?? ""
        }
        let handle = self.handle
        Task {
            let verdict = await handle(query)
            Self.respond(channel, verdict)
        }
    }

    private static func respond(_ channel: any Channel, _ verdict: LoopbackListener.Verdict) {
        let html = """
            <!doctype html>
            <html><head><meta charset="utf-8"><title>tokenvault: \(escape(verdict.title))</title></head>
            <body style="font-family: sans-serif; margin: 3em"><h1>\(escape(verdict.title))</h1>
            <p>\(escape(verdict.message))</p></body></html>

            """
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/html; charset=utf-8")
        headers.add(name: "Content-Length", value: String(html.utf8.count))
        headers.add(name: "Cache-Control", value: "no-store")
        headers.add(name: "Connection", value: "close")
        let head = HTTPResponseHead(version: .http1_1, status: verdict.status, headers: headers)
        channel.write(HTTPServerResponsePart.head(head), promise: nil)
        channel.write(HTTPServerResponsePart.body(.byteBuffer(channel.allocator.buffer(string: html))), promise: nil)
        channel.writeAndFlush(HTTPServerResponsePart.end(nil)).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    private static func escape(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            default: out.append(character)
            }
        }
        return out
    }
}
