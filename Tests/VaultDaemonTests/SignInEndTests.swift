import Testing
import VaultDaemon
import VaultTestIssuer
import VaultTestKit

/// An account's sign-ins in progress end when it is signed out or removed:
/// the door ends them first, before the broker wipes anything.
@Suite(.timeLimit(.minutes(1)))
struct SignInEndTests {
    static let email = "ada@example.org"

    func setUp() async throws -> (TestIssuer, InProcessVault, LineClient, LineClient) {
        let issuer = try await TestIssuer.start()
        issuer.addNativeUser(Self.email)
        let vault = try await InProcessVault.start()
        let client = try LineClient(path: vault.socketPath)
        let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","offline_access"]}"#
        #expect(await client.call(add)?["ok"] as? Bool == true)
        let subscriber = try LineClient(path: vault.socketPath)
        #expect(await subscriber.call(#"{"id":1,"op":"subscribe","accounts":["work"]}"#)?["ok"] as? Bool == true)
        let started = try #require(
            await client.call(#"{"id":"s","op":"signin.start","account":"work","method":"email_otp","username":"\#(Self.email)"}"#)
        )
        #expect(started["state"] as? String == "code_required", "\(started)")
        return (issuer, vault, client, subscriber)
    }

    /// The sign-in's `cancelled` and the account's `signed_out`, in the order the subscriber heard them.
    func endings(_ subscriber: LineClient) async -> [String] {
        var heard: [String] = []
        while heard.count < 2, let line = await subscriber.readObject() {
            if line["event"] as? String == "signin", line["step"] as? String == "cancelled" { heard.append("cancelled") }
            if line["event"] as? String == "signed_out" { heard.append("signed_out") }
        }
        return heard
    }

    @Test(arguments: [#"{"id":"o","op":"signout","account":"work"}"#, #"{"id":"r","op":"account.remove","name":"work"}"#])
    func signOutAndRemovalEndTheFlowFirst(request: String) async throws {
        let (issuer, vault, client, subscriber) = try await self.setUp()
        try await using(issuer, vault) { _, _ in
            #expect(await client.call(request)?["ok"] as? Bool == true)
            #expect(await vault.signIns.count == 0)
            #expect(await self.endings(subscriber) == ["cancelled", "signed_out"])
        }
    }

    /// The broker alone does not know the sign-ins (the doors end them
    /// first): a flow that outlives a sign-out it never heard of is fenced
    /// when it completes, keeps nothing, and its refresh token is revoked.
    @Test func aFlowTheBrokersSignOutLeftIsFencedWhenItCompletes() async throws {
        let (issuer, vault, client, _) = try await self.setUp()
        try await using(issuer, vault) { _, _ in
            // The same start again joins the flow in progress: its id.
            let joined = await client.call(#"{"id":"j","op":"signin.start","account":"work","method":"email_otp","username":"\#(Self.email)"}"#)
            let flow = try #require(joined?["flow"] as? String, "\(joined ?? [:])")
            _ = try await vault.broker.signOut("work")
            #expect(await vault.signIns.count == 1)
            let code = try #require(issuer.lastCode(for: Self.email))
            let submitted = try #require(await client.call(#"{"id":"c","op":"signin.submit_code","flow":"\#(flow)","code":"\#(code)"}"#))
            #expect(submitted["ok"] as? Bool == false, "\(submitted)")
            try await eventually { issuer.revocationCount == 1 }
            let status = try #require(await client.call(#"{"id":"st","op":"status"}"#))
            #expect((status["accounts"] as? [[String: Any]])?.first?["signed_in"] as? Bool == false, "\(status)")
        }
    }

    /// The flow keeps what it captured at start, so a code sent while the
    /// vault is locked reaches the issuer; the broker keeps nothing of the
    /// answer, revokes its refresh token, and says the vault is locked.
    @Test func aCodeSubmittedWhileLockedIsAnsweredLockedAndKeepsNothing() async throws {
        let (issuer, vault, client, _) = try await self.setUp()
        try await using(issuer, vault) { _, _ in
            let started = try #require(await client.call(#"{"id":"s2","op":"signin.start","account":"work","method":"email_otp","username":"\#(Self.email)"}"#))
            let flow = try #require(started["flow"] as? String, "\(started)")
            let code = try #require(issuer.lastCode(for: Self.email))
            #expect(await client.call(#"{"id":"l","op":"lock"}"#)?["ok"] as? Bool == true)
            let submitted = try #require(await client.call(#"{"id":"c","op":"signin.submit_code","flow":"\#(flow)","code":"\#(code)"}"#))
            #expect(submitted.errorCode == "locked", "\(submitted)")
            #expect(await vault.signIns.count == 0)
            try await eventually { issuer.revocationCount == 1 }
            #expect(await client.call(#"{"id":"u","op":"unlock"}"#)?["ok"] as? Bool == true)
            let status = try #require(await client.call(#"{"id":"st","op":"status"}"#))
            #expect((status["accounts"] as? [[String: Any]])?.first?["signed_in"] as? Bool == false, "\(status)")
        }
    }
}
