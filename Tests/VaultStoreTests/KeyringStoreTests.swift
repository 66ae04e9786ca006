import Foundation
import Testing
import VaultCrypto
@testable import VaultStore

/// The keyring backend against a real gnome-keyring on a private session bus
/// (Tests/Support/keyring/session.sh), checked with the real secret-tool.
/// Serialized: one test locks the collection every other test uses.
@Suite(.serialized, .privateKeyring)
struct KeyringStoreTests {
    let session: KeyringSession
    let clock = ContinuousClock()

    init() throws {
        self.session = try #require(KeyringSession.current, "the suite runs without its keyring session")
    }

    func secrets(_ token: String) throws -> AccountSecrets {
        AccountSecrets(
            refreshToken: try SecretBytes(utf8: token),
            clientSecret: try SecretBytes(utf8: "cs-" + token),
            idToken: try SecretBytes(utf8: "eyJ.id." + token)
        )
    }

    func uniqueAccount() -> String {
        "acct-" + String(UUID().uuidString.prefix(8)).lowercased()
    }

    func encoded(_ secrets: AccountSecrets) throws -> [UInt8] {
        try secrets.encoded().withUnsafeBytes { Array($0) }
    }

    /// secret-tool's view of the account's items: how many, and their text
    /// (labels on stdout; secret-tool prints attributes on stderr).
    func search(_ account: String) async throws -> (count: Int, labels: String, attributes: String) {
        let found = try await self.session.secretTool(["search", "--all", "application", "tokenvault", "account", account])
        let labels = found.text
        let count = labels.split(separator: "\n").filter { $0.hasPrefix("[/") }.count
        return (count, labels, found.errorText)
    }

    func expectError(
        _ kind: StoreError.Kind,
        containing text: String? = nil,
        sourceLocation: SourceLocation = #_sourceLocation,
        _ body: () async throws(StoreError) -> Void
    ) async {
        do {
            try await body()
            Issue.record("no error; expected \(kind)", sourceLocation: sourceLocation)
        } catch {
            #expect(error.kind == kind, "\(error.message)", sourceLocation: sourceLocation)
            if let text {
                #expect(error.message.contains(text), "\(error.message)", sourceLocation: sourceLocation)
            }
        }
    }

    @Test func storesReplacesLoadsAndRemovesOneItemPerAccount() async throws {
        let store = KeyringStore()
        let account = self.uniqueAccount()
        #expect(try await store.load(account) == nil)
        #expect(try await self.search(account).count == 0)

        let first = try self.secrets("rt-1")
        try await store.save(first, for: account)
        let listed = try await self.search(account)
        #expect(listed.count == 1)
        #expect(listed.labels.contains("label = tokenvault: \(account)\n"))
        #expect(listed.attributes.contains("attribute.application = tokenvault\n"))
        #expect(listed.attributes.contains("attribute.account = \(account)\n"))
        // The secret is the record's encoding, byte for byte, as the keyring holds it.
        let lookup = try await self.session.secretTool(["lookup", "application", "tokenvault", "account", account])
        #expect(lookup.status == 0)
        #expect(lookup.stdout == (try self.encoded(first)))

        let second = try self.secrets("rt-2")
        try await store.save(second, for: account)
        #expect(try await self.search(account).count == 1)
        let replaced = try await self.session.secretTool(["lookup", "application", "tokenvault", "account", account])
        #expect(replaced.stdout == (try self.encoded(second)))
        #expect(try await store.load(account) == second)
        // Nothing is cached in the store: another one reads the same.
        #expect(try await KeyringStore().load(account) == second)
        #expect(!store.isLocked)

        #expect(try await store.remove(account))
        #expect(try await self.search(account).count == 0)
        let gone = try await self.session.secretTool(["lookup", "application", "tokenvault", "account", account])
        #expect(gone.status != 0 && gone.stdout.isEmpty)
        #expect(try await store.load(account) == nil)
        #expect(!(try await store.remove(account)))
    }

    @Test func accountsAreKeptApart() async throws {
        let store = KeyringStore()
        let (work, home) = (self.uniqueAccount(), self.uniqueAccount())
        try await store.save(try self.secrets("rt-work"), for: work)
        try await store.save(try self.secrets("rt-home"), for: home)
        #expect(try await store.load(work) == (try self.secrets("rt-work")))
        #expect(try await store.load(home) == (try self.secrets("rt-home")))
        #expect(try await store.remove(work))
        #expect(try await store.load(work) == nil)
        #expect(try await store.load(home) == (try self.secrets("rt-home")))
        #expect(try await store.remove(home))
    }

