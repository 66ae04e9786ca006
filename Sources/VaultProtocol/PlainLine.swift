import FoundationEssentials
import VaultCrypto
import VaultJSON

/// The `token` request and its reply, read and written without Codable.
///
/// `token` is the line programs send in loops. JSONDecoder and JSONEncoder
/// spend most of their time on it in the Swift runtime, looking up generic
/// metadata and protocol conformances: a quarter of vaultd's samples at 64
/// clients, a third of a fresh `vaultctl token` process (BENCHMARKS.md).
/// `LineCodec` tries this path first.
///
/// It takes only plain lines: one JSON object, each key once, whose values
/// are integers, `true`, `false`, strings without escapes or control
/// characters, or lists of such strings. It declines (nil) everything else,
/// and the caller then takes the Codable path, so a line never means here
/// what it would not mean to JSONDecoder, and what it writes is what
/// JSONEncoder writes (`.sortedKeys`, `.withoutEscapingSlashes`), byte for
/// byte. PlainLineTests and the request-decode fuzzer (`checkPlainAgrees`)
/// hold it to both.
enum PlainLine {
    enum Value {
        case string(String)
        case integer(Int64)
        case bool(Bool)
        case strings([String])
    }

    /// At most this many fields; a longer line is not plain.
    static let maximumFields = 16

    /// Calls `field` with each key and value in order. False when the line
    /// is not plain, or as soon as `field` returns false.
    static func read(_ bytes: UnsafeRawBufferPointer, _ field: (String, Value) -> Bool) -> Bool {
        var scanner = JSONScanner(bytes: bytes)
        var keys: [String] = []
        scanner.skipSpace()
        guard scanner.take(UInt8(ascii: "{")) else { return false }
        scanner.skipSpace()
        if !scanner.take(UInt8(ascii: "}")) {
            while true {
                guard keys.count < Self.maximumFields, let key = Self.string(&scanner), !keys.contains(key) else { return false }
                keys.append(key)
                scanner.skipSpace()
                guard scanner.take(UInt8(ascii: ":")) else { return false }
                scanner.skipSpace()
                guard let value = Self.value(&scanner), field(key, value) else { return false }
                // A trailing comma is JSONDecoder's to allow.
                guard let closed = scanner.next(closing: UInt8(ascii: "}"), trailingComma: false) else { return false }
                if closed { break }
            }
        }
        scanner.skipSpace()
        return scanner.atEnd
    }

    private static func value(_ scanner: inout JSONScanner) -> Value? {
        guard let first = scanner.peek else { return nil }
        switch first {
        case UInt8(ascii: "\""): return Self.string(&scanner).map(Value.string)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return scanner.integer().map(Value.integer)
        case UInt8(ascii: "t"): return scanner.literal("true") ? .bool(true) : nil
        case UInt8(ascii: "f"): return scanner.literal("false") ? .bool(false) : nil
        case UInt8(ascii: "["): return Self.strings(&scanner).map(Value.strings)
        default: return nil
        }
    }

    /// A string without escapes or control characters, valid UTF-8.
    private static func string(_ scanner: inout JSONScanner) -> String? {
        scanner.plainString().flatMap { String(validating: $0, as: UTF8.self) }
    }

    private static func strings(_ scanner: inout JSONScanner) -> [String]? {
        guard scanner.take(UInt8(ascii: "[")) else { return nil }
        var list: [String] = []
        scanner.skipSpace()
        if scanner.take(UInt8(ascii: "]")) { return list }
        while true {
            guard list.count < PlainLine.maximumFields, let element = Self.string(&scanner) else { return nil }
            list.append(element)
            guard let closed = scanner.next(closing: UInt8(ascii: "]"), trailingComma: false) else { return nil }
            if closed { return list }
        }
    }

    // MARK: Writing

    /// A line being written; nil once a string would need escaping.
    struct Writer {
        private(set) var bytes: [UInt8]?

        init(capacity: Int) {
            self.bytes = []
            self.bytes?.reserveCapacity(capacity)
        }

        /// The line as `Data`, its own buffer wiped: the `Data` the reply is
        /// written from is the only unguarded copy left. The buffer is taken
        /// out first, so the wipe reaches it and not a copy-on-write copy.
        mutating func finish() -> Data? {
            guard var bytes = self.bytes else { return nil }
            self.bytes = nil
            defer { bytes.secureZero() }
            return Data(bytes)
        }

