import Foundation
import Testing
import VaultCrypto
import VaultProtocol

@Suite struct RequestDecodingTests {
    func decode(_ line: String) -> Request { LineCodec.request(from: Array(line.utf8)) }

    func failure(_ line: String) -> (RequestID?, VaultError?) {
        let request = self.decode(line)
        if case .failure(let error) = request.command { return (request.id, error) }
        return (request.id, nil)
    }

    @Test(arguments: [
        (#"{"id":1,"op":"self_destruct"}"#, ErrorCode.unknownOp, RequestID.number(1)),
        (#"{"id":"a","op":"account.remove"}"#, ErrorCode.badRequest, RequestID.string("a")),
        (#"{"id":2,"op":"account.add","name":"w","issuer":5,"client_id":"c"}"#, ErrorCode.badRequest, RequestID.number(2)),
        (#"{"id":3,"op":"account.add","name":"w","issuer":"https://x","client_id":"c","scopes":"openid"}"#, ErrorCode.badRequest, RequestID.number(3)),
        (#"{"id":4}"#, ErrorCode.badRequest, RequestID.number(4)),
        (#"{"id":5,"op":7}"#, ErrorCode.badRequest, RequestID.number(5)),
        (#"{"id":6,"op":"unlock","passphrase":["x"]}"#, ErrorCode.badRequest, RequestID.number(6)),
        (#"{"id":7,"op":"signin.start","account":"w","method":"carrier_pigeon"}"#, ErrorCode.badRequest, RequestID.number(7)),
        (#"{"id":8,"op":"signin.submit_code","flow":"f-1"}"#, ErrorCode.badRequest, RequestID.number(8)),
        (#"{"id":9,"op":"signin.wait","flow":"f-1","timeout_ms":600001}"#, ErrorCode.badRequest, RequestID.number(9)),
        (#"{"id":10,"op":"signout","account":"w","all":true}"#, ErrorCode.badRequest, RequestID.number(10)),
        (#"{"id":11,"op":"signout"}"#, ErrorCode.badRequest, RequestID.number(11)),
        (#"{"id":12,"op":"migrate","to":"floppy"}"#, ErrorCode.badRequest, RequestID.number(12)),
        (#"{"id":13,"op":"subscribe","accounts":"w"}"#, ErrorCode.badRequest, RequestID.number(13)),
    ])
    func fieldErrorsKeepTheID(line: String, code: ErrorCode, id: RequestID) {
        let (decodedID, error) = self.failure(line)
        #expect(decodedID == id)
        #expect(error?.code == code)
    }

    @Test(arguments: ["not json", "", "[1,2]", "\"hello\"", "{\"id\":1,", "{\"id\":{},\"op\":\"hello\"}", "\u{0}"])
    func nonRequestsAreBadRequestsWithoutID(line: String) {
        let (id, error) = self.failure(line)
        #expect(id == nil)
        #expect(error == LineCodec.notARequest)
    }

    @Test func invalidUTF8IsABadRequest() {
        var bytes = Array(#"{"id":1,"op":"hello","x":""#.utf8)
        bytes += [0xC3, 0x28, 0xFF]
        bytes += Array(#""}"#.utf8)
        let request = LineCodec.request(from: bytes)
        guard case .failure(let error) = request.command else {
            Issue.record("invalid UTF-8 was accepted")
            return
        }
        #expect(error.code == .badRequest)
    }

    @Test func errorsNeverEchoSecretValues() {
        let lines = [
            #"{"id":1,"op":"account.add","name":"w","issuer":"CANARY-VALUE","client_id":"c"}"#,
            #"{"id":1,"op":"unlock","passphrase":12345678}"#,
            #"{"id":1,"op":"signin.submit_code","flow":7,"code":"12345678"}"#,
            #"{"id":1,"op":"signin.submit_password","flow":"f-1","password":12345678}"#,
            #"{"id":1,"op":"CANARY-VALUE-op-with-dashes"}"#,
            #"CANARY-VALUE"#,
        ]
        for line in lines {
            let response = Response(id: nil, error: self.failure(line).1 ?? VaultError(.internalError, "accepted"))
            let reply = String(decoding: LineCodec.line(for: response), as: UTF8.self)
            #expect(!reply.contains("CANARY"))
            #expect(!reply.contains("12345678"))
        }
    }

    @Test func secretsDecodeIntoGuardedMemory() throws {
        let request = self.decode(#"{"id":9,"op":"unlock","passphrase":"correct horse"}"#)
        guard case .success(.unlock(let passphrase)) = request.command else {
            Issue.record("unlock did not decode")
            return
        }
        #expect(passphrase == (try SecretBytes(utf8: "correct horse")))
    }

    @Test func requestsRoundTrip() throws {
        let configuration = AccountConfiguration(
            name: "work",
            issuer: "https://id.example.org",
            clientID: "cli",
            scopes: ["openid", "offline_access"],
            allowedClients: ["/usr/bin/git"],
            releaseRefreshToken: true,
            redirectURI: "http://127.0.0.1:8400/cb"
        )
        let request = Request(
            id: .string("x"),
            command: .accountAdd(AccountAddition(configuration: configuration, clientSecret: try SecretBytes(utf8: "s")))
        )
        let decoded = LineCodec.request(from: try LineCodec.line(for: request))
        guard case .success(.accountAdd(let addition)) = decoded.command else {
            Issue.record("account.add did not round-trip")
            return
        }
        #expect(decoded.id == .string("x"))
        #expect(addition.configuration == configuration)
        #expect(addition.clientSecret == (try SecretBytes(utf8: "s")))
    }

    /// Every sign-in, sign-out and companion operation survives encode → decode → encode.
    @Test func theNewOperationsRoundTrip() throws {
        let commands: [Command] = [
            .signinStart(SignInStart(account: "w", method: .emailOTP, username: "ada@example.org")),
            .signinStart(SignInStart(account: "w", method: .password, username: "ada", password: try SecretBytes(utf8: "pw"))),
            .signinSubmitCode(flow: "f-1", code: try SecretBytes(utf8: "12345678")),
            .signinResendCode(flow: "f-1"),
            .signinSubmitPassword(flow: "f-1", password: try SecretBytes(utf8: "pw")),
            .signinWait(flow: "f-1", timeoutMs: 1000),
            .signinWait(flow: "f-1", timeoutMs: nil),
            .signinCancel(flow: "f-1"),
            .subscribe(accounts: ["w"]),
            .subscribe(accounts: nil),
            .signout(.account("w")),
            .signout(.all),
            .refreshToken(account: "w"),
            .migrate(to: .keyring),
        ]
        for command in commands {
            let line = try LineCodec.line(for: Request(id: .number(1), command: command))
            let decoded = LineCodec.request(from: line)
            guard case .success(let again) = decoded.command else {
                Issue.record("\(String(decoding: line, as: UTF8.self)) did not decode")
                continue
            }
            #expect(try LineCodec.line(for: Request(id: .number(1), command: again)) == line)
        }
    }

    @Test func repliesFollowTheWireContract() throws {
        let hello = String(decoding: LineCodec.line(for: Response(id: .number(1), HelloResult())), as: UTF8.self)
        #expect(hello == #"{"id":1,"ok":true,"protocol":1,"server":"vaultd","version":"\#(TokenVault.version)"}"#)
        let failure = Response(id: nil, error: VaultError(.invalidCode, "that code is not right; 4 attempts left", attemptsLeft: 4))
        let line = String(decoding: LineCodec.line(for: failure), as: UTF8.self)
        #expect(
            line
                == #"{"error":{"attempts_left":4,"code":"invalid_code","message":"that code is not right; 4 attempts left"},"id":null,"ok":false}"#
        )
        let head = try LineCodec.head(of: Data(line.utf8))
        #expect(head.ok == false)
        #expect(head.error?.attemptsLeft == 4)
    }
}
