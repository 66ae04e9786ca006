internal import Crypto
import FoundationEssentials
public import VaultCrypto
public import VaultProtocol

/// A grant's DPoP key (RFC 9449): made in the vault when a sign-in starts,
/// sealed with the refresh token it binds, and used only to sign proofs
/// here. Its secret half never leaves guarded memory; the public half goes
/// out in each proof's header, and its RFC 7638 thumbprint is what the
/// issuer binds the tokens to.
public struct DPoPKey: Sendable, Equatable {
    public enum Algorithm: String, Sendable, Codable, CaseIterable {
        /// Ed25519, signed by libsodium: the vault's choice where the issuer takes it.
        case edDSA = "EdDSA"
        /// ECDSA on P-256 with SHA-256, signed by swift-crypto: for issuers without EdDSA.
        case es256 = "ES256"
    }

    public let algorithm: Algorithm
    /// Ed25519: libsodium's 64-byte secret key. ES256: the 32-byte P-256 scalar.
    public let secretKey: SecretBytes
    /// The public key, as the JWK's members carry it (ES256: x, then y).
    private let publicKey: [UInt8]

    /// The key `secretKey` is, or nil when it is not one of `algorithm`.
    public init?(algorithm: Algorithm, secretKey: SecretBytes) {
        switch algorithm {
        case .edDSA:
            guard let publicKey = Ed25519.publicKey(of: secretKey) else { return nil }
            self.publicKey = publicKey
        case .es256:
            guard secretKey.count == 32, let key = try? Self.p256(secretKey) else { return nil }
            self.publicKey = Array(key.publicKey.rawRepresentation)
        }
        self.algorithm = algorithm
        self.secretKey = secretKey
    }

    /// The P-256 key of a scalar in guarded memory. swift-crypto holds it
    /// in BoringSSL's memory for as long as the value lives (one signature),
    /// and BoringSSL clears what it frees.
    private static func p256(_ scalar: SecretBytes) throws -> P256.Signing.PrivateKey {
        try scalar.withUnsafeBytes { bytes in try P256.Signing.PrivateKey(rawRepresentation: bytes) }
    }

    /// The key as it rests with its refresh token (`AccountSecrets.dpopKey`):
    /// one byte naming the algorithm, then the secret key, in guarded memory.
    public var sealed: SecretBytes {
        get throws(SodiumError) {
            let key = self.secretKey
            let made = try SecretBytes(count: 1 + key.count) { out in
                out[0] = Self.tag(of: self.algorithm)
                key.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: out[1...]).copyMemory(from: $0) }
                return true
            }
            guard let made else { throw SodiumError(operation: "sealing a DPoP key") }
            return made
        }
    }

    /// The key `sealed` wrote, or nil when it is not one (a record of a
    /// newer tokenvault's algorithm, or damaged).
    public init?(sealed: SecretBytes) throws(SodiumError) {
        guard sealed.count > 1 else { return nil }
        let tag = sealed.withUnsafeBytes { $0[0] }
        guard let algorithm = Algorithm.allCases.first(where: { Self.tag(of: $0) == tag }) else { return nil }
        let secretKey = try SecretBytes(count: sealed.count - 1) { out in
            sealed.withUnsafeBytes { out.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[1...])) }
            return true
        }
        guard let secretKey else { return nil }
        self.init(algorithm: algorithm, secretKey: secretKey)
    }

    private static func tag(of algorithm: Algorithm) -> UInt8 {
        switch algorithm {
        case .edDSA: 1
        case .es256: 2
        }
    }

    /// A new key of the first algorithm both the vault and the issuer
    /// (`dpop_signing_alg_values_supported`) know, Ed25519 first; nil when
    /// they share none.
    public static func generate(supported: [String]) throws(SodiumError) -> DPoPKey? {
        if supported.contains(Algorithm.edDSA.rawValue) {
            return DPoPKey(algorithm: .edDSA, secretKey: try Ed25519.generate())
        }
        guard supported.contains(Algorithm.es256.rawValue) else { return nil }
        var scalar = P256.Signing.PrivateKey().rawRepresentation
        defer { scalar.resetBytes(in: 0..<scalar.count) }
        let secretKey = try SecretBytes(count: scalar.count) { out in
            scalar.withUnsafeBytes { out.copyMemory(from: $0) }
            return true
        }
        return secretKey.flatMap { DPoPKey(algorithm: .es256, secretKey: $0) }
    }

    /// The public JWK, members in RFC 7638's order, as the thumbprint hashes it.
    public var publicJWK: String {
        switch self.algorithm {
        case .edDSA:
            return #"{"crv":"Ed25519","kty":"OKP","x":"\#(Base64URL.encode(self.publicKey))"}"#
        case .es256:
            let x = Base64URL.encode(Array(self.publicKey[..<32]))
            let y = Base64URL.encode(Array(self.publicKey[32...]))
            return #"{"crv":"P-256","kty":"EC","x":"\#(x)","y":"\#(y)"}"#
        }
    }

    /// The RFC 7638 thumbprint (SHA-256, base64url): `cnf.jkt` and `dpop_jkt`.
    public var thumbprint: String {
        Base64URL.encode((try? sha256(Array(self.publicJWK.utf8))) ?? [])
    }

    /// A proof's `iat` at `now` (Unix seconds): the second before. Issuers
    /// accept no `iat` ahead of their clock (Glewlwyd: not one second), and
    /// a server reading a coarse clock (time(2) lags by up to a tick) may
    /// still be in the previous second when this one has begun.
    public static func issuedAt(_ now: Double) -> Int64 {
        Int64(now.rounded(.down)) - 1
    }

    /// A proof for one request (RFC 9449 §4.2): `htm` and `htu` as
    /// `DPoPTarget` checked them, `iat` the vault's now (never ahead), a
    /// random `jti`, `ath` over the access token it goes with, and the
    /// server's `nonce` when it gave one.
    ///
    /// Written without an encoder: every value is a JSON string that needs
    /// no escape (`DPoPTarget` and `DPoPNonce` admit no quote, backslash or
    /// control character; the rest is base64url) or an integer.
    public func proof(for target: DPoPTarget, issuedAt: Int64, nonce: String? = nil, accessToken: SecretBytes? = nil) throws -> String {
        let header = #"{"alg":"\#(self.algorithm.rawValue)","jwk":\#(self.publicJWK),"typ":"dpop+jwt"}"#
        var claims = "{"
        if let accessToken {
            claims += #""ath":""# + Base64URL.encode(try accessToken.withUnsafeBytes { token throws(SodiumError) in try sha256(token) }) + #"","#
        }
        claims += #""htm":""# + target.method + #"","htu":""# + target.url + #"","iat":"# + String(issuedAt)
        claims += #","jti":""# + Base64URL.encode(try randomBytes(16)) + "\""
        if let nonce = DPoPNonce.valid(nonce) { claims += #","nonce":""# + nonce + "\"" }
        claims += "}"
        let input = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(Array(claims.utf8))
        let signature: [UInt8]
        switch self.algorithm {
        case .edDSA: signature = try Ed25519.sign(Array(input.utf8), with: self.secretKey)
        case .es256: signature = Array(try Self.p256(self.secretKey).signature(for: Array(input.utf8)).rawRepresentation)
        }
        return input + "." + Base64URL.encode(signature)
    }
}
