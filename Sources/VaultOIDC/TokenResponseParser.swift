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

    /// What is left of a success once its tokens are taken.
    private struct Rest: Decodable {
        var tokenType: String?
        var expiresIn: Int?
        var scope: String?

        enum CodingKeys: String, CodingKey {
            case tokenType = "token_type"
            case expiresIn = "expires_in"
            case scope
        }

        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            self.tokenType = try? c.decodeIfPresent(String.self, forKey: .tokenType)
            // Bounded here (IssuerNumber): a number or a string, at most ten years.
            self.expiresIn = IssuerNumber.bounded(try? c.decodeIfPresent(JSONValue.self, forKey: .expiresIn), IssuerNumber.lifetimes)
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

    /// `body` is left with its tokens blanked: the caller wipes it, and no
    /// other copy of them is made outside guarded memory.
    /// `proved`: the request carried a DPoP proof, so a `DPoP` token type is
    /// what it asked for; without one, only `Bearer` is.
    static func parse(status: UInt, body: inout [UInt8], retryAfter: Int?, proved: Bool = false) throws(ProviderError) -> TokenResponse {
        switch status {
        case 200:
            return try Self.response(secrets: try Self.takeSecrets(from: &body), rest: body, proved: proved)
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
    static func takeSecrets(from body: inout [UInt8], key: (String) -> String = { $0 }) throws(ProviderError) -> [String: SecretBytes] {
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

    /// A token response from its taken tokens and the rest of the answer.
    static func response(secrets: [String: SecretBytes], rest: [UInt8], proved: Bool = false) throws(ProviderError) -> TokenResponse {
        guard let accessToken = secrets["access_token"], accessToken.count > 0,
            let rest = try? JSONDecoder().decode(Rest.self, from: Data(rest))
        else {
            throw .unavailable(reason: "the token endpoint's answer is not a token response", retryAfterSeconds: nil)
        }
        let tokenType: String
        switch (rest.tokenType ?? "Bearer").lowercased() {
        case "bearer": tokenType = "Bearer"
        case "dpop" where proved: tokenType = "DPoP"
        case "dpop": throw .untrusted(reason: "the issuer sent a DPoP token for a request without a proof")
        default: throw .untrusted(reason: "the issuer sent a token type other than Bearer or DPoP")
        }
        return TokenResponse(
            accessToken: accessToken,
            tokenType: tokenType,
            // 0 (or a negative lifetime, read as 0) counts as not said, as no issuer means it.
            expiresIn: rest.expiresIn.flatMap { $0 > 0 ? $0 : nil },
            refreshToken: secrets["refresh_token"],
            idToken: secrets["id_token"],
            scope: rest.scope
        )
    }

    /// Issuer text goes to clients and logs: its control characters
    /// escaped (the one escaper, for a terminal), and at most 200 characters.
    static func clean(_ text: String) -> String {
        String(text.escaped(for: .terminal).prefix(200))
    }
}
