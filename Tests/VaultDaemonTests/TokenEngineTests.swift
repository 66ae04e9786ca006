import Foundation
import Testing
import VaultCrypto
import VaultDaemon
import VaultJSON
import VaultProtocol
import VaultServer
import VaultStore
import VaultTestIssuer
import VaultTestKit

/// The broker against the project's own test issuer, for what a real
/// provider will not do on demand: hold requests, fail, lie.
@Suite(.timeLimit(.minutes(1)))
struct TokenEngineTests {
    struct Setup: Stoppable {
        let issuer: TestIssuer
        let vault: InProcessVault
        let clock: ManualClock
        var broker: Broker { self.vault.broker }

        func stop() async {
            await self.vault.stop()
            await self.issuer.stop()
        }
    }

    func setUp(
        lifetime: Int = 100,
        rotate: Bool = false,
        confidential: Bool = false,
        allowedClients: [String] = []
    ) async throws -> Setup {
        let issuer = try await TestIssuer.start(accessTokenLifetime: lifetime, rotateRefreshTokens: rotate)
        let clock = ManualClock()
        let vault = try await InProcessVault.start(clock: clock)
        let configuration = AccountConfiguration(
            name: "work",
            issuer: issuer.issuer,
            clientID: confidential ? TestIssuer.confidentialClientID : TestIssuer.clientID,
            scopes: ["openid", "profile", "email", "offline_access"],
            allowedClients: allowedClients
        )
        _ = try await vault.broker.add(
            AccountAddition(
                configuration: configuration,
                clientSecret: confidential ? try SecretBytes(utf8: TestIssuer.clientSecret) : nil,
                refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
            )
        )
        return Setup(issuer: issuer, vault: vault, clock: clock)
    }

    func token(_ setup: Setup, minTTL: Int = 60, force: Bool = false, scopes: [String]? = nil) async throws -> TokenResult {
        try await setup.vault.rooms.token(
            TokenRequest(account: "work", scopes: scopes, minTTL: minTTL, forceRefresh: force),
            for: testPeer
        )
    }

    func code(_ setup: Setup, minTTL: Int = 60, force: Bool = false) async -> VaultError? {
        do {
            _ = try await self.token(setup, minTTL: minTTL, force: force)
            return nil
        } catch let error as VaultError {
            return error
        } catch {
            return VaultError(.internalError, "\(type(of: error))")
        }
    }

