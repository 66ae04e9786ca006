import Foundation
import Testing
import VaultClient
import VaultCrypto
import VaultProtocol
import VaultTestIssuer
import VaultTestKit

/// `vaultctl token` and friends, and the async client, against a live vaultd.
@Suite(.timeLimit(.minutes(1)))
struct TokenCommandTests {
    @Test func vaultctlImportsAndPrintsOnlyTheToken() async throws {
        let issuer = try await TestIssuer.start()
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder, arguments: ["--log-level", "trace"])
        #expect(await daemon.waitForLog("listening"))
        let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
        let refreshToken = issuer.mintRefreshToken()
        let imported = try await runTool(
            "vaultctl",
            ["import", "work", "--issuer", issuer.issuer, "--client-id", TestIssuer.clientID, "--scope", "openid"],
            input: refreshToken + "\n",
            environment: env
        )
        #expect(imported.status == 0, "\(imported.stderr)")

        let token = try await runTool("vaultctl", ["token", "work"], environment: env)
        #expect(token.status == 0, "\(token.stderr)")
        #expect(token.stderr.isEmpty)
        let accessToken = token.stdout.trimmingCharacters(in: .newlines)
        #expect(accessToken.hasPrefix("at-"))
        #expect(token.stdout == accessToken + "\n", "nothing but the token on stdout")
        #expect(await daemon.waitForLog("token released account=work exe=\(productsDirectory)/vaultctl pid="), "an audit line names the program")
        #expect(!daemon.output.contains(accessToken), "and never the token")
        let header = try await runTool("vaultctl", ["token", "work", "--header"], environment: env)
        #expect(header.stdout == "Authorization: Bearer \(accessToken)\n")
        let json = try await runTool("vaultctl", ["token", "work", "--json"], environment: env)
        let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        #expect(object?["access_token"] as? String == accessToken)
        #expect(object?["token_type"] as? String == "Bearer")
        let claims = try await runTool("vaultctl", ["claims", "work"], environment: env)
        #expect(claims.stdout.contains("preferred_username: ada"), "\(claims.stdout)")
        let userinfo = try await runTool("vaultctl", ["userinfo", "work"], environment: env)
        #expect(userinfo.stdout.contains("email: ada@example.org"), "\(userinfo.stdout) \(userinfo.stderr)")
        let unknown = try await runTool("vaultctl", ["token", "nobody"], environment: env)
        #expect(unknown.status == 67)
        #expect(unknown.stdout.isEmpty)

        #expect(await daemon.terminate() == 0)
        let log = daemon.output
        #expect(log.contains("token refreshed"), "the log was captured")
        #expect(!log.contains(refreshToken), "the refresh token reached the log")
        #expect(!log.contains(accessToken), "the access token reached the log")
        await issuer.stop()
    }

    /// What mail clients take from a command: the SASL initial response,
    /// base64, for XOAUTH2 and for OAUTHBEARER (RFC 7628), naming the address.
    @Test func vaultctlPrintsTheSASLResponsesMailClientsSend() async throws {
        let vault = try await IssuerAndDaemon.start()
        let (env, token) = (vault.env, vault.token)
        func decoded(_ arguments: [String]) async throws -> String {
            let result = try await runTool("vaultctl", ["token", "work"] + arguments, environment: env)
            #expect(result.status == 0, "\(result.stderr)")
            #expect(result.stdout.hasSuffix("\n") && !result.stdout.dropLast().contains("\n"), "one line")
            let bytes = try #require(Data(base64Encoded: result.stdout.trimmingCharacters(in: .newlines)))
            return String(decoding: bytes, as: UTF8.self)
        }
        #expect(try await decoded(["--sasl", "xoauth2", "--user", "ada@example.org"]) == "user=ada@example.org\u{1}auth=Bearer \(token)\u{1}\u{1}")
        #expect(try await decoded(["--sasl", "oauthbearer", "--user", "a,b=c@example.org"]) == "n,a=a=2Cb=3Dc@example.org,\u{1}auth=Bearer \(token)\u{1}\u{1}")
        for wrong in [["--sasl", "xoauth2"], ["--user", "ada@example.org"], ["--sasl", "plain", "--user", "a"], ["--sasl", "xoauth2", "--user", "a\u{1}b"],
            ["--sasl", "xoauth2", "--user", "a", "--header"]] {
            let refused = try await runTool("vaultctl", ["token", "work"] + wrong, environment: env)
            #expect(refused.status == 64, "\(wrong): \(refused.status) \(refused.stderr)")
            #expect(refused.stdout.isEmpty)
            #expect(!refused.stderr.contains(token))
        }
        await vault.stop()
    }

    @Test func theAsyncClientPipelinesRequests() async throws {
        let issuer = try await TestIssuer.start()
        try await withVault { vault in
            let client = try await VaultClient.connect(path: vault.socketPath)
            let configuration = AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"])
            _ = try await client.call(
                .accountAdd(AccountAddition(configuration: configuration, refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken()))),
                as: AccountResult.self
            )
            let tokens = try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<100 { group.addTask { try await client.token("work").accessToken.unsafeString() } }
                var tokens: Set<String> = []
                for try await token in group { tokens.insert(token) }
                return tokens
            }
            #expect(tokens.count == 1)
            #expect(issuer.refreshCount == 1)
            do throws(VaultError) {
                _ = try await client.token("nobody")
                Issue.record("an unknown account served a token")
            } catch {
                #expect(error.code == .unknownAccount)
            }
            let hello = try await client.call(.hello, as: HelloResult.self)
            #expect(hello.protocol == 1)
            client.close()
            await issuer.stop()
        }
    }

    @Test func allowedClientsAreEnforcedOnTheCachedPath() async throws {
        let issuer = try await TestIssuer.start()
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            let add = #"{"id":1,"op":"account.add","name":"git","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","allowed_clients":["/usr/bin/git"],"refresh_token":"\#(issuer.mintRefreshToken())"}"#
            #expect(await client.call(add)?["ok"] as? Bool == true)
            #expect(await client.call(#"{"id":2,"op":"token","account":"git"}"#)?.errorCode == "forbidden")
            #expect(issuer.refreshCount == 0)
            await issuer.stop()
        }
    }
}
