import Foundation
import NIOCore
import Synchronization
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultServer
import VaultStore
import VaultTestIssuer
import VaultTestKit

/// The broker's promises where the scheduler decides: one refresh token,
/// one spender; nothing survives a sign-out that lands at a suspension
/// point; events arrive in order or the subscriber is told; one request per
/// flow and one sign-in per account; accounts.json as answered.
@Suite(.timeLimit(.minutes(1)))
struct ConcurrencyTests {
    static let scopes = ["openid", "profile", "email", "offline_access"]

    struct Setup: Stoppable {
        let issuer: TestIssuer
        let vault: InProcessVault
        let store: GatedStore
        var broker: Broker { self.vault.broker }

        func stop() async {
            await self.vault.stop()
            await self.issuer.stop()
        }

        func token(scopes: [String]? = nil, force: Bool = false) async throws -> TokenResult {
            try await self.vault.rooms.token(TokenRequest(account: "work", scopes: scopes, minTTL: 1, forceRefresh: force), for: testPeer)
        }

        func tokenError(scopes: [String]? = nil) async -> ErrorCode? {
            do {
                _ = try await self.token(scopes: scopes)
                return nil
            } catch let error as VaultError {
                return error.code
            } catch {
                return .internalError
            }
        }

        /// The account's record as the sealed file holds it after a restart.
        func restartedStatus(folder: String) async throws -> AccountStatus? {
            await self.vault.stop()
            return try await withVault(folder: folder) { again in
                return await again.broker.status().accounts.first { $0.name == "work" }
            }
        }
    }

    func setUp(rotate: Bool = true, lifetime: Int = 100) async throws -> Setup {
        let issuer = try await TestIssuer.start(accessTokenLifetime: lifetime, rotateRefreshTokens: rotate)
        let gated = Shared<GatedStore?>(nil)
        // Revocations wait at the issuer's gate while a test probes the
        // vault: give them longer than the default 5 s, which a loaded
        // machine running every suite at once has exceeded.
        let vault = try await InProcessVault.start(revocationTimeout: .seconds(30), wrapStore: { store in
            let wrapper = GatedStore(store)
            gated.value.withLock { $0 = wrapper }
            return wrapper
        })
        _ = try await vault.broker.add(
            AccountAddition(
                configuration: AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: Self.scopes),
                refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
            )
        )
        return Setup(issuer: issuer, vault: vault, store: try #require(gated.value.withLock { $0 }))
    }

    static let email = "ada@example.org"

    /// The test issuer with a native-auth user, a vault with account `work`
    /// on it, and a client of the vault's socket.
    /// An issuer with a native-auth user and a vault with `work` added, stopped when `body` ends.
    func withNativeSetUp<T>(_ body: (TestIssuer, InProcessVault, LineClient) async throws -> T) async throws -> T {
        try await using(TestIssuer.start(), InProcessVault.start()) { issuer, vault in
            issuer.addNativeUser(Self.email)
            let client = try LineClient(path: vault.socketPath)
            let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","profile","offline_access"]}"#
            #expect(await client.call(add)?["ok"] as? Bool == true)
            return try await body(issuer, vault, client)
        }
    }

    // MARK: One spender

