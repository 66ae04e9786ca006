import FoundationEssentials
import VaultCrypto
import VaultJSON
import VaultOIDC
import VaultProtocol

/// An account's validated ID-token claims, kept as the JSON text the issuer
/// signed and parsed again only for `claims`: parsed, a dictionary of a
/// handful of claims takes about 800 bytes per account, the text a quarter
/// of that.
struct StoredClaims: Sendable {
    private let json: [UInt8]
    /// `preferred_username`, else `email`: the name `status` and sign-in show.
    let username: String?

    /// Claims just validated (`value`) from `idToken`.
    init(_ value: JSONValue, of idToken: SecretBytes) {
        self.json = IDTokenReader.claimsJSON(of: idToken.unsafeString()) ?? (try? Array(LineCodec.json(value))) ?? []
        self.username = Self.username(in: value)
    }

    /// The claims of an ID token validated when it arrived and kept sealed
    /// since; nil when they do not read as JSON.
    init?(storedIDToken idToken: SecretBytes) {
        guard let json = IDTokenReader.claimsJSON(of: idToken.unsafeString()), let value = Self.parse(json) else { return nil }
        self.json = json
        self.username = Self.username(in: value)
    }

    var value: JSONValue? { Self.parse(self.json) }

    private static func parse(_ json: [UInt8]) -> JSONValue? {
        try? JSONDecoder().decode(JSONValue.self, from: Data(json))
    }

    private static func username(in claims: JSONValue) -> String? {
        claims["preferred_username"]?.stringValue ?? claims["email"]?.stringValue
    }
}
