import FoundationEssentials
import JWTKit
public import VaultJSON

/// The claims an ID token must carry (OIDC Core §2). Checks beyond the
/// signature happen in `OIDCClient.validateIDToken`, against the daemon's clock.
struct IDTokenPayload: JWTPayload {
    var iss: IssuerClaim
    var sub: SubjectClaim
    var aud: AudienceClaim
    var exp: ExpirationClaim
    var iat: IssuedAtClaim
    var nonce: String?
    var azp: String?

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Reads the claims of an ID token without checking it: only for tokens
/// that were validated when they arrived and were kept sealed since.
public enum IDTokenReader {
    public static func claims(of token: String) -> JSONValue? {
        Self.segment(1, of: token)
    }

    /// The claims as the JSON text the issuer signed, unverified and not
    /// parsed: a few hundred bytes, where the parsed claims take several
    /// times that.
    public static func claimsJSON(of token: String) -> [UInt8]? {
        Self.bytes(1, of: token).map { Array($0) }
    }

    /// The JOSE header (`alg`, `kid`), unverified.
    public static func header(of token: String) -> JSONValue? {
        Self.segment(0, of: token)
    }

    private static func segment(_ index: Int, of token: String) -> JSONValue? {
        guard let data = Self.bytes(index, of: token) else { return nil }
        return try? JSONDecoder().decode(JSONValue.self, from: data)
    }

    private static func bytes(_ index: Int, of token: String) -> Data? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        var base64 = String(parts[index].map { $0 == "-" ? "+" : $0 == "_" ? "/" : $0 })
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }
}
