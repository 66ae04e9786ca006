import Foundation
import Testing
import VaultCrypto
@testable import VaultStore

@Suite struct SealedFileStoreTests {
    let folder: String
    var vaultPath: String { self.folder + "/state/vault.sealed" }
    var keyPath: String { self.folder + "/state/vault.key" }

    init() throws {
        self.folder = NSTemporaryDirectory() + "tv-store-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: self.folder, withIntermediateDirectories: true)
    }

    func secrets(_ token: String) throws -> AccountSecrets {
        AccountSecrets(refreshToken: try SecretBytes(utf8: token), clientSecret: try SecretBytes(utf8: "cs-" + token))
    }

    func keyFileStore() throws -> SealedFileStore {
        try SealedFileStore(path: self.vaultPath, keySource: .keyFile(self.keyPath))
    }

    func bytes(_ path: String) throws -> [UInt8] {
        Array(try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    func write(_ bytes: [UInt8], _ path: String) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }

    func mode(_ path: String) throws -> Int {
        (try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) ?? -1
    }

    @Test func roundTripsAcrossRestarts() async throws {
        let store = try self.keyFileStore()
        #expect(try await store.load("work") == nil)
        try await store.save(try self.secrets("rt-1"), for: "work")
        try await store.save(try self.secrets("rt-2"), for: "home")
        try await store.save(try self.secrets("rt-3"), for: "work")
        let reopened = try self.keyFileStore()
        #expect(try await reopened.load("work") == (try self.secrets("rt-3")))
        #expect(try await reopened.load("home") == (try self.secrets("rt-2")))
        #expect(try await reopened.remove("home"))
        #expect(!(try await reopened.remove("home")))
        #expect(try await self.keyFileStore().load("home") == nil)
        #expect(try self.mode(self.vaultPath) == 0o600)
        #expect(try self.mode(self.keyPath) == 0o600)
        #expect(try self.mode(self.folder + "/state") == 0o700)
        let raw = String(decoding: try self.bytes(self.vaultPath), as: UTF8.self)
        #expect(!raw.contains("rt-3"))
    }

    @Test func aRecordMovedToAnotherAccountDoesNotOpen() async throws {
        let store = try self.keyFileStore()
        try await store.save(try self.secrets("rt-a"), for: "aaaa")
        var bytes = try self.bytes(self.vaultPath)
        // Rename the record in place: same length, so only the associated data changes.
        let name = Array("aaaa".utf8)
        let at = try #require(bytes.indices.first { Array(bytes[$0..<min($0 + 4, bytes.count)]) == name })
        bytes.replaceSubrange(at..<at + 4, with: Array("bbbb".utf8))
        try self.write(bytes, self.vaultPath)
        #expect(throws: StoreError.self) { try self.keyFileStore() }
    }

    /// The bytes from the record named `name` to the end (the records are last, sorted by name).
    func tail(_ bytes: [UInt8], from name: String) throws -> Int {
        let utf8 = Array(name.utf8)
        return try #require(bytes.indices.last { Array(bytes[$0..<min($0 + utf8.count, bytes.count)]) == utf8 }) - 2
    }

    /// A record from an older copy of the vault (a rollback of one account,
    /// say to before its sign-out) does not open in the newer file.
    @Test func aRecordFromAnOlderWriteDoesNotOpen() async throws {
        let store = try self.keyFileStore()
        try await store.save(try self.secrets("rt-old"), for: "work")
        let older = try self.bytes(self.vaultPath)
        try await store.save(try self.secrets("rt-new"), for: "work")
        var newer = try self.bytes(self.vaultPath)
        #expect(older.count == newer.count)
        let at = try self.tail(newer, from: "work")
        newer.replaceSubrange(at..., with: older[at...])
        try self.write(newer, self.vaultPath)
        let refused = #expect(throws: StoreError.self) { try self.keyFileStore() }
        #expect(refused?.kind == .corrupt && refused?.message.contains("older copy") == true, "\(String(describing: refused))")
    }

    /// The same key, another vault file: its records do not open in this one.
    @Test func aRecordFromAnotherVaultDoesNotOpen() async throws {
        let store = try self.keyFileStore()
        try await store.save(try self.secrets("rt-1"), for: "work")
        let other = self.folder + "/other"
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: self.keyPath, toPath: other + "/vault.key")
        let second = try SealedFileStore(path: other + "/vault.sealed", keySource: .keyFile(other + "/vault.key"))
        try await second.save(try self.secrets("rt-2"), for: "work")
        var mine = try self.bytes(self.vaultPath)
        let theirs = try self.bytes(other + "/vault.sealed")
        let at = try self.tail(mine, from: "work")
        mine.replaceSubrange(at..., with: theirs[try self.tail(theirs, from: "work")...])
        try self.write(mine, self.vaultPath)
        #expect(throws: StoreError.self) { try self.keyFileStore() }
    }

