import Foundation
import Glibc
import Testing
import VaultCrypto
import VaultDaemon
import VaultJSON
import VaultOIDC
import VaultProtocol
import VaultServer
import VaultTestIssuer
import VaultTestKit

/// What vaultd trusts: ID tokens only once validated, loopback only by
/// address, and files only where no other user can write.
@Suite(.timeLimit(.minutes(1)))
struct TrustTests {
    func signedIn(_ vault: InProcessVault, at issuer: TestIssuer, scopes: [String] = ["openid", "offline_access"]) async throws {
        _ = try await vault.broker.add(
            AccountAddition(
                configuration: AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: scopes),
                refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
            )
        )
    }

    /// A refreshed ID token that fails validation leaves nothing behind: not
    /// in memory, not on disk after a restart, not as sign-out's `id_token_hint`.
    @Test(arguments: ["unsigned", "another subject"])
    func aRefusedIDTokenIsNeverKept(_ forgery: String) async throws {
        let issuer = try await TestIssuer.start(rotateRefreshTokens: true)
        let folder = try temporaryFolder()
        var vault = try await InProcessVault.start(folder: folder)
        try await self.signedIn(vault, at: issuer)
        _ = try await vault.workToken()
        let before = try await vault.rooms.claims(account: "work", for: testPeer).claims
        #expect(before["sub"]?.stringValue != nil)

        if forgery == "unsigned" {
            issuer.setIDTokenForgery(unsigned: true)
        } else {
            issuer.setIDTokenForgery(subject: "mallory")
        }
        let refused = await vault.workTokenFailure(force: true)
        #expect(refused?.code == .idpError && refused?.error == "untrusted_response", "\(String(describing: refused))")
        #expect(try await vault.rooms.claims(account: "work", for: testPeer).claims == before)

        await vault.stop()
        vault = try await InProcessVault.start(folder: folder)
        #expect(try await vault.rooms.claims(account: "work", for: testPeer).claims == before, "the forged token was not stored")
        // The rotated refresh token that came with it was kept: the session lives on.
        issuer.setIDTokenForgery()
        #expect(try await vault.workToken(force: true).accessToken.count > 0)
        await vault.stop()
        await issuer.stop()
    }

    /// `localhost` is a name: another local user may answer on `::1`. Loopback is named by address.
    @Test func loopbackIsNamedByAddressOnly() async throws {
        let vault = try await InProcessVault.start()
        for issuer in ["http://localhost:8080", "http://LOCALHOST:8080", "http://127.0.0.2.example:80", "http://example.org"] {
            let refused = await #expect(throws: VaultError.self) {
                _ = try await vault.broker.add(AccountAddition(configuration: AccountConfiguration(name: "a", issuer: issuer, clientID: "c", scopes: [])))
            }
            #expect(refused?.code == .badRequest, "\(issuer)")
        }
        let redirect = await #expect(throws: VaultError.self) {
            _ = try await vault.broker.add(
                AccountAddition(
                    configuration: AccountConfiguration(
                        name: "a", issuer: "https://id.example.org", clientID: "c", scopes: [], redirectURI: "http://localhost:8400/callback"
                    )
                )
            )
        }
        #expect(redirect?.code == .badRequest)
        for issuer in ["http://127.0.0.1:8080", "http://[::1]:8080"] {
            _ = try await vault.broker.add(AccountAddition(configuration: AccountConfiguration(name: "a", issuer: issuer, clientID: "c", scopes: [])))
            _ = try await vault.broker.remove("a")
        }
        await vault.stop()
    }

    /// An https issuer whose discovery names a plain-http endpoint never
    /// gets the refresh token sent there in clear.
    @Test func anHTTPSIssuerMayNotNameAPlainHTTPEndpoint() throws {
        // The rule itself, on what discovery would hand it: the client checks every endpoint under the issuer.
        #expect(throws: Never.self) { try OIDCClient.requireSecure("https://id.example.org/token", under: "https://id.example.org") }
        #expect(throws: (any Error).self) { try OIDCClient.requireSecure("http://127.0.0.1:9/token", under: "https://id.example.org") }
        #expect(throws: Never.self) { try OIDCClient.requireSecure("http://127.0.0.1:9/token", under: "http://127.0.0.1:9") }
        #expect(throws: (any Error).self) { try OIDCClient.requireSecure("http://localhost:9/token", under: "http://localhost:9") }
    }

    /// accounts.json says where refresh tokens and client secrets are sent:
    /// vaultd refuses to start on one another user could have written.
    @Test func aConfigFolderOthersCanWriteIsRefused() async throws {
        let folder = try temporaryFolder()
        let vault = try await InProcessVault.start(folder: folder)
        await vault.stop()
        #expect(chmod(folder + "/config", 0o777) == 0)
        let loose = await #expect(throws: ServerError.self) { _ = try await InProcessVault.start(folder: folder) }
        #expect(loose?.description.contains("\(folder)/config is writable by its group or others") == true, "\(String(describing: loose))")

        #expect(chmod(folder + "/config", 0o700) == 0)
        let file = folder + "/config/accounts.json"
        try #"{"version":1,"accounts":[]}"#.write(toFile: file, atomically: false, encoding: .utf8)
        #expect(chmod(file, 0o666) == 0)
        let writable = await #expect(throws: ServerError.self) { _ = try await InProcessVault.start(folder: folder) }
        #expect(writable?.description.contains("accounts.json is writable by its group or others") == true)
        #expect(chown(file, 65534, 65534) == 0 && chmod(file, 0o644) == 0)
        let theirs = await #expect(throws: ServerError.self) { _ = try await InProcessVault.start(folder: folder) }
        #expect(theirs?.description.contains("belongs to uid 65534") == true)
    }

    /// A loaded account passes the rules account.add holds a client to.
    @Test func aLoadedAccountIsValidatedAsAnAddedOneIs() async throws {
        let folder = try temporaryFolder()
        let vault = try await InProcessVault.start(folder: folder)
        await vault.stop()
        let file = folder + "/config/accounts.json"
        try #"{"version":1,"accounts":[{"name":"work","issuer":"http://evil.example","client_id":"c"}]}"#
            .write(toFile: file, atomically: false, encoding: .utf8)
        let refused = await #expect(throws: VaultError.self) { _ = try await InProcessVault.start(folder: folder) }
        #expect(refused?.message.contains("accounts.json holds an account vaultd refuses") == true, "\(String(describing: refused))")
        #expect(refused?.message.contains("evil") == false)
    }

    /// An accounts.json from before identities gets one per account, kept across restarts.
    @Test func accountsGetAStableIdentity() async throws {
        let issuer = try await TestIssuer.start()
        let folder = try temporaryFolder()
        var vault = try await InProcessVault.start(folder: folder)
        try await self.signedIn(vault, at: issuer)
        let added = try #require(vault.cache.identity(of: "work") as String?)
        await vault.stop()
        vault = try await InProcessVault.start(folder: folder)
        #expect(vault.cache.identity(of: "work") == added)
        await vault.stop()

        let file = folder + "/config/accounts.json"
        let text = try String(contentsOfFile: file, encoding: .utf8)
        try text.replacingOccurrences(of: #""identity" : "\#(added)","#, with: "").write(toFile: file, atomically: false, encoding: .utf8)
        #expect(try !String(contentsOfFile: file, encoding: .utf8).contains(added))
        vault = try await InProcessVault.start(folder: folder)
        let given = try #require(vault.cache.identity(of: "work") as String?)
        #expect(given != added)
        #expect(try String(contentsOfFile: file, encoding: .utf8).contains(given), "written at start")
        await vault.stop()
        await issuer.stop()
    }

    /// accounts.json pointed at another issuer (by a neighbour, or by hand):
    /// the sealed record is bound to the issuer it came from, so the account
    /// loads signed out and its refresh token is never sent to the new one.
    @Test func aRecordIsNeverSentToAnotherIssuerThanItsOwn() async throws {
        let issuer = try await TestIssuer.start()
        let impostor = try await TestIssuer.start()
        let folder = try temporaryFolder()
        var vault = try await InProcessVault.start(folder: folder)
        try await self.signedIn(vault, at: issuer)
        _ = try await vault.workToken()
        await vault.stop()
        let file = folder + "/config/accounts.json"
        let text = try String(contentsOfFile: file, encoding: .utf8)
        try text.replacingOccurrences(of: issuer.issuer, with: impostor.issuer).write(toFile: file, atomically: false, encoding: .utf8)

        vault = try await InProcessVault.start(folder: folder)
        #expect(await vault.broker.status().accounts.first?.signedIn == false)
        let refused = await vault.workTokenFailure(force: true)
        #expect(refused?.code == .notSignedIn, "\(String(describing: refused))")
        #expect(impostor.refreshCount == 0 && impostor.requestCount(at: TestIssuer.tokenPath) == 0)
        await vault.stop()
        await issuer.stop()
        await impostor.stop()
    }
}
