public import VaultCrypto

/// A value of a form field: plain text, or a secret that is encoded from its
/// guarded memory without passing through a `String` (which would be freed
/// unwiped).
public protocol FormValue: Sendable {
    func withFormBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R
}

extension String: FormValue {
    public func withFormBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        var text = self
        return text.withUTF8 { body(UnsafeRawBufferPointer($0)) }
    }
}

extension SecretBytes: FormValue {
    public func withFormBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        self.withUnsafeBytes(body)
    }
}

/// `application/x-www-form-urlencoded`, as RFC 6749 appendix B asks: every
/// byte but the unreserved set percent-encoded.
enum FormEncoding {
    /// The encoded form, in one allocation of its exact size: a growing
    /// array would leave earlier copies of a secret behind, unwiped. The
    /// caller wipes what it gets once sent.
    static func encode(_ fields: [(String, any FormValue)]) -> [UInt8] {
        var count = max(fields.count - 1, 0)
        for (name, value) in fields {
            count += Self.encodedCount(name) + 1 + value.withFormBytes { Self.encodedCount($0) }
        }
        var out = [UInt8](repeating: 0, count: count)
        out.withUnsafeMutableBufferPointer { buffer in
            var at = 0
            for (index, (name, value)) in fields.enumerated() {
                if index > 0 { Self.put(UInt8(ascii: "&"), buffer, &at) }
                name.withFormBytes { Self.append($0, buffer, &at) }
                Self.put(UInt8(ascii: "="), buffer, &at)
                value.withFormBytes { Self.append($0, buffer, &at) }
            }
        }
        return out
    }

    static func escape(_ string: String) -> String {
        String(decoding: string.withFormBytes { bytes in
            var out = [UInt8](repeating: 0, count: Self.encodedCount(bytes))
            out.withUnsafeMutableBufferPointer { buffer in
                var at = 0
                Self.append(bytes, buffer, &at)
            }
            return out
        }, as: UTF8.self)
    }

    private static func isUnreserved(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
            UInt8(ascii: "~"):
            true
        default:
            false
        }
    }

    private static func encodedCount(_ string: String) -> Int {
        string.withFormBytes { Self.encodedCount($0) }
    }

    private static func encodedCount(_ bytes: UnsafeRawBufferPointer) -> Int {
        bytes.reduce(0) { $0 + (Self.isUnreserved($1) ? 1 : 3) }
    }

    private static func put(_ byte: UInt8, _ out: UnsafeMutableBufferPointer<UInt8>, _ at: inout Int) {
        out[at] = byte
        at += 1
    }

    private static func append(_ bytes: UnsafeRawBufferPointer, _ out: UnsafeMutableBufferPointer<UInt8>, _ at: inout Int) {
        let hex = Array("0123456789ABCDEF".utf8)
        for byte in bytes {
            if Self.isUnreserved(byte) {
                Self.put(byte, out, &at)
            } else {
                Self.put(UInt8(ascii: "%"), out, &at)
                Self.put(hex[Int(byte >> 4)], out, &at)
                Self.put(hex[Int(byte & 0x0F)], out, &at)
            }
        }
    }
}