    /// A record bound to one account's identity, issuer and client opens
    /// for that owner only: one with another issuer (accounts.json edited)
    /// is told `.foreign`, never handed the refresh token.
    @Test func aBoundRecordOpensOnlyForItsOwner() async throws {
        let owner = RecordOwner(name: "work", identity: "a-1", issuer: "https://id.example.org", clientID: "cli")
        try await self.keyFileStore().save(try self.secrets("rt-1"), for: owner)
        let store = try self.keyFileStore()
        #expect(try await store.load(owner) == (try self.secrets("rt-1")))
        for other in [
            RecordOwner(name: "work", identity: "a-1", issuer: "https://evil.example", clientID: "cli"),
            RecordOwner(name: "work", identity: "a-2", issuer: "https://id.example.org", clientID: "cli"),
            RecordOwner(name: "work", identity: "a-1", issuer: "https://id.example.org", clientID: "other"),
        ] {
            let refused = await #expect(throws: StoreError.self) { _ = try await store.load(other) }
            #expect(refused?.kind == .foreign, "\(String(describing: refused))")
        }
        // The binding is sealed in: rewritten in the file, the record does not open.
        var bytes = try self.bytes(self.vaultPath)
        let issuer = Array("id.example.org".utf8)
        let at = try #require(bytes.indices.first { Array(bytes[$0..<min($0 + issuer.count, bytes.count)]) == issuer })
        bytes.replaceSubrange(at..<at + issuer.count, with: Array("id.example.net".utf8))
        try self.write(bytes, self.vaultPath)
        #expect(throws: StoreError.self) { try self.keyFileStore() }
    }

    /// A version 1 vault (records sealed to their names alone) is read, and
    /// written as version 2 at its next change, each record then bound to
    /// the owner it was read for.
    @Test func aVersionOneVaultIsReadAndUpgraded() async throws {
        _ = try self.keyFileStore()
        let key = try SecretBytes(copying: try self.bytes(self.keyPath))
        var v1 = Array("TOKENVLT".utf8) + [0, 1, 1] + [UInt8](repeating: 0, count: 32) + [0, 0, 0, 2]
        v1 += try AEAD.seal(try SecretBytes(copying: []), key: key, associatedData: v1)
        for (name, token) in [("home", "rt-home"), ("work", "rt-work")] {
            let box = try AEAD.seal(try self.secrets(token).encoded(), key: key, associatedData: Array(name.utf8))
            v1 += [0, UInt8(name.utf8.count)] + Array(name.utf8)
            v1 += [UInt8(box.count >> 24), UInt8(box.count >> 16 & 0xFF), UInt8(box.count >> 8 & 0xFF), UInt8(box.count & 0xFF)] + box
        }
        try self.write(v1, self.vaultPath)
        let owner = RecordOwner(name: "work", identity: "a-1", issuer: "https://id.example.org", clientID: "cli")
        let store = try self.keyFileStore()
        #expect(try await store.load(owner) == (try self.secrets("rt-work")))
        try await store.save(try self.secrets("rt-3"), for: "other")
        let upgraded = try self.bytes(self.vaultPath)
        #expect(upgraded[9] == 2, "written as version 2")
        let reopened = try self.keyFileStore()
        #expect(try await reopened.load(owner) == (try self.secrets("rt-work")))
        #expect(try await reopened.load("home") == (try self.secrets("rt-home")))
        let stranger = RecordOwner(name: "work", identity: "a-9", issuer: "https://id.example.org", clientID: "cli")
        await #expect(throws: StoreError.self) { _ = try await reopened.load(stranger) }
    }

