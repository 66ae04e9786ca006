import Foundation
import Testing
import VaultCrypto
@testable import VaultProtocol

/// The `token` line and its reply skip Codable when they are plain. Whatever
/// the plain path does, it must do exactly what JSONDecoder and JSONEncoder
/// would: the same request or the same error from every line, the same bytes
/// from every reply.
@Suite struct PlainLineTests {
    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    /// What a decoded request means, comparable.
    static func meaning(_ request: Request) -> String {
        let id = request.id.map { "\($0)" } ?? "nil"
        switch request.command {
        case .success(.token(let token)):
            return "\(id) token \(token.account)|\(token.scopes ?? ["<none>"])|\(token.minTTL)|\(token.forceRefresh)"
        case .success(let command): return "\(id) \(command)"
        case .failure(let error): return "\(id) error \(error.code.rawValue): \(error.message)"
        }
    }

    static func checkAgrees(_ line: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
        let both = Self.meaning(LineCodec.request(from: line))
        let codable = Self.meaning(LineCodec.codableRequest(from: line))
        #expect(both == codable, "line \(String(decoding: line, as: UTF8.self).debugDescription)", sourceLocation: sourceLocation)
    }

    static let lines = [
        // Plain: taken by the plain path.
        #"{"id":1,"op":"token","account":"work"}"#,
        #"{"account":"work","id":1,"min_ttl":60,"op":"token"}"#,
        #" { "op" : "token" , "account" : "wörk" , "id" : "a-1" , "scope" : "openid  email", "force_refresh" : true } "#,
        #"{"op":"token","account":"w","scope":["openid","email"],"min_ttl":0,"id":-5}"#,
        #"{"op":"token","account":"w","min_ttl":86400,"force_refresh":false,"id":999999999999999999}"#,
        #"{"op":"token","account":"w"}"#,
        "{\"op\":\"token\",\"account\":\"w\",\"id\":1}\r",
        // Not plain, or refused: the Codable path answers, and the plain path must not.
        #"{"op":"token","account":"w\u0041"}"#,
        #"{"op":"token","account":"a\"b"}"#,
        #"{"op":"token","account":"w","min_ttl":60.0}"#,
        #"{"op":"token","account":"w","min_ttl":6e1}"#,
        #"{"op":"token","account":"w","min_ttl":-1}"#,
        #"{"op":"token","account":"w","min_ttl":86401}"#,
        #"{"op":"token","account":"w","min_ttl":0060}"#,
        #"{"op":"token","account":"w","id":-0}"#,
        #"{"op":"token","account":"w","id":1234567890123456789}"#,
        // Past Int64 while being read: a number the plain path must decline, not trap on.
        #"{"op":"token","account":"w","id":9999999999999999999}"#,
        #"{"op":"token","account":"w","min_ttl":99999999999999999999999999999999}"#,
        #"{"op":"token","account":"w","id":-9999999999999999999}"#,
        #"{"op":"token","account":"w","id":null}"#,
        #"{"op":"token","account":"w","id":{}}"#,
        #"{"op":"token","account":"w","account":"v"}"#,
        #"{"op":"token","account":"w","extra":1}"#,
        #"{"op":"token","account":"w","scope":[]}"#,
        #"{"op":"token","account":"w","scope":""}"#,
        #"{"op":"token","account":"w","scope":["a b"]}"#,
        #"{"op":"token","account":"w","scope":[""]}"#,
        #"{"op":"token","account":"w","scope":[1]}"#,
        #"{"op":"token","account":"w","force_refresh":1}"#,
        #"{"op":"token","account":7}"#,
        #"{"op":"token"}"#,
        #"{"op":"status","account":"w"}"#,
        #"{"op":"token","account":"w"} x"#,
        #"{"op":"token","account":"w",}"#,
        #"{"op":"token","account":"w""#,
        #"{"op":"token","account":"w"}}"#,
        #"[{"op":"token","account":"w"}]"#,
        "{\"op\":\"token\",\"account\":\"w\u{7}\"}",
        "\u{FEFF}{\"op\":\"token\",\"account\":\"w\"}",
        "",
    ]

