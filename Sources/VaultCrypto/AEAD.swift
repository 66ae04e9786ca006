internal import CSodium

/// XChaCha20-Poly1305 (IETF) with a random 24-byte nonce per message.
///
/// A sealed box is `nonce ‖ ciphertext ‖ tag`. The associated data binds the
/// box to its context (the account name, the file header): a box moved to
/// another context fails to open.
public enum AEAD {
    public static let keyBytes = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    public static let nonceBytes = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    public static let tagBytes = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    /// Bytes a sealed box adds to its plaintext.
    public static var overhead: Int { nonceBytes + tagBytes }

    public enum Failure: Error, Hashable, Sendable {
        /// Wrong key, wrong associated data, or altered bytes: AEAD cannot tell which.
        case authenticationFailed
        case badKey
        case sodium(String)
    }

    /// Seals `plaintext` under `key` with `associatedData`.
    public static func seal(
        _ plaintext: SecretBytes,
        key: SecretBytes,
        associatedData: [UInt8]
    ) throws(Failure) -> [UInt8] {
        guard key.count == keyBytes else { throw .badKey }
        do {
            try Sodium.ensureInitialized()
        } catch {
            throw .sodium(error.operation)
        }
        var box = [UInt8](repeating: 0, count: nonceBytes + plaintext.count + tagBytes)
        let status = box.withUnsafeMutableBytes { out -> Int32 in
            randombytes_buf(out.mutableBytes, nonceBytes)
            return key.withUnsafeBytes { k in
                plaintext.withUnsafeBytes { p in
                    associatedData.withUnsafeBytes { ad in
                        crypto_aead_xchacha20poly1305_ietf_encrypt(
                            out.mutableBytes.advanced(by: nonceBytes),
                            nil,
                            p.bytes,
                            UInt64(p.count),
                            ad.bytes,
                            UInt64(ad.count),
                            nil,
                            out.mutableBytes,
                            k.bytes
                        )
                    }
                }
            }
        }
        guard status == 0 else { throw .sodium("crypto_aead_xchacha20poly1305_ietf_encrypt") }
        return box
    }

    /// Opens a box made by `seal`. The plaintext goes straight into guarded memory.
    public static func open(
        _ box: some Collection<UInt8>,
        key: SecretBytes,
        associatedData: [UInt8]
    ) throws(Failure) -> SecretBytes {
        guard key.count == keyBytes else { throw .badKey }
        let box = Array(box)
        guard box.count >= nonceBytes + tagBytes else { throw .authenticationFailed }
        let opened: SecretBytes?
        do {
            opened = try SecretBytes(count: box.count - nonceBytes - tagBytes) { out in
                let status = box.withUnsafeBytes { b in
                    key.withUnsafeBytes { k in
                        associatedData.withUnsafeBytes { ad in
                            crypto_aead_xchacha20poly1305_ietf_decrypt(
                                out.mutableBytes,
                                nil,
                                nil,
                                b.bytes.advanced(by: nonceBytes),
                                UInt64(b.count - nonceBytes),
                                ad.bytes,
                                UInt64(ad.count),
                                b.bytes,
                                k.bytes
                            )
                        }
                    }
                }
                return status == 0
            }
        } catch {
            throw .sodium(error.operation)
        }
        guard let opened else { throw .authenticationFailed }
        return opened
    }
}