    /// Fields of a newer version are kept through a rewrite by this one.
    /// A DPoP key rests in the refresh token's record (tag 4), sealed with it,
    /// and a record without one reads as before.
    @Test func aDPoPKeyRestsWithItsRefreshToken() async throws {
        var secrets = try self.secrets("rt-1")
        secrets.dpopKey = try SecretBytes(copying: [1] + Array(repeating: 7, count: 64))
        let store = try self.keyFileStore()
        try await store.save(secrets, for: "work")
        let loaded = try #require(try await self.keyFileStore().load("work"))
        #expect(loaded == secrets)
        #expect(loaded.unknownFields.isEmpty)
        #expect(!loaded.isEmpty)
        #expect(try await self.keyFileStore().remove("work"))
        #expect(AccountSecrets(dpopKey: try SecretBytes(copying: [1])).isEmpty == false, "a key alone is something to remove")
    }

    @Test func fieldsOfANewerVersionAreKept() async throws {
        // refresh token "rt", then tag 9 (unknown here) holding "dpop-key".
        let plaintext: [UInt8] = [1, 0, 0, 0, 2] + Array("rt".utf8) + [9, 0, 0, 0, 8] + Array("dpop-key".utf8)
        var secrets = try AccountSecrets(decoding: try SecretBytes(copying: plaintext))
        #expect(secrets.unknownFields.count == 1)
        let store = try self.keyFileStore()
        try await store.save(secrets, for: "work")
        secrets = try #require(try await self.keyFileStore().load("work"))
        secrets.refreshToken = try SecretBytes(utf8: "rotated")
        try await store.save(secrets, for: "work")
        let again = try #require(try await self.keyFileStore().load("work"))
        #expect(again.unknownFields.map(\.tag) == [9])
        #expect(again.unknownFields.first?.value == (try SecretBytes(utf8: "dpop-key")))
        #expect(again.refreshToken == (try SecretBytes(utf8: "rotated")))
    }

    @Test func refusesDamagedFilesAndNeverOverwritesThem() async throws {
        let store = try self.keyFileStore()
        try await store.save(try self.secrets("rt-1"), for: "work")
        let good = try self.bytes(self.vaultPath)
        var damaged: [(String, [UInt8], StoreError.Kind)] = [
            ("truncated", Array(good.dropLast(7)), .corrupt),
            ("header only", Array(good.prefix(30)), .corrupt),
            ("trailing bytes", good + [0], .corrupt),
            ("foreign", Array("{\"hello\": 1}".utf8), .foreign),
            ("empty", [], .foreign),
        ]
        var newer = good
        newer[9] = 3
        damaged.append(("newer version", newer, .foreign))
        for index in [12, 50, good.count - 1] {
            var flipped = good
            flipped[index] ^= 0x40
            damaged.append(("bit \(index)", flipped, index < 111 ? .wrongKey : .corrupt))
        }
        for (label, bytes, kind) in damaged {
            try self.write(bytes, self.vaultPath)
            do {
                _ = try self.keyFileStore()
                Issue.record("\(label) was accepted")
            } catch let error as StoreError {
                #expect(error.kind == kind, "\(label): \(error.message)")
            }
            #expect(try self.bytes(self.vaultPath) == bytes, "\(label) was rewritten")
        }
    }

    @Test func aLeftoverTemporaryFileDoesNotHarm() async throws {
        let store = try self.keyFileStore()
        try await store.save(try self.secrets("rt-1"), for: "work")
        // A crash between writing the temporary file and renaming it.
        try self.write(Array("half-written".utf8), self.vaultPath + ".tmp-crashed")
        let reopened = try self.keyFileStore()
        #expect(try await reopened.load("work") == (try self.secrets("rt-1")))
        #expect(!FileManager.default.fileExists(atPath: self.vaultPath + ".tmp-crashed"), "opening clears what a crash left")
        try await reopened.save(try self.secrets("rt-2"), for: "work")
        #expect(try await self.keyFileStore().load("work") == (try self.secrets("rt-2")))
    }

    @Test func aMissingKeyFileNextToAVaultIsRefused() async throws {
        let store = try self.keyFileStore()
        try await store.save(try self.secrets("rt-1"), for: "work")
        let before = try self.bytes(self.vaultPath)
        try FileManager.default.removeItem(atPath: self.keyPath)
        #expect(throws: StoreError.self) { try self.keyFileStore() }
        #expect(try self.bytes(self.vaultPath) == before)
        #expect(!FileManager.default.fileExists(atPath: self.keyPath))
    }

