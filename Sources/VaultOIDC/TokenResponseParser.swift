import FoundationEssentials
import VaultCrypto
import VaultJSON

/// Reads token-endpoint answers as they come in the wild: `bearer` in any
/// case, `expires_in` as a number or a string or missing, extra fields, and
/// `400` with an empty body for a dead refresh token (Glewlwyd).
enum TokenResponseParser {
    private struct Success: Decodable {
        var accessToken: String
        var tokenType: String?
        var expiresIn: Int?
        var refreshToken: String?
        var idToken: String?
        var scope: String?

        enum CodingKeys: String, CodingKey {
            case accessToken = "access_token"
            case tokenType = "token_type"
            case expiresIn = "expires_in"
            case refreshToken = "refresh_token"
            case idToken = "id_token"
            case scope
        }

        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            self.accessToken = try c.decode(String.self, forKey: .accessToken)
            self.tokenType = try? c.decodeIfPresent(String.self, forKey: .tokenType)
            // Bounded here (IssuerNumber): a number or a string, at most ten years.
            self.expiresIn = IssuerNumber.bounded(try? c.decodeIfPresent(JSONValue.self, forKey: .expiresIn), IssuerNumber.lifetimes)
            self.refreshToken = try? c.decodeIfPresent(String.self, forKey: .refreshToken)
            self.idToken = try? c.decodeIfPresent(String.self, forKey: .idToken)
            self.scope = try? c.decodeIfPresent(String.self, forKey: .scope)
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

    static func parse(status: UInt, body: [UInt8], retryAfter: Int?) throws(ProviderError) -> TokenResponse {
        switch status {
        case 200:
            guard let success = try? JSONDecoder().decode(Success.self, from: Data(body)), !success.accessToken.isEmpty
            else {
                throw .unavailable(reason: "the token endpoint's answer is not a token response", retryAfterSeconds: nil)
            }
            guard (success.tokenType ?? "Bearer").lowercased() == "bearer" else {
                throw .untrusted(reason: "the issuer sent a token type other than Bearer")
            }
            do {
                return TokenResponse(
                    accessToken: try SecretBytes(utf8: success.accessToken),
                    tokenType: "Bearer",
                    // 0 (or a negative lifetime, read as 0) counts as not said, as no issuer means it.
                    expiresIn: success.expiresIn.flatMap { $0 > 0 ? $0 : nil },
                    refreshToken: try success.refreshToken.map { try SecretBytes(utf8: $0) },
                    idToken: try success.idToken.map { try SecretBytes(utf8: $0) },
                    scope: success.scope
                )
            } catch {
                throw .unavailable(reason: "out of guarded memory", retryAfterSeconds: nil)
            }
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

    /// Issuer text goes to clients and logs: printable, bounded.
    static func clean(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }).prefix(200))
    }
}
