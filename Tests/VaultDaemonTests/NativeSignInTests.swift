import Foundation
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultTestIssuer
import VaultTestKit

/// Email one-time passcode and native password sign-in (MSAL native
/// authentication) against the project's test issuer, through the socket:
/// every state of the email-code state machine.
@Suite(.timeLimit(.minutes(1)))
struct NativeSignInTests {
    static let email = "ada@example.org"

    struct Setup: Stoppable {
        let issuer: TestIssuer
        let vault: InProcessVault
        let clock: ManualClock
        let client: LineClient

        func stop() async {
            await self.vault.stop()
            await self.issuer.stop()
        }
    }

    func setUp() async throws -> Setup {
        let issuer = try await TestIssuer.start()
        issuer.addNativeUser(Self.email)
        let clock = ManualClock()
        let vault = try await InProcessVault.start(clock: clock)
        let client = try LineClient(path: vault.socketPath)
        let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","profile","offline_access"]}"#
        #expect(await client.call(add)?["ok"] as? Bool == true)
        return Setup(issuer: issuer, vault: vault, clock: clock, client: client)
    }

    func start(_ setup: Setup, username: String = Self.email, method: String = "email_otp") async throws -> [String: Any] {
        try #require(await setup.client.call(#"{"id":"s","op":"signin.start","account":"work","method":"\#(method)","username":"\#(username)"}"#))
    }

    func submit(_ setup: Setup, _ flow: String, _ code: String) async throws -> [String: Any] {
        try #require(await setup.client.call(#"{"id":"c","op":"signin.submit_code","flow":"\#(flow)","code":"\#(code)"}"#))
    }

    /// A code of the right length that is not the one sent.
    func wrongCode(_ setup: Setup) -> String {
        setup.issuer.lastCode(for: Self.email) == "00000000" ? "11111111" : "00000000"
    }

    @Test func aWrongCodeThenTheRightOneSignsInAndEveryStepIsAnEvent() async throws {
        try await using(self.setUp()) { setup in
            let subscriber = try LineClient(path: setup.vault.socketPath)
            #expect(await subscriber.call(#"{"id":1,"op":"subscribe","accounts":["work"]}"#)?["ok"] as? Bool == true)

            let started = try await self.start(setup)
            #expect(started["state"] as? String == "code_required", "\(started)")
            #expect(started["sent_to"] as? String == "a**@example.org")
            #expect(started["channel"] as? String == "email")
            #expect(started["code_length"] as? Int == 8)
            #expect(started["attempts_left"] as? Int == 5)
            let flow = try #require(started["flow"] as? String)

            let wrong = try await self.submit(setup, flow, self.wrongCode(setup))
            #expect(wrong.errorCode == "invalid_code", "\(wrong)")
            #expect((wrong["error"] as? [String: Any])?["attempts_left"] as? Int == 4)

            let code = try #require(setup.issuer.lastCode(for: Self.email))
            let done = try await self.submit(setup, flow, code)
            #expect(done["state"] as? String == "signed_in", "\(done)")
            #expect(done["username"] as? String == Self.email)
            #expect(setup.issuer.codesSent(to: Self.email) == 1, "the wrong code did not cost a new email")

            let token = try #require(await setup.client.call(#"{"id":"t","op":"token","account":"work"}"#))
            #expect(token["ok"] as? Bool == true, "\(token)")
            let status = try #require(await setup.client.call(#"{"id":"st","op":"status"}"#))
            let account = try #require((status["accounts"] as? [[String: Any]])?.first)
            #expect(account["signed_in"] as? Bool == true)
            #expect(account["username"] as? String == Self.email)

            var steps: [String] = []
            var signedIn = false
            while steps.last != "done", let event = await subscriber.readObject() {
                #expect(event["id"] == nil && event["ok"] == nil, "events have no id and no ok")
                if event["event"] as? String == "signin" { steps.append(event["step"] as? String ?? "?") }
                if event["event"] as? String == "signed_in" {
                    signedIn = true
                    #expect(event["username"] as? String == Self.email)
                }
                #expect(!"\(event)".contains(code), "no code in any event")
            }
            #expect(signedIn)
            #expect(steps == ["sending_code", "awaiting_code", "submitting", "incorrect_code", "submitting", "done"], "\(steps)")
        }
    }

