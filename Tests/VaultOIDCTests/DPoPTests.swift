import Crypto
import Foundation
import Testing
import VaultCrypto
import VaultOIDC
import VaultProtocol

/// DPoP keys and proofs (RFC 9449), against the RFCs' own examples.
struct DPoPTests {
    /// RFC 8037 appendix A.1's key: `d` (the seed), then `x`.
    static let seed = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"
    static let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"

    static func decode(_ text: some StringProtocol) -> [UInt8] {
        var base64 = text.map { $0 == "-" ? "+" : $0 == "_" ? "/" : String($0) }.joined()
        while base64.count % 4 != 0 { base64 += "=" }
        return Array(Data(base64Encoded: base64) ?? Data())
    }

    static func rfcKey() throws -> DPoPKey {
        try #require(DPoPKey(algorithm: .edDSA, secretKey: try SecretBytes(copying: decode(seed) + decode(x))))
    }

    /// RFC 8037 A.3: the key's thumbprint.
    @Test func theThumbprintIsRFC8037s() throws {
        let key = try Self.rfcKey()
        #expect(key.publicJWK == #"{"crv":"Ed25519","kty":"OKP","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}"#)
        #expect(key.thumbprint == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k")
    }

    /// RFC 8037 A.4: Ed25519 signs deterministically; the example's signature.
    @Test func theSignatureIsRFC8037s() throws {
        let key = try Self.rfcKey()
        let input = Array("eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc".utf8)
        let signature = try Ed25519.sign(input, with: key.secretKey)
        #expect(signature == Self.decode("hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg"))
        #expect(Ed25519.verify(signature, of: input, by: Self.decode(Self.x)))
    }

