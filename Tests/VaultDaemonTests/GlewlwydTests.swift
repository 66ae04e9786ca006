import Foundation
import Logging
import Testing
import VaultCrypto
import VaultDaemon
import VaultOIDC
import VaultJSON
import VaultProtocol
import VaultStore
import VaultTestKit

/// The token engine against Glewlwyd, a real OpenID provider written by
/// others, started for each test on 127.0.0.1 with a fresh database.
@Suite(.timeLimit(.minutes(2)))
struct GlewlwydTests {
    static let scopes = #"["openid","offline_access","profile","email"]"#

    func addLine(_ name: String, issuer: String, client: String, secret: String? = nil, refreshToken: String) -> String {
        let secretField = secret.map { #","client_secret":"\#($0)""# } ?? ""
        return #"{"id":"add","op":"account.add","name":"\#(name)","issuer":"\#(issuer)","client_id":"\#(client)","scopes":\#(Self.scopes)\#(secretField),"refresh_token":"\#(refreshToken)"}"#
    }

    @Test func anImportedTokenRefreshesRotatesAndSurvivesARestart() async throws {
        try await Glewlwyd.with { provider in
            let login = try await provider.login(client: "public-rotating")
            let original = try #require(login["refresh_token"] as? String)
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                #expect(await client.call(self.addLine("work", issuer: provider.issuer, client: "public-rotating", refreshToken: original))?["ok"] as? Bool == true)

                let first = try #require(await client.call(#"{"id":1,"op":"token","account":"work","min_ttl":0}"#))
                #expect(first["ok"] as? Bool == true, "\(first)")
                #expect(first["token_type"] as? String == "Bearer", "lower-case 'bearer' from the issuer is normalised")
                let accessToken = try #require(first["access_token"] as? String)
                #expect(!accessToken.isEmpty)
                #expect((first["expires_in"] as? Int).map { $0 <= 3 } == true)
                let cached = try #require(await client.call(#"{"id":2,"op":"token","account":"work","min_ttl":0}"#))
                #expect(cached["access_token"] as? String == accessToken, "served from memory")
                let forced = try #require(await client.call(#"{"id":3,"op":"token","account":"work","force_refresh":true}"#))
                #expect(forced["ok"] as? Bool == true)
                #expect(forced["access_token"] as? String != accessToken)

                // The rotated refresh token reached the sealed file.
                let store = try SealedFileStore(path: vault.vaultFile, keySource: .keyFile(vault.keyFile))
                let stored = try #require(try await store.load("work")?.refreshToken)
                #expect(stored != (try SecretBytes(utf8: original)))

                // A restart keeps working with the rotated token.
                await vault.stop()
                try await withVault(folder: vault.folder) { restarted in
                    let again = try LineClient(path: restarted.socketPath)
                    let afterRestart = try #require(await again.call(#"{"id":4,"op":"token","account":"work","force_refresh":true}"#))
                    #expect(afterRestart["ok"] as? Bool == true, "\(afterRestart)")
                    let status = try #require(await again.call(#"{"id":5,"op":"status"}"#))
                    let account = try #require((status["accounts"] as? [[String: Any]])?.first)
                    #expect(account["signed_in"] as? Bool == true)
                    #expect(account["access_token_expires_at"] is Int)
                }
            }
        }
    }

