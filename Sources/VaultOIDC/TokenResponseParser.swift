import FoundationEssentials
import VaultCrypto
import VaultJSON
import VaultProtocol

/// Reads token-endpoint answers as they come in the wild: `bearer` in any
/// case, `expires_in` as a number or a string or missing, extra fields, and
/// `400` with an empty body for a dead refresh token (Glewlwyd).
enum TokenResponseParser {
    /// The fields that are taken into guarded memory before anything else
    /// reads the answer (`SecretFields`).
    static let secretKeys: Set<String> = ["access_token", "refresh_token", "id_token"]

    /// What is left of a success once its tokens are taken. `token_type`
    /// and `scope` are strings when present: another JSON type, `null`
    /// included, is an answer nothing of is served (`shapeless`).
    private struct Rest: Decodable {
        var tokenType: String?
        var expiresIn: Int?
        var scope: String?
        /// A field that is there with a type the protocol does not allow.
        var shapeless: String?

        enum CodingKeys: String, CodingKey {
            case tokenType = "token_type"
            case expiresIn = "expires_in"
            case scope
        }

        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            var shapeless: String?
            func text(_ key: CodingKeys) -> String? {
                guard c.contains(key) else { return nil }
                guard let value = try? c.decode(String.self, forKey: key) else {
                    shapeless = key.rawValue
                    return nil
                }
                return value
            }
            self.tokenType = text(.tokenType)
            // Bounded here (IssuerNumber): a number or a string, at most ten years.
            self.expiresIn = IssuerNumber.bounded(try? c.decodeIfPresent(JSONValue.self, forKey: .expiresIn), IssuerNumber.lifetimes)
            // "" says no more than a missing scope (RFC 6749 §5.1: the scope asked).
            self.scope = text(.scope).flatMap { $0.isEmpty ? nil : $0 }
            self.shapeless = shapeless
        }
    }

    private struct Failure: Decodable {
        var error: String
        var errorDescription: String?

        enum CodingKeys: String, CodingKey {
            case error
            case errorDescription = "error_description"
        }
    }

    /// `body` is left with its tokens blanked: the caller wipes it, and no
    /// other copy of them is made outside guarded memory.
    /// `proved`: the request carried a DPoP proof, so a `DPoP` token type is
    /// what it asked for; without one, only `Bearer` is.
    /// An answer that is not served (`TokenAnswer.tokens` failed) keeps
    /// nothing: its tokens are wiped.
    static func parse(status: UInt, body: inout [UInt8], retryAfter: Int?, proved: Bool = false) throws(ProviderError) -> TokenResponse {
        try Self.answer(status: status, body: &body, retryAfter: retryAfter, proved: proved).served()
    }

    /// As `parse`, but a 200 whose tokens may not be served still gives the
    /// refresh token it carried: a refresh spent the one it sent, and the
    /// rotation is kept even when the access token is not.
    static func answer(status: UInt, body: inout [UInt8], retryAfter: Int?, proved: Bool = false) throws(ProviderError) -> TokenAnswer {
        switch status {
        case 200:
            return Self.answer(secrets: try Self.takeSecrets(from: &body), rest: body, proved: proved)
        case 429, 500...599:
            throw .unavailable(reason: "the token endpoint answered HTTP \(status)", retryAfterSeconds: retryAfter)
        case 400...499:
            if body.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) && status == 400 {
                throw .invalidGrant
            }
            guard let failure = try? JSONDecoder().decode(Failure.self, from: Data(body)) else {
                throw .rejected(error: "http_\(status)", description: nil)
            }
            switch failure.error {
            case "invalid_grant": throw .invalidGrant
            case "temporarily_unavailable", "server_error":
                throw .unavailable(reason: "the issuer is \(failure.error)", retryAfterSeconds: retryAfter)
            default:
                throw .rejected(error: Self.clean(failure.error), description: failure.errorDescription.map(Self.clean))
            }
        default:
            throw .unavailable(reason: "the token endpoint answered HTTP \(status)", retryAfterSeconds: retryAfter)
        }
    }

    /// The tokens of a 200 answer, straight into guarded memory.
    static func takeSecrets(from body: inout [UInt8], key: ((String) -> String)? = nil) throws(ProviderError) -> [String: SecretBytes] {
        do {
            return try SecretFields.take(Self.secretKeys, from: &body, key: key)
        } catch .duplicate(let name) {
            throw .untrusted(reason: "the issuer's answer names '\(name)' twice")
        } catch .outOfMemory {
            throw .unavailable(reason: "out of guarded memory", retryAfterSeconds: nil)
        } catch {
            throw .unavailable(reason: "the token endpoint's answer is not a token response", retryAfterSeconds: nil)
        }
    }

    /// A token response from its taken tokens and the rest of the answer;
    /// one that may not be served keeps nothing (a sign-in's answer).
    static func response(secrets: [String: SecretBytes], rest: [UInt8], proved: Bool = false) throws(ProviderError) -> TokenResponse {
        try Self.answer(secrets: secrets, rest: rest, proved: proved).served()
    }

    /// The one rule for what an issuer's answer may hand on: an access
    /// token is 1 or more visible ASCII characters without space (RFC 6750's
    /// b64token and RFC 9449's token68 are narrower still), so no token can
    /// carry a line break or a control character into a header, a SASL
    /// string or a command's environment; `token_type` is Bearer or DPoP;
    /// `token_type` and `scope` are strings when present.
    static func answer(secrets: [String: SecretBytes], rest: [UInt8], proved: Bool = false) -> TokenAnswer {
        let refreshToken = secrets["refresh_token"]
        func refused(_ error: ProviderError) -> TokenAnswer {
            for (name, secret) in secrets where name != "refresh_token" { secret.wipe() }
            return TokenAnswer(refreshToken: refreshToken, tokens: .failure(error))
        }
        guard let rest = try? JSONDecoder().decode(Rest.self, from: Data(rest)) else {
            return refused(.unavailable(reason: "the token endpoint's answer is not a token response", retryAfterSeconds: nil))
        }
        guard let accessToken = secrets["access_token"], accessToken.count > 0 else {
            return refused(.unavailable(reason: "the token endpoint's answer is not a token response", retryAfterSeconds: nil))
        }
        guard Self.isVisibleASCII(accessToken) else {
            return refused(.untrusted(reason: "the issuer's access token holds a space, a control character or non-ASCII text"))
        }
        if let shapeless = rest.shapeless {
            return refused(.untrusted(reason: "the issuer's '\(shapeless)' is not a string"))
        }
        let tokenType: String
        switch (rest.tokenType ?? "Bearer").lowercased() {
        case "bearer": tokenType = "Bearer"
        case "dpop" where proved: tokenType = "DPoP"
        case "dpop": return refused(.untrusted(reason: "the issuer sent a DPoP token for a request without a proof"))
        default: return refused(.untrusted(reason: "the issuer sent a token type other than Bearer or DPoP"))
        }
        let response = TokenResponse(
            accessToken: accessToken,
            tokenType: tokenType,
            // 0 (or a negative lifetime, read as 0) counts as not said, as no issuer means it.
            expiresIn: rest.expiresIn.flatMap { $0 > 0 ? $0 : nil },
            refreshToken: refreshToken,
            idToken: secrets["id_token"],
            scope: rest.scope
        )
        return TokenAnswer(refreshToken: refreshToken, tokens: .success(response))
    }

    /// An OAuth error answer's `error` and `error_description` (RFC 6749
    /// §5.2, RFC 7591 §3.2.2, RFC 9126 §2.3), cleaned; nil when the body is
    /// not one.
    static func rejection(in body: [UInt8]) -> ProviderError? {
        guard let failure = try? JSONDecoder().decode(Failure.self, from: Data(body)) else { return nil }
        return .rejected(error: Self.clean(failure.error), description: failure.errorDescription.map(Self.clean))
    }

    /// 1 or more bytes, each from `!` to `~`.
    static func isVisibleASCII(_ token: SecretBytes) -> Bool {
        token.count > 0 && token.withUnsafeBytes { bytes in bytes.allSatisfy { (0x21...0x7E).contains($0) } }
    }

    /// Issuer text goes to clients and logs: its control characters
    /// escaped (the one escaper, for a terminal), and at most 200 characters.
    static func clean(_ text: String) -> String {
        String(text.escaped(for: .terminal).prefix(200))
    }
}