    @Test func aResentCodeReplacesTheFirst() async throws {
        try await using(self.setUp()) { setup in
            let flow = try #require(try await self.start(setup)["flow"] as? String)
            let first = try #require(setup.issuer.lastCode(for: Self.email))
            let resent = try #require(await setup.client.call(#"{"id":"r","op":"signin.resend_code","flow":"\#(flow)"}"#))
            #expect(resent["state"] as? String == "code_required", "\(resent)")
            #expect(resent["attempts_left"] as? Int == 5)
            #expect(setup.issuer.codesSent(to: Self.email) == 2)
            let second = try #require(setup.issuer.lastCode(for: Self.email))
            if first != second {
                #expect(try await self.submit(setup, flow, first).errorCode == "invalid_code", "the first code is void")
            }
            #expect(try await self.submit(setup, flow, second)["state"] as? String == "signed_in")
        }
    }

    /// A new code lives its own lifetime: the flow's timer moves with it,
    /// or the flow would end at the first code's deadline while its reply
    /// promised the second's.
    @Test func aResentCodeMovesTheFlowsDeadline() async throws {
        try await using(self.setUp()) { setup in
            let started = try await self.start(setup)
            let flow = try #require(started["flow"] as? String)
            let first = try #require(await setup.vault.signIns.expiryDeadline(of: flow))
            setup.clock.advance(by: 500)
            let resent = try #require(await setup.client.call(#"{"id":"r","op":"signin.resend_code","flow":"\#(flow)"}"#))
            let promised = try #require(resent["expires_in"] as? Int)
            let timer = try #require(await setup.vault.signIns.expiryDeadline(of: flow))
            #expect(timer == first + 500, "the timer ends the flow a full lifetime after the new code")
            #expect(Int((timer - setup.clock.now()).rounded(.down)) == promised, "and when the reply said it would")
        }
    }

    @Test func anExpiredFlowAnswersCodeExpiredAndCanBeRestarted() async throws {
        try await using(self.setUp()) { setup in
            let flow = try #require(try await self.start(setup)["flow"] as? String)
            setup.issuer.expireNativeFlows()
            let code = try #require(setup.issuer.lastCode(for: Self.email))
            #expect(try await self.submit(setup, flow, code).errorCode == "code_expired")
            #expect(try await self.submit(setup, flow, code).errorCode == "flow_not_found", "the flow is gone")

            let again = try await self.start(setup)
            let flow2 = try #require(again["flow"] as? String)
            #expect(flow2 != flow)
            let fresh = try #require(setup.issuer.lastCode(for: Self.email))
            #expect(try await self.submit(setup, flow2, fresh)["state"] as? String == "signed_in")
        }
    }

    /// The flow's deadline passes with nobody asking: its chore ends it, and
    /// subscribers hear why. Read after its deadline but before the chore ran,
    /// a flow answers `code_expired` (`anExpiredFlowAnswersCodeExpired...`).
    @Test func aFlowLeftAloneExpiresByItself() async throws {
        try await using(self.setUp()) { setup in
            let subscriber = try LineClient(path: setup.vault.socketPath)
            #expect(await subscriber.call(#"{"id":1,"op":"subscribe","accounts":["work"]}"#)?["ok"] as? Bool == true)
            let flow = try #require(try await self.start(setup)["flow"] as? String)
            setup.clock.advance(by: 599)
            setup.clock.advance(by: 2)
            var ended: [String: Any]?
            while ended == nil, let event = await subscriber.readObject() {
                if event["event"] as? String == "signin", event["step"] as? String == "error" { ended = event }
            }
            #expect(ended?["flow"] as? String == flow)
            #expect(ended?["code"] as? String == "code_expired", "\(ended ?? [:])")
            #expect(await setup.vault.signIns.count == 0, "nothing of the flow is left")
            let code = try #require(setup.issuer.lastCode(for: Self.email))
            #expect(try await self.submit(setup, flow, code).errorCode == "flow_not_found")
        }
    }

    @Test func fiveWrongCodesEndTheFlow() async throws {
        try await using(self.setUp()) { setup in
            let flow = try #require(try await self.start(setup)["flow"] as? String)
            let wrong = self.wrongCode(setup)
            for left in (1...4).reversed() {
                let reply = try await self.submit(setup, flow, wrong)
                #expect(reply.errorCode == "invalid_code")
                #expect((reply["error"] as? [String: Any])?["attempts_left"] as? Int == left)
            }
            #expect(try await self.submit(setup, flow, wrong).errorCode == "too_many_attempts")
            let code = try #require(setup.issuer.lastCode(for: Self.email))
            #expect(try await self.submit(setup, flow, code).errorCode == "flow_not_found")
        }
    }