    /// Two companions asking one rotating account for different scope sets
    /// at once: Glewlwyd revokes the whole chain if one refresh token is
    /// presented twice, so every round would end the session.
    @Test func mixedScopeRefreshesOfARotatingClientKeepTheSession() async throws {
        try await Glewlwyd.with { provider in
            let login = try await provider.login(client: "public-rotating")
            let original = try #require(login["refresh_token"] as? String)
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                #expect(await client.call(self.addLine("work", issuer: provider.issuer, client: "public-rotating", refreshToken: original))?["ok"] as? Bool == true)
                let scopes = [#""#, #","scope":"openid offline_access""#, #","scope":["openid","profile","offline_access"]"#]
                for round in 0..<20 {
                    for (index, scope) in scopes.enumerated() {
                        client.send(#"{"id":\#(index),"op":"token","account":"work","force_refresh":true\#(scope)}"# + "\n")
                    }
                    for _ in scopes {
                        let answer = try #require(await client.readObject())
                        #expect(answer["ok"] as? Bool == true, "round \(round): \(answer)")
                    }
                }
                let last = try #require(await client.call(#"{"id":9,"op":"token","account":"work","force_refresh":true}"#))
                #expect(last["ok"] as? Bool == true, "the session survived: \(last)")
            }
        }
    }

    @Test func aTokenRevokedAtTheProviderMeansReauthRequired() async throws {
        try await Glewlwyd.with { provider in
            let secret = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET"])
            let login = try await provider.login(client: "confidential-app", secret: secret, grant: "password")
            let refreshToken = try #require(login["refresh_token"] as? String)
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                let add = self.addLine("ci", issuer: provider.issuer, client: "confidential-app", secret: secret, refreshToken: refreshToken)
                #expect(await client.call(add)?["ok"] as? Bool == true)
                let token = try #require(await client.call(#"{"id":1,"op":"token","account":"ci","min_ttl":0}"#))
                #expect(token["ok"] as? Bool == true, "\(token)")

                try await provider.revoke(refreshToken, client: "confidential-app", secret: secret)
                let refused = try #require(await client.call(#"{"id":2,"op":"token","account":"ci","force_refresh":true}"#))
                #expect(refused.errorCode == "reauth_required", "\(refused)")
                let message = (refused["error"] as? [String: Any])?["message"] as? String
                #expect(message?.contains("vaultctl signin ci") == true)
                let status = try #require(await client.call(#"{"id":3,"op":"status"}"#))
                #expect((status["accounts"] as? [[String: Any]])?.first?["needs_reauth"] as? Bool == true)
                #expect(await client.call(#"{"id":4,"op":"token","account":"ci"}"#)?.errorCode == "reauth_required")
            }
        }
    }

    @Test func idTokensValidateAgainstTheProviderKeys() async throws {
        try await Glewlwyd.with { provider in
            let secret = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET"])
            let login = try await provider.login(client: "confidential-app", secret: secret, grant: "password")
            let idToken = try SecretBytes(utf8: try #require(login["id_token"] as? String))
            let oidc = OIDCClient(logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
            let now = Date().timeIntervalSince1970
            let metadata = try await oidc.metadata(for: provider.issuer, now: now)
            #expect(metadata.jwksURI != nil)
            let claims = try await oidc.validateIDToken(idToken, clientID: "confidential-app", nonce: nil, metadata: metadata, now: now)
            #expect(claims["email"]?.stringValue == "ada@example.org")
            await #expect(throws: ProviderError.self) {
                try await oidc.validateIDToken(idToken, clientID: "someone-else", nonce: nil, metadata: metadata, now: now)
            }
            await #expect(throws: ProviderError.self) {
                try await oidc.validateIDToken(idToken, clientID: "confidential-app", nonce: nil, metadata: metadata, now: now + 3600)
            }
            await #expect(throws: ProviderError.self) {
                try await oidc.metadata(for: provider.issuer + "/", now: now)
            }
        }
    }

    @Test func userinfoIsFetchedWithAFreshToken() async throws {
        try await Glewlwyd.with { provider in
            let login = try await provider.login(client: "public-app")
            let refreshToken = try #require(login["refresh_token"] as? String)
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                #expect(await client.call(self.addLine("home", issuer: provider.issuer, client: "public-app", refreshToken: refreshToken))?["ok"] as? Bool == true)
                let userinfo = try #require(await client.call(#"{"id":1,"op":"userinfo","account":"home"}"#))
                #expect((userinfo["userinfo"] as? [String: Any])?["email"] as? String == "ada@example.org", "\(userinfo)")
            }
        }
    }
}
