import AsyncHTTPClient
import FoundationEssentials
import NIOHTTP1
public import VaultCrypto
import VaultJSON
import VaultProtocol

/// A client tokenvault registered at an issuer (RFC 7591 §3.2.1): its id,
/// the secret the issuer may insist on, and what deletes the registration
/// later (RFC 7592 §2.3), a bearer token and the client's URI. Both of those
/// are sealed with the account, like its refresh token.
public struct ClientRegistration: Sendable {
    public var clientID: String
    public var clientSecret: SecretBytes?
    public var accessToken: SecretBytes?
    public var clientURI: String?
}

extension OIDCClient {
    /// What an issuer's registration answer may hold that is a secret.
    static let registrationSecrets: Set<String> = ["client_secret", "registration_access_token"]

    /// Registers a public native client (RFC 7591 §3.1, RFC 8252 §8.4):
    /// no client secret (`token_endpoint_auth_method: none`), the loopback
    /// `redirectURI` the browser flow will listen on, the grants discovery
    /// offers. `initialAccessToken`: the bearer token an issuer that allows
    /// registration only with one asks for (§3.1).
    public func register(
        metadata: ProviderMetadata,
        redirectURI: String,
        clientName: String,
        initialAccessToken: SecretBytes?
    ) async throws(ProviderError) -> ClientRegistration {
        guard let endpoint = metadata.registrationEndpoint else {
            throw .untrusted(reason: "the issuer's discovery names no registration_endpoint")
        }
        // The two grants every issuer names alike; the device grant's name
        // differs (Glewlwyd refuses RFC 8628's URN), so a registered client
        // signs in by browser.
        let grants = ["authorization_code", "refresh_token"]
        let request: [String: JSONValue] = [
            "client_name": .string(clientName),
            "application_type": .string("native"),
            "token_endpoint_auth_method": .string("none"),
            "redirect_uris": .array([.string(redirectURI)]),
            "grant_types": .array(grants.map(JSONValue.string)),
            "response_types": .array([.string("code")]),
            // Glewlwyd stores a client registered with `none` as confidential
            // unless told otherwise; RFC 7591 §2 lets other issuers ignore it.
            "client_confidential": .bool(false),
        ]
        guard let body = try? Array(LineCodec.json(request)) else {
            throw .unavailable(reason: "the registration request could not be written", retryAfterSeconds: nil)
        }
        var headers = HTTPHeaders([("Content-Type", "application/json")])
        if let initialAccessToken {
            guard TokenResponseParser.isVisibleASCII(initialAccessToken) else {
                throw .rejected(error: "invalid_token", description: "the initial access token is not visible ASCII")
            }
            headers.add(name: "Authorization", value: "Bearer " + initialAccessToken.unsafeString())
        }
        var reply = try await self.send(url: endpoint, method: .POST, headers: headers, body: body)
        defer { reply.body.secureZero() }
        return try Self.registration(status: reply.status, body: &reply.body, issuer: metadata.issuer)
    }

    /// Reads a registration answer: 200 or 201 with a `client_id` (RFC 7591
    /// §3.2.1), else the issuer's error (§3.2.2) or its HTTP status. The
    /// secrets go straight into guarded memory; the client id must be
    /// visible ASCII, and the client's URI https (or loopback http).
    static func registration(status: UInt, body: inout [UInt8], issuer: String) throws(ProviderError) -> ClientRegistration {
        guard status == 200 || status == 201 else {
            if status == 401 || status == 403 {
                throw .rejected(
                    error: "invalid_token",
                    description: "the issuer answered HTTP \(status): registration needs an initial access token it accepts"
                )
            }
            if let rejection = TokenResponseParser.rejection(in: body) { throw rejection }
            throw .unavailable(reason: "the registration endpoint answered HTTP \(status)", retryAfterSeconds: nil)
        }
        let secrets: [String: SecretBytes]
        do {
            secrets = try SecretFields.take(Self.registrationSecrets, from: &body)
        } catch .duplicate(let name) {
            throw .untrusted(reason: "the registration answer names '\(name)' twice")
        } catch .outOfMemory {
            throw .unavailable(reason: "out of guarded memory", retryAfterSeconds: nil)
        } catch {
            throw .untrusted(reason: "the registration answer is not a JSON object")
        }
        func refuse(_ reason: String) -> ProviderError {
            for secret in secrets.values { secret.wipe() }
            return .untrusted(reason: reason)
        }
        struct Rest: Decodable {
            var clientID: String
            var clientURI: String?
            enum CodingKeys: String, CodingKey {
                case clientID = "client_id"
                case clientURI = "registration_client_uri"
            }
        }
        guard let rest = try? JSONDecoder().decode(Rest.self, from: Data(body)) else {
            throw refuse("the registration answer has no client_id string")
        }
        let id = rest.clientID.utf8
        guard (1...512).contains(id.count), id.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            throw refuse("the registration answer's client_id is not 1 to 512 visible ASCII characters")
        }
        for secret in secrets.values where !TokenResponseParser.isVisibleASCII(secret) {
            throw refuse("the registration answer's secrets are not visible ASCII")
        }
        if let uri = rest.clientURI {
            do {
                try Self.requireSecure(uri, under: issuer)
            } catch {
                throw refuse("the registration answer's registration_client_uri is not https")
            }
        }
        // RFC 7592 needs both: one without the other is of no use, and is dropped.
        var token = secrets["registration_access_token"]
        var uri = rest.clientURI
        if token == nil || uri == nil {
            token?.wipe()
            token = nil
            uri = nil
        }
        return ClientRegistration(clientID: rest.clientID, clientSecret: secrets["client_secret"], accessToken: token, clientURI: uri)
    }

    /// Deletes a registration (RFC 7592 §2.3): 204 (or Glewlwyd's 200) is
    /// done; anything else, and an issuer that cannot be reached, is why not.
    public func deleteRegistration(clientURI: String, accessToken: SecretBytes) async -> (deleted: Bool, reason: String?) {
        guard TokenResponseParser.isVisibleASCII(accessToken) else { return (false, "the registration access token is not visible ASCII") }
        let headers = HTTPHeaders([("Authorization", "Bearer " + accessToken.unsafeString())])
        do {
            var reply = try await self.send(url: clientURI, method: .DELETE, headers: headers, timeout: self.configuration.revocationTimeout)
            reply.body.secureZero()
            guard reply.status == 204 || reply.status == 200 else {
                return (false, "the issuer answered HTTP \(reply.status) at registration_client_uri")
            }
            return (true, nil)
        } catch {
            switch error {
            case .unavailable(let reason, _), .untrusted(let reason): return (false, reason)
            default: return (false, "\(error)")
            }
        }
    }
}