    @Test func bytesOfEveryValueSurvive() async throws {
        let store = KeyringStore()
        let account = self.uniqueAccount()
        let all = AccountSecrets(
            refreshToken: try SecretBytes(copying: (0...255).map { UInt8($0) }),
            clientSecret: try SecretBytes(copying: [UInt8](repeating: 0, count: 17)),
            idToken: nil
        )
        try await store.save(all, for: account)
        let loaded = try #require(try await store.load(account))
        #expect(loaded == all)
        #expect(loaded.idToken == nil)
        let empty = AccountSecrets()
        try await store.save(empty, for: account)
        #expect(try await store.load(account) == empty)
        #expect(try await store.remove(account))
    }

    @Test func anItemStoredByHandIsReplacedNotDuplicated() async throws {
        let account = self.uniqueAccount()
        let stored = try await self.session.secretTool(
            ["store", "--label=by hand", "application", "tokenvault", "account", account],
            input: Array("hand-made".utf8)
        )
        #expect(stored.status == 0, "\(stored.errorText)")
        let store = KeyringStore()
        try await store.save(try self.secrets("rt-1"), for: account)
        let listed = try await self.search(account)
        #expect(listed.count == 1)
        #expect(listed.labels.contains("label = tokenvault: \(account)\n"))
        #expect(try await store.load(account) == (try self.secrets("rt-1")))
        #expect(try await store.remove(account))
    }

