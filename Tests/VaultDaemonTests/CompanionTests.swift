import Foundation
import Testing
import VaultClient
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultTestIssuer

/// What a companion program sees: events as an AsyncSequence, and a token
/// copy that goes away when the account signs out.
@Suite(.timeLimit(.minutes(1)))
struct CompanionTests {
    @Test func aCompanionDropsItsCopyOnSignOut() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await withVault { vault in
                let admin = try LineClient(path: vault.socketPath)
                let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","offline_access"],"refresh_token":"\#(issuer.mintRefreshToken())"}"#
                #expect(await admin.call(add)?["ok"] as? Bool == true)

                let companion = try await VaultClient.connect(path: vault.socketPath)
                let copies = try await TokenCopies.start(companion)
                let watcher = try await VaultClient.connect(path: vault.socketPath)
                var events = try await watcher.events(accounts: ["work"]).makeAsyncIterator()

                let first = try await copies.token("work")
                #expect(copies.held == ["work"])
                #expect(try await copies.token("work").accessToken == first.accessToken, "served from the companion's copy")
                let refreshed = await events.next()
                #expect(refreshed?.event == .tokenRefreshed && refreshed?.expiresAt == first.expiresAt)

                let signout = try #require(await admin.call(#"{"id":1,"op":"signout","account":"work"}"#))
                #expect(signout["notified"] as? Int == 2, "both subscribed connections were told: \(signout)")
                let signedOut = await events.next()
                #expect(signedOut?.event == .signedOut && signedOut?.account == "work")
                let deadline = Date().addingTimeInterval(10)
                while !copies.held.isEmpty && Date() < deadline { await Task.yield() }
                #expect(copies.held.isEmpty, "the companion dropped its copy")
                await #expect(throws: VaultError.self) { try await copies.token("work") }
            }
        }
    }

    /// A companion that stops hearing events (vaultd closed its connection,
    /// as it does with `overloaded` for one that fell behind) could miss a
    /// sign-out: it drops its copies and keeps none after.
    @Test func aCompanionThatLosesItsEventsKeepsNoCopy() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await withVault { vault in
                _ = try await vault.broker.add(
                    AccountAddition(
                        configuration: AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"]),
                        refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
                    )
                )
                let copies = try await TokenCopies.start(try await VaultClient.connect(path: vault.socketPath))
                _ = try await copies.token("work")
                #expect(copies.held == ["work"])
                vault.server.closeConnections()
                try await poll { copies.held.isEmpty }
            }
        }
    }

    @Test func theRefreshTokenGoesOnlyToAnAllowedCompanionOfAnAccountThatReleasesIt() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await withVault { vault in
                let companion = try #require(testPeer.executable)
                func add(_ name: String, release: Bool, allowed: [String]) async throws -> String {
                    let refreshToken = issuer.mintRefreshToken()
                    _ = try await vault.broker.add(
                        AccountAddition(
                            configuration: AccountConfiguration(
                                name: name, issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"],
                                allowedClients: allowed, releaseRefreshToken: release
                            ),
                            refreshToken: try SecretBytes(utf8: refreshToken)
                        )
                    )
                    return refreshToken
                }
                let released = try await add("phone", release: true, allowed: [companion])
                _ = try await add("closed", release: false, allowed: [companion])
                _ = try await add("anyone", release: true, allowed: [])
                let result = try await vault.broker.releaseRefreshToken(account: "phone", for: testPeer)
                #expect(result.refreshToken.unsafeString() == released)
                let stranger = Peer(pid: testPeer.pid, uid: testPeer.uid, gid: testPeer.gid, executable: "/usr/bin/stranger")
                for (name, peer) in [("phone", stranger), ("closed", testPeer), ("anyone", testPeer)] {
                    var code: ErrorCode?
                    do throws(VaultError) {
                        _ = try await vault.broker.releaseRefreshToken(account: name, for: peer)
                    } catch {
                        code = error.code
                    }
                    #expect(code == .forbidden, "\(name) for \(peer.executable ?? "?")")
                }
                // allowed_clients gates token for everyone else too.
                await #expect(throws: VaultError.self) { try await vault.broker.token(TokenRequest(account: "phone"), for: stranger) }
            }
        }
    }
}
