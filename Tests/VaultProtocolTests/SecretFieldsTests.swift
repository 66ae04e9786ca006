import Foundation
import Testing
import VaultCrypto
import VaultJSON
import VaultProtocol

/// Secret fields go into guarded memory before any decoder makes a String of them.
@Suite struct SecretFieldsTests {
    func take(_ json: String, _ keys: Set<String>) throws(SecretFields.Malformed) -> ([String: String], String) {
        var bytes = Array(json.utf8)
        let taken = try SecretFields.take(keys, from: &bytes)
        return (taken.mapValues { $0.unsafeString() }, String(decoding: bytes, as: UTF8.self))
    }

    @Test func namedStringsAreTakenAndBlankedInPlace() throws {
        let json = #"{"refresh_token":"rt-\u00e9\ud83d\ude00\n\/\"x","scope":"openid","nested":{"refresh_token":"kept"},"n":-1.5e3}"#
        let (taken, rest) = try self.take(json, ["refresh_token", "id_token"])
        #expect(taken == ["refresh_token": "rt-é😀\n/\"x"])
        #expect(!rest.contains("rt-"))
        // The rest is the same document with 0 where the secret was.
        let document = try JSONDecoder().decode([String: JSONValue].self, from: Data(rest.utf8))
        #expect(document["refresh_token"] == .number(0))
        #expect(document["scope"] == .string("openid"))
        #expect(document["nested"] == .object(["refresh_token": .string("kept")]))
        #expect(rest.utf8.count == json.utf8.count)
    }

