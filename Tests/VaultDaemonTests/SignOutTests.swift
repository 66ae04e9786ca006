import Foundation
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultStore
import VaultTestIssuer
import VaultTestKit

/// Sign-out wipes every copy: at the issuer, on disk, in memory, and in
/// every companion that subscribed.
@Suite(.timeLimit(.minutes(2)))
struct SignOutTests {
    static let scopes = #"["openid","offline_access","profile","email"]"#

    @Test func signOutAtGlewlwydRevokesWipesAndTellsSubscribers() async throws {
        // Access tokens that outlive the test: one dead after sign-out was revoked, not expired.
        try await Glewlwyd.with(accessTokenSeconds: 600) { provider in
            let secret = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET"])
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(provider.issuer)","client_id":"confidential-app","client_secret":"\#(secret)","scopes":\#(Self.scopes)}"#
                #expect(await client.call(add)?["ok"] as? Bool == true)
                let signedIn = try #require(await client.call(#"{"id":1,"op":"signin.start","account":"work","method":"password","username":"ada","password":"correct horse"}"#))
                #expect(signedIn["state"] as? String == "signed_in", "\(signedIn)")
                let store = try SealedFileStore(path: vault.vaultFile, keySource: .keyFile(vault.keyFile))
                let refreshToken = try #require(try await store.load("work")?.refreshToken).unsafeString()

                // Two access tokens handed out: the cached one, and the one a forced refresh replaced.
                let first = try #require(await client.call(#"{"id":"t1","op":"token","account":"work"}"#)?["access_token"] as? String)
                let second = try #require(await client.call(#"{"id":"t2","op":"token","account":"work","force_refresh":true}"#)?["access_token"] as? String)
                #expect(first != second)

                let subscriber = try LineClient(path: vault.socketPath)
                #expect(await subscriber.call(#"{"id":"sub","op":"subscribe"}"#)?["ok"] as? Bool == true)
                let reply = try #require(await client.call(#"{"id":2,"op":"signout","account":"work"}"#))
                #expect(reply["ok"] as? Bool == true, "\(reply)")
                let receipt = try #require((reply["accounts"] as? [[String: Any]])?.first)
                #expect(receipt["revoked"] as? String == "yes", "\(receipt)")
                #expect(receipt["access_tokens_revoked"] as? Int == 2, "\(receipt)")
                for accessToken in [first, second] {
                    let seen = try await runTool(
                        packageRoot + "/demo/glewlwyd/introspect.py",
                        ["--issuer", provider.issuer, "--client-id", "confidential-app", "--client-secret", secret, "--hint", "access_token"],
                        input: accessToken
                    )
                    #expect(seen.stdout.contains(#""active": false"#), "an access token handed out lives on at the issuer: \(seen.stdout)")
                }
                #expect(receipt["wiped"] as? [String] == ["memory", "file"])
                #expect((receipt["end_session_url"] as? String)?.contains("id_token_hint=") == true)
                #expect(reply["notified"] as? Int == 1)
                let event = try #require(await subscriber.readObject())
                #expect(event["event"] as? String == "signed_out" && event["account"] as? String == "work", "\(event)")

                let introspection = try await runTool(
                    packageRoot + "/demo/glewlwyd/introspect.py",
                    ["--issuer", provider.issuer, "--client-id", "confidential-app", "--client-secret", secret],
                    input: refreshToken
                )
                #expect(introspection.stdout.contains(#""active": false"#), "the provider calls it dead: \(introspection.stdout)")
                #expect(await client.call(#"{"id":3,"op":"token","account":"work"}"#)?.errorCode == "not_signed_in")

                // After a restart nothing of the session is on disk; the client secret stays with the account.
                await vault.stop()
                let after = try #require(try await SealedFileStore(path: vault.vaultFile, keySource: .keyFile(vault.keyFile)).load("work"))
                #expect(after.refreshToken == nil && after.idToken == nil)
                #expect(after.clientSecret != nil)
                try await withVault(folder: vault.folder) { restarted in
                    let again = try LineClient(path: restarted.socketPath)
                    #expect(await again.call(#"{"id":4,"op":"token","account":"work"}"#)?.errorCode == "not_signed_in")
                    // And it signs in again without being added again.
                    let back = try #require(await again.call(#"{"id":5,"op":"signin.start","account":"work","method":"password","username":"ada","password":"correct horse"}"#))
                    #expect(back["state"] as? String == "signed_in", "\(back)")
                }
            }
        }
    }

    /// A vault with `work` signed in at `issuer`, stopped when `body` ends.
    func withSignedInVault<T>(with issuer: TestIssuer, _ body: (InProcessVault, LineClient) async throws -> T) async throws -> T {
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":\#(Self.scopes),"refresh_token":"\#(issuer.mintRefreshToken())"}"#
            #expect(await client.call(add)?["ok"] as? Bool == true)
            #expect(await client.call(#"{"id":"t","op":"token","account":"work"}"#)?["ok"] as? Bool == true)
            return try await body(vault, client)
        }
    }

    /// "Every copy" reaches the issuer's: each access token handed out and
    /// still live is revoked with the refresh token, and the receipt counts them.
    @Test func signOutRevokesTheAccessTokensHandedOut() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await self.withSignedInVault(with: issuer) { vault, client in
                var handedOut: [String] = []
                for (id, ask) in [("a", ""), ("b", #","force_refresh":true"#), ("c", #","scope":"openid""#)] {
                    let token = try #require(await client.call(#"{"id":"\#(id)","op":"token","account":"work"\#(ask)}"#))
                    handedOut.append(try #require(token["access_token"] as? String, "\(token)"))
                }
                #expect(handedOut.allSatisfy(issuer.isAccessTokenActive))
                let reply = try #require(await client.call(#"{"id":1,"op":"signout","account":"work"}"#))
                let receipt = try #require((reply["accounts"] as? [[String: Any]])?.first)
                #expect(receipt["revoked"] as? String == "yes", "\(reply)")
                // The first is the cached one, which the forced refresh replaced: three in all.
                #expect(receipt["access_tokens_revoked"] as? Int == 3, "\(reply)")
                #expect(!handedOut.contains(where: issuer.isAccessTokenActive), "an access token handed out lives on at the issuer")
            }
        }
    }

    @Test func anIssuerThatIsDownStillLeavesNothingLocally() async throws {
        let issuer = try await TestIssuer.start()
        try await self.withSignedInVault(with: issuer) { vault, client in
            await issuer.stop()
            let reply = try #require(await client.call(#"{"id":1,"op":"signout","all":true}"#))
            let receipt = try #require((reply["accounts"] as? [[String: Any]])?.first)
            #expect(receipt["revoked"] as? String == "failed", "\(reply)")
            #expect(receipt["reason"] is String)
            #expect(receipt["wiped"] as? [String] == ["memory", "file"])
            #expect(await client.call(#"{"id":2,"op":"token","account":"work"}"#)?.errorCode == "not_signed_in")
            let stored = try await SealedFileStore(path: vault.vaultFile, keySource: .keyFile(vault.keyFile)).load("work")
            #expect(stored == nil)
        }
    }

    @Test func removingAnAccountSignsItOutFirst() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await self.withSignedInVault(with: issuer) { vault, client in
                let removed = try #require(await client.call(#"{"id":1,"op":"account.remove","name":"work"}"#))
                #expect(removed["revoked"] as? String == "yes", "\(removed)")
                #expect(issuer.revocationCount == 2, "the refresh token and the access token handed out")
                let status = try #require(await client.call(#"{"id":2,"op":"status"}"#))
                #expect((status["accounts"] as? [Any])?.isEmpty == true)
            }
        }
    }

    @Test func vaultctlSignoutSaysWhatItDid() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await using(DaemonProcess(folder: try temporaryFolder())) { daemon in
                #expect(await daemon.waitForLog("listening"))
                let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
                try await importAccount(from: issuer, environment: env)
                let out = try await runTool("vaultctl", ["signout", "work"], environment: env)
                #expect(out.status == 0, "\(out.stderr)")
                #expect(out.stdout.contains("signed out of work: refresh token revoked at the issuer; wiped from memory, file"), "\(out.stdout)")
                #expect(out.stdout.contains("0 subscribed programs were told"))
                let token = try await runTool("vaultctl", ["token", "work"], environment: env)
                #expect(token.status == 67, "\(token.stderr)")
                let neither = try await runTool("vaultctl", ["signout"], environment: env)
                #expect(neither.status == 64)
            }
        }
    }
}
