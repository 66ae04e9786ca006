internal import CSodium

/// Ed25519 (libsodium's `crypto_sign`), for DPoP keys: the secret key is
/// made in guarded memory and signs there; only the public key and the
/// signatures leave it.
public enum Ed25519 {
    public static let publicKeyBytes = 32
    public static let secretKeyBytes = 64
    public static let signatureBytes = 64

    /// A new key: libsodium's 64-byte secret key (seed, then public key).
    public static func generate() throws(SodiumError) -> SecretBytes {
        try Sodium.ensureInitialized()
        var publicKey = [UInt8](repeating: 0, count: Self.publicKeyBytes)
        let made = try SecretBytes(count: Self.secretKeyBytes) { secret in
            crypto_sign_keypair(&publicKey, secret.baseAddress!.assumingMemoryBound(to: UInt8.self)) == 0
        }
        guard let made else { throw SodiumError(operation: "crypto_sign_keypair") }
        return made
    }

    /// The public key of `secretKey`, or nil when it is not an Ed25519 secret key.
    public static func publicKey(of secretKey: SecretBytes) -> [UInt8]? {
        guard secretKey.count == Self.secretKeyBytes else { return nil }
        return secretKey.withUnsafeBytes { Array($0[Self.publicKeyBytes...]) }
    }

    /// The detached signature of `message`.
    public static func sign(_ message: [UInt8], with secretKey: SecretBytes) throws(SodiumError) -> [UInt8] {
        guard secretKey.count == Self.secretKeyBytes else { throw SodiumError(operation: "crypto_sign_detached (key size)") }
        try Sodium.ensureInitialized()
        var signature = [UInt8](repeating: 0, count: Self.signatureBytes)
        let status = secretKey.withUnsafeBytes { key in
            crypto_sign_detached(&signature, nil, message, UInt64(message.count), key.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        guard status == 0 else { throw SodiumError(operation: "crypto_sign_detached") }
        return signature
    }

    /// Whether `signature` is `publicKey`'s over `message`.
    public static func verify(_ signature: [UInt8], of message: [UInt8], by publicKey: [UInt8]) -> Bool {
        guard signature.count == Self.signatureBytes, publicKey.count == Self.publicKeyBytes,
            (try? Sodium.ensureInitialized()) != nil
        else { return false }
        return crypto_sign_verify_detached(signature, message, UInt64(message.count), publicKey) == 0
    }
}
