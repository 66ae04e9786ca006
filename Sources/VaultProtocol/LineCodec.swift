public import FoundationEssentials
import VaultCrypto
import VaultJSON

/// Turns lines into requests and replies into lines. Never throws: a line
/// that is not a request becomes a request that fails with `bad_request`.
public enum LineCodec {
    private static let decoder = JSONDecoder()
    /// The one way tokenvault writes JSON: keys sorted, slashes as they are;
    /// `pretty` for a file a person reads (accounts.json).
    private static let encoder = Self.encoder(pretty: false)
    private static let prettyEncoder = Self.encoder(pretty: true)

    private static func encoder(pretty: Bool) -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = pretty ? [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes] : [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    /// `value` as tokenvault writes JSON everywhere (the wire, accounts.json,
    /// vaultctl's output).
    public static func json(_ value: some Encodable, pretty: Bool = false) throws -> Data {
        try (pretty ? Self.prettyEncoder : Self.encoder).encode(value)
    }

    public static let notARequest = VaultError.notARequest

    public static func request(from line: some Collection<UInt8>) -> Request {
        if let request = line.withContiguousStorageIfAvailable({ Request(plainToken: UnsafeRawBufferPointer($0)) }) ?? nil {
            return request
        }
        return Self.codableRequest(from: line)
    }

    /// `request(from:)` without the plain path: what JSONDecoder makes of
    /// the line. The plain path must always agree with it.
    public static func codableRequest(from line: some Collection<UInt8>) -> Request {
        // JSONDecoder lets invalid UTF-8 through in fields it skips; the
        // protocol is UTF-8, so the whole line is checked first.
        guard Self.isValidUTF8(line) else {
            return Request(id: nil, failure: .notUTF8)
        }
        // The line may carry a secret: its copy here is wiped once decoded,
        // and its secret fields go straight into guarded memory before
        // JSONDecoder (which would make Strings of them) reads the rest.
        var bytes = Array(line)
        defer { bytes.secureZero() }
        let secrets: [String: SecretBytes]
        do {
            secrets = try SecretFields.take(Request.secretKeys, from: &bytes)
        } catch .duplicate(let name) {
            return Request(id: nil, failure: .namedTwice(name))
        } catch .outOfMemory {
            return Request(id: nil, failure: .requestOutOfMemory)
        } catch {
            return Request(id: nil, failure: Self.notARequest)
        }
        let decoder = JSONDecoder()
        decoder.userInfo[.secretFields] = secrets
        do {
            return try decoder.decode(Request.self, from: Data(bytes))
        } catch {
            return Request(id: nil, failure: Self.notARequest)
        }
    }

    /// Whether `bytes` are UTF-8, checked without making a `String` of them
    /// (which would be one more unwiped copy of whatever secret they carry).
    static func isValidUTF8(_ bytes: some Collection<UInt8>) -> Bool {
        var iterator = bytes.makeIterator()
        var decoder = UTF8()
        while true {
            switch decoder.decode(&iterator) {
            case .scalarValue: continue
            case .emptyInput: return true
            case .error: return false
            }
        }
    }

    /// The reply's JSON without the trailing newline.
    public static func line(for response: Response) -> Data {
        if case .success(let payload) = response.outcome {
            if let token = payload as? TokenResult, let line = token.plainLine(id: response.id) { return line }
            if let proof = payload as? DPoPProofResult, let line = proof.plainLine(id: response.id) { return line }
        }
        do {
            return try Self.encoder.encode(response)
        } catch {
            let fallback = Response(id: response.id, error: .replyNotEncoded)
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
        if let line = request.plainLine() { return line }
        return try Self.encoder.encode(request)
    }

    /// `request` as a client sends it: its line and the newline that ends it.
    public static func framed(_ request: Request) throws -> Data {
        var line = try Self.line(for: request)
        line.append(0x0A)
        return line
    }

    public static func head(of line: Data) throws -> ResponseHead {
        if let head = line.withUnsafeBytes({ ResponseHead(plain: $0) }) { return head }
        return try Self.decoder.decode(ResponseHead.self, from: line)
    }

    public static func payload<P: ResultPayload>(_ type: P.Type, of line: Data) throws -> P {
        // The one reply programs read in loops; a metatype comparison, not a
        // conformance lookup.
        if P.self == TokenResult.self, let reply = line.withUnsafeBytes({ TokenResult.plainReply($0) }),
            let result = TokenResult(plain: reply)
        {
            return result as! P
        }
        return try Self.decoder.decode(P.self, from: line)
    }

    /// The access token of a successful `token` reply in a plain line, for
    /// a program that prints it at once (`vaultctl token`): the reply it
    /// comes in is unguarded memory already, so a guarded copy would guard
    /// nothing. Nil for any other line; read it with `payload` then.
    public static func plainAccessToken(of line: Data) -> String? {
        line.withUnsafeBytes { TokenResult.plainReply($0)?.accessToken }
    }
}

extension Request {
    public init(id: RequestID?, failure: VaultError) {
        self.id = id
        self.command = .failure(failure)
    }
}