    @Test func aWrongKeyFileIsRefused() async throws {
        let store = try self.keyFileStore()
        try await store.save(try self.secrets("rt-1"), for: "work")
        try self.write(Array(repeating: 1, count: 32), self.keyPath)
        do {
            _ = try self.keyFileStore()
            Issue.record("a wrong key opened the vault")
        } catch let error as StoreError {
            #expect(error.kind == .wrongKey)
        }
        try self.write(Array(repeating: 1, count: 31), self.keyPath)
        do {
            _ = try self.keyFileStore()
            Issue.record("a short key was accepted")
        } catch let error as StoreError {
            #expect(error.kind == .keySource)
        }
    }

    @Test func aPassphraseVaultStartsLockedAndUnlocks() async throws {
        let store = try SealedFileStore(path: self.vaultPath, keySource: .passphrase)
        #expect(store.isLocked)
        await #expect(throws: StoreError.self) { try await store.load("work") }
        try await store.unlock(passphrase: try SecretBytes(utf8: "correct horse"))
        #expect(!store.isLocked)
        try await store.save(try self.secrets("rt-1"), for: "work")
        await store.lock()
        #expect(store.isLocked)
        do {
            try await store.unlock(passphrase: try SecretBytes(utf8: "wrong horse"))
            Issue.record("a wrong passphrase unlocked the vault")
        } catch let error as StoreError {
            #expect(error.kind == .wrongKey)
        }
        #expect(store.isLocked)
        let reopened = try SealedFileStore(path: self.vaultPath, keySource: .passphrase)
        try await reopened.unlock(passphrase: try SecretBytes(utf8: "correct horse"))
        #expect(try await reopened.load("work") == (try self.secrets("rt-1")))
        // The same file cannot be opened as a key-file vault.
        do {
            _ = try self.keyFileStore()
            Issue.record("a passphrase vault opened with a key file")
        } catch let error as StoreError {
            #expect(error.kind == .keySource)
        }
    }

    @Test func aCredentialKeysTheVault() async throws {
        let credential = self.folder + "/vault.key.cred"
        try self.write(Array(repeating: 9, count: 32), credential)
        let store = try SealedFileStore(path: self.vaultPath, keySource: .credential(credential))
        try await store.save(try self.secrets("rt-1"), for: "work")
        let reopened = try SealedFileStore(path: self.vaultPath, keySource: .credential(credential))
        #expect(try await reopened.load("work") == (try self.secrets("rt-1")))
        #expect(throws: StoreError.self) {
            try SealedFileStore(path: self.vaultPath, keySource: .credential(self.folder + "/absent"))
        }
    }

    /// The broker reads the lock state on its hot path: it never waits
    /// behind a change being written and flushed to disk.
    @Test func theLockStateIsAnsweredWhileAWriteIsUnderWay() async throws {
        let gate = WriteGate()
        let store = try SealedFileStore(path: self.vaultPath, keySource: .keyFile(self.keyPath), beforeWrite: { gate.pass() })
        gate.arm()
        let saved = Task { try await store.save(try self.secrets("rt-1"), for: "work") }
        await onThread { gate.entered.wait() }
        let answered = DispatchSemaphore(value: 0)
        Thread {
            _ = store.isLocked
            answered.signal()
        }.start()
        let inTime = await onThread { answered.wait(timeout: .now() + 5) == .success }
        gate.release.signal()
        try await saved.value
        #expect(inTime, "isLocked waited for the write to end")
        #expect(try await store.load("work")?.refreshToken == (try SecretBytes(utf8: "rt-1")))
    }
}

/// Holds the next write of a store until `release` is signalled; `entered`
/// says the write has reached it.
final class WriteGate: @unchecked Sendable {
    let entered = DispatchSemaphore(value: 0)
    let release = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var armed = false

    func arm() { self.lock.withLock { self.armed = true } }

    func pass() {
        let armed = self.lock.withLock {
            defer { self.armed = false }
            return self.armed
        }
        guard armed else { return }
        self.entered.signal()
        self.release.wait()
    }
}

/// Runs blocking `body` on a thread of its own, off the cooperative pool.
func onThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread { continuation.resume(returning: body()) }.start()
    }
}
