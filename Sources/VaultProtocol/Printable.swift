/// Where escaped text goes.
public enum EscapeMode: Sendable {
    /// A terminal (vaultctl's output): every control character (C0, DEL
    /// and C1: ESC, CSI, newline, carriage return, backspace, ...) becomes
    /// a visible escape, `\n`, `\r`, `\t` or `\u{1B}`, so text from an
    /// issuer, a peer or a file cannot move the cursor, rewrite a terminal
    /// or forge a line of its own. So do the bidi embedding, override and
    /// isolate controls (U+202A–U+202E, U+2066–U+2069: `\u{202E}`), which
    /// would otherwise reorder what a person reads after them on the line.
    /// Everything else, backslashes included, stays as it is.
    case terminal
    /// One field of a log line (a value a peer chose: executable paths,
    /// cgroup names): as for a terminal, and the backslash, the space and
    /// U+2028/U+2029 too (`\\`, `\x20`, `\u2028`; a bidi control is
    /// `\u202e`), so a value stays one field of one line whatever its
    /// author put in it.
    case log
}

extension String {
    /// The one escaper: this string made safe for `mode`.
    public func escaped(for mode: EscapeMode) -> String {
        let needs = { (scalar: Unicode.Scalar) -> Bool in
            if scalar.isControl || scalar.isBidiControl { return true }
            guard mode == .log else { return false }
            switch scalar.value {
            case 0x5C, 0x20, 0x2028, 0x2029: return true
            default: return false
            }
        }
        guard self.unicodeScalars.contains(where: needs) else { return self }
        var escaped = ""
        escaped.reserveCapacity(self.utf8.count + 8)
        for scalar in self.unicodeScalars {
            guard needs(scalar) else {
                escaped.unicodeScalars.append(scalar)
                continue
            }
            switch scalar {
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            case "\\": escaped += "\\\\"
            default:
                let hex = String(scalar.value, radix: 16, uppercase: mode == .terminal)
                switch mode {
                case .terminal: escaped += "\\u{" + hex + "}"
                case .log: escaped += scalar.value > 0xFF ? "\\u" + hex : "\\x" + (hex.count < 2 ? "0" + hex : hex)
                }
            }
        }
        return escaped
    }
}

extension String {
    /// The string as HTML text or an attribute value: `&`, `<`, `>`, `"`
    /// and `'` written as entities. For vaultd's sign-in page and vaultctl's
    /// browser hand-off.
    public var escapingHTML: String {
        var escaped = ""
        escaped.reserveCapacity(self.utf8.count)
        for character in self {
            switch character {
            case "&": escaped += "&amp;"
            case "<": escaped += "&lt;"
            case ">": escaped += "&gt;"
            case "\"": escaped += "&quot;"
            case "'": escaped += "&#39;"
            default: escaped.append(character)
            }
        }
        return escaped
    }
}

extension Unicode.Scalar {
    /// General category Cc: U+0000–U+001F, U+007F and U+0080–U+009F.
    fileprivate var isControl: Bool {
        self.value < 0x20 || (0x7F...0x9F).contains(self.value)
    }

    /// The bidi embeddings and overrides (LRE, RLE, PDF, LRO, RLO) and
    /// isolates (LRI, RLI, FSI, PDI) of Unicode's bidi algorithm (UAX #9):
    /// invisible, and able to show the rest of a line in another order than
    /// its bytes (CVE-2021-42574, "Trojan Source").
    fileprivate var isBidiControl: Bool {
        (0x202A...0x202E).contains(self.value) || (0x2066...0x2069).contains(self.value)
    }
}