        mutating func raw(_ text: StaticString) {
            self.bytes?.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
        }

        /// `"name":`, after a comma unless it is the line's first key.
        mutating func key(_ name: String) {
            if self.bytes?.last != UInt8(ascii: "{") { self.raw(",") }
            var name = name
            self.raw("\"")
            name.withUTF8 { self.bytes?.append(contentsOf: $0) }
            self.raw("\":")
        }

        mutating func integer(_ value: Int64) {
            // By hand: String(value) asks the runtime for generic metadata,
            // which a fresh vaultctl process pays for.
            var magnitude = value.magnitude
            var digits: [UInt8] = []
            repeat {
                digits.append(UInt8(ascii: "0") + UInt8(magnitude % 10))
                magnitude /= 10
            } while magnitude > 0
            if value < 0 { self.raw("-") }
            for digit in digits.indices.reversed() { self.bytes?.append(digits[digit]) }
        }

        mutating func string(_ text: String) {
            var text = text
            text.withUTF8 { self.string(UnsafeRawBufferPointer($0)) }
        }

        /// A JSON string of `utf8`, which needs no escape; else the line is lost.
        mutating func string(_ utf8: UnsafeRawBufferPointer) {
            self.string(prefixed: "", utf8)
        }

        /// A JSON string of `prefix` and `utf8`, which needs no escape; else the line is lost.
        mutating func string(prefixed prefix: StaticString, _ utf8: UnsafeRawBufferPointer) {
            guard JSONScanner.needsNoEscape(utf8) else {
                self.bytes?.secureZero()
                self.bytes = nil
                return
            }
            self.raw("\"")
            self.raw(prefix)
            self.bytes?.append(contentsOf: utf8)
            self.raw("\"")
        }

        mutating func id(_ id: RequestID?) {
            switch id {
            case nil: self.raw("null")
            case .number(let number): self.integer(number)
            case .string(let string): self.string(string)
            }
        }
    }
}

/// The fields of a `token` or `dpop.proof` request line, in the order
/// JSONEncoder's `.sortedKeys` writes them: the one table the plain reader
/// and writer are written from. Each switch over it is exhaustive, so a new
/// field is read and written or nothing builds, and PlainLineTests fails
/// when `TokenRequest`, `DPoPProofRequest` or `DPoPTarget` has a property
/// that `properties` does not place here.
enum TokenLineField: String, CaseIterable {
    case account
    case forceRefresh = "force_refresh"
    case htm
    case htu
    case id
    case minTTL = "min_ttl"
    case op
    case scope

    /// Each property of the request types, by the field that carries it.
    static let properties: [String: TokenLineField] = [
        "TokenRequest.account": .account, "TokenRequest.scopes": .scope, "TokenRequest.minTTL": .minTTL,
        "TokenRequest.forceRefresh": .forceRefresh, "DPoPProofRequest.token": .account,
        "DPoPProofRequest.target": .htu, "DPoPTarget.method": .htm, "DPoPTarget.url": .htu,
        // Derived from `url`, never sent.
        "DPoPTarget.origin": .htu,
    ]
}

/// The fields of a successful `token` or `dpop.proof` reply line, sorted as
/// JSONEncoder writes them; the one table of their plain reader and writers,
/// held to `TokenResult` and `DPoPProofResult` as `TokenLineField` is.
enum ReplyLineField: String, CaseIterable {
    case accessToken = "access_token"
    case authorization
    case dpop
    case expiresAt = "expires_at"
    case expiresIn = "expires_in"
    case id
    case ok
    case scope
    case tokenType = "token_type"

    static let properties: [String: ReplyLineField] = [
        "TokenResult.accessToken": .accessToken, "TokenResult.tokenType": .tokenType,
        "TokenResult.expiresAt": .expiresAt, "TokenResult.expiresIn": .expiresIn, "TokenResult.scope": .scope,
        "DPoPProofResult.proof": .dpop, "DPoPProofResult.accessToken": .authorization,
        "DPoPProofResult.expiresAt": .expiresAt, "DPoPProofResult.expiresIn": .expiresIn, "DPoPProofResult.scope": .scope,
    ]
}