    /// The plain reader and writers are written from two field tables. A
    /// property added to a request or reply type must find its field there,
    /// else it would vanish from the plain line while Codable sends it.
    @Test func everyPropertyOfTheTokenTypesHasAPlainField() throws {
        let token = TokenRequest(account: "a", scopes: ["s"], minTTL: 5, forceRefresh: true)
        let target = try #require(DPoPTarget(method: "GET", url: "https://rs.example/a"))
        let secret = try SecretBytes(utf8: "t")
        let requests: [(String, Any)] = [
            ("TokenRequest", token), ("DPoPProofRequest", DPoPProofRequest(token: token, target: target)), ("DPoPTarget", target),
        ]
        let replies: [(String, Any)] = [
            ("TokenResult", TokenResult(accessToken: secret, tokenType: "Bearer", expiresAt: 1, expiresIn: 1, scope: "s")),
            ("DPoPProofResult", DPoPProofResult(proof: "p", accessToken: secret, expiresAt: 1, expiresIn: 1, scope: "s")),
        ]
        var requestProperties: Set<String> = []
        for (type, value) in requests {
            for child in Mirror(reflecting: value).children { requestProperties.insert("\(type).\(child.label ?? "?")") }
        }
        var replyProperties: Set<String> = []
        for (type, value) in replies {
            for child in Mirror(reflecting: value).children { replyProperties.insert("\(type).\(child.label ?? "?")") }
        }
        #expect(requestProperties == Set(TokenLineField.properties.keys))
        #expect(replyProperties == Set(ReplyLineField.properties.keys))
        // Written in the order of JSONEncoder's sorted keys.
        #expect(TokenLineField.allCases.map(\.rawValue) == TokenLineField.allCases.map(\.rawValue).sorted())
        #expect(ReplyLineField.allCases.map(\.rawValue) == ReplyLineField.allCases.map(\.rawValue).sorted())
        // Every field Codable writes for a token request is one of the table's.
        let line = try Self.encoder.encode(Request(id: .number(1), command: .token(token)))
        let keys = try #require(try JSONSerialization.jsonObject(with: line) as? [String: Any]).keys
        #expect(Set(keys).isSubset(of: Set(TokenLineField.allCases.map(\.rawValue))))
    }

    @Test(arguments: Self.lines)
    func decodesAsJSONDecoderDoes(line: String) {
        Self.checkAgrees(Array(line.utf8))
    }

