public import FoundationEssentials

/// Turns lines into requests and replies into lines. Never throws: a line
/// that is not a request becomes a request that fails with `bad_request`.
public enum LineCodec {
    private static let decoder = JSONDecoder()
    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    public static let notARequest = VaultError(.badRequest, "a request is one JSON object per line")

    public static func request(from line: some Collection<UInt8>) -> Request {
        // JSONDecoder lets invalid UTF-8 through in fields it skips; the
        // protocol is UTF-8, so the whole line is checked first.
        guard String(validating: line, as: UTF8.self) != nil else {
            return Request(id: nil, failure: VaultError(.badRequest, "a request line must be valid UTF-8"))
        }
        let data = Data(line)
        do {
            return try Self.decoder.decode(Request.self, from: data)
        } catch {
            return Request(id: nil, failure: Self.notARequest)
        }
    }

    /// The reply's JSON without the trailing newline.
    public static func line(for response: Response) -> Data {
        do {
            return try Self.encoder.encode(response)
        } catch {
            let fallback = Response(id: response.id, error: VaultError(.internalError, "vaultd could not encode its reply"))
            return (try? Self.encoder.encode(fallback)) ?? Data(#"{"id":null,"ok":false}"#.utf8)
        }
    }

    /// An event's JSON without the trailing newline.
    public static func line(for event: Event) -> Data {
        (try? Self.encoder.encode(event)) ?? Data(#"{"event":"internal"}"#.utf8)
    }

    public static func event(from line: Data) throws -> Event {
        try Self.decoder.decode(Event.self, from: line)
    }

    public static func line(for request: Request) throws -> Data {
        try Self.encoder.encode(request)
    }

    public static func head(of line: Data) throws -> ResponseHead {
        try Self.decoder.decode(ResponseHead.self, from: line)
    }

    public static func payload<P: ResultPayload>(_ type: P.Type, of line: Data) throws -> P {
        try Self.decoder.decode(P.self, from: line)
    }
}

extension Request {
    public init(id: RequestID?, failure: VaultError) {
        self.id = id
        self.command = .failure(failure)
    }
}
