// What the two request harnesses share (FuzzRequest.swift, and the
// decoder-only FuzzRequestDecode.swift): cutting an input into lines as
// vaultd does, the round-trip property of the request decoder, and what
// SecretFields takes against what JSONDecoder reads. Compiled into both by
// dev/fuzz.sh; it needs VaultProtocol only.

import FoundationEssentials
import VaultCrypto
import VaultJSON
@testable import VaultProtocol

/// Stops the process with a message libFuzzer reports as a crash.
func fail(_ message: String) -> Never {
    fatalError("fuzz property failed: \(message)")
}

enum RequestLines {
    /// `SecretFields` refuses no line that JSONDecoder reads as `Request`
    /// does (names decoded, values skipped), and takes from it what
    /// JSONDecoder would have decoded under each secret key: the same
    /// string, and nothing where the decoder makes no string. The secret
    /// fields of a request are taken out before JSONDecoder sees the rest,
    /// so a line it refused that the decoder reads would be a request lost,
    /// and a string it left there would reach the decoder's Strings.
    static func checkSecretFieldsAgree(_ line: ArraySlice<UInt8>) {
        guard let decoded = try? JSONDecoder().decode(SecretStrings.self, from: Data(line)) else { return }
        var bytes = Array(line)
        let taken: [String: SecretBytes]
        do {
            taken = try SecretFields.take(SecretStrings.keys, from: &bytes)
        } catch .duplicate {
            return
        } catch {
            fail("SecretFields refused a line JSONDecoder reads: \(error)")
        }
        defer { for secret in taken.values { secret.wipe() } }
        // UTF-8 is SecretFields' caller's to check, as LineCodec does.
        guard LineCodec.isValidUTF8(line) else { return }
        for key in SecretStrings.keys {
            let secret = taken[key].map { $0.withUnsafeBytes { [UInt8]($0) } }
            let string = decoded.strings[key].map { [UInt8]($0.utf8) }
            guard secret == string else {
                let size = { (bytes: [UInt8]?) in bytes.map { "\($0.count) bytes" } ?? "nothing" }
                fail("under '\(key)' SecretFields took \(size(secret)) where JSONDecoder decodes \(size(string))")
            }
        }
    }

    /// What JSONDecoder decodes of a line: every name (values skipped, as
    /// `Request` reads them), and the string under each secret key where
    /// there is one it decodes.
    struct SecretStrings: Decodable {
        /// The request's secret keys, and one a fuzzer finds fast.
        static let keys = Request.secretKeys.union(["a"])

        var strings: [String: String] = [:]

        init(from decoder: any Decoder) throws {
            _ = try [String: Skip](from: decoder)
            let c = try decoder.container(keyedBy: Name.self)
            for key in Self.keys { self.strings[key] = try? c.decodeIfPresent(String.self, forKey: Name(stringValue: key)) }
        }

        struct Name: CodingKey {
            var stringValue: String
            var intValue: Int? { nil }
            init(stringValue: String) { self.stringValue = stringValue }
            init?(intValue: Int) { nil }
        }
    }

    struct Skip: Decodable {
        init(from decoder: any Decoder) throws {}
    }

    /// The lines vaultd's LineBasedFrameDecoder would cut `input` into: at
    /// "\n", without a trailing "\r", the last one without its newline; a
    /// line over the protocol's limit ends the input, as it ends the
    /// connection.
    static func lines(of input: [UInt8]) -> [ArraySlice<UInt8>] {
        var lines: [ArraySlice<UInt8>] = []
        var start = input.startIndex
        while start < input.endIndex {
            let end = input[start...].firstIndex(of: UInt8(ascii: "\n")) ?? input.endIndex
            var line = input[start..<end]
            if line.last == UInt8(ascii: "\r") { line = line.dropLast() }
            // Over the limit, vaultd answers `line_too_long` and closes the connection.
            guard line.count <= TokenVault.maximumLineBytes else { break }
            lines.append(line)
            start = end == input.endIndex ? end : end + 1
        }
        return lines
    }

    /// A request that decoded encodes, and its line decodes to the same request.
    static func checkRoundTrip(_ request: Request) {
        guard case .success = request.command else { return }
        let first = Self.encoded(request)
        let again = LineCodec.request(from: first)
        guard case .success = again.command else {
            fail("a re-encoded request does not decode: \(String(decoding: first, as: UTF8.self))")
        }
        guard again.id == request.id else { fail("the id changed in a round trip") }
        let second = Self.encoded(again)
        guard first == second else {
            fail("encoding is not a fixed point:\n\(String(decoding: first, as: UTF8.self))\n\(String(decoding: second, as: UTF8.self))")
        }
    }

    /// The plain path (PlainLine.swift) reads `line` as JSONDecoder does,
    /// and writes what it read as JSONEncoder does.
    static func checkPlainAgrees(_ line: ArraySlice<UInt8>) {
        let request = LineCodec.request(from: line)
        guard Self.meaning(request) == Self.meaning(LineCodec.codableRequest(from: line)) else {
            fail("the plain path read a line differently: \(String(decoding: line, as: UTF8.self).debugDescription)")
        }
        guard case .success(let command) = request.command else { return }
        guard Self.encoded(request) == (try? Array(Self.encoder.encode(request))) else {
            fail("the plain path wrote a request differently")
        }
        // The plain path is taken where it claims to be: a token request it
        // can write, it reads back itself, not through Codable.
        if case .token = command, let line = request.plainLine() {
            guard let read = line.withUnsafeBytes({ Request(plainToken: $0) }), Self.meaning(read) == Self.meaning(request) else {
                fail("the plain path declined or misread its own line: \(String(decoding: line, as: UTF8.self))")
            }
        }
    }

    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    /// What a decoded request means, comparable.
    private static func meaning(_ request: Request) -> String {
        let id = request.id.map { "\($0)" } ?? "nil"
        switch request.command {
        case .success(.token(let token)):
            return "\(id) token \(token.account)|\(token.scopes ?? ["<none>"])|\(token.minTTL)|\(token.forceRefresh)"
        case .success(let command): return "\(id) \(command)"
        case .failure(let error): return "\(id) error \(error.code.rawValue): \(error.message)"
        }
    }

    private static func encoded(_ request: Request) -> [UInt8] {
        do {
            return Array(try LineCodec.line(for: request))
        } catch {
            fail("a decoded request does not encode: \(error)")
        }
    }
}
