import Glibc
public import NIOPosix
import Synchronization
public import VaultCrypto
public import VaultProtocol

/// Where the file backend's key comes from.
public enum KeySource: Hashable, Sendable {
    /// A 0600 file of 32 random bytes, made on first start: zero set-up.
    case keyFile(String)
    /// A passphrase given to `unlock`; the vault starts locked.
    case passphrase
    /// A systemd credential: a file of 32 bytes (`$CREDENTIALS_DIRECTORY/NAME`).
    case credential(String)

    public var name: String {
        switch self {
        case .keyFile: "keyfile"
        case .passphrase: "passphrase"
        case .credential: "credential"
        }
    }
}

/// The `file` backend: every account's secrets sealed in one file with
/// XChaCha20-Poly1305, replaced atomically on each change.
///
/// A file that fails to parse or authenticate is never written over: the
/// store refuses every change until a person has looked at it.
public final class SealedFileStore: SecretStore {
    public let backend = Backend.file
    public let path: String
    public let keySource: KeySource
    private let threadPool: NIOThreadPool
    /// The key and the file as last written: held only to read or replace
    /// them, never across a write, so `isLocked` and `load` never wait on disk.
    private let state: Mutex<State>
    /// Held across a change's seal, write and fsync: changes happen one at a time.
    private let writer = Mutex<Void>(())
    /// Runs before each write of the file; a test holds a write here.
    private let beforeWrite: @Sendable () -> Void

    private struct State {
        var key: SecretBytes?
        var file: VaultFile?
        /// Owners' bindings for records read unbound (written before
        /// bindings): each is sealed to its binding at the next write.
        var rebind: [String: [UInt8]] = [:]
    }

    /// Opens the vault at `path`. With a key file or credential the key is
    /// loaded and the file checked now, so a bad file stops the daemon at start;
    /// a passphrase vault starts locked.
    public convenience init(path: String, keySource: KeySource, threadPool: NIOThreadPool = .singleton) throws(StoreError) {
        try self.init(path: path, keySource: keySource, threadPool: threadPool, beforeWrite: {})
    }

    init(
        path: String,
        keySource: KeySource,
        threadPool: NIOThreadPool = .singleton,
        beforeWrite: @escaping @Sendable () -> Void
    ) throws(StoreError) {
        self.path = path
        self.keySource = keySource
        self.threadPool = threadPool
        self.state = Mutex(State())
        self.beforeWrite = beforeWrite
        try FileSystem.ensurePrivateDirectory(FileSystem.directory(of: path))
        if keySource != .passphrase {
            try self.state.withLock { (state) throws(StoreError) in
                state = try self.open(passphrase: nil)
            }
        }
    }

    public var isLocked: Bool { self.state.withLock { $0.key == nil } }

    public func load(_ owner: RecordOwner) async throws(StoreError) -> AccountSecrets? {
        try await self.offload { () throws(StoreError) in
            try self.state.withLock { (state) throws(StoreError) -> AccountSecrets? in
                let (key, file) = try Self.unlocked(state)
                guard let record = file.records[owner.name] else { return nil }
                if !owner.binding.isEmpty {
                    if record.binding.isEmpty {
                        state.rebind[owner.name] = owner.binding
                    } else if record.binding != owner.binding {
                        throw StoreError(
                            .foreign,
                            "the record of '\(owner.name)' was sealed for another account of that name, or another issuer or client; "
                                + "its refresh token is not sent elsewhere"
                        )
                    }
                }
                guard let plaintext = try file.open(owner.name, key: key) else { return nil }
                return try AccountSecrets(decoding: plaintext)
            }
        }
    }

    public func save(_ secrets: AccountSecrets, for owner: RecordOwner) async throws(StoreError) {
        guard owner.binding.count <= Int(UInt16.max) else {
            throw StoreError(.io, "the account of '\(owner.name)' names an issuer or client too long to bind a record to")
        }
        try await self.offload { () throws(StoreError) in
            _ = try self.change { (file, key, rebind) throws(StoreError) -> VaultFile? in
                try file.next(key: key, rebind: rebind, setting: owner.name, to: try secrets.encoded(), binding: owner.binding)
            }
        }
    }

    public func remove(_ account: String) async throws(StoreError) -> Bool {
        try await self.offload { () throws(StoreError) -> Bool in
            try self.change { (file, key, rebind) throws(StoreError) -> VaultFile? in
                guard file.records[account] != nil else { return nil }
                return try file.next(key: key, rebind: rebind, setting: account)
            }
        }
    }

    /// Writes the file `body` makes of the current one (nil: no change) and
    /// keeps it; true when it wrote. One change at a time, under `writer`; the
    /// state lock is held only to read the file and to keep the new one, so
    /// the lock state is read meanwhile without waiting on the disk.
    private func change(
        _ body: (VaultFile, SecretBytes, [String: [UInt8]]) throws(StoreError) -> VaultFile?
    ) throws(StoreError) -> Bool {
        try self.writer.withLock { (_: inout Void) throws(StoreError) -> Bool in
            let (key, file, rebind) = try self.state.withLock { (state) throws(StoreError) in
                let (key, file) = try Self.unlocked(state)
                return (key, file, state.rebind)
            }
            guard let next = try body(file, key, rebind) else { return false }
            try self.write(next, key: key)
            // Locked while it was written: the file is on disk; unlocking reads it again.
            self.state.withLock { state in
                if state.key != nil {
                    state.file = next
                    state.rebind = state.rebind.filter { next.records[$0.key]?.binding.isEmpty ?? false }
                }
            }
            return true
        }
    }

