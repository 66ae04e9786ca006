extension TokenVault {
    /// `value` made safe to put in a log line: control characters (C0, DEL,
    /// C1, U+2028 and U+2029), the backslash and the space are written as
    /// escapes (`\n`, `\t`, `\r`, `\\`, `\x20`, `\u2028`), so a value stays one
    /// field of one line whatever its author put in it. For every value a
    /// peer chose: executable paths, cgroup names.
    public static func escapedForLog(_ value: String) -> String {
        var escaped = ""
        escaped.reserveCapacity(value.utf8.count)
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\\": escaped += "\\\\"
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            case " ", "\u{00}"..."\u{1F}", "\u{7F}"..."\u{9F}":
                escaped += "\\x" + Self.hex(scalar.value, width: 2)
            case "\u{2028}", "\u{2029}":
                escaped += "\\u" + Self.hex(scalar.value, width: 4)
            default:
                escaped.unicodeScalars.append(scalar)
            }
        }
        return escaped
    }

    private static func hex(_ value: UInt32, width: Int) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: max(0, width - digits.count)) + digits
    }
}
