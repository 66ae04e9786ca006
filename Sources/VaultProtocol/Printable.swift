extension String {
    /// The string with every control character (C0, DEL and C1: ESC, CSI,
    /// newline, carriage return, backspace, ...) written as a visible escape,
    /// `\n`, `\r`, `\t` or `\u{1B}`, so text from an issuer, a peer or a file
    /// cannot move the cursor, rewrite a terminal or forge a line of its own.
    /// Everything else, backslashes included, stays as it is.
    public var escapingControlCharacters: String {
        guard self.unicodeScalars.contains(where: \.isControl) else { return self }
        var escaped = ""
        escaped.reserveCapacity(self.utf8.count + 8)
        for scalar in self.unicodeScalars {
            switch scalar {
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            case _ where scalar.isControl:
                escaped += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
            default: escaped.unicodeScalars.append(scalar)
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
}