    /// The plain path itself, not through LineCodec (which falls back to
    /// Codable): it takes the plain lines, and declines every other one.
    @Test func thePlainPathTakesThePlainLinesAndDeclinesTheRest() {
        let plain = Self.lines.prefix(7)
        for line in plain {
            let read = Array(line.utf8).withUnsafeBytes { Request(plainToken: $0) }
            #expect(read != nil, "declined a plain line: \(line)")
            if let read { #expect(Self.meaning(read) == Self.meaning(LineCodec.codableRequest(from: Array(line.utf8))), "\(line)") }
        }
        for line in Self.lines.dropFirst(7) {
            let read = Array(line.utf8).withUnsafeBytes { Request(plainToken: $0) }
            #expect(read == nil, "took a line Codable reads differently or refuses: \(line)")
        }
    }

    @Test func invalidUTF8InAPlainShapeIsRefusedAsBefore() {
        var line = Array(#"{"op":"token","account":""#.utf8)
        line += [0xC3, 0x28]
        line += Array(#""}"#.utf8)
        Self.checkAgrees(line)
        guard case .failure(let error) = LineCodec.request(from: line).command else {
            Issue.record("invalid UTF-8 was accepted")
            return
        }
        #expect(error.code == .badRequest)
    }

    /// Every one-byte change of plain lines: the plain path never accepts
    /// what Codable reads differently.
    @Test func everyOneByteChangeDecodesAsJSONDecoderDoes() {
        let seeds = [
            #"{"account":"work","force_refresh":true,"id":12,"min_ttl":60,"op":"token","scope":["openid","x"]}"#,
            #"{"op":"token","account":"w","scope":"a b","id":"r-1"}"#,
        ]
        let alphabet = Array(#"{}[]":, -019eE.tfnul"\a"#.utf8) + [0x00, 0x09, 0x0A, 0x7F, 0xC3, 0xFF]
        for seed in seeds.map({ Array($0.utf8) }) {
            for index in seed.indices {
                var removed = seed
                removed.remove(at: index)
                Self.checkAgrees(removed)
                for byte in alphabet {
                    var replaced = seed
                    replaced[index] = byte
                    Self.checkAgrees(replaced)
                    var inserted = seed
                    inserted.insert(byte, at: index)
                    Self.checkAgrees(inserted)
                }
            }
        }
    }

    static let strings = ["work", "wörk 🔑", "a/b", "a\"b", "back\\slash", "tab\there", "nl\nx", "\u{1}", "", "\u{7F}", "\u{2028}"]

    @Test func tokenRequestsEncodeAsJSONEncoderDoes() throws {
        for account in Self.strings {
            for scopes in [nil, ["openid"], ["openid", account]] {
                for id in [nil, RequestID.number(-3), .number(Int64.max), .string(account)] {
                    for force in [false, true] {
                        let request = Request(id: id, command: .token(TokenRequest(account: account, scopes: scopes, minTTL: 120, forceRefresh: force)))
                        #expect(try LineCodec.line(for: request) == Self.encoder.encode(request))
                    }
                }
            }
        }
    }

    /// `dpop.proof` lines take the plain path too, when their `htm` and `htu` name a request.
    @Test func proofRequestsDecodeAsJSONDecoderDoes() {
        let plain = [
            #"{"id":1,"op":"dpop.proof","account":"work","htm":"GET","htu":"https://rs.example/a?b=c#d"}"#,
            #"{"op":"dpop.proof","account":"w","htm":"POST","htu":"http://127.0.0.1:8080/","scope":"a b","min_ttl":0}"#,
        ]
        let declined = [
            #"{"op":"dpop.proof","account":"w","htm":"GE T","htu":"https://rs.example/"}"#,
            #"{"op":"dpop.proof","account":"w","htm":"GET","htu":"ftp://rs.example/"}"#,
            #"{"op":"dpop.proof","account":"w","htm":"GET"}"#,
            #"{"op":"dpop.proof","account":"w","htu":"https://rs.example/"}"#,
            #"{"op":"dpop.proof","account":"w","htm":"GET","htu":"https://user@rs.example/"}"#,
            #"{"op":"token","account":"w","htm":"GET","htu":"https://rs.example/"}"#,
        ]
        for line in plain + declined {
            Self.checkAgrees(Array(line.utf8))
            let read = Array(line.utf8).withUnsafeBytes { Request(plainToken: $0) }
            #expect((read != nil) == plain.contains(line), "\(line)")
        }
    }

    @Test func proofRepliesEncodeAsJSONEncoderDoes() throws {
        for text in Self.strings {
            for id in [nil, RequestID.number(7), .string(text)] {
                let result = DPoPProofResult(
                    proof: "eyJ.h." + text,
                    accessToken: try SecretBytes(utf8: "eyJ" + text),
                    expiresAt: 1_795_320_027,
                    expiresIn: 59,
                    scope: text
                )
                let response = Response(id: id, result)
                #expect(LineCodec.line(for: response) == (try Self.encoder.encode(response)))
            }
        }
    }

    @Test func tokenRepliesEncodeAsJSONEncoderDoes() throws {
        for text in Self.strings {
            for id in [nil, RequestID.number(7), .string(text)] {
                let result = TokenResult(
                    accessToken: try SecretBytes(utf8: "eyJ" + text),
                    tokenType: text.isEmpty ? "Bearer" : text,
                    expiresAt: 1_795_320_027,
                    expiresIn: -2,
                    scope: text
                )
                let response = Response(id: id, result)
                #expect(LineCodec.line(for: response) == (try Self.encoder.encode(response)))
            }
        }
    }

    @Test func tokenRepliesDecodeAsJSONDecoderDoes() throws {
        let decoder = JSONDecoder()
        let replies = [
            #"{"access_token":"eyJ.a.b","expires_at":1795320027,"expires_in":3417,"id":4,"ok":true,"scope":"openid offline_access","token_type":"Bearer"}"#,
            #"{"access_token":"t","expires_at":1,"expires_in":0,"id":"x","ok":true,"token_type":"Bearer"}"#,
            #"{"access_token":"t\/u","expires_at":1,"expires_in":0,"id":1,"ok":true,"scope":"","token_type":"Bearer"}"#,
            #"{"access_token":"t","expires_at":1,"expires_in":0,"id":1,"ok":true,"scope":"","token_type":"Bearer","new":[1]}"#,
            #"{"access_token":"t","expires_at":1.5,"expires_in":0,"id":1,"ok":true,"scope":"","token_type":"Bearer"}"#,
        ]
        for reply in replies.map({ Data($0.utf8) }) {
            let head = try LineCodec.head(of: reply)
            let codableHead = try decoder.decode(ResponseHead.self, from: reply)
            #expect(head.id == codableHead.id && head.ok == codableHead.ok && head.event == codableHead.event && head.error == nil)
            let token = try? LineCodec.payload(TokenResult.self, of: reply)
            let codable = try? decoder.decode(TokenResult.self, from: reply)
            #expect(token?.accessToken == codable?.accessToken)
            #expect(token?.expiresAt == codable?.expiresAt && token?.expiresIn == codable?.expiresIn)
            #expect(token?.scope == codable?.scope && token?.tokenType == codable?.tokenType)
        }
        let failure = Data(#"{"error":{"code":"not_signed_in","message":"m"},"id":2,"ok":false}"#.utf8)
        #expect(try LineCodec.head(of: failure).error?.code == .notSignedIn)
        let event = Data(#"{"account":"w","event":"signed_out"}"#.utf8)
        #expect(try LineCodec.head(of: event).event == "signed_out")
    }
}
