/// `application/x-www-form-urlencoded`, as RFC 6749 appendix B asks: every
/// byte but the unreserved set percent-encoded.
enum FormEncoding {
    static func encode(_ fields: [(String, String)]) -> [UInt8] {
        var out: [UInt8] = []
        for (index, (name, value)) in fields.enumerated() {
            if index > 0 { out.append(UInt8(ascii: "&")) }
            Self.append(name, to: &out)
            out.append(UInt8(ascii: "="))
            Self.append(value, to: &out)
        }
        return out
    }

    static func escape(_ string: String) -> String {
        var out: [UInt8] = []
        Self.append(string, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    private static func append(_ string: String, to out: inout [UInt8]) {
        let hex = Array("0123456789ABCDEF".utf8)
        for byte in string.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.append(byte)
            default:
                out.append(UInt8(ascii: "%"))
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0x0F)])
            }
        }
    }
}