    @Test func fiftyCallersAfterExpiryCauseExactlyOneRefresh() async throws {
        try await using(self.setUp()) { setup in
            setup.issuer.setTokenBehaviour(.gate)
            try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<50 {
                    group.addTask { try await self.token(setup).accessToken.unsafeString() }
                }
                try await eventually { await setup.broker.waitingCallers(account: "work") == 50 }
                setup.issuer.openGate()
                var tokens: Set<String> = []
                for try await token in group { tokens.insert(token) }
                #expect(tokens.count == 1, "every caller got the one refreshed token")
            }
            #expect(setup.issuer.refreshCount == 1)
            for _ in 0..<100 { _ = try await self.token(setup) }
            #expect(setup.issuer.refreshCount == 1, "cached tokens are served from memory")
        }
    }

    @Test func minTTLDecidesWhenToRefresh() async throws {
        try await using(self.setUp(lifetime: 100)) { setup in
            let first = try await self.token(setup)
            #expect(first.expiresIn == 100)
            setup.clock.advance(by: 50)
            let cached = try await self.token(setup, minTTL: 10)
            #expect(cached.accessToken == first.accessToken)
            #expect(cached.expiresIn == 50)
            #expect(setup.issuer.refreshCount == 1)
            let fresh = try await self.token(setup, minTTL: 60)
            #expect(fresh.accessToken != first.accessToken)
            #expect(setup.issuer.refreshCount == 2)
            _ = try await self.token(setup, minTTL: 0, force: true)
            #expect(setup.issuer.refreshCount == 3)
        }
    }

    @Test func aFinishedRefreshIsLetGo() async throws {
        try await using(self.setUp()) { setup in
            _ = try await self.token(setup)
            #expect(await setup.broker.heldRefreshes(account: "work") == 0, "the account keeps its finished refresh")
            _ = try await self.token(setup, force: true)
            _ = try await self.token(setup, scopes: ["openid"])
            #expect(await setup.broker.heldRefreshes(account: "work") == 0, "the account keeps its finished refreshes")
            #expect(setup.issuer.refreshCount == 3)
            let cached = try await self.token(setup)
            #expect(setup.issuer.refreshCount == 3, "a cached token still needs no refresh: \(cached.expiresIn)")
        }
    }

    @Test func aHangingIssuerDoesNotStallAnotherAccount() async throws {
        let hanging = try await self.setUp()
        hanging.issuer.setTokenBehaviour(.hang)
        let other = try await TestIssuer.start()
        let configuration = AccountConfiguration(name: "home", issuer: other.issuer, clientID: TestIssuer.clientID, scopes: ["openid"])
        _ = try await hanging.broker.add(
            AccountAddition(configuration: configuration, refreshToken: try SecretBytes(utf8: other.mintRefreshToken()))
        )
        let stuck = Task { try? await self.token(hanging) }
        try await eventually { await hanging.broker.waitingCallers(account: "work") >= 1 }
        let home = try await hanging.vault.rooms.token(TokenRequest(account: "home"), for: testPeer)
        #expect(!home.accessToken.unsafeString().isEmpty)
        #expect(await hanging.broker.waitingCallers(account: "work") == 1, "work is still waiting on its issuer")
        stuck.cancel()
    }

    @Test(arguments: [TokenBehaviour.invalidGrant, .emptyBody400])
    func aRejectedRefreshTokenMeansReauthRequired(behaviour: TokenBehaviour) async throws {
        try await using(self.setUp()) { setup in
            setup.issuer.setTokenBehaviour(behaviour)
            #expect(await self.code(setup)?.code == .reauthRequired)
            #expect(await setup.broker.status().accounts.first?.needsReauth == true)
            #expect(await self.code(setup)?.code == .reauthRequired)
            #expect(setup.issuer.refreshCount == 1, "no second try with a dead refresh token")
        }
    }

    @Test(arguments: [
        TokenBehaviour.status(503, body: ""), .status(500, body: "oops"), .malformedJSON, .temporarilyUnavailable,
        .resetConnection,
    ])
    func anUnavailableIssuerBacksOffAndACachedTokenKeepsServing(behaviour: TokenBehaviour) async throws {
        try await using(self.setUp(lifetime: 100)) { setup in
            let first = try await self.token(setup)
            setup.clock.advance(by: 50)
            setup.issuer.setTokenBehaviour(behaviour)
            let served = try await self.token(setup)
            #expect(served.accessToken == first.accessToken, "the still-valid token is served while the issuer fails")
            #expect(setup.issuer.refreshCount == 2)
            _ = try await self.token(setup)
            #expect(setup.issuer.refreshCount == 2, "no refresh during the backoff")
            setup.clock.advance(by: 60)
            let error = try #require(await self.code(setup))
            #expect(error.code == .idpUnavailable)
            #expect((error.retryAfterMs ?? 0) > 0)
            setup.issuer.setTokenBehaviour(.normal)
            // The issuer signs with the real clock; keep its ID token current for the moved one.
            setup.issuer.setAccessTokenLifetime(1000)
            setup.clock.advance(by: 61)
            let healed = try await self.token(setup)
            #expect(healed.accessToken != first.accessToken)
        }
    }

    @Test func retryAfterIsHonoured() async throws {
        try await using(self.setUp()) { setup in
            setup.issuer.setTokenBehaviour(.tooManyRequests(retryAfterSeconds: 30))
            let error = try #require(await self.code(setup))
            #expect(error.code == .idpUnavailable)
            #expect((29_000...30_000).contains(error.retryAfterMs ?? 0))
        }
    }

    @Test func aRotatedRefreshTokenIsStoredBeforeTheAnswer() async throws {
        try await using(self.setUp(rotate: true)) { setup in
            _ = try await self.token(setup)
            let store = try SealedFileStore(path: setup.vault.vaultFile, keySource: .keyFile(setup.vault.keyFile))
            let stored = try #require(try await store.load("work")?.refreshToken)
            #expect(setup.issuer.isRefreshTokenActive(stored.unsafeString()))
            _ = try await self.token(setup, force: true)
            let reread = try SealedFileStore(path: setup.vault.vaultFile, keySource: .keyFile(setup.vault.keyFile))
            let again = try #require(try await reread.load("work")?.refreshToken)
            #expect(again != stored)
            #expect(setup.issuer.isRefreshTokenActive(again.unsafeString()))
        }
    }

    @Test func realWorldResponsesAreAccepted() async throws {
        try await using(self.setUp(confidential: true)) { setup in
            setup.issuer.setTokenTypeSpelling("bearer")
            setup.issuer.setIncludeExpiresIn(false)
            let token = try await self.token(setup)
            #expect(token.tokenType == "Bearer")
            #expect(token.expiresIn == 300, "a missing expires_in is taken as 5 minutes")
            #expect(setup.issuer.lastClientAuthentication == "basic")
            let claims = try await setup.vault.rooms.claims(account: "work", for: testPeer)
            #expect(claims.claims["preferred_username"]?.stringValue == "ada")
            #expect(await setup.broker.status().accounts.first?.username == "ada")
        }
    }

    @Test func theHeapIsTrimmedOnceABurstOfRefreshesIsOver() async throws {
        try await using(self.setUp()) { setup in
            // The trim is a chore on the test's clock: time moves a second
            // at a time, and each step waits for the chores it made due.
            func trims(over count: Int) async throws -> Bool {
                for _ in 0..<3 where setup.vault.rooms.heapTrim.count <= count {
                    setup.clock.advance(by: 1)
                    try await eventually { setup.vault.rooms.chores.isQuiet }
                }
                return setup.vault.rooms.heapTrim.count > count
            }
            #expect(try await trims(over: 0), "no trim followed the account's addition")
            let before = setup.vault.rooms.heapTrim.count
            _ = try await self.token(setup)
            _ = try await self.token(setup, force: true)
            #expect(try await trims(over: before), "no trim followed the refreshes")
            #expect(setup.issuer.refreshCount == 2)
        }
    }

    @Test func claimsAreTheLastIDTokensAfterARefreshAndAfterAReload() async throws {
        try await using(self.setUp(rotate: true)) { setup in
            _ = try await self.token(setup)
            func check(_ when: String) async throws {
                let claims = try await setup.vault.rooms.claims(account: "work", for: testPeer).claims
                #expect(claims["iss"]?.stringValue == setup.issuer.issuer, "\(when)")
                #expect(claims["sub"]?.stringValue == "ada", "\(when)")
                #expect(claims["aud"]?.stringValue == TestIssuer.clientID, "\(when)")
                #expect(claims["email"]?.stringValue == "ada@example.org", "\(when)")
                #expect(claims["preferred_username"]?.stringValue == "ada", "\(when)")
                if case .number(let exp)? = claims["exp"], case .number(let iat)? = claims["iat"] {
                    #expect(exp - iat == 100, "\(when)")
                } else {
                    Issue.record("exp and iat are not numbers \(when)")
                }
                #expect(await setup.broker.status().accounts.first?.username == "ada", "\(when)")
            }
            try await check("after a refresh")
            await setup.broker.lock()
            try await setup.broker.unlock(passphrase: nil)
            try await check("after the secrets were read again")
        }
    }

    @Test func aNarrowerScopeIsItsOwnToken() async throws {
        try await using(self.setUp()) { setup in
            let full = try await self.token(setup)
            let narrow = try await self.token(setup, scopes: ["openid"])
            #expect(setup.issuer.lastRequestedScope == "openid")
            #expect(narrow.scope == "openid")
            #expect(narrow.accessToken != full.accessToken)
            #expect(try await self.token(setup, scopes: ["openid"]).accessToken == narrow.accessToken)
        }
    }

    @Test func aRotatedSigningKeyIsFetchedOnce() async throws {
        try await using(self.setUp()) { setup in
            _ = try await self.token(setup, force: true)
            let fetches = setup.issuer.jwksFetchCount
            setup.issuer.rotateSigningKey()
            _ = try await self.token(setup, force: true)
            #expect(setup.issuer.jwksFetchCount == fetches + 1, "an unknown kid fetches the JWKS again, once")
        }
    }

    @Test func callersOutsideAllowedClientsAreForbidden() async throws {
        try await using(self.setUp(allowedClients: ["/usr/bin/only-this"])) { setup in
            for command in [Command.token(TokenRequest(account: "work")), .claims(account: "work"), .userinfo(account: "work")] {
                #expect(await setup.vault.dispatcher.refusal(command, from: testPeer)?.code == .forbidden, "\(command)")
            }
            #expect(setup.issuer.refreshCount == 0)
            let allowed = Peer(pid: testPeer.pid, uid: testPeer.uid, gid: testPeer.gid, executable: "/usr/bin/only-this")
            #expect(await setup.vault.dispatcher.refusal(.token(TokenRequest(account: "work")), from: allowed) == nil)
        }
    }

    /// A program outside `allowed_clients` hears nothing of the account:
    /// naming it in `subscribe` is forbidden, and subscribing to every
    /// account leaves it out.
    @Test func subscribeObeysAllowedClients() async throws {
        try await using(self.setUp(allowedClients: ["/usr/bin/only-this"])) { setup in
            let dispatcher = setup.vault.dispatcher
            #expect(await dispatcher.refusal(.subscribe(accounts: ["work"]), from: testPeer)?.code == .forbidden)
            guard case .subscribe(_, let all) = dispatcher.handle(Request(id: .number(1), command: .subscribe(accounts: nil)), from: testPeer) else {
                Issue.record("subscribe is not a subscription")
                return
            }
            #expect(all == [])
            let allowed = Peer(pid: testPeer.pid, uid: testPeer.uid, gid: testPeer.gid, executable: "/usr/bin/only-this")
            guard case .subscribe(_, let heard) = dispatcher.handle(Request(id: .number(2), command: .subscribe(accounts: nil)), from: allowed) else {
                Issue.record("subscribe is not a subscription")
                return
            }
            #expect(heard == nil, "a program the account allows hears every account, those added later too")
        }
    }

    @Test func unknownAndUnsignedAccounts() async throws {
        try await using(self.setUp()) { setup in
            await #expect(throws: VaultError.self) {
                try await setup.vault.rooms.token(TokenRequest(account: "nobody"), for: testPeer)
            }
            let bare = AccountConfiguration(name: "bare", issuer: setup.issuer.issuer, clientID: TestIssuer.clientID, scopes: [])
            _ = try await setup.broker.add(AccountAddition(configuration: bare))
            do throws(VaultError) {
                _ = try await setup.vault.rooms.token(TokenRequest(account: "bare"), for: testPeer)
                Issue.record("an account without a refresh token served a token")
            } catch {
                #expect(error.code == .notSignedIn)
            }
        }
    }
}
