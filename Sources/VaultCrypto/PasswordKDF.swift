internal import CSodium

/// Argon2id key derivation (`crypto_pwhash`), run once per unlock.
///
/// The parameters are stored beside the salt in the vault header, so they can
/// grow later without breaking old vaults.
public struct PasswordKDF: Hashable, Sendable {
    public var salt: [UInt8]
    public var opsLimit: UInt64
    public var memLimit: UInt64

    public static let saltBytes = Int(crypto_pwhash_SALTBYTES)

    /// libsodium's MODERATE profile: about 0.5 s and 256 MiB here, paid once per unlock.
    public static func moderate() throws(SodiumError) -> PasswordKDF {
        try Sodium.ensureInitialized()
        var salt = [UInt8](repeating: 0, count: saltBytes)
        randombytes_buf(&salt, saltBytes)
        return PasswordKDF(
            salt: salt,
            opsLimit: UInt64(crypto_pwhash_opslimit_moderate()),
            memLimit: UInt64(crypto_pwhash_memlimit_moderate())
        )
    }

    public init(salt: [UInt8], opsLimit: UInt64, memLimit: UInt64) {
        self.salt = salt
        self.opsLimit = opsLimit
        self.memLimit = memLimit
    }

    /// True when the parameters are within what libsodium accepts; a header
    /// asking for more is refused before any memory is allocated.
    public var isValid: Bool {
        self.salt.count == Self.saltBytes
            && self.opsLimit >= UInt64(crypto_pwhash_opslimit_min())
            && self.opsLimit <= UInt64(crypto_pwhash_opslimit_sensitive())
            && self.memLimit >= UInt64(crypto_pwhash_memlimit_min())
            && self.memLimit <= UInt64(crypto_pwhash_memlimit_sensitive())
    }

    /// Derives a 32-byte key from `passphrase`.
    public func deriveKey(from passphrase: SecretBytes) throws(SodiumError) -> SecretBytes {
        guard self.isValid else { throw SodiumError(operation: "crypto_pwhash parameters") }
        let key = try SecretBytes(count: AEAD.keyBytes) { out in
            passphrase.withUnsafeBytes { p in
                self.salt.withUnsafeBytes { s in
                    crypto_pwhash(
                        out.mutableBytes,
                        UInt64(out.count),
                        UnsafeRawPointer(p.bytes).assumingMemoryBound(to: CChar.self),
                        UInt64(p.count),
                        s.bytes,
                        self.opsLimit,
                        Int(self.memLimit),
                        crypto_pwhash_ALG_ARGON2ID13
                    ) == 0
                }
            }
        }
        guard let key else { throw SodiumError(operation: "crypto_pwhash") }
        return key
    }
}
