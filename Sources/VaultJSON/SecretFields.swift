public import VaultCrypto

/// Takes the secret string fields out of a JSON object before anything else
/// reads it. Foundation's `JSONDecoder` makes a `String` of every string it
/// decodes, and a `String` cannot be wiped; so a token answer or a request
/// line goes through here first: each named top-level string is decoded
/// straight into guarded memory, and its place in the bytes is overwritten
/// with `0` and spaces. What is left decodes as before and holds no secret.
///
/// The walk refuses only what JSONDecoder refuses too (it is as lenient as
/// JSONDecoder is with values it skips: trailing commas, a leading byte
/// order mark, unchecked escapes and numbers), so no request it read before
/// is lost; a secret is taken only when it is a string JSONDecoder would
/// decode, else it is left in place for the decoder to refuse. UTF-8 is the
/// caller's to check. It keeps no stack: nesting is bounded by the input.
public enum SecretFields {
    public enum Malformed: Error, Equatable, Sendable {
        /// Not one JSON object.
        case notAnObject
        /// A secret field named twice: which one a decoder keeps is its own business.
        case duplicate(String)
        /// Guarded memory ran out.
        case outOfMemory
    }

    /// The secrets found under `keys` (ASCII names) at the top level of the
    /// object in `bytes`, which are left with those values blanked. A name
    /// is compared as JSONDecoder compares it, unescaped, as a `String`,
    /// however long it is written: a name passed over would leave its value
    /// to the decoder's Strings. `key`, when given, maps a name as sent to
    /// the name it is looked up by, dropping nothing but spaces and tabs (an
    /// issuer that pads its keys with them). A named field whose value is
    /// not a valid string is left in place for the decoder to refuse with
    /// its own words. On a throw, nothing taken survives and `bytes` may be
    /// partly blanked.
    public static func take(
        _ keys: Set<String>,
        from bytes: UnsafeMutableRawBufferPointer,
        key: ((String) -> String)? = nil
    ) throws(Malformed) -> [String: SecretBytes] {
        precondition(keys.allSatisfy { $0.utf8.allSatisfy { $0 < 0x80 } }, "secret keys are ASCII")
        // A name with more scalars than the longest key (spaces and tabs
        // aside when `key` may drop them) is no key: one equal to an ASCII
        // key has a scalar per byte of it (a String compares canonical
        // equivalents, and the only scalars equivalent to an ASCII one are
        // single ones, like U+212A KELVIN SIGN for K). So a hostile megabyte
        // of a name is counted, not stored.
        let nameLimit = keys.map(\.utf8.count).max() ?? 0
        let read = UnsafeRawBufferPointer(bytes)
        var scanner = JSONScanner(bytes: read)
        var spans: [(key: String, range: Range<Int>)] = []
        var seen: Set<String> = []
        // A byte order mark, which JSONDecoder skips too.
        if read.starts(with: [0xEF, 0xBB, 0xBF]) { scanner.index = 3 }
        scanner.skipSpace()
        guard scanner.take(UInt8(ascii: "{")) else { throw .notAnObject }
        scanner.skipSpace()
        var closed = scanner.take(UInt8(ascii: "}"))
        while !closed {
            let nameStart = scanner.index
            guard scanner.skipString() else { throw .notAnObject }
            let name = Self.name(UnsafeRawBufferPointer(rebasing: read[nameStart..<scanner.index]), limit: nameLimit, padded: key != nil)
            scanner.skipSpace()
            guard scanner.take(UInt8(ascii: ":")) else { throw .notAnObject }
            scanner.skipSpace()
            let start = scanner.index
            guard scanner.skipValue() else { throw .notAnObject }
            let looked = name.map { key?($0) ?? $0 }
            if let looked, keys.contains(looked) {
                guard seen.insert(looked).inserted else { throw .duplicate(looked) }
                let value = UnsafeRawBufferPointer(rebasing: read[start..<scanner.index])
                if value.first == UInt8(ascii: "\"") && Self.isDecodable(value) { spans.append((looked, start..<scanner.index)) }
            }
            guard let next = scanner.next(closing: UInt8(ascii: "}")) else { throw .notAnObject }
            closed = next
        }
        scanner.skipSpace()
        guard scanner.index == read.count else { throw .notAnObject }

        var taken: [String: SecretBytes] = [:]
        for span in spans {
            let quoted = UnsafeRawBufferPointer(rebasing: read[span.range])
            let secret: SecretBytes?
            do {
                secret = try SecretBytes(count: Self.unescapedCount(quoted)) { out in Self.unescape(quoted, into: out) }
            } catch {
                for value in taken.values { value.wipe() }
                throw .outOfMemory
            }
            guard let secret else { throw .notAnObject }
            taken[span.key] = secret
            bytes[span.range.lowerBound] = UInt8(ascii: "0")
            for i in span.range.dropFirst() { bytes[i] = UInt8(ascii: " ") }
        }
        return taken
    }

