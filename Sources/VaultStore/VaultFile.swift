import VaultCrypto

/// The on-disk layout of the sealed vault, version 2. All integers big-endian.
///
/// ```
/// header  "TOKENVLT" magic (8) | format version u16 | key kind u8
///         | salt (16) | ops limit u64 | mem limit u64   (zero unless passphrase)
///         | file id (16) | write counter u64 | record count u32
/// check   AEAD box of nothing, associated data = the header bytes above
/// records count × ( name length u16 | name UTF-8 | binding length u16 | binding
///                   | box length u32 | box )
///         box = AEAD box of the record, associated data =
///               "tokenvault record 2" | file id | write counter | name length u16 | name
///               | binding length u16 | binding
/// ```
///
/// The check box authenticates the header, so a wrong key is told at once and
/// a truncated file (fewer records than the header counts) or trailing bytes
/// are refused. Each record opens only under its own account name and
/// binding (the account's identity, issuer and client id, `RecordOwner`),
/// in this file (its random id) and at this write (the counter, one more at
/// every write, when every record is sealed again): a record spliced in from
/// another account, another vault or an older copy of this one does not open.
///
/// Version 1 had no file id, counter or bindings, and sealed a record to its
/// name alone; it is read, and written as version 2 at the next change.
struct VaultFile: Equatable {
    static let magic: [UInt8] = Array("TOKENVLT".utf8)
    static let version: UInt16 = 2
    static let fileIDBytes = 16
    /// Refuse files larger than this before reading them into memory.
    static let maximumSize = 16 << 20

    enum KeyKind: UInt8 {
        /// A 32-byte key read from a key file or a systemd credential.
        case raw = 1
        /// A key derived from a passphrase with Argon2id.
        case passphrase = 2
    }

    struct Record: Equatable {
        /// What the record is bound to (`RecordOwner.binding`), empty for none.
        var binding: [UInt8]
        var box: [UInt8]
    }

    var keyKind: KeyKind
    var kdf: PasswordKDF?
    var fileID: [UInt8]
    var counter: UInt64
    var records: [String: Record]
    /// Read from a version 1 file: the records are sealed to their names alone.
    var sealedByName = false

    /// A new, empty vault file.
    static func empty(keyKind: KeyKind, kdf: PasswordKDF?) throws(StoreError) -> VaultFile {
        VaultFile(keyKind: keyKind, kdf: kdf, fileID: try Self.newFileID(), counter: 0, records: [:])
    }

    static func newFileID() throws(StoreError) -> [UInt8] {
        do {
            return try randomBytes(Self.fileIDBytes)
        } catch {
            throw StoreError(.io, "could not draw the vault file's id")
        }
    }

    /// What `name`'s record, bound to `binding`, is sealed to at write `counter`.
    func associatedData(_ name: String, binding: [UInt8], counter: UInt64) -> [UInt8] {
        if self.sealedByName { return Array(name.utf8) }
        var data = Array("tokenvault record 2".utf8)
        data.append(contentsOf: self.fileID)
        data.appendBig(counter)
        let utf8 = Array(name.utf8)
        data.appendBig(UInt16(truncatingIfNeeded: utf8.count))
        data.append(contentsOf: utf8)
        data.appendBig(UInt16(truncatingIfNeeded: binding.count))
        data.append(contentsOf: binding)
        return data
    }

    /// The plaintext of `name`'s record.
    func open(_ name: String, key: SecretBytes) throws(StoreError) -> SecretBytes? {
        guard let record = self.records[name] else { return nil }
        do {
            return try AEAD.open(record.box, key: key, associatedData: self.associatedData(name, binding: record.binding, counter: self.counter))
        } catch {
            throw StoreError(.corrupt, "the record of '\(name)' does not open")
        }
    }

    /// The file of the next write: the counter one more, every record sealed
    /// again to it (`rebind`: new bindings for records read unbound), then
    /// `name`'s record replaced by `plaintext` bound to `binding`, or removed
    /// when `plaintext` is nil.
    func next(
        key: SecretBytes,
        rebind: [String: [UInt8]] = [:],
        setting name: String? = nil,
        to plaintext: SecretBytes? = nil,
        binding: [UInt8] = []
    ) throws(StoreError) -> VaultFile {
        var next = self
        next.sealedByName = false
        if self.sealedByName { next.fileID = try Self.newFileID() }
        next.counter = self.counter &+ 1
        next.records = [:]
        for (recordName, record) in self.records where recordName != name {
            guard let opened = try self.open(recordName, key: key) else { continue }
            let bound = record.binding.isEmpty ? rebind[recordName] ?? [] : record.binding
            next.records[recordName] = Record(binding: bound, box: try next.seal(opened, recordName, binding: bound, key: key))
        }
        if let name, let plaintext {
            next.records[name] = Record(binding: binding, box: try next.seal(plaintext, name, binding: binding, key: key))
        }
        return next
    }

    private func seal(_ plaintext: SecretBytes, _ name: String, binding: [UInt8], key: SecretBytes) throws(StoreError) -> [UInt8] {
        do {
            return try AEAD.seal(plaintext, key: key, associatedData: self.associatedData(name, binding: binding, counter: self.counter))
        } catch {
            throw StoreError(.io, "could not seal the record of '\(name)'")
        }
    }