    @Test func fiftyRoundsOfMixedScopesNeverSpendARefreshTokenTwice() async throws {
        try await using(self.setUp()) { setup in
            let sets: [[String]?] = [nil, ["openid", "offline_access"], ["openid", "profile"]]
            for _ in 0..<50 {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for scopes in sets {
                        group.addTask { _ = try await setup.token(scopes: scopes, force: true) }
                    }
                    try await group.waitForAll()
                }
            }
            #expect(setup.issuer.reusedRefreshTokens == 0)
            #expect(setup.issuer.refreshCount == 150)
            #expect(try await setup.token(force: true).accessToken.unsafeString().hasPrefix("at-"), "the session is intact")
        }
    }

    /// `lock` while a refresh is at the issuer: the rotation that comes back
    /// is sealed before the key goes, so `unlock` reads the live refresh
    /// token, not the one the issuer has spent (which an issuer that detects
    /// reuse answers by revoking the whole chain).
    @Test func aLockDuringARefreshKeepsTheRotation() async throws {
        try await using(self.setUp()) { setup in
            _ = try await setup.token()
            setup.issuer.setTokenBehaviour(.gate)
            let refresh = Task { try await setup.token(force: true) }
            try await eventually { setup.issuer.heldRequestCount == 1 }
            let lock = Task { await setup.broker.lock() }
            try await eventually { await setup.broker.status().locked }
            #expect(await setup.tokenError(scopes: ["openid"]) == .locked, "no refresh starts while the lock waits")
            setup.issuer.openGate()
            await lock.value
            _ = try? await refresh.value
            try await setup.broker.unlock(passphrase: nil)
            #expect(try await setup.token(force: true).accessToken.unsafeString().hasPrefix("at-"), "the session is intact")
            #expect(setup.issuer.reusedRefreshTokens == 0)
        }
    }

    @Test func aRefreshWhoseCallerIsGoneStillStoresItsRotatedToken() async throws {
        try await using(self.setUp()) { setup in
            setup.issuer.setTokenBehaviour(.gate)
            let caller = Task { try await setup.token(force: true) }
            try await eventually { setup.issuer.heldRequestCount == 1 }
            caller.cancel()
            setup.issuer.openGate()
            _ = try? await caller.value
            // The next refresh must present the rotated token, or the issuer sees a reuse.
            _ = try await setup.token(scopes: ["openid", "offline_access"], force: true)
            #expect(setup.issuer.reusedRefreshTokens == 0)
        }
    }

    // MARK: Sign-out at every suspension point

    @Test func aSignOutDuringTheExchangeKeepsNothingOfItsAnswer() async throws {
        try await using(self.setUp()) { setup in
            setup.issuer.setTokenBehaviour(.gate)
            let refresh = Task { try await setup.token(force: true) }
            try await eventually { setup.issuer.heldRequestCount == 1 }
            let signOut = Task { try await setup.broker.signOut("work") }
            // Wiped at once; the revocation waits for the exchange that spends the token.
            try await eventually { await setup.broker.status().accounts.first?.signedIn == false }
            #expect(await setup.tokenError() == .notSignedIn)
            #expect(setup.issuer.revocationCount == 0)
            setup.issuer.openGate()
            _ = try await signOut.value
            await #expect(throws: VaultError.self) { try await refresh.value }
            #expect(await setup.tokenError() == .notSignedIn)
            // Revoked: the token the issuer rotated meanwhile with the access token it came with,
            // and the one the sign-out held; the issuer never saw a token presented after its revocation.
            try await eventually { setup.issuer.revocationCount == 3 }
            #expect(setup.issuer.reusedRefreshTokens == 0)
            #expect(try await setup.restartedStatus(folder: setup.vault.folder)?.signedIn == false)
        }
    }

    @Test func aSignOutWhileTheRotatedTokenIsWrittenLeavesNothingOnDisk() async throws {
        try await using(self.setUp()) { setup in
            setup.store.holdSaves()
            let refresh = Task { try await setup.token(force: true) }
            try await eventually { setup.store.heldSaves == 1 }
            let signOut = Task { try await setup.broker.signOut("work") }
            // Memory is wiped at once; the store removal waits its turn behind the save.
            try await eventually { await setup.broker.status().accounts.first?.signedIn == false }
            setup.store.releaseSaves()
            _ = try await signOut.value
            await #expect(throws: VaultError.self) { try await refresh.value }
            #expect(await setup.tokenError() == .notSignedIn)
            #expect(try await setup.store.load("work") == nil)
            // Revoked: the rotated token by the sign-out (memory held it), and again when the
            // refresh discarded it, with the access token that came with it.
            try await eventually { setup.issuer.revocationCount == 3 }
            #expect(try await setup.restartedStatus(folder: setup.vault.folder)?.signedIn == false)
        }
    }

    @Test func aSignOutWhileTheIDTokenIsCheckedKeepsNothing() async throws {
        try await using(self.setUp()) { setup in
            setup.issuer.pause(path: "/jwks")
            let refresh = Task { try await setup.token(force: true) }
            try await eventually { setup.issuer.heldRequestCount == 1 }
            _ = try await setup.broker.signOut("work")
            setup.issuer.openGate()
            await #expect(throws: VaultError.self) { try await refresh.value }
            #expect(await setup.tokenError() == .notSignedIn)
            #expect(await setup.broker.status().accounts.first?.username == nil, "no claims written back")
            #expect(try await setup.store.load("work") == nil)
            #expect(try await setup.restartedStatus(folder: setup.vault.folder)?.signedIn == false)
        }
    }

    @Test func aSignInThatCompletesDuringASignOutDoesNotSignBackIn() async throws {
        try await self.withNativeSetUp { issuer, vault, client in
            let email = Self.email
            let started = try #require(await client.call(#"{"id":"s","op":"signin.start","account":"work","method":"email_otp","username":"\#(email)"}"#))
            let flow = try #require(started["flow"] as? String)
            let code = try #require(issuer.lastCode(for: email))
            issuer.pause(path: "/jwks")
            client.send(#"{"id":"c","op":"signin.submit_code","flow":"\#(flow)","code":"\#(code)"}"# + "\n")
            try await eventually { issuer.heldRequestCount == 1 }
            let other = try LineClient(path: vault.socketPath)
            let signedOut = try #require(await other.call(#"{"id":"o","op":"signout","account":"work"}"#))
            #expect(signedOut["ok"] as? Bool == true, "\(signedOut)")
            issuer.openGate()
            let submitted = try #require(await client.readObject())
            #expect(submitted["ok"] as? Bool == false, "\(submitted)")
            let token = try #require(await other.call(#"{"id":"t","op":"token","account":"work"}"#))
            #expect(token.errorCode == "not_signed_in", "\(token)")
            await vault.stop()
            try await withVault(folder: vault.folder) { again in
                #expect(await again.broker.status().accounts.first?.signedIn == false)
            }
        }
    }

    // MARK: sign-out --all

    @Test func signOutAllWipesEveryAccountBeforeTheIssuerAnswers() async throws {
        try await using(self.setUp(rotate: false)) { setup in
            _ = try await setup.broker.add(
                AccountAddition(
                    configuration: AccountConfiguration(name: "home", issuer: setup.issuer.issuer, clientID: TestIssuer.clientID, scopes: Self.scopes),
                    refreshToken: try SecretBytes(utf8: setup.issuer.mintRefreshToken())
                )
            )
            _ = try await setup.token()
            setup.issuer.pause(path: "/revoke")
            let client = try LineClient(path: setup.vault.socketPath)
            client.send(#"{"id":"all","op":"signout","all":true}"# + "\n")
            // Every revocation is out at once (both refresh tokens, and work's access token
            // handed out), and nothing is served meanwhile.
            try await eventually { setup.issuer.heldRequestCount == 3 }
            let probe = try LineClient(path: setup.vault.socketPath)
            for name in ["work", "home"] {
                let token = try #require(await probe.call(#"{"id":"t","op":"token","account":"\#(name)"}"#))
                // On failure, the error code alone: a served reply carries a token.
                #expect(token.errorCode == "not_signed_in", "\(token.errorCode ?? "a token was served")")
            }
            setup.issuer.openGate()
            let reply = try #require(await client.readObject())
            let rows = try #require(reply["accounts"] as? [[String: Any]], "\(reply)")
            #expect(rows.compactMap { $0["name"] as? String } == ["home", "work"])
            // Not the rows themselves: their end_session_url carries the ID token.
            #expect(rows.allSatisfy { $0["revoked"] as? String == "yes" }, "\(rows.map { [$0["revoked"], $0["reason"]] })")
        }
    }

    @Test func statusRowsNameEveryFieldNullWhenUnknown() async throws {
        try await using(self.setUp(rotate: false)) { setup in
            let client = try LineClient(path: setup.vault.socketPath)
            let line = try #require(await client.call(#"{"id":1,"op":"status"}"#))
            let row = try #require((line["accounts"] as? [[String: Any]])?.first)
            #expect(row["username"] is NSNull, "\(row)")
            #expect(row["access_token_expires_at"] is NSNull, "\(row)")
        }
    }

    // MARK: Events

    @Test func aSubscriberThatStopsReadingHearsEveryEventInOrderOrIsToldItFellBehind() async throws {
        try await withVault(events: EventHub(maximumBacklog: 4096)) { vault in
            let subscriber = try LineClient(path: vault.socketPath)
            #expect(await subscriber.call(#"{"id":1,"op":"subscribe"}"#)?["ok"] as? Bool == true)
            // Far more than the socket buffers hold, while the subscriber does not read.
            for sequence in 0..<50_000 {
                var event = Event(.tokenRefreshed, account: "work")
                event.expiresAt = Int64(sequence)
                vault.rooms.events.emit(event)
            }
            var next: Int64 = 0
            var overloaded = false
            while let line = await subscriber.readObject() {
                if let sequence = line["expires_at"] as? Int64 ?? (line["expires_at"] as? Int).map(Int64.init) {
                    #expect(sequence == next, "events arrive in order and without a gap")
                    next = sequence + 1
                } else {
                    #expect(line.errorCode == "overloaded", "\(line)")
                    overloaded = true
                    break
                }
            }
            #expect(overloaded)
            #expect(await subscriber.readLine() == nil, "the connection is closed after the overloaded line")
        }
    }

    @Test func aSubscriberThatPausesGetsSignedOutWhenItReadsAgain() async throws {
        try await using(self.setUp(rotate: false)) { setup in
            let subscriber = try LineClient(path: setup.vault.socketPath)
            #expect(await subscriber.call(#"{"id":1,"op":"subscribe","accounts":["work"]}"#)?["ok"] as? Bool == true)
            for _ in 0..<200 { _ = try await setup.token(force: true) }
            _ = try await setup.broker.signOut("work")
            var refreshed = 0
            while let line = await subscriber.readObject() {
                if line["event"] as? String == "token_refreshed" { refreshed += 1 }
                if line["event"] as? String == "signed_out" { break }
            }
            #expect(refreshed == 200)
        }
    }

    // MARK: Sign-in flows

    @Test func concurrentCodesForOneFlowReachTheIssuerOnce() async throws {
        try await self.withNativeSetUp { issuer, vault, client in
            let email = Self.email
            let started = try #require(await client.call(#"{"id":"s","op":"signin.start","account":"work","method":"email_otp","username":"\#(email)"}"#))
            let flow = try #require(started["flow"] as? String)
            let wrong = issuer.lastCode(for: email) == "00000000" ? "11111111" : "00000000"
            let before = issuer.nativeRequestCount
            issuer.pause(path: "/oauth2/v2.0/token")
            for index in 0..<6 {
                client.send(#"{"id":\#(index),"op":"signin.submit_code","flow":"\#(flow)","code":"\#(wrong)"}"# + "\n")
            }
            var refused = 0
            while refused < 5, let line = await client.readObject() {
                #expect(line.errorCode == "bad_request", "\(line)")
                refused += 1
            }
            try await eventually { issuer.heldRequestCount == 1 }
            issuer.openGate()
            let answered = try #require(await client.readObject())
            #expect(answered.errorCode == "invalid_code", "\(answered)")
            #expect(issuer.nativeRequestCount == before + 1)
        }
    }

    @Test func manyStartsOfOneSignInShareOneFlowAndOneCode() async throws {
        try await self.withNativeSetUp { issuer, vault, client in
            let email = Self.email
            let start = #"{"id":"s","op":"signin.start","account":"work","method":"email_otp","username":"\#(email)"}"#
            for _ in 0..<10 { client.send(start + "\n") }
            var flows: Set<String> = []
            var joined = 0
            for _ in 0..<10 {
                let line = try #require(await client.readObject())
                #expect(line["state"] as? String == "code_required", "\(line)")
                flows.insert(line["flow"] as? String ?? "")
                if line["joined"] as? Bool == true { joined += 1 }
            }
            #expect(flows.count == 1)
            #expect(issuer.codesSent(to: email) == 1)
            #expect(joined == 9, "every start after the first says it joined")
            let other = try #require(await client.call(#"{"id":"p","op":"signin.start","account":"work","method":"device"}"#))
            #expect(other.errorCode == "bad_request")
            let message = (other["error"] as? [String: Any])?["message"] as? String ?? ""
            #expect(message.contains(flows.first ?? "?") && message.contains("--restart"), "\(message)")
            let restarted = try #require(await client.call(#"{"id":"r","op":"signin.start","account":"work","method":"email_otp","username":"\#(email)","restart":true}"#))
            #expect(restarted["flow"] as? String != flows.first)
            #expect(issuer.codesSent(to: email) == 2)
        }
    }

    // MARK: Refresh ahead

    @Test func aTokenInUseIsRefreshedAheadSoNoCallerAfterTheFirstWaits() async throws {
        let clock = ManualClock()
        try await using(TestIssuer.start(accessTokenLifetime: 10, rotateRefreshTokens: true), InProcessVault.start(clock: clock)) { issuer, vault in
            _ = try await vault.broker.add(
                AccountAddition(
                    configuration: AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["offline_access", "profile"]),
                    refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken(scope: "profile offline_access"))
                )
            )
            // A caller that waited on the held refresh would never be answered;
            // 30 s tells that from a first refresh slowed by the suite beside it.
            let client = try LineClient(path: vault.socketPath, timeoutSeconds: 30)
            let request = #"{"id":1,"op":"token","account":"work","min_ttl":1}"#
            let first = await client.call(request)
            #expect(first?["ok"] as? Bool == true, "\(String(describing: first))")
            issuer.setTokenBehaviour(.gate)
            // 25 s of a caller every 100 ms, with the issuer holding every refresh
            // until the test lets it through: a caller that waited on one would
            // get no answer at all. The clock stands still while a refresh runs.
            var refreshAt = clock.now() + 8
            for _ in 0..<250 {
                clock.advance(by: 0.1)
                let answer = try #require(await client.call(request))
                #expect(answer["ok"] as? Bool == true, "\(answer)")
                if clock.now() >= refreshAt {
                    try await eventually { issuer.heldRequestCount == 1 }
                    issuer.openGate()
                    try await eventually { await !vault.broker.isRefreshing(account: "work") }
                    issuer.setTokenBehaviour(.gate)
                    refreshAt = clock.now() + 8
                }
            }
            #expect(issuer.refreshCount == 4, "one refresh at first, then one every 8 s of a 10 s token")
            #expect(issuer.reusedRefreshTokens == 0)
        }
    }

    // MARK: accounts.json

    @Test func fiftyConcurrentAddsAndRemovesAreOnDiskAsAnswered() async throws {
        try await withVault { vault in
            let names = (0..<50).map { "a\($0)" }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, name) in names.enumerated() {
                    group.addTask {
                        let configuration = AccountConfiguration(name: name, issuer: "https://id.example.org", clientID: "c", scopes: ["openid"])
                        _ = try await vault.broker.add(AccountAddition(configuration: configuration))
                        if index.isMultiple(of: 2) { _ = try await vault.broker.remove(name) }
                    }
                }
                try await group.waitForAll()
            }
            let expected = names.enumerated().filter { !$0.offset.isMultiple(of: 2) }.map(\.element).sorted()
            #expect(await vault.broker.status().accounts.map(\.name) == expected)
            await vault.stop()
            try await withVault(folder: vault.folder) { again in
                #expect(await again.broker.status().accounts.map(\.name) == expected)
                let leftovers = try FileManager.default.contentsOfDirectory(atPath: vault.folder + "/config").filter { $0.contains(".tmp") }
                #expect(leftovers.isEmpty)
            }
        }
    }
}