    /// [UInt8] convenience: blanks `bytes` in place (no copy is made of them).
    public static func take(
        _ keys: Set<String>,
        from bytes: inout [UInt8],
        key: ((String) -> String)? = nil
    ) throws(Malformed) -> [String: SecretBytes] {
        let result: Result<[String: SecretBytes], Malformed> = bytes.withUnsafeMutableBytes { buffer in
            do throws(Malformed) { return .success(try Self.take(keys, from: buffer, key: key)) } catch { return .failure(error) }
        }
        return try result.get()
    }

    // MARK: Strings

    /// A member's name, decoded when JSONDecoder would decode it; nil when
    /// it would not (no field anyone looks up) or when it has more than
    /// `limit` scalars, not counting spaces and tabs when it is `padded`.
    private static func name(_ quoted: UnsafeRawBufferPointer, limit: Int, padded: Bool) -> String? {
        guard Self.isDecodable(quoted) else { return nil }
        var count = 0
        let counts = { (value: UInt32) in !padded || (value != 0x20 && value != 0x09) }
        Self.walk(quoted) { scalar in
            if counts(scalar.value) { count += 1 }
        } raw: { byte in
            // A scalar's first byte (not a UTF-8 continuation byte) counts it.
            if byte & 0xC0 != 0x80 && counts(UInt32(byte)) { count += 1 }
        }
        guard count <= limit else { return nil }
        var utf8: [UInt8] = []
        Self.walk(quoted) { utf8.append(contentsOf: UTF8.encode($0)!) } raw: { utf8.append($0) }
        return String(decoding: utf8, as: UTF8.self)
    }

    /// Whether a string literal, quotes included, is one JSONDecoder decodes:
    /// no control characters, known escapes, `\u` with four hex digits, and
    /// surrogates only in pairs.
    static func isDecodable(_ quoted: UnsafeRawBufferPointer) -> Bool {
        guard quoted.count >= 2 else { return false }
        let end = quoted.count - 1
        var i = 1
        func hex4(_ at: Int) -> UInt32? {
            guard at + 4 <= end else { return nil }
            var value: UInt32 = 0
            for j in at..<at + 4 {
                guard let digit = JSONScanner.hexValue(quoted[j]) else { return nil }
                value = value << 4 | UInt32(digit)
            }
            return value
        }
        while i < end {
            let byte = quoted[i]
            if byte < 0x20 { return false }
            guard byte == UInt8(ascii: "\\") else {
                i += 1
                continue
            }
            guard i + 1 < end else { return false }
            switch quoted[i + 1] {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                i += 2
            case UInt8(ascii: "u"):
                guard let unit = hex4(i + 2), !(0xDC00..<0xE000).contains(unit) else { return false }
                i += 6
                if (0xD800..<0xDC00).contains(unit) {
                    guard i + 1 < end, quoted[i] == UInt8(ascii: "\\"), quoted[i + 1] == UInt8(ascii: "u"),
                        let low = hex4(i + 2), (0xDC00..<0xE000).contains(low)
                    else { return false }
                    i += 6
                }
            default:
                return false
            }
        }
        return true
    }

    /// The decoded length of a checked string literal, quotes included in `quoted`.
    private static func unescapedCount(_ quoted: UnsafeRawBufferPointer) -> Int {
        var count = 0
        Self.walk(quoted) { scalar in count += UTF8.width(scalar) } raw: { _ in count += 1 }
        return count
    }

    private static func unescape(_ quoted: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer) -> Bool {
        var offset = 0
        Self.walk(quoted) { scalar in
            for byte in UTF8.encode(scalar)! {
                out[offset] = byte
                offset += 1
            }
        } raw: { byte in
            out[offset] = byte
            offset += 1
        }
        return offset == out.count
    }

    /// Calls `raw` for each byte of a decodable literal as it stands and
    /// `scalar` for each escape, a surrogate pair making one scalar.
    private static func walk(_ quoted: UnsafeRawBufferPointer, scalar: (Unicode.Scalar) -> Void, raw: (UInt8) -> Void) {
        var i = 1
        let end = quoted.count - 1
        while i < end {
            let byte = quoted[i]
            guard byte == UInt8(ascii: "\\") else {
                raw(byte)
                i += 1
                continue
            }
            let escaped = quoted[i + 1]
            i += 2
            switch escaped {
            case UInt8(ascii: "b"): raw(0x08)
            case UInt8(ascii: "f"): raw(0x0C)
            case UInt8(ascii: "n"): raw(0x0A)
            case UInt8(ascii: "r"): raw(0x0D)
            case UInt8(ascii: "t"): raw(0x09)
            case UInt8(ascii: "u"):
                let high = Self.hex4(quoted, at: i)
                i += 4
                if (0xD800..<0xDC00).contains(high) {
                    // The scanner let through only whole pairs.
                    let low = Self.hex4(quoted, at: i + 2)
                    i += 6
                    scalar(Unicode.Scalar(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))!)
                } else {
                    scalar(Unicode.Scalar(high)!)
                }
            default: raw(escaped)  // " \ /
            }
        }
    }

    fileprivate static func hex4(_ bytes: UnsafeRawBufferPointer, at index: Int) -> UInt32 {
        var value: UInt32 = 0
        for i in index..<index + 4 { value = value << 4 | UInt32(JSONScanner.hexValue(bytes[i])!) }
        return value
    }
}