    /// Parses and authenticates a file. `key` is asked for after the header is
    /// read, because a passphrase vault derives it from the header's salt.
    static func parse(
        _ bytes: [UInt8],
        key: (KeyKind, PasswordKDF?) throws(StoreError) -> SecretBytes
    ) throws(StoreError) -> (VaultFile, SecretBytes) {
        var reader = Reader(bytes: bytes)
        guard bytes.count >= 8, Array(bytes[0..<8]) == magic else {
            throw StoreError(.foreign, "not a tokenvault vault file")
        }
        reader.offset = 8
        let version = try reader.u16()
        guard version == 1 || version == Self.version else {
            throw StoreError(
                .foreign,
                "the vault file has format version \(version); this tokenvault reads versions 1 and \(Self.version)"
            )
        }
        guard let keyKind = KeyKind(rawValue: try reader.u8()) else {
            throw StoreError(.foreign, "the vault file names a key kind this tokenvault does not know")
        }
        let salt = try reader.bytes(PasswordKDF.saltBytes)
        let ops = try reader.u64()
        let mem = try reader.u64()
        let kdf: PasswordKDF?
        switch keyKind {
        case .raw:
            kdf = nil
        case .passphrase:
            let parameters = PasswordKDF(salt: salt, opsLimit: ops, memLimit: mem)
            guard parameters.isValid else {
                throw StoreError(.corrupt, "the vault file's key-derivation parameters are out of range")
            }
            kdf = parameters
        }
        var file = VaultFile(keyKind: keyKind, kdf: kdf, fileID: [], counter: 0, records: [:], sealedByName: version == 1)
        if version == 1 {
            file.fileID = [UInt8](repeating: 0, count: Self.fileIDBytes)
        } else {
            file.fileID = try reader.bytes(Self.fileIDBytes)
            file.counter = try reader.u64()
        }
        let count = Int(try reader.u32())
        let header = Array(bytes[0..<reader.offset])
        let check = try reader.bytes(AEAD.overhead)
        let key = try key(keyKind, kdf)
        do {
            _ = try AEAD.open(check, key: key, associatedData: header)
        } catch {
            throw StoreError(
                .wrongKey,
                "the key does not open the vault file (a wrong passphrase or key, or an altered header)"
            )
        }
        for _ in 0..<count {
            let nameLength = Int(try reader.u16())
            // Strict: a repaired name would seal under other bytes than it opened
            // under, and could grow past the u16 its length is written in.
            guard let name = String(validating: try reader.bytes(nameLength), as: UTF8.self) else {
                throw StoreError(.corrupt, "a record name in the vault file is not UTF-8")
            }
            let binding = version == 1 ? [] : try reader.bytes(Int(try reader.u16()))
            let boxLength = Int(try reader.u32())
            let box = try reader.bytes(boxLength)
            guard file.records[name] == nil else {
                throw StoreError(.corrupt, "the vault file holds two records for one account")
            }
            file.records[name] = Record(binding: binding, box: box)
            guard (try? file.open(name, key: key)) != nil else {
                throw StoreError(
                    .corrupt,
                    "a record in the vault file does not open (it was altered, moved from another account, or copied in from another vault or an older copy of this one)"
                )
            }
        }
        guard reader.offset == bytes.count else {
            throw StoreError(.corrupt, "the vault file has bytes after its last record")
        }
        return (file, key)
    }

    /// The file's bytes, with a fresh check box; always version 2, so a file
    /// read as version 1 is written only once `next` has sealed its records again.
    func serialized(key: SecretBytes) throws(StoreError) -> [UInt8] {
        guard !self.sealedByName else { throw StoreError(.io, "a version 1 vault is written only after its records are sealed again") }
        var out = Self.magic
        out.appendBig(Self.version)
        out.append(self.keyKind.rawValue)
        out.append(contentsOf: self.kdf?.salt ?? [UInt8](repeating: 0, count: PasswordKDF.saltBytes))
        out.appendBig(self.kdf?.opsLimit ?? 0)
        out.appendBig(self.kdf?.memLimit ?? 0)
        out.append(contentsOf: self.fileID)
        out.appendBig(self.counter)
        out.appendBig(UInt32(self.records.count))
        do {
            let empty = try SecretBytes(copying: [])
            out.append(contentsOf: try AEAD.seal(empty, key: key, associatedData: out))
        } catch {
            throw StoreError(.io, "could not seal the vault header")
        }
        for name in self.records.keys.sorted() {
            guard let record = self.records[name] else { continue }
            let utf8 = Array(name.utf8)
            out.appendBig(UInt16(utf8.count))
            out.append(contentsOf: utf8)
            out.appendBig(UInt16(record.binding.count))
            out.append(contentsOf: record.binding)
            out.appendBig(UInt32(record.box.count))
            out.append(contentsOf: record.box)
        }
        return out
    }
}

private struct Reader {
    let bytes: [UInt8]
    var offset = 0

    mutating func bytes(_ count: Int) throws(StoreError) -> [UInt8] {
        guard count >= 0, self.bytes.count - self.offset >= count else {
            throw StoreError(.corrupt, "the vault file is truncated")
        }
        defer { self.offset += count }
        return Array(self.bytes[self.offset..<self.offset + count])
    }

    mutating func u8() throws(StoreError) -> UInt8 { try self.bytes(1)[0] }
    mutating func u16() throws(StoreError) -> UInt16 { UInt16(try self.big(2)) }
    mutating func u32() throws(StoreError) -> UInt32 { UInt32(try self.big(4)) }
    mutating func u64() throws(StoreError) -> UInt64 { try self.big(8) }

    private mutating func big(_ count: Int) throws(StoreError) -> UInt64 {
        try self.bytes(count).reduce(0) { $0 << 8 | UInt64($1) }
    }
}

extension [UInt8] {
    mutating func appendBig<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.bigEndian) { self.append(contentsOf: $0) }
    }
}
