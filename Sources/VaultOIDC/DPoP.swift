import FoundationEssentials
public import VaultCrypto
import VaultProtocol

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
    public func proof(for target: DPoPTarget, issuedAt: Int64, nonce: String? = nil, accessToken: SecretBytes? = nil) throws -> String {
        let header = #"{"alg":"\#(self.algorithm.rawValue)","jwk":\#(self.publicJWK),"typ":"dpop+jwt"}"#
        let claims = ProofClaims(
            ath: try accessToken.map { token in Base64URL.encode(try token.withUnsafeBytes { try sha256($0) }) },
            htm: target.method,
            htu: target.url,
            iat: issuedAt,
            jti: Base64URL.encode(try randomBytes(16)),
            nonce: nonce
        )
        let input = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(Array(try LineCodec.json(claims)))
        let signature = try Ed25519.sign(Array(input.utf8), with: self.secretKey)
        return input + "." + Base64URL.encode(signature)
    }

    private struct ProofClaims: Encodable {
        var ath: String?
        var htm: String
        var htu: String
        var iat: Int64
        var jti: String
        var nonce: String?
    }
}

/// The request a proof is for: an HTTP method token and an absolute
/// http(s) URL, which the `htu` claim carries without its query and
/// fragment and otherwise as given (RFC 9449 §4.2: no normalisation).
public struct DPoPTarget: Sendable, Equatable {
    public let method: String
    public let url: String
    /// The URL's scheme and authority, lower-cased: where a resource
    /// server's nonce applies.
    public let origin: String

    /// nil when `method` is not an HTTP method token or `url` not an
    /// absolute http or https URL with a host.
    public init?(method: String, url: String) {
        let tokenBytes = Set(Array("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8))
        guard !method.isEmpty, method.utf8.count <= 32, method.utf8.allSatisfy(tokenBytes.contains) else { return nil }
        guard url.utf8.count <= 4096, url.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") })
        else { return nil }
        let bare = String(url.prefix { $0 != "?" && $0 != "#" })
        let lower = bare.lowercased()
        let scheme: String
        if lower.hasPrefix("https://") {
            scheme = "https://"
        } else if lower.hasPrefix("http://") {
            scheme = "http://"
        } else {
            return nil
        }
        let rest = bare.dropFirst(scheme.count)
        let authority = rest.prefix { $0 != "/" }
        guard !authority.isEmpty, !authority.contains("@") else { return nil }
        self.method = method
        self.url = bare
        self.origin = scheme + authority.lowercased()
    }
}
