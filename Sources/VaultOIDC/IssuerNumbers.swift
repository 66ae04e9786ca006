import VaultJSON

/// Every number an issuer sends is bounded here, where it is parsed, so no
/// later arithmetic or conversion can trap on it (docs/threat-model.md):
///
/// - a JSON number, or a string holding one, is read; anything else, and a
///   value that is not finite (`NaN`, `1e400`), counts as absent, so the
///   field's default applies;
/// - a fraction is rounded down;
/// - the result is clamped into the field's range: lifetimes to 0 … ten
///   years (a negative lifetime is 0), device polling intervals to 1 … 60 s,
///   waits (`Retry-After`) to 0 … 3600 s.
enum IssuerNumber {
    /// Ten years, in seconds: the longest lifetime believed.
    static let maximumLifetime = 315_360_000
    static let lifetimes = 0...maximumLifetime
    static let intervals = 1...60
    static let waits = 0...3600

    /// `value` in `range`, or nil when it is absent or not a number.
    static func bounded(_ value: JSONValue?, _ range: ClosedRange<Int>) -> Int? {
        let number: Double?
        switch value {
        case .number(let double): number = double
        case .string(let text): number = Double(text.trimmed)
        default: number = nil
        }
        guard let number, number.isFinite else { return nil }
        let floor = number.rounded(.down)
        if floor <= Double(range.lowerBound) { return range.lowerBound }
        if floor >= Double(range.upperBound) { return range.upperBound }
        return Int(floor)
    }

    /// The `max-age` of `Cache-Control` directives (RFC 9111 §5.2.2.1), within a day;
    /// `no-store` or `no-cache` is 0.
    static func maxAge(_ directives: [Substring]) -> Int? {
        var maxAge: Int?
        for directive in directives {
            let parts = directive.split(separator: "=", maxSplits: 1).map { String($0).trimmed.lowercased() }
            switch parts.first {
            case "no-store", "no-cache": return 0
            case "max-age" where parts.count == 2:
                let digits = parts[1].filter { $0 != "\"" }
                guard !digits.isEmpty, digits.allSatisfy(\.isASCII), digits.allSatisfy(\.isNumber) else { continue }
                maxAge = digits.count > 6 ? 86400 : min(Int(digits) ?? 86400, 86400)
            default: continue
            }
        }
        return maxAge
    }

    /// A `Retry-After` header (RFC 9110 §10.2.3) in seconds; an HTTP-date is ignored.
    static func retryAfter(_ header: String?) -> Int? {
        guard let header, !header.isEmpty, header.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else {
            return nil
        }
        // Digits only: longer than the bound's own digits is over it.
        guard header.utf8.count <= 6, let seconds = Int(header) else { return Self.waits.upperBound }
        return min(seconds, Self.waits.upperBound)
    }
}