    @Test func aProofCarriesWhatRFC9449AsksAndVerifies() throws {
        let key = try #require(try DPoPKey.generate(supported: ["RS256", "ES256", "EdDSA"]))
        let target = try #require(DPoPTarget(method: "POST", url: "https://id.example.org/token?x=1#f"))
        let token = try SecretBytes(utf8: "at-123")
        let proof = try key.proof(for: target, issuedAt: 1_800_000_000, nonce: #"n"1\"#, accessToken: token)
        let parts = proof.split(separator: ".")
        try #require(parts.count == 3)
        let header = try #require(try JSONSerialization.jsonObject(with: Data(Self.decode(parts[0]))) as? [String: Any])
        let claims = try #require(try JSONSerialization.jsonObject(with: Data(Self.decode(parts[1]))) as? [String: Any])
        #expect(header["typ"] as? String == "dpop+jwt")
        #expect(header["alg"] as? String == "EdDSA")
        let jwk = try #require(header["jwk"] as? [String: Any])
        #expect(jwk.count == 3, "the public key only: \(jwk.keys.sorted())")
        #expect(jwk["kty"] as? String == "OKP" && jwk["crv"] as? String == "Ed25519")
        #expect(claims["htm"] as? String == "POST")
        #expect(claims["htu"] as? String == "https://id.example.org/token", "no query, no fragment")
        #expect(claims["iat"] as? Int == 1_800_000_000)
        #expect(claims["nonce"] == nil, "what is not a nonce (RFC 9449 §8.1's NQCHARs) is left out, never spliced in")
        let withNonce = try key.proof(for: target, issuedAt: 1_800_000_000, nonce: "eyJ7S_zG.eyJH0-Z", accessToken: token).split(separator: ".")
        let nonceClaims = try #require(try JSONSerialization.jsonObject(with: Data(Self.decode(withNonce[1]))) as? [String: Any])
        #expect(nonceClaims["nonce"] as? String == "eyJ7S_zG.eyJH0-Z")
        let ath = try #require(claims["ath"] as? String)
        #expect(Self.decode(ath) == (try sha256(Array("at-123".utf8))))
        let publicKey = Self.decode(try #require(jwk["x"] as? String))
        #expect(Ed25519.verify(Self.decode(parts[2]), of: Array("\(parts[0]).\(parts[1])".utf8), by: publicKey))
        let again = try key.proof(for: target, issuedAt: 1_800_000_000)
        let againClaims = try #require(try JSONSerialization.jsonObject(with: Data(Self.decode(again.split(separator: ".")[1]))) as? [String: Any])
        #expect(againClaims["jti"] as? String != claims["jti"] as? String, "each proof has its own jti")
        #expect(againClaims["ath"] == nil && againClaims["nonce"] == nil)
        #expect(!proof.contains(key.secretKey.unsafeString()), "no secret key bytes in a proof")
    }

    /// The key rests with its refresh token as algorithm and secret key, and
    /// comes back the same key; what is not such a record is no key.
    @Test func aSealedKeyOpensAsTheSameKey() throws {
        let key = try Self.rfcKey()
        let sealed = try key.sealed
        #expect(sealed.count == 65)
        let opened = try #require(try DPoPKey(sealed: sealed))
        #expect(opened == key)
        #expect(opened.thumbprint == key.thumbprint)
        #expect(try DPoPKey(sealed: try SecretBytes(copying: [9] + Array(repeating: 0, count: 64))) == nil, "an algorithm this vault does not know")
        #expect(try DPoPKey(sealed: try SecretBytes(copying: [1, 2, 3])) == nil, "a key of the wrong size")
    }

    @Test func noKeyWithoutAnAlgorithmBothKnow() throws {
        #expect(try DPoPKey.generate(supported: ["RS256", "PS256"]) == nil)
        #expect(try DPoPKey.generate(supported: []) == nil)
    }

    @Test(arguments: [
        ("GET", "https://rs.example/path?q=1", "https://rs.example/path", "https://rs.example"),
        ("POST", "HTTP://RS.example:8443/a#b", "HTTP://RS.example:8443/a", "http://rs.example:8443"),
        ("PATCH", "https://[::1]:9/x", "https://[::1]:9/x", "https://[::1]:9"),
    ])
    func aTargetKeepsItsURLButQueryAndFragment(method: String, url: String, htu: String, origin: String) throws {
        let target = try #require(DPoPTarget(method: method, url: url))
        #expect(target.url == htu)
        #expect(target.origin == origin)
    }

    @Test(arguments: [
        ("GET", "/relative"), ("GET", "ftp://x/y"), ("GET", "https:///nohost"), ("GE T", "https://x/"),
        ("", "https://x/"), ("GET", "https://user@x/"), ("GET", "https://x/\"quote"), ("GET", "https://x/ space"),
        ("G\u{e9}T", "https://x/"), ("GET", "https://x/\u{e9}"),
    ])
    func aMalformedTargetIsRefused(method: String, url: String) {
        #expect(DPoPTarget(method: method, url: url) == nil)
    }

    /// A proof's `iat` is the second before now: never ahead of a server
    /// whose time(2) has not yet reached this second.
    @Test func aProofsIssuedAtIsNeverAhead() {
        #expect(DPoPKey.issuedAt(1_800_000_000.0) == 1_799_999_999)
        #expect(DPoPKey.issuedAt(1_800_000_000.999) == 1_799_999_999)
    }

    /// ES256, for issuers without EdDSA: a P-256 key whose proofs verify
    /// with the public key in their header, sealed and unsealed intact.
    @Test func anES256KeyMakesProofsThatVerify() throws {
        let key = try #require(try DPoPKey.generate(supported: ["RS256", "ES256"]))
        #expect(key.algorithm == .es256 && key.secretKey.count == 32)
        let target = try #require(DPoPTarget(method: "GET", url: "https://rs.example/items"))
        let parts = try key.proof(for: target, issuedAt: 1_800_000_000, accessToken: try SecretBytes(utf8: "at-1")).split(separator: ".")
        try #require(parts.count == 3)
        let header = try #require(try JSONSerialization.jsonObject(with: Data(Self.decode(parts[0]))) as? [String: Any])
        #expect(header["alg"] as? String == "ES256")
        let jwk = try #require(header["jwk"] as? [String: String])
        #expect(jwk.keys.sorted() == ["crv", "kty", "x", "y"] && jwk["crv"] == "P-256" && jwk["kty"] == "EC")
        let publicKey = try P256.Signing.PublicKey(rawRepresentation: Self.decode(jwk["x"] ?? "") + Self.decode(jwk["y"] ?? ""))
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: Self.decode(parts[2]))
        #expect(publicKey.isValidSignature(signature, for: Array("\(parts[0]).\(parts[1])".utf8)))
        let unsealed = try #require(try DPoPKey(sealed: try key.sealed))
        #expect(unsealed.thumbprint == key.thumbprint && unsealed.algorithm == .es256)
        #expect(try DPoPKey.generate(supported: ["RS256"]) == nil, "no algorithm in common: no key")
    }
}