extension Request {
    /// A `token` or `dpop.proof` request in a plain line; nil for any other line.
    init?(plainToken line: UnsafeRawBufferPointer) {
        var id: RequestID?
        var isToken = false
        var isProof = false
        var htm: String?
        var htu: String?
        var account: String?
        var scopes: [String]?
        var minTTL: Int?
        var forceRefresh: Bool?
        let plain = PlainLine.read(line) { key, value in
            guard let field = TokenLineField(rawValue: key) else { return false }
            switch (field, value) {
            case (.id, .integer(let number)): id = .number(number)
            case (.id, .string(let string)): id = .string(string)
            case (.op, .string(let op)):
                isToken = op == Op.token.rawValue
                isProof = op == Op.dpopProof.rawValue
            case (.htm, .string(let method)): htm = method
            case (.htu, .string(let url)): htu = url
            case (.account, .string(let name)): account = name
            case (.scope, .string(let list)): scopes = list.split(separator: " ").map(String.init)
            case (.scope, .strings(let list)): scopes = list
            case (.minTTL, .integer(let seconds)): minTTL = Int(seconds)
            case (.forceRefresh, .bool(let force)): forceRefresh = force
            case (.account, _), (.forceRefresh, _), (.htm, _), (.htu, _), (.id, _), (.minTTL, _), (.op, _), (.scope, _):
                return false
            }
            return true
        }
        // What the Codable path would refuse, it refuses with its own words.
        guard plain, isToken || isProof, let account else { return nil }
        if let scopes, scopes.isEmpty || scopes.contains(where: { $0.isEmpty || $0.contains(" ") }) { return nil }
        if let minTTL, !TokenRequest.minTTLRange.contains(minTTL) { return nil }
        let token = TokenRequest(
            account: account,
            scopes: scopes,
            minTTL: minTTL ?? TokenRequest.defaultMinTTL,
            forceRefresh: forceRefresh ?? false
        )
        if isToken {
            // A field `token` does not know is the Codable path's to ignore.
            guard htm == nil, htu == nil else { return nil }
            self.init(id: id, command: .token(token))
        } else {
            guard let htm, let htu, let target = DPoPTarget(method: htm, url: htu) else { return nil }
            self.init(id: id, command: .dpopProof(DPoPProofRequest(token: token, target: target)))
        }
    }

    /// The line of a `token` request, as JSONEncoder writes it; nil for any
    /// other request, or one with a string that needs escaping.
    func plainLine() -> Data? {
        guard case .success(.token(let request)) = self.command else { return nil }
        var line = PlainLine.Writer(capacity: 96 + request.account.utf8.count)
        line.raw("{")
        for field in TokenLineField.allCases {
            switch field {
            case .account:
                line.key(field.rawValue)
                line.string(request.account)
            case .forceRefresh:
                guard request.forceRefresh else { continue }
                line.key(field.rawValue)
                line.raw("true")
            case .htm, .htu:
                continue  // dpop.proof's; vaultctl sends it through Codable
            case .id:
                guard let id = self.id else { continue }
                line.key(field.rawValue)
                line.id(id)
            case .minTTL:
                line.key(field.rawValue)
                line.integer(Int64(request.minTTL))
            case .op:
                line.key(field.rawValue)
                line.string(Op.token.rawValue)
            case .scope:
                guard let scopes = request.scopes else { continue }
                line.key(field.rawValue)
                line.raw("[")
                for (index, scope) in scopes.enumerated() {
                    if index > 0 { line.raw(",") }
                    line.string(scope)
                }
                line.raw("]")
            }
        }
        line.raw("}")
        return line.bytes.map { Data($0) }
    }
}

extension ResponseHead {
    /// The head of a plain reply line (a `token` reply); nil for any other
    /// line. Like the Codable head, it skips the result's fields.
    init?(plain line: UnsafeRawBufferPointer) {
        var id: RequestID?
        var ok: Bool?
        var event: String?
        let plain = PlainLine.read(line) { key, value in
            switch (key, value) {
            case ("id", .integer(let number)): id = .number(number)
            case ("id", .string(let string)): id = .string(string)
            case ("ok", .bool(let value)): ok = value
            case ("event", .string(let name)): event = name
            case ("id", _), ("ok", _), ("event", _), ("error", _): return false
            default: break
            }
            return true
        }
        guard plain else { return nil }
        self.init(id: id, ok: ok, error: nil, event: event)
    }
}