    @Test func aNamedFieldThatIsNoStringIsLeftForTheDecoder() throws {
        let (taken, rest) = try self.take(#"{"password":["x"], "code": null}"#, ["password", "code"])
        #expect(taken.isEmpty)
        #expect(rest == #"{"password":["x"], "code": null}"#)
    }

    /// What JSONDecoder makes of a line when it reads the names and skips the values, as `Request` does.
    struct Skipped: Decodable {
        struct Skip: Decodable { init(from decoder: any Decoder) throws {} }
        init(from decoder: any Decoder) throws { _ = try [String: Skip](from: decoder) }
    }

    func decoderReads(_ json: String) -> Bool {
        (try? JSONDecoder().decode(Skipped.self, from: Data(json.utf8))) != nil
    }

    @Test(arguments: [
        #""#, #"[]"#, #""x""#, #"{"a":1"#, #"{"a":1}x"#, #"{"a":tru}"#, #"{"a":truex}"#, #"{"a":[1,,]}"#, #"{,}"#,
        #"{"a":[,]}"#, #"{"a" 1}"#, #"{a:1}"#, #"{"a":+1}"#, #"{"a":.5}"#, #"{"a":'x'}"#, #"{"a":"x}"#, #"{"a":[1}"#,
        #"{"a":{"b"}}"#,
    ])
    func whatJSONDecoderRefusesIsRefused(json: String) {
        #expect(!self.decoderReads(json))
        #expect(throws: SecretFields.Malformed.notAnObject) { try self.take(json, ["refresh_token"]) }
    }

    @Test(arguments: [
        #"{"a":[1,],}"#, #"{"a":{"b":1,}}"#, "\u{FEFF}{\"a\":-0}", #" { } "#, #"{"a":"\x"}"#, "{\"a\":\"\u{01}\"}",
        #"{"a":01}"#, #"{"a":1.}"#, #"{"a":-}"#, #"{"a":"\ud800"}"#, #"{"a":[[[{"b":[{}]}]]]}"#,
    ])
    func whatJSONDecoderAcceptsIsAccepted(json: String) throws {
        #expect(self.decoderReads(json))
        _ = try self.take(json, ["refresh_token"])
    }

    @Test(arguments: [#"{"password":"\ud800"}"#, "{\"password\":\"a\u{01}\"}", #"{"password":"\x"}"#])
    func aSecretJSONDecoderCannotDecodeIsLeftForItToRefuse(json: String) throws {
        let (taken, rest) = try self.take(json, ["password"])
        #expect(taken.isEmpty)
        #expect(rest == json)
    }

    @Test func aSecretNamedTwiceIsRefusedByName() {
        #expect(throws: SecretFields.Malformed.duplicate("password")) {
            try self.take(#"{"password":"a","\u0070assword":"b"}"#, ["password"])
        }
    }

    /// `name` (ASCII from U+0010) with every character written as a `\u00XX` escape.
    static func escaped(_ name: String) -> String {
        name.unicodeScalars.map { #"\u00"# + String($0.value, radix: 16) }.joined()
    }

    /// JSONDecoder reads a name whatever its length as written: so does
    /// SecretFields, or a secret under a long-escaped name would reach the
    /// decoder and its Strings.
    @Test func aLongEscapedNameIsTaken() throws {
        let name = Self.escaped("refresh_token")
        #expect(name.utf8.count == 78)
        let (taken, rest) = try self.take(#"{"\#(name)":"rt-1","scope":"openid"}"#, ["refresh_token"])
        #expect(taken == ["refresh_token": "rt-1"])
        #expect(!rest.contains("rt-1"))
        #expect(throws: SecretFields.Malformed.duplicate("refresh_token")) {
            try self.take(#"{"refresh_token":"a","\#(name)":"b"}"#, ["refresh_token"])
        }
        #expect(throws: SecretFields.Malformed.duplicate("refresh_token")) {
            try self.take(#"{"\#(name)":"a","refresh_token":"b"}"#, ["refresh_token"])
        }
    }

    /// The decoder compares names as Strings do (canonical equivalence: the
    /// KELVIN SIGN is a K), so SecretFields does too.
    @Test func namesCompareAsTheDecoderComparesThem() throws {
        let kelvin = #"{"\u212A":"k-1"}"#
        #expect(try JSONDecoder().decode([String: String].self, from: Data(kelvin.utf8))["K"] == "k-1")
        #expect(try self.take(kelvin, ["K"]).0 == ["K": "k-1"])
        let kelvins = String(repeating: #"\u212a"#, count: 13)
        #expect(try self.take(#"{"\#(kelvins)":"k-13"}"#, [String(repeating: "K", count: 13)]).0.values.first == "k-13")
    }

    /// A name longer than any key is none of them (it is counted, not stored).
    @Test func aNameLongerThanAnyKeyIsNoKey() throws {
        let long = Self.escaped("refresh_token") + String(repeating: #"\u0020"#, count: 200_000)
        let (taken, _) = try self.take(#"{"\#(long)":"x","refresh_token":"rt"}"#, ["refresh_token"])
        #expect(taken == ["refresh_token": "rt"])
    }

    /// A caller's `key` maps a name as sent (here: trimmed of spaces and
    /// tabs, as native-auth answers are read) to the name it is looked up
    /// by; it sees the whole name, however long. Without one, a padded name
    /// is no key, as for JSONDecoder.
    @Test func aMappedNameIsDecodedWhole() throws {
        let padded = String(repeating: " ", count: 100) + Self.escaped("refresh_token") + String(repeating: #"\t"#, count: 50)
        let json = #"{"\#(padded)":"rt-2"}"#
        var bytes = Array(json.utf8)
        let taken = try SecretFields.take(["refresh_token"], from: &bytes) { name in
            String(name.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
        }
        #expect(taken.mapValues { $0.unsafeString() } == ["refresh_token": "rt-2"])
        #expect(try self.take(json, ["refresh_token"]).0.isEmpty)
        #expect(try self.take(#"{" refresh_token":"rt-3"}"#, ["refresh_token"]).0.isEmpty)
    }

    @Test func deepNestingIsWalkedWithoutRecursion() throws {
        let deep = String(repeating: "[", count: 30_000) + String(repeating: "]", count: 30_000)
        let (taken, _) = try self.take(#"{"a":\#(deep),"password":"p"}"#, ["password"])
        #expect(taken["password"] == "p")
    }

    @Test func requestLinesHandTheirSecretsOverWithoutAString() throws {
        let line = #"{"id":1,"op":"signin.submit_password","flow":"f-1","password":"p\u00e4ss \"w\""}"#
        let request = LineCodec.request(from: Array(line.utf8))
        guard case .success(.signinSubmitPassword(let flow, let password)) = request.command else {
            Issue.record("not decoded: \(request.command)")
            return
        }
        #expect(flow == "f-1")
        #expect(password.unsafeString() == "päss \"w\"")
        let twice = LineCodec.request(from: Array(#"{"id":1,"op":"unlock","passphrase":"a","passphrase":"b"}"#.utf8))
        guard case .failure(let error) = twice.command else {
            Issue.record("a doubled passphrase was decoded")
            return
        }
        #expect(error.code == .badRequest)
        #expect(!error.message.contains("\"a\""))
    }
}
