import Glibc
import Testing
import VaultDaemon
import VaultTestIssuer
import VaultTestKit

/// `signin.wait` over the socket: each wait has one timer, and a wait that is
/// answered before its timeout leaves nothing running behind it.
@Suite(.timeLimit(.minutes(1)))
struct SignInWaitTests {
    func setUp() async throws -> (TestIssuer, InProcessVault, LineClient) {
        let issuer = try await TestIssuer.start()
        let vault = try await InProcessVault.start()
        let client = try LineClient(path: vault.socketPath)
        let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","offline_access"]}"#
        #expect(await client.call(add)?["ok"] as? Bool == true)
        return (issuer, vault, client)
    }

    @Test func waitsAnsweredBeforeTheirTimeoutLeaveNoTimerRunning() async throws {
        let (issuer, vault, client) = try await self.setUp()
        try await using(issuer, vault) { _, _ in
            let started = try #require(await client.call(#"{"id":"s","op":"signin.start","account":"work","method":"browser"}"#))
            let flow = try #require(started["flow"] as? String, "\(started)")
            let signIns = vault.signIns
            // Twenty callers wait ten minutes each for the browser sign-in.
            for index in 0..<20 {
                client.send(#"{"id":\#(index),"op":"signin.wait","flow":"\#(flow)","timeout_ms":600000}"# + "\n")
            }
            try await eventually { await signIns.waitTimers == 20 }
            #expect(await signIns.waitTimers == 20, "one timer per waiting call")
            // The flow ends: every wait is answered at once, and its timer goes with it.
            let other = try LineClient(path: vault.socketPath)
            #expect(await other.call(#"{"id":"c","op":"signin.cancel","flow":"\#(flow)"}"#)?["ok"] as? Bool == true)
            for _ in 0..<20 {
                let answer = try #require(await client.readObject())
                #expect(answer.errorCode == "flow_not_found", "\(answer)")
            }
            #expect(await signIns.count == 0)
            try await eventually { await signIns.waitTimers == 0 }
        }
    }

    @Test func aWaitThatTimesOutAnswersTheStateAndLeavesNoTimer() async throws {
        let (issuer, vault, client) = try await self.setUp()
        try await using(issuer, vault) { _, _ in
            let started = try #require(await client.call(#"{"id":"s","op":"signin.start","account":"work","method":"browser"}"#))
            let flow = try #require(started["flow"] as? String, "\(started)")
            let waited = try #require(await client.call(#"{"id":"w","op":"signin.wait","flow":"\#(flow)","timeout_ms":50}"#))
            #expect(waited["state"] as? String == "open_browser", "\(waited)")
            try await eventually { await vault.signIns.waitTimers == 0 }
            #expect(await vault.signIns.count == 1, "the flow goes on")
        }
    }

    /// A wait whose connection closes ends then: nothing waits ten minutes
    /// for a caller that is gone, and the flow goes on for the others.
    @Test func aWaitWhoseConnectionClosesLeavesNoTimer() async throws {
        let (issuer, vault, client) = try await self.setUp()
        try await using(issuer, vault) { _, _ in
            let started = try #require(await client.call(#"{"id":"s","op":"signin.start","account":"work","method":"browser"}"#))
            let flow = try #require(started["flow"] as? String, "\(started)")
            let signIns = vault.signIns
            let leaving = try LineClient(path: vault.socketPath)
            leaving.send(#"{"id":"w","op":"signin.wait","flow":"\#(flow)","timeout_ms":600000}"# + "\n")
            try await eventually { await signIns.waitTimers == 1 }
            shutdown(leaving.fd, Int32(SHUT_RDWR))
            try await eventually { await signIns.waitTimers == 0 }
            #expect(await signIns.count == 1, "the flow goes on")
            let waited = try #require(await client.call(#"{"id":"w2","op":"signin.wait","flow":"\#(flow)","timeout_ms":50}"#))
            #expect(waited["state"] as? String == "open_browser", "\(waited)")
        }
    }
}
