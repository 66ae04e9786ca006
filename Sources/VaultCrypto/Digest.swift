internal import CSodium

/// SHA-256 (libsodium's `crypto_hash_sha256`), for PKCE challenges.
public func sha256(_ bytes: some Collection<UInt8>) throws(SodiumError) -> [UInt8] {
    try Sodium.ensureInitialized()
    let input = Array(bytes)
    var digest = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
    _ = crypto_hash_sha256(&digest, input, UInt64(input.count))
    return digest
}

/// `count` bytes from the system's CSPRNG, for values that are not secret
/// once sent (a flow id, an OAuth `state`, a nonce).
public func randomBytes(_ count: Int) throws(SodiumError) -> [UInt8] {
    try Sodium.ensureInitialized()
    var bytes = [UInt8](repeating: 0, count: count)
    randombytes_buf(&bytes, count)
    return bytes
}