    @Test func anIssuerLockoutIsTooManyAttempts() async throws {
        try await using(self.setUp()) { setup in
            setup.issuer.setNativeAuth(maxAttempts: 1)
            let flow = try #require(try await self.start(setup)["flow"] as? String)
            #expect(try await self.submit(setup, flow, self.wrongCode(setup)).errorCode == "invalid_code")
            let code = try #require(setup.issuer.lastCode(for: Self.email))
            #expect(try await self.submit(setup, flow, code).errorCode == "too_many_attempts")
        }
    }

    @Test func aMalformedCodeCostsNoAttemptAndNoRequest() async throws {
        try await using(self.setUp()) { setup in
            let flow = try #require(try await self.start(setup)["flow"] as? String)
            let before = setup.issuer.nativeRequestCount
            for code in ["123", "abcdefgh", "", "123456789"] {
                let reply = try await self.submit(setup, flow, code)
                // docs/protocol.md: the wrong length or other than digits is
                // `invalid_code`, costs no attempt, and the issuer is not asked.
                #expect(reply.errorCode == "invalid_code", "\(code.count) characters: \(reply)")
                #expect((reply["error"] as? [String: Any])?["attempts_left"] as? Int == 5, "\(reply)")
            }
            #expect(setup.issuer.nativeRequestCount == before)
        }
    }

    @Test func anUnknownUserAndABrowserOnlyUser() async throws {
        try await using(self.setUp()) { setup in
            #expect(try await self.start(setup, username: "nobody@example.org").errorCode == "user_not_found")
            setup.issuer.addNativeUser("grace@example.org", .browserOnly)
            let redirected = try await self.start(setup, username: "grace@example.org")
            #expect(redirected["state"] as? String == "browser_required", "\(redirected)")
            #expect(await setup.vault.signIns.count == 0)
        }
    }

    @Test func anIssuerThatIsDownLeavesTheFlowUsable() async throws {
        try await using(self.setUp()) { setup in
            let flow = try #require(try await self.start(setup)["flow"] as? String)
            setup.issuer.failNextNativeCall(.status(503))
            let code = try #require(setup.issuer.lastCode(for: Self.email))
            #expect(try await self.submit(setup, flow, code).errorCode == "idp_unavailable")
            #expect(try await self.submit(setup, flow, code)["state"] as? String == "signed_in")
        }
    }

    @Test func aCancelledFlowIsGone() async throws {
        try await using(self.setUp()) { setup in
            let flow = try #require(try await self.start(setup)["flow"] as? String)
            #expect(await setup.client.call(#"{"id":"x","op":"signin.cancel","flow":"\#(flow)"}"#)?["ok"] as? Bool == true)
            #expect(await setup.vault.signIns.count == 0)
            #expect(try await self.submit(setup, flow, "12345678").errorCode == "flow_not_found")
        }
    }

    @Test func aNativePasswordUserSignsInAfterAWrongPassword() async throws {
        try await using(self.setUp()) { setup in
            setup.issuer.addNativeUser("grace@example.org", .password("correct horse"))
            let started = try await self.start(setup, username: "grace@example.org", method: "password")
            #expect(started["state"] as? String == "password_required", "\(started)")
            let flow = try #require(started["flow"] as? String)
            let wrong = try #require(await setup.client.call(#"{"id":"p","op":"signin.submit_password","flow":"\#(flow)","password":"wrong"}"#))
            #expect(wrong.errorCode == "invalid_credentials", "\(wrong)")
            let right = try #require(await setup.client.call(#"{"id":"p","op":"signin.submit_password","flow":"\#(flow)","password":"correct horse"}"#))
            #expect(right["state"] as? String == "signed_in", "\(right)")
            #expect(right["username"] as? String == "grace@example.org")
        }
    }

    @Test func aPasswordForAnEmailCodeUserAsksForTheCode() async throws {
        try await using(self.setUp()) { setup in
            let started = try await self.start(setup, method: "password")
            #expect(started["state"] as? String == "code_required", "\(started)")
        }
    }
}
