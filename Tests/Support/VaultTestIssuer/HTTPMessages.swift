import NIOHTTP1

/// A fully received HTTP request, detached from the channel so it can cross threads.
struct IssuerRequest: Sendable {
    var method: HTTPMethod
    /// The request target without its query string.
    var path: String
    var headers: HTTPHeaders
    var body: [UInt8]
    var keepAlive: Bool
}

/// A complete HTTP response. `Content-Length` is added when it is written.
struct IssuerReply: Sendable {
    var status: HTTPResponseStatus
    var headers: [(String, String)]
    var body: [UInt8]

    init(status: HTTPResponseStatus, headers: [(String, String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// Headers every token-endpoint response carries (RFC 6749 §5.1).
    static let noStore: [(String, String)] = [("Cache-Control", "no-store"), ("Pragma", "no-cache")]

    /// A JSON response.
    static func json(
        _ status: HTTPResponseStatus,
        _ value: JSONValue,
        headers: [(String, String)] = []
    ) -> IssuerReply {
        IssuerReply(
            status: status,
            headers: [("Content-Type", "application/json")] + headers,
            body: value.bytes
        )
    }

    /// An OAuth 2.0 error response: `{"error":code,"error_description":description}`.
    static func oauthError(
        _ status: HTTPResponseStatus,
        _ code: String,
        _ description: String? = nil,
        headers: [(String, String)] = []
    ) -> IssuerReply {
        var members: [(String, JSONValue)] = [("error", .string(code))]
        if let description { members.append(("error_description", .string(description))) }
        return .json(status, .object(members), headers: IssuerReply.noStore + headers)
    }

    /// A response with a raw body; JSON content type if the body looks like a JSON object.
    static func raw(_ status: HTTPResponseStatus, body: String, headers: [(String, String)] = []) -> IssuerReply {
        var all = headers
        if body.hasPrefix("{") {
            all.insert(("Content-Type", "application/json"), at: 0)
        } else if !body.isEmpty {
            all.insert(("Content-Type", "text/plain; charset=utf-8"), at: 0)
        }
        return IssuerReply(status: status, headers: all, body: Array(body.utf8))
    }
}
