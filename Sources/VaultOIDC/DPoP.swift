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
        /// Ed25519, signed by libsodium.
        case edDSA = "EdDSA"
    }

    public let algorithm: Algorithm
    /// libsodium's 64-byte Ed25519 secret key.
    public let secretKey: SecretBytes
    /// The public key, as the JWK's members carry it.
    private let publicKey: [UInt8]

    /// The key `secretKey` is, or nil when it is not one of `algorithm`.
    public init?(algorithm: Algorithm, secretKey: SecretBytes) {
        guard let publicKey = Ed25519.publicKey(of: secretKey) else { return nil }
        self.algorithm = algorithm
        self.secretKey = secretKey
        self.publicKey = publicKey
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
        }
    }

    /// A new key of the first algorithm both the vault and the issuer
    /// (`dpop_signing_alg_values_supported`) know; nil when they share none.
    public static func generate(supported: [String]) throws(SodiumError) -> DPoPKey? {
        guard supported.contains(Algorithm.edDSA.rawValue) else { return nil }
        return DPoPKey(algorithm: .edDSA, secretKey: try Ed25519.generate())
    }

    /// The public JWK, members in RFC 7638's order, as the thumbprint hashes it.
    public var publicJWK: String {
        #"{"crv":"Ed25519","kty":"OKP","x":"\#(Base64URL.encode(self.publicKey))"}"#
    }

    /// The RFC 7638 thumbprint (SHA-256, base64url): `cnf.jkt` and `dpop_jkt`.
    public var thumbprint: String {
        Base64URL.encode((try? sha256(Array(self.publicJWK.utf8))) ?? [])
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
        let signature = try Ed25519.sign(Array(input.utf8), with: self.secretKey)
        return input + "." + Base64URL.encode(signature)
    }
}
