import Foundation
import Glibc
import Testing
import VaultDaemon
import VaultServer
import VaultTestIssuer
import VaultTestKit

/// What a connection's requests do once it closes.
@Suite(.timeLimit(.minutes(1)))
struct ConnectionLifetimeTests {
    /// A client that closes its connection while its `token` waits on a
    /// refresh stops waiting at once; the refresh it started is shared, runs
    /// on, and answers the client still connected.
    @Test func aClosedConnectionStopsWaitingAndTheSharedRefreshStillAnswersTheOthers() async throws {
        try await using(TestIssuer.start(rotateRefreshTokens: true)) { issuer in
            try await withVault { vault in
                let setup = try LineClient(path: vault.socketPath)
                let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid"],"refresh_token":"\#(issuer.mintRefreshToken())"}"#
                #expect(await setup.call(add)?["ok"] as? Bool == true)
                issuer.setTokenBehaviour(.gate)

                // The first caller starts the refresh; the second joins it.
                let first = try LineClient(path: vault.socketPath)
                first.send(#"{"id":"first","op":"token","account":"work"}"# + "\n")
                #expect(try await self.waitingCallers(vault, becomes: 1))
                let second = try LineClient(path: vault.socketPath)
                second.send(#"{"id":"second","op":"token","account":"work"}"# + "\n")
                #expect(try await self.waitingCallers(vault, becomes: 2))

                shutdown(first.fd, Int32(SHUT_RDWR))
                #expect(try await self.waitingCallers(vault, becomes: 1), "the closed connection's caller still waits")
                #expect(try await eventually { vault.server.requestsInFlight == 1 }, "the closed connection's request still counts")

                issuer.openGate()
                let answer = try #require(await second.readObject())
                #expect(answer["ok"] as? Bool == true, "\(answer)")
                #expect(issuer.refreshCount == 1)
                let again = try #require(await second.call(#"{"id":"again","op":"token","account":"work"}"#))
                #expect(again["access_token"] as? String == answer["access_token"] as? String, "the refresh was kept")
                #expect(issuer.refreshCount == 1)
            }
        }
    }

    /// Connections that close leave holes in the C heap; once they stop
    /// closing, vaultd trims it (what that returns is in BENCHMARKS.md).
    @Test func closedConnectionsAreFollowedByATrimOfTheHeap() async throws {
        try await withVault { vault in
            #expect(try await eventually { !vault.rooms.heapTrim.isPending }, "the set-up's trim is still due")
            let before = vault.rooms.heapTrim.count
            for _ in 0..<20 {
                let client = try LineClient(path: vault.socketPath)
                #expect(await client.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
                shutdown(client.fd, Int32(SHUT_RDWR))
            }
            #expect(try await eventually { vault.rooms.heapTrim.count > before }, "no trim followed the closed connections")
        }
    }

    /// Waits, with a deadline, until `count` callers wait on a refresh of `work`.
    func waitingCallers(_ vault: InProcessVault, becomes count: Int) async throws -> Bool {
        try await eventually { await vault.broker.waitingCallers(account: "work") == count }
    }
}
