public import VaultCrypto

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
        guard !method.isEmpty, method.utf8.count <= 32, method.utf8.allSatisfy(Self.isTokenByte) else { return nil }
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
        guard !authority.contains("@"), Self.hasHost(authority) else { return nil }
        self.method = method
        self.url = bare
        self.origin = scheme + authority.lowercased()
    }

    /// Whether `authority` names a host before its port. `https://:443/x`
    /// (or `https://[]/x`) names none: no request goes there, and its origin
    /// is none that a resource server's nonce could belong to.
    private static func hasHost(_ authority: Substring) -> Bool {
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return false }
            return authority.index(after: authority.startIndex) < close
        }
        return !authority.prefix { $0 != ":" }.isEmpty
    }

    /// RFC 9110's `tchar`: what an HTTP method token is made of.
    private static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"): true
        default: Array("!#$%&'*+-.^_`|~".utf8).contains(byte)
        }
    }
}

/// A server's DPoP nonce (RFC 9449 §8.1): 1 to 512 `NQCHAR`s. Anything
/// else an issuer or a companion sends is not put in a proof.
public enum DPoPNonce {
    public static func valid(_ value: String?) -> String? {
        guard let value, !value.isEmpty, value.utf8.count <= 512,
            value.utf8.allSatisfy({ $0 == 0x21 || (0x23...0x5B).contains($0) || (0x5D...0x7E).contains($0) })
        else { return nil }
        return value
    }

    /// `origin` as `DPoPTarget` would name it (scheme and authority,
    /// lower-cased, no path), or nil when it is not one.
    public static func origin(_ value: String) -> String? {
        guard let target = DPoPTarget(method: "GET", url: value), target.origin == value.lowercased() else { return nil }
        return target.origin
    }
}

/// `dpop.proof`'s request fields: the token it pairs with, asked for as
/// `token` asks, and the request the proof is for.
public struct DPoPProofRequest: Sendable, Equatable {
    public var token: TokenRequest
    public var target: DPoPTarget

    public init(token: TokenRequest, target: DPoPTarget) {
        self.token = token
        self.target = target
    }
}

/// `dpop.proof`: the two header values a companion sends to a resource
/// server, `Authorization` and `DPoP`, and the access token's lifetime.
/// Encoded from guarded memory at the last moment, as `token` is.
public struct DPoPProofResult: ResultPayload {
    public var proof: String
    public var accessToken: SecretBytes
    public var expiresAt: Int64
    public var expiresIn: Int64
    public var scope: String

    /// The `Authorization` header's value.
    public var authorization: String { "DPoP " + self.accessToken.unsafeString() }

    public init(proof: String, accessToken: SecretBytes, expiresAt: Int64, expiresIn: Int64, scope: String) {
        self.proof = proof
        self.accessToken = accessToken
        self.expiresAt = expiresAt
        self.expiresIn = expiresIn
        self.scope = scope
    }

    enum CodingKeys: String, CodingKey {
        case scope, authorization
        case proof = "dpop"
        case tokenType = "token_type"
        case expiresAt = "expires_at"
        case expiresIn = "expires_in"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.proof = try c.decode(String.self, forKey: .proof)
        let authorization = try c.decode(String.self, forKey: .authorization)
        guard authorization.hasPrefix("DPoP ") else {
            throw DecodingError.dataCorruptedError(forKey: .authorization, in: c, debugDescription: "not a DPoP authorization")
        }
        self.accessToken = try SecretBytes(utf8: String(authorization.dropFirst(5)))
        self.expiresAt = try c.decode(Int64.self, forKey: .expiresAt)
        self.expiresIn = try c.decode(Int64.self, forKey: .expiresIn)
        self.scope = try c.decodeIfPresent(String.self, forKey: .scope) ?? ""
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(self.proof, forKey: .proof)
        try c.encode(self.authorization, forKey: .authorization)
        try c.encode("DPoP", forKey: .tokenType)
        try c.encode(self.expiresAt, forKey: .expiresAt)
        try c.encode(self.expiresIn, forKey: .expiresIn)
        try c.encode(self.scope, forKey: .scope)
    }
}
