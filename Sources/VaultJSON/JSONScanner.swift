/// The one walk over JSON bytes in tokenvault: whitespace, strings and
/// their escapes, numbers and literals, written once for `SecretFields`
/// (which blanks secrets before JSONDecoder sees a line) and for
/// VaultProtocol's `PlainLine` (which reads and writes the `token` line
/// without Codable). It builds no value it is not asked for and keeps no
/// stack of its own: nesting is bounded by the input, not by recursion.
///
/// Inlinable: `PlainLine` runs on every `token` request and reply, in
/// another module.
@frozen
package struct JSONScanner {
    @usableFromInline let bytes: UnsafeRawBufferPointer
    package var index = 0

    @inlinable
    package init(bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    @inlinable
    package var peek: UInt8? { self.index < self.bytes.count ? self.bytes[self.index] : nil }

    @inlinable
    package var atEnd: Bool { self.index == self.bytes.count }

    @inlinable
    package mutating func take(_ byte: UInt8) -> Bool {
        guard self.peek == byte else { return false }
        self.index += 1
        return true
    }

    /// JSON's four whitespace bytes.
    @inlinable
    package mutating func skipSpace() {
        while let byte = self.peek, byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 { self.index += 1 }
    }

    /// `true`, `false` or `null`, whole.
    @inlinable
    package mutating func literal(_ word: StaticString) -> Bool {
        let count = word.utf8CodeUnitCount
        guard self.bytes.count - self.index >= count else { return false }
        for i in 0..<count where self.bytes[self.index + i] != word.utf8Start[i] { return false }
        self.index += count
        return true
    }

    /// After a member or element: true when `closer` ended the container,
    /// false when a comma says another follows (a trailing comma before
    /// `closer` ends it, as JSONDecoder allows, when `trailingComma`), nil
    /// when neither.
    @inlinable
    package mutating func next(closing closer: UInt8, trailingComma: Bool = true) -> Bool? {
        self.skipSpace()
        if self.take(closer) { return true }
        guard self.take(UInt8(ascii: ",")) else { return nil }
        self.skipSpace()
        return trailingComma && self.take(closer) ? true : false
    }

    // MARK: Strings

    /// A string literal from its opening quote to past its closing one; an
    /// escape is any byte after a backslash (checked only where decoded).
    @inlinable
    package mutating func skipString() -> Bool {
        guard self.take(UInt8(ascii: "\"")) else { return false }
        while let byte = self.peek {
            self.index += 1
            if byte == UInt8(ascii: "\"") { return true }
            if byte == UInt8(ascii: "\\") {
                guard self.peek != nil else { return false }
                self.index += 1
            }
        }
        return false
    }

    /// The bytes between the quotes of a string literal that needs no
    /// decoding: no escape and no control character. Nil, and where it
    /// stopped unspecified, for any other value. UTF-8 is the caller's.
    @inlinable
    package mutating func plainString() -> UnsafeRawBufferPointer? {
        guard self.take(UInt8(ascii: "\"")) else { return nil }
        let start = self.index
        while let byte = self.peek {
            if byte == UInt8(ascii: "\"") {
                self.index += 1
                return UnsafeRawBufferPointer(rebasing: self.bytes[start..<self.index - 1])
            }
            guard byte >= 0x20, byte != UInt8(ascii: "\\") else { return nil }
            self.index += 1
        }
        return nil
    }

    /// Whether bytes can stand between a string's quotes as they are.
    @inlinable
    package static func needsNoEscape(_ utf8: UnsafeRawBufferPointer) -> Bool {
        !utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") })
    }

    @inlinable
    package static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case 0x30...0x39: return byte - 0x30
        case 0x41...0x46: return byte - 0x41 + 10
        case 0x61...0x66: return byte - 0x61 + 10
        default: return nil
        }
    }

    // MARK: Numbers

    @inlinable
    package static func isDigit(_ byte: UInt8) -> Bool { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) }

    /// A number as loosely as JSONDecoder passes over one it does not read:
    /// a sign or digit, then digits, `.`, `e`, `E`, `+` and `-`.
    @inlinable
    package mutating func skipNumber() -> Bool {
        guard let first = self.peek, first == UInt8(ascii: "-") || Self.isDigit(first) else { return false }
        self.index += 1
        while let next = self.peek,
            Self.isDigit(next) || next == UInt8(ascii: ".") || next == UInt8(ascii: "e") || next == UInt8(ascii: "E")
                || next == UInt8(ascii: "+") || next == UInt8(ascii: "-")
        {
            self.index += 1
        }
        return true
    }

    /// `-?(0|[1-9][0-9]*)`, at most 18 digits and not `-0`, not followed by
    /// a fraction or exponent: a number every JSON reader turns into the
    /// same Int64. Nil for any other.
    @inlinable
    package mutating func integer() -> Int64? {
        let negative = self.take(UInt8(ascii: "-"))
        let start = self.index
        var value: Int64 = 0
        while let byte = self.peek, Self.isDigit(byte) {
            // Counted before the digit is added: 18 digits always fit.
            guard self.index - start < 18 else { return nil }
            value = value * 10 + Int64(byte - UInt8(ascii: "0"))
            self.index += 1
        }
        let digits = self.index - start
        guard digits > 0, digits == 1 || self.bytes[start] != UInt8(ascii: "0"), !(negative && value == 0) else { return nil }
        switch self.peek {
        case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): return nil
        default: return negative ? -value : value
        }
    }

    // MARK: Values

    /// `"name" :` and the space after it.
    @inlinable
    package mutating func memberHead() -> Bool {
        guard self.skipString() else { return false }
        self.skipSpace()
        guard self.take(UInt8(ascii: ":")) else { return false }
        self.skipSpace()
        return true
    }

    /// One value of any kind. Containers are walked with a count of what
    /// they open, not by recursion: a line of `[` cannot exhaust the stack.
    package mutating func skipValue() -> Bool {
        // Whether each open container is an object (else an array).
        var open: [Bool] = []
        while true {
            guard let byte = self.peek else { return false }
            switch byte {
            case UInt8(ascii: "\""):
                guard self.skipString() else { return false }
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                self.index += 1
                self.skipSpace()
                let keyed = byte == UInt8(ascii: "{")
                if self.take(keyed ? UInt8(ascii: "}") : UInt8(ascii: "]")) { break }
                open.append(keyed)
                if keyed { guard self.memberHead() else { return false } }
                continue
            case UInt8(ascii: "t"): guard self.literal("true") else { return false }
            case UInt8(ascii: "f"): guard self.literal("false") else { return false }
            case UInt8(ascii: "n"): guard self.literal("null") else { return false }
            default:
                guard self.skipNumber() else { return false }
            }
            // A value ended: close what it ends, or go on to the next one.
            while let keyed = open.last {
                guard let closed = self.next(closing: keyed ? UInt8(ascii: "}") : UInt8(ascii: "]")) else { return false }
                if closed {
                    open.removeLast()
                    continue
                }
                if keyed { guard self.memberHead() else { return false } }
                break
            }
            if open.isEmpty { return true }
        }
    }
}