extension TokenResult {
    /// A successful `token` reply in a plain line; nil for any other line.
    struct PlainReply {
        var id: RequestID?
        var accessToken: String
        var tokenType: String
        var expiresAt: Int64
        var expiresIn: Int64
        var scope: String
    }

    static func plainReply(_ line: UnsafeRawBufferPointer) -> PlainReply? {
        var id: RequestID?
        var ok = false
        var accessToken: String?
        var tokenType: String?
        var expiresAt: Int64?
        var expiresIn: Int64?
        var scope: String?
        let plain = PlainLine.read(line) { key, value in
            guard let field = ReplyLineField(rawValue: key) else { return false }
            switch (field, value) {
            case (.id, .integer(let number)): id = .number(number)
            case (.id, .string(let string)): id = .string(string)
            case (.ok, .bool(let value)): ok = value
            case (.accessToken, .string(let token)): accessToken = token
            case (.tokenType, .string(let type)): tokenType = type
            case (.expiresAt, .integer(let seconds)): expiresAt = seconds
            case (.expiresIn, .integer(let seconds)): expiresIn = seconds
            case (.scope, .string(let text)): scope = text
            case (.accessToken, _), (.authorization, _), (.dpop, _), (.expiresAt, _), (.expiresIn, _), (.id, _), (.ok, _),
                (.scope, _), (.tokenType, _):
                return false
            }
            return true
        }
        guard plain, ok, let accessToken, let tokenType, let expiresAt, let expiresIn else { return nil }
        return PlainReply(id: id, accessToken: accessToken, tokenType: tokenType, expiresAt: expiresAt, expiresIn: expiresIn, scope: scope ?? "")
    }

    init?(plain reply: PlainReply) {
        guard let secret = try? SecretBytes(utf8: reply.accessToken) else { return nil }
        self.init(accessToken: secret, tokenType: reply.tokenType, expiresAt: reply.expiresAt, expiresIn: reply.expiresIn, scope: reply.scope)
    }

    /// The reply line for request `id`, as JSONEncoder writes it; nil when
    /// a string needs escaping.
    func plainLine(id: RequestID?) -> Data? {
        self.accessToken.withUnsafeBytes { token in
            var line = PlainLine.Writer(capacity: 128 + token.count + self.scope.utf8.count)
            line.raw("{")
            for field in ReplyLineField.allCases {
                switch field {
                case .accessToken:
                    line.key(field.rawValue)
                    line.string(token)
                case .authorization, .dpop:
                    continue  // dpop.proof's
                case .expiresAt:
                    line.key(field.rawValue)
                    line.integer(self.expiresAt)
                case .expiresIn:
                    line.key(field.rawValue)
                    line.integer(self.expiresIn)
                case .id:
                    line.key(field.rawValue)
                    line.id(id)
                case .ok:
                    line.key(field.rawValue)
                    line.raw("true")
                case .scope:
                    line.key(field.rawValue)
                    line.string(self.scope)
                case .tokenType:
                    line.key(field.rawValue)
                    line.string(self.tokenType)
                }
            }
            line.raw("}")
            return line.finish()
        }
    }
}

extension DPoPProofResult {
    /// The reply line for request `id`, as JSONEncoder writes it; nil when
    /// a string needs escaping.
    func plainLine(id: RequestID?) -> Data? {
        self.accessToken.withUnsafeBytes { token in
            var line = PlainLine.Writer(capacity: 160 + token.count + self.proof.utf8.count + self.scope.utf8.count)
            line.raw("{")
            for field in ReplyLineField.allCases {
                switch field {
                case .accessToken:
                    continue  // token's: here the token is in `authorization`
                case .authorization:
                    line.key(field.rawValue)
                    line.string(prefixed: "DPoP ", token)
                case .dpop:
                    line.key(field.rawValue)
                    line.string(self.proof)
                case .expiresAt:
                    line.key(field.rawValue)
                    line.integer(self.expiresAt)
                case .expiresIn:
                    line.key(field.rawValue)
                    line.integer(self.expiresIn)
                case .id:
                    line.key(field.rawValue)
                    line.id(id)
                case .ok:
                    line.key(field.rawValue)
                    line.raw("true")
                case .scope:
                    line.key(field.rawValue)
                    line.string(self.scope)
                case .tokenType:
                    line.key(field.rawValue)
                    line.string("DPoP")
                }
            }
            line.raw("}")
            return line.finish()
        }
    }
}