    public func lock() async {
        self.state.withLock { $0 = State() }
    }

    public func unlock(passphrase: SecretBytes?) async throws(StoreError) {
        if self.keySource == .passphrase && passphrase == nil {
            throw StoreError(.keySource, "this vault is sealed with a passphrase; unlock needs it")
        }
        try await self.offload { () throws(StoreError) in
            try self.writer.withLock { (_: inout Void) throws(StoreError) in
                let opened = try self.open(passphrase: passphrase)
                self.state.withLock { $0 = opened }
            }
        }
    }

    /// Reads the key and the file, or makes both on first use.
    private func open(passphrase: SecretBytes?) throws(StoreError) -> State {
        FileSystem.removeTemporaries(of: self.path)
        let existing = try FileSystem.read(self.path, limit: VaultFile.maximumSize)
        switch self.keySource {
        case .keyFile(let keyPath):
            let key: SecretBytes
            if let bytes = try FileSystem.read(keyPath, limit: 4096) {
                key = try Self.rawKey(bytes, from: keyPath)
            } else if existing != nil {
                throw StoreError(
                    .keySource,
                    "the vault \(self.path) exists but its key file \(keyPath) is missing; restore the key file"
                )
            } else {
                key = try Self.makeKeyFile(at: keyPath)
            }
            return try self.open(existing, expecting: .raw, key: { _ throws(StoreError) in key })
        case .credential(let credentialPath):
            guard let bytes = try FileSystem.read(credentialPath, limit: 4096) else {
                throw StoreError(.keySource, "the credential \(credentialPath) does not exist")
            }
            let key = try Self.rawKey(bytes, from: credentialPath)
            return try self.open(existing, expecting: .raw, key: { _ throws(StoreError) in key })
        case .passphrase:
            guard let passphrase else { return State() }
            return try self.open(existing, expecting: .passphrase) { kdf throws(StoreError) in
                do {
                    return try (kdf ?? PasswordKDF.moderate()).deriveKey(from: passphrase)
                } catch {
                    throw StoreError(.io, "could not derive the key: \(error)")
                }
            }
        }
    }

    private func open(
        _ existing: [UInt8]?,
        expecting kind: VaultFile.KeyKind,
        key: (PasswordKDF?) throws(StoreError) -> SecretBytes
    ) throws(StoreError) -> State {
        guard let existing else {
            let kdf: PasswordKDF?
            do {
                kdf = kind == .passphrase ? try PasswordKDF.moderate() : nil
            } catch {
                throw StoreError(.io, "could not draw a salt: \(error)")
            }
            let fresh = try VaultFile.empty(keyKind: kind, kdf: kdf)
            let key = try key(kdf)
            try self.write(fresh, key: key)
            return State(key: key, file: fresh)
        }
        let (file, key) = try VaultFile.parse(existing) { (found, kdf) throws(StoreError) -> SecretBytes in
            guard found == kind else {
                let sealedWith = found == .passphrase ? "a passphrase" : "a key file or credential"
                throw StoreError(.keySource, "the vault \(self.path) is sealed with \(sealedWith); start vaultd with that key source")
            }
            return try key(kdf)
        }
        return State(key: key, file: file)
    }

    private func write(_ file: VaultFile, key: SecretBytes) throws(StoreError) {
        self.beforeWrite()
        try FileSystem.writeAtomically(try file.serialized(key: key), to: self.path)
    }

    private static func unlocked(_ state: State) throws(StoreError) -> (SecretBytes, VaultFile) {
        guard let key = state.key, let file = state.file else {
            throw StoreError(.locked, "the vault is locked")
        }
        return (key, file)
    }

    private static func rawKey(_ bytes: [UInt8], from path: String) throws(StoreError) -> SecretBytes {
        var bytes = bytes
        defer { bytes.secureZero() }
        guard bytes.count == AEAD.keyBytes else {
            throw StoreError(.keySource, "\(path) must hold exactly \(AEAD.keyBytes) bytes; it holds \(bytes.count)")
        }
        do {
            return try SecretBytes(copying: bytes)
        } catch {
            throw StoreError(.io, "could not allocate guarded memory for the key")
        }
    }

    private static func makeKeyFile(at path: String) throws(StoreError) -> SecretBytes {
        try FileSystem.createDirectories(FileSystem.directory(of: path))
        let key: SecretBytes
        do {
            key = try SecretBytes(randomCount: AEAD.keyBytes)
        } catch {
            throw StoreError(.io, "could not draw a key")
        }
        var bytes = key.withUnsafeBytes { Array($0) }
        defer { bytes.secureZero() }
        try FileSystem.writeAtomically(bytes, to: path)
        return key
    }

    /// Runs blocking file work on the I/O thread pool, never on an event loop
    /// or the cooperative pool.
    private func offload<T: Sendable>(
        _ body: @escaping @Sendable () throws(StoreError) -> T
    ) async throws(StoreError) -> T {
        let result: Result<T, StoreError>
        do {
            result = try await self.threadPool.runIfActive { () -> Result<T, StoreError> in
                do throws(StoreError) {
                    return .success(try body())
                } catch {
                    return .failure(error)
                }
            }
        } catch {
            throw StoreError(.unavailable, "the I/O thread pool has stopped")
        }
        return try result.get()
    }
}