    @Test func aLockedCollectionIsReportedLockedNotEmpty() async throws {
        let store = KeyringStore()
        let account = self.uniqueAccount()
        try await store.save(try self.secrets("rt-1"), for: account)
        try await self.session.run("lock")
        do {
            // secret-tool's lookup sees nothing: a locked collection looks empty.
            let lookup = try await self.session.secretTool(["lookup", "application", "tokenvault", "account", account])
            #expect(lookup.stdout.isEmpty)

            await self.expectError(.locked, containing: "locked") { () throws(StoreError) in _ = try await store.load(account) }
            #expect(store.isLocked)
            let next = try self.secrets("rt-2")
            await self.expectError(.locked) { () throws(StoreError) in try await store.save(next, for: account) }
            await self.expectError(.locked) { () throws(StoreError) in _ = try await store.remove(account) }
            #expect(try await store.checkLocked())
            let probed = await KeyringStore.probe()
            #expect(throws: StoreError.self) { try probed.get() }
            if case .failure(let error) = probed { #expect(error.kind == .locked) }

            // No desktop shows the keyring's prompt here: unlock fails, quickly.
            let start = self.clock.now
            await self.expectError(.locked) { () throws(StoreError) in try await store.unlock(passphrase: nil) }
            #expect(self.clock.now - start < .seconds(10))
            #expect(store.isLocked)
        } catch {
            try await self.session.run("unlock")
            throw error
        }
        try await self.session.run("unlock")
        #expect(!(try await store.checkLocked()))
        #expect(!store.isLocked)
        // Nothing was lost or changed while it was locked.
        #expect(try await store.load(account) == (try self.secrets("rt-1")))
        #expect(try await store.remove(account))
    }

    @Test func lockHoldsTheStoreButLeavesTheKeyringOpen() async throws {
        let store = KeyringStore()
        let account = self.uniqueAccount()
        try await store.save(try self.secrets("rt-1"), for: account)
        await store.lock()
        #expect(store.isLocked)
        await self.expectError(.locked, containing: "locked") { () throws(StoreError) in _ = try await store.load(account) }
        let next = try self.secrets("rt-2")
        await self.expectError(.locked) { () throws(StoreError) in try await store.save(next, for: account) }
        // The user's keyring is untouched.
        #expect(!(try await store.checkLocked()))
        let lookup = try await self.session.secretTool(["lookup", "application", "tokenvault", "account", account])
        #expect(lookup.stdout == (try self.encoded(try self.secrets("rt-1"))))
        try await store.unlock(passphrase: nil)
        #expect(!store.isLocked)
        #expect(try await store.load(account) == (try self.secrets("rt-1")))
        #expect(try await store.remove(account))
    }

    /// The `auto` backend's test: a running, unlocked keyring is found, the
    /// probe leaves it as it was (no item, still unlocked), and a store then
    /// round-trips through it.
    @Test func probeFindsAnUnlockedKeyringAndLeavesItAsItWas() async throws {
        let before = try await self.session.secretTool(["search", "--all", "application", "tokenvault"])
        let probed = await KeyringStore.probe()
        if case .failure(let error) = probed {
            Issue.record("probe missed a running, unlocked keyring: \(error.kind) \(error.message)")
        }
        let after = try await self.session.secretTool(["search", "--all", "application", "tokenvault"])
        #expect(after.text == before.text, "the probe changed the keyring's items")
        let store = KeyringStore()
        #expect(!(try await store.checkLocked()))
        let account = self.uniqueAccount()
        try await store.save(try self.secrets("rt-probe"), for: account)
        #expect(try await store.load(account) == (try self.secrets("rt-probe")))
        #expect(try await store.remove(account))
    }

    @Test func noSecretServiceOnTheBusFailsAtOnce() async throws {
        let store = KeyringStore()
        let account = self.uniqueAccount()
        try await store.save(try self.secrets("rt-1"), for: account)
        // What a session bus without a keyring answers.
        try await self.session.run("stop-keyring")
        do {
            let start = self.clock.now
            await self.expectError(.unavailable, containing: "was not provided by any .service files") { () throws(StoreError) in
                _ = try await store.load(account)
            }
            #expect(self.clock.now - start < .seconds(1))
            let secrets = try self.secrets("rt-2")
            await self.expectError(.unavailable, containing: "run vaultd under a desktop session or choose --backend file") {
                () throws(StoreError) in try await store.save(secrets, for: account)
            }
            await self.expectError(.unavailable) { () throws(StoreError) in _ = try await store.remove(account) }
            #expect(!store.isLocked)
            let probeStart = self.clock.now
            let probed = await KeyringStore.probe()
            let probeTime = self.clock.now - probeStart
            #expect(probeTime < .seconds(1))
            if case .failure(let error) = probed {
                #expect(error.kind == .unavailable, "\(error.message)")
            } else {
                Issue.record("probe found a Secret Service with none on the bus")
            }
        } catch {
            try await self.session.run("start-keyring")
            throw error
        }
        try await self.session.run("start-keyring")
        // The same store reaches the new keyring; the item is on disk.
        #expect(try await store.load(account) == (try self.secrets("rt-1")))
        #expect(try await store.remove(account))
    }

    @Test func aSecretServiceThatNeverAnswersTimesOut() async throws {
        let account = self.uniqueAccount()
        let secrets = try self.secrets("rt-1")
        // The keyring keeps its bus name but answers nothing: a hung provider.
        try await self.session.run("freeze")
        // Nothing below throws: the keyring is thawed whatever happens.
        var elapsed = [Duration]()
        let store = KeyringStore(timeout: .milliseconds(500))
        var start = self.clock.now
        await self.expectError(.unavailable, containing: "did not answer within 0.5 s") { () throws(StoreError) in
            try await store.save(secrets, for: account)
        }
        elapsed.append(self.clock.now - start)
        // The default: 2 s, and the message the daemon shows.
        do {
            start = self.clock.now
            _ = try await KeyringStore().load(account)
            Issue.record("a frozen keyring answered")
        } catch {
            elapsed.append(self.clock.now - start)
            #expect(error.message == "the Secret Service did not answer within 2 s; run vaultd under a desktop session or choose --backend file")
        }
        start = self.clock.now
        await self.expectError(.unavailable, containing: "did not answer within 0.5 s") { () throws(StoreError) in
            _ = try await store.remove(account)
        }
        elapsed.append(self.clock.now - start)
        start = self.clock.now
        let probed = await KeyringStore.probe(timeout: .milliseconds(300))
        elapsed.append(self.clock.now - start)
        if case .failure(let error) = probed {
            #expect(error.kind == .unavailable)
            #expect(error.message.contains("did not answer within 0.3 s"), "\(error.message)")
        } else {
            Issue.record("probe found a frozen keyring answering")
        }
        try await self.session.run("thaw")
        for (index, (took, limit)) in zip(elapsed, [0.5, 2.0, 0.5, 0.3]).enumerated() {
            #expect(took >= .seconds(limit * 0.9) && took < .seconds(limit + 1.5), "call \(index) took \(took)")
        }
        // Thawed, it answers at once, and nothing was stored meanwhile.
        try await KeyringStore.probe().get()
        #expect(try await KeyringStore().load(account) == nil)
    }

    @Test func aForeignItemIsReportedCorrupt() async throws {
        let account = self.uniqueAccount()
        // Some other program's item under our attributes: not a record.
        let stored = try await self.session.secretTool(
            ["store", "--label=foreign", "application", "tokenvault", "account", account],
            input: Array("plain text".utf8)
        )
        #expect(stored.status == 0, "\(stored.errorText)")
        let store = KeyringStore()
        await self.expectError(.corrupt, containing: "not a tokenvault record") { () throws(StoreError) in
            _ = try await store.load(account)
        }
        #expect(try await store.remove(account))
    }

    @Test func theDefaultTimeoutIsTwoSeconds() {
        #expect(KeyringStore().timeout == .seconds(2))
        #expect(KeyringStore.timeoutError(.seconds(2)).message
            == "the Secret Service did not answer within 2 s; run vaultd under a desktop session or choose --backend file")
    }
}
