import FoundationEssentials
import VaultCrypto

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
        var cursor = Cursor(bytes: bytes)
        var keys: [String] = []
        cursor.skipSpace()
        guard cursor.take(UInt8(ascii: "{")) else { return false }
        cursor.skipSpace()
        if !cursor.take(UInt8(ascii: "}")) {
            while true {
                guard keys.count < Self.maximumFields, let key = cursor.string(), !keys.contains(key) else { return false }
                keys.append(key)
                cursor.skipSpace()
                guard cursor.take(UInt8(ascii: ":")) else { return false }
                cursor.skipSpace()
                guard let value = cursor.value(), field(key, value) else { return false }
                cursor.skipSpace()
                if cursor.take(UInt8(ascii: "}")) { break }
                guard cursor.take(UInt8(ascii: ",")) else { return false }
                cursor.skipSpace()
            }
        }
        cursor.skipSpace()
        return cursor.atEnd
    }

    private struct Cursor {
        let bytes: UnsafeRawBufferPointer
        var index = 0

        var atEnd: Bool { self.index == self.bytes.count }

        mutating func skipSpace() {
            while self.index < self.bytes.count {
                switch self.bytes[self.index] {
                case 0x20, 0x09, 0x0A, 0x0D: self.index += 1
                default: return
                }
            }
        }

        mutating func take(_ byte: UInt8) -> Bool {
            guard self.index < self.bytes.count, self.bytes[self.index] == byte else { return false }
            self.index += 1
            return true
        }

        mutating func value() -> Value? {
            guard self.index < self.bytes.count else { return nil }
            switch self.bytes[self.index] {
            case UInt8(ascii: "\""): return self.string().map(Value.string)
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return self.integer().map(Value.integer)
            case UInt8(ascii: "t"): return self.word("true") ? .bool(true) : nil
            case UInt8(ascii: "f"): return self.word("false") ? .bool(false) : nil
            case UInt8(ascii: "["): return self.strings().map(Value.strings)
            default: return nil
            }
        }

        /// A string without escapes or control characters, valid UTF-8.
        mutating func string() -> String? {
            guard self.take(UInt8(ascii: "\"")) else { return nil }
            let start = self.index
            while self.index < self.bytes.count {
                let byte = self.bytes[self.index]
                if byte == UInt8(ascii: "\"") {
                    let text = String(validating: UnsafeRawBufferPointer(rebasing: self.bytes[start..<self.index]), as: UTF8.self)
                    self.index += 1
                    return text
                }
                guard byte >= 0x20, byte != UInt8(ascii: "\\") else { return nil }
                self.index += 1
            }
            return nil
        }

        /// `-?(0|[1-9][0-9]*)`, at most 18 digits and not `-0`: what every
        /// JSON reader turns into the same Int64. No fraction, no exponent.
        mutating func integer() -> Int64? {
            let negative = self.take(UInt8(ascii: "-"))
            let start = self.index
            var value: Int64 = 0
            while self.index < self.bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(self.bytes[self.index]) {
                // Counted before the digit is added: 18 digits always fit.
                guard self.index - start < 18 else { return nil }
                value = value * 10 + Int64(self.bytes[self.index] - UInt8(ascii: "0"))
                self.index += 1
            }
            let digits = self.index - start
            guard digits > 0, digits == 1 || self.bytes[start] != UInt8(ascii: "0"), !(negative && value == 0) else { return nil }
            if self.index < self.bytes.count {
                switch self.bytes[self.index] {
                case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): return nil
                default: break
                }
            }
            return negative ? -value : value
        }

        mutating func word(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard self.bytes.count - self.index >= count else { return false }
            for offset in 0..<count where self.bytes[self.index + offset] != word.utf8Start[offset] { return false }
            self.index += count
            return true
        }

        mutating func strings() -> [String]? {
            guard self.take(UInt8(ascii: "[")) else { return nil }
            var list: [String] = []
            self.skipSpace()
            if self.take(UInt8(ascii: "]")) { return list }
            while true {
                guard list.count < PlainLine.maximumFields, let element = self.string() else { return nil }
                list.append(element)
                self.skipSpace()
                if self.take(UInt8(ascii: "]")) { return list }
                guard self.take(UInt8(ascii: ",")) else { return nil }
                self.skipSpace()
            }
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
            guard !utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else {
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
            switch (key, value) {
            case ("id", .integer(let number)): id = .number(number)
            case ("id", .string(let string)): id = .string(string)
            case ("op", .string(let op)):
                isToken = op == Op.token.rawValue
                isProof = op == Op.dpopProof.rawValue
            case ("htm", .string(let method)): htm = method
            case ("htu", .string(let url)): htu = url
            case ("account", .string(let name)): account = name
            case ("scope", .string(let list)): scopes = list.split(separator: " ").map(String.init)
            case ("scope", .strings(let list)): scopes = list
            case ("min_ttl", .integer(let seconds)): minTTL = Int(seconds)
            case ("force_refresh", .bool(let force)): forceRefresh = force
            default: return false
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
        line.raw(#"{"account":"#)
        line.string(request.account)
        if request.forceRefresh { line.raw(#","force_refresh":true"#) }
        if let id = self.id {
            line.raw(#","id":"#)
            line.id(id)
        }
        line.raw(#","min_ttl":"#)
        line.integer(Int64(request.minTTL))
        line.raw(#","op":"token""#)
        if let scopes = request.scopes {
            line.raw(#","scope":["#)
            for (index, scope) in scopes.enumerated() {
                if index > 0 { line.raw(",") }
                line.string(scope)
            }
            line.raw("]")
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
            switch (key, value) {
            case ("id", .integer(let number)): id = .number(number)
            case ("id", .string(let string)): id = .string(string)
            case ("ok", .bool(let value)): ok = value
            case ("access_token", .string(let token)): accessToken = token
            case ("token_type", .string(let type)): tokenType = type
            case ("expires_at", .integer(let seconds)): expiresAt = seconds
            case ("expires_in", .integer(let seconds)): expiresIn = seconds
            case ("scope", .string(let text)): scope = text
            default: return false
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
            line.raw(#"{"access_token":"#)
            line.string(token)
            line.raw(#","expires_at":"#)
            line.integer(self.expiresAt)
            line.raw(#","expires_in":"#)
            line.integer(self.expiresIn)
            line.raw(#","id":"#)
            line.id(id)
            line.raw(#","ok":true,"scope":"#)
            line.string(self.scope)
            line.raw(#","token_type":"#)
            line.string(self.tokenType)
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
            line.raw(#"{"authorization":"#)
            line.string(prefixed: "DPoP ", token)
            line.raw(#","dpop":"#)
            line.string(self.proof)
            line.raw(#","expires_at":"#)
            line.integer(self.expiresAt)
            line.raw(#","expires_in":"#)
            line.integer(self.expiresIn)
            line.raw(#","id":"#)
            line.id(id)
            line.raw(#","ok":true,"scope":"#)
            line.string(self.scope)
            line.raw(#","token_type":"DPoP"}"#)
            return line.finish()
        }
    }
}
