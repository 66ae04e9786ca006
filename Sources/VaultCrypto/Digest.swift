internal import CSodium

/// SHA-256 (libsodium's `crypto_hash_sha256`), for PKCE challenges.
/// SHA-256 of bytes in place (a secret's, without a copy).
public func sha256(_ bytes: UnsafeRawBufferPointer) throws(SodiumError) -> [UInt8] {
    try Sodium.ensureInitialized()
    var digest = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
    _ = crypto_hash_sha256(&digest, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(bytes.count))
    return digest
}

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

/// A random identifier: `prefix` then `count` random bytes in lower-case
/// hex, never shorter. libsodium's CSPRNG, or the system's (getrandom) when
/// libsodium could not start; ids of flows, shares and accounts all come from here.
public func randomID(_ prefix: String, bytes count: Int) -> String {
    var generator = SystemRandomNumberGenerator()
    let bytes = (try? randomBytes(count)) ?? (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
    let hex = Array("0123456789abcdef".utf8)
    var text = Array(prefix.utf8)
    for byte in bytes {
        text.append(hex[Int(byte >> 4)])
        text.append(hex[Int(byte & 0x0F)])
    }
    return String(decoding: text, as: UTF8.self)
}
