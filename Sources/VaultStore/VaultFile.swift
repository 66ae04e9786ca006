import VaultCrypto

/// The on-disk layout of the sealed vault, version 1. All integers big-endian.
///
/// ```
/// header  "TOKENVLT" magic (8) | format version u16 | key kind u8
///         | salt (16) | ops limit u64 | mem limit u64   (zero unless passphrase)
///         | record count u32
/// check   AEAD box of nothing, associated data = the header bytes above
/// records count × ( name length u16 | name UTF-8 | box length u32 | box )
///         box = AEAD box of the record, associated data = the account name
/// ```
///
/// The check box authenticates the header, so a wrong key is told at once and
/// a truncated file (fewer records than the header counts) or trailing bytes
/// are refused. Each record opens only under its own account name.
struct VaultFile: Equatable {
    static let magic: [UInt8] = Array("TOKENVLT".utf8)
    static let version: UInt16 = 1
    /// Refuse files larger than this before reading them into memory.
    static let maximumSize = 16 << 20

    enum KeyKind: UInt8 {
        /// A 32-byte key read from a key file or a systemd credential.
        case raw = 1
        /// A key derived from a passphrase with Argon2id.
        case passphrase = 2
    }

    var keyKind: KeyKind
    var kdf: PasswordKDF?
    /// Sealed boxes by account name.
    var records: [String: [UInt8]]

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
        guard version == Self.version else {
            throw StoreError(
                .foreign,
                "the vault file has format version \(version); this tokenvault reads version \(Self.version)"
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
        var records: [String: [UInt8]] = [:]
        for _ in 0..<count {
            let nameLength = Int(try reader.u16())
            // Strict: a repaired name would seal under other bytes than it opened
            // under, and could grow past the u16 its length is written in.
            guard let name = String(validating: try reader.bytes(nameLength), as: UTF8.self) else {
                throw StoreError(.corrupt, "a record name in the vault file is not UTF-8")
            }
            let boxLength = Int(try reader.u32())
            let box = try reader.bytes(boxLength)
            guard records[name] == nil else {
                throw StoreError(.corrupt, "the vault file holds two records for one account")
            }
            do {
                _ = try AEAD.open(box, key: key, associatedData: Array(name.utf8))
            } catch {
                throw StoreError(.corrupt, "a record in the vault file does not open (it was altered or moved)")
            }
            records[name] = box
        }
        guard reader.offset == bytes.count else {
            throw StoreError(.corrupt, "the vault file has bytes after its last record")
        }
        return (VaultFile(keyKind: keyKind, kdf: kdf, records: records), key)
    }

    /// The file's bytes, with a fresh check box.
    func serialized(key: SecretBytes) throws(StoreError) -> [UInt8] {
        var out = Self.magic
        out.appendBig(Self.version)
        out.append(self.keyKind.rawValue)
        out.append(contentsOf: self.kdf?.salt ?? [UInt8](repeating: 0, count: PasswordKDF.saltBytes))
        out.appendBig(self.kdf?.opsLimit ?? 0)
        out.appendBig(self.kdf?.memLimit ?? 0)
        out.appendBig(UInt32(self.records.count))
        do {
            let empty = try SecretBytes(copying: [])
            out.append(contentsOf: try AEAD.seal(empty, key: key, associatedData: out))
        } catch {
            throw StoreError(.io, "could not seal the vault header")
        }
        for name in self.records.keys.sorted() {
            guard let box = self.records[name] else { continue }
            let utf8 = Array(name.utf8)
            out.appendBig(UInt16(utf8.count))
            out.append(contentsOf: utf8)
            out.appendBig(UInt32(box.count))
            out.append(contentsOf: box)
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
    fileprivate mutating func appendBig<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.bigEndian) { self.append(contentsOf: $0) }
    }
}