/// A store that can hold its saves at the suspension point, to land other
/// work (a sign-out) exactly there.
final class GatedStore: SecretStore, @unchecked Sendable {
    private let inner: any SecretStore
    private let lock = NSLock()
    private var holding = false
    private var held: [CheckedContinuation<Void, Never>] = []

    init(_ inner: any SecretStore) { self.inner = inner }

    var backend: Backend { self.inner.backend }
    var isLocked: Bool { self.inner.isLocked }

    func holdSaves() { self.lock.withLock { self.holding = true } }

    var heldSaves: Int { self.lock.withLock { self.held.count } }

    func releaseSaves() {
        let waiting = self.lock.withLock {
            self.holding = false
            defer { self.held = [] }
            return self.held
        }
        for continuation in waiting { continuation.resume() }
    }

    func load(_ owner: RecordOwner) async throws(StoreError) -> AccountSecrets? { try await self.inner.load(owner) }

    func save(_ secrets: AccountSecrets, for owner: RecordOwner) async throws(StoreError) {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = self.lock.withLock {
                guard self.holding else { return true }
                self.held.append(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
        try await self.inner.save(secrets, for: owner)
    }

    func remove(_ account: String) async throws(StoreError) -> Bool { try await self.inner.remove(account) }
    func lock() async { await self.inner.lock() }
    func unlock(passphrase: SecretBytes?) async throws(StoreError) { try await self.inner.unlock(passphrase: passphrase) }
}
