// Small, dependency-free encoders/decoders used by the test issuer:
// an ordered JSON writer, an `application/x-www-form-urlencoded` parser,
// and random token generation.

/// A minimal JSON value with ordered object keys, so responses are deterministic.
enum JSONValue: Sendable {
    case string(String)
    case int(Int)
    /// JSON text written as it is (an absurd number, say).
    case raw(String)
    case bool(Bool)
    case array([JSONValue])
    case object([(String, JSONValue)])
    case null

    /// The compact UTF-8 serialisation of this value.
    var bytes: [UInt8] { Array(self.serialized.utf8) }

    /// The compact serialisation of this value.
    var serialized: String {
        var out = ""
        self.write(into: &out)
        return out
    }

    private func write(into out: inout String) {
        switch self {
        case .string(let s):
            JSONValue.writeString(s, into: &out)
        case .int(let i):
            out += String(i)
        case .raw(let text):
            out += text
        case .bool(let b):
            out += b ? "true" : "false"
        case .null:
            out += "null"
        case .array(let items):
            out += "["
            for (index, item) in items.enumerated() {
                if index > 0 { out += "," }
                item.write(into: &out)
            }
            out += "]"
        case .object(let members):
            out += "{"
            for (index, (key, value)) in members.enumerated() {
                if index > 0 { out += "," }
                JSONValue.writeString(key, into: &out)
                out += ":"
                value.write(into: &out)
            }
            out += "}"
        }
    }

    private static func writeString(_ s: String, into out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "\""
    }
}

/// Errors raised while decoding an `application/x-www-form-urlencoded` body.
enum FormDecodingError: Error, Sendable {
    case invalidPercentEncoding
    case invalidUTF8
    case duplicateParameter(String)
}

enum FormCoding {
    /// Decodes one form-urlencoded component: `+` becomes a space and `%XX` escapes are decoded.
    static func decodeComponent<Bytes: Sequence>(_ input: Bytes) throws(FormDecodingError) -> String
    where Bytes.Element == UInt8 {
        let bytes = Array(input)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "+"):
                out.append(UInt8(ascii: " "))
                index += 1
            case UInt8(ascii: "%"):
                guard index + 2 < bytes.count,
                    let high = hexValue(bytes[index + 1]),
                    let low = hexValue(bytes[index + 2])
                else { throw .invalidPercentEncoding }
                out.append(high << 4 | low)
                index += 3
            default:
                out.append(byte)
                index += 1
            }
        }
        guard let string = String(validating: out, as: UTF8.self) else { throw .invalidUTF8 }
        return string
    }

    /// Parses a whole form body. Parameters with an empty value are treated as omitted
    /// (RFC 6749 §3.1); a parameter given twice is an error (RFC 6749 §3.1).
    static func parse(_ body: [UInt8]) throws(FormDecodingError) -> [String: String] {
        var result: [String: String] = [:]
        for pair in body.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: true) {
            let name: String
            let value: String
            if let eq = pair.firstIndex(of: UInt8(ascii: "=")) {
                name = try decodeComponent(pair[pair.startIndex..<eq])
                value = try decodeComponent(pair[pair.index(after: eq)...])
            } else {
                name = try decodeComponent(pair)
                value = ""
            }
            if name.isEmpty || value.isEmpty { continue }
            if result[name] != nil { throw .duplicateParameter(name) }
            result[name] = value
        }
        return result
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

enum RandomToken {
    /// `prefix` followed by `byteCount` cryptographically random bytes as lowercase hex.
    static func make(prefix: String, byteCount: Int = 16) -> String {
        var generator = SystemRandomNumberGenerator()
        let digits = Array("0123456789abcdef")
        var out = prefix
        for _ in 0..<byteCount {
            let byte = UInt8.random(in: .min ... .max, using: &generator)
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return out
    }
}
