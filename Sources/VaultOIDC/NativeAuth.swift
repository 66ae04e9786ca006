import FoundationEssentials
import NIOHTTP1
public import VaultCrypto
import VaultJSON

/// Where an issuer's native authentication (Microsoft Entra's native
/// authentication API, V1) lives: beside its token endpoint, which ends in
/// `/oauth2/v2.0/token`. Other issuers do not speak it.
public struct NativeAuthEndpoints: Sendable, Hashable {
    public var initiate: String
    public var challenge: String
    public var token: String

    public init?(metadata: ProviderMetadata) {
        let suffix = "/oauth2/v2.0/token"
        let endpoint = metadata.tokenEndpoint.split(separator: "?", maxSplits: 1).first.map(String.init) ?? ""
        guard endpoint.hasSuffix(suffix) else { return nil }
        let base = String(endpoint.dropLast("/token".count))
        self.initiate = base + "/initiate"
        self.challenge = base + "/challenge"
        self.token = endpoint
    }
}

/// A successful native-authentication answer.
public enum NativeAuthAnswer: Sendable {
    /// `/initiate`: the flow goes on with this continuation token.
    case continuation(SecretBytes)
    /// `/challenge`: a code was sent.
    case codeSent(continuation: SecretBytes, sentTo: String, channel: String, codeLength: Int)
    /// `/challenge`: the user has a password.
    case passwordRequired(continuation: SecretBytes)
    /// Any endpoint: the issuer wants a browser (`challenge_type: redirect`).
    case redirect(reason: String?)
    /// `/token`: signed in.
    case tokens(TokenResponse)
}

/// Why a native-authentication call failed: the issuer's own error, or the
/// issuer could not be used at all.
public enum NativeAuthError: Error, Sendable {
    /// A `400` answer: `error`, `suberror` and the first of `error_codes`.
    case refused(error: String, suberror: String?, errorCode: Int?)
    case provider(ProviderError)
}

extension OIDCClient {
    /// `POST /initiate`: starts a sign-in for `username`.
    public func nativeInitiate(
        username: String,
        challengeTypes: [String],
        clientID: String,
        endpoints: NativeAuthEndpoints
    ) async throws(NativeAuthError) -> NativeAuthAnswer {
        try await self.native(
            endpoints.initiate,
            [("client_id", clientID), ("username", username), ("challenge_type", Self.challengeList(challengeTypes))]
        )
    }

    /// `POST /challenge`: sends the code (again) or asks for the password.
    public func nativeChallenge(
        continuation: SecretBytes,
        challengeTypes: [String],
        clientID: String,
        endpoints: NativeAuthEndpoints
    ) async throws(NativeAuthError) -> NativeAuthAnswer {
        try await self.native(
            endpoints.challenge,
            [
                ("client_id", clientID), ("continuation_token", continuation),
                ("challenge_type", Self.challengeList(challengeTypes)),
            ]
        )
    }

    /// `POST /token` with `grant_type=oob`: submits a code.
    public func nativeSubmitCode(
        _ code: SecretBytes,
        continuation: SecretBytes,
        scope: String,
        clientID: String,
        endpoints: NativeAuthEndpoints
    ) async throws(NativeAuthError) -> NativeAuthAnswer {
        try await self.native(
            endpoints.token,
            [
                ("client_id", clientID), ("continuation_token", continuation), ("grant_type", "oob"),
                ("oob", code), ("scope", scope), ("client_info", "true"),
            ]
        )
    }

    /// `POST /token` with `grant_type=password`: submits a password.
    public func nativeSubmitPassword(
        _ password: SecretBytes,
        username: String,
        continuation: SecretBytes,
        challengeTypes: [String],
        scope: String,
        clientID: String,
        endpoints: NativeAuthEndpoints
    ) async throws(NativeAuthError) -> NativeAuthAnswer {
        try await self.native(
            endpoints.token,
            [
                ("client_id", clientID), ("username", username), ("continuation_token", continuation),
                ("grant_type", "password"), ("password", password), ("scope", scope),
                ("client_info", "true"), ("challenge_type", Self.challengeList(challengeTypes)),
            ]
        )
    }

    /// MSAL always lists `redirect` last: an issuer refuses a list without it.
    private static func challengeList(_ types: [String]) -> String {
        (types.filter { $0 != "redirect" } + ["redirect"]).joined(separator: " ")
    }

    private func native(_ url: String, _ fields: [(String, any FormValue)]) async throws(NativeAuthError) -> NativeAuthAnswer {
        var body = FormEncoding.encode(fields)
        defer { body.secureZero() }
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        var reply: Reply
        do {
            reply = try await self.send(url: url, method: .POST, headers: headers, body: body)
        } catch {
            throw .provider(error)
        }
        defer { reply.body.secureZero() }
        return try NativeAuthParser.parse(status: reply.status, body: &reply.body, retryAfter: reply.retryAfter)
    }
}

/// Reads native-authentication answers (the `email_otp` method of docs/protocol.md's Sign-in): the
/// redirect envelope is checked before anything else, keys and values are
/// trimmed, unknown keys ignored.
enum NativeAuthParser {
    /// The tokens a native-auth answer carries, taken into guarded memory first.
    static let secretKeys = TokenResponseParser.secretKeys.union(["continuation_token"])

    /// `body` is left with its tokens blanked (`SecretFields`); the caller wipes it.
    static func parse(status: UInt, body: inout [UInt8], retryAfter: Int?) throws(NativeAuthError) -> NativeAuthAnswer {
        switch status {
        case 200:
            let secrets: [String: SecretBytes]
            do {
                secrets = try SecretFields.take(Self.secretKeys, from: &body, key: { $0.trimmed })
            } catch .duplicate(let name) {
                throw .provider(.untrusted(reason: "the issuer's answer names '\(name)' twice"))
            } catch .outOfMemory {
                throw .provider(.unavailable(reason: "out of guarded memory", retryAfterSeconds: nil))
            } catch {
                throw .provider(.unavailable(reason: "the issuer's native-auth answer is not JSON", retryAfterSeconds: nil))
            }
            guard case .object(let raw)? = try? JSONDecoder().decode(JSONValue.self, from: Data(body)) else {
                throw .provider(.unavailable(reason: "the issuer's native-auth answer is not JSON", retryAfterSeconds: nil))
            }
            var document: [String: JSONValue] = [:]
            for (key, value) in raw { document[key.trimmed] = value }
            let text = { (key: String) in document[key]?.stringValue?.trimmed }
            let challengeType = text("challenge_type")?.lowercased()
            if challengeType == "redirect" {
                return .redirect(reason: text("redirect_reason").map(TokenResponseParser.clean))
            }
            if document["access_token"] != nil {
                do {
                    return .tokens(try TokenResponseParser.response(secrets: secrets, rest: body))
                } catch {
                    throw .provider(error)
                }
            }
            guard let continuation = secrets["continuation_token"].flatMap(Self.trimmed), continuation.count > 0 else {
                throw .provider(.unavailable(reason: "the issuer's native-auth answer has no continuation token", retryAfterSeconds: nil))
            }
            switch challengeType ?? "" {
            case "oob":
                guard let sentTo = text("challenge_target_label"), let channel = text("challenge_channel"),
                    let length = IssuerNumber.bounded(document["code_length"], 0...33), (1...32).contains(length)
                else {
                    throw .provider(.unavailable(reason: "the issuer's code challenge is incomplete", retryAfterSeconds: nil))
                }
                return .codeSent(
                    continuation: continuation,
                    sentTo: TokenResponseParser.clean(sentTo),
                    channel: TokenResponseParser.clean(channel.lowercased()),
                    codeLength: length
                )
            case "password":
                return .passwordRequired(continuation: continuation)
            case "":
                return .continuation(continuation)
            default:
                throw .provider(.unavailable(reason: "the issuer asked for a challenge tokenvault does not know", retryAfterSeconds: nil))
            }
        case 400, 401:
            guard let document = try? JSONDecoder().decode(JSONValue.self, from: Data(body)),
                let error = document["error"]?.stringValue
            else {
                throw .refused(error: "http_\(status)", suberror: nil, errorCode: nil)
            }
            var code: Int?
            if case .array(let codes)? = document["error_codes"] { code = codes.first?.intValue }
            return try Self.refuse(
                error: TokenResponseParser.clean(error),
                suberror: document["suberror"]?.stringValue.map(TokenResponseParser.clean),
                errorCode: code,
                retryAfter: retryAfter
            )
        case 404, 405:
            throw .provider(.rejected(error: "unsupported", description: "the issuer does not offer native authentication"))
        default:
            throw .provider(.unavailable(reason: "the issuer answered HTTP \(status)", retryAfterSeconds: retryAfter))
        }
    }

    /// A continuation token without the spaces and tabs some issuers pad values with.
    private static func trimmed(_ secret: SecretBytes) -> SecretBytes? {
        secret.withUnsafeBytes { bytes -> SecretBytes? in
            let isSpace = { (byte: UInt8) in byte == 0x20 || byte == 0x09 }
            guard let first = bytes.firstIndex(where: { !isSpace($0) }), let last = bytes.lastIndex(where: { !isSpace($0) }) else {
                return nil
            }
            if first == 0 && last == bytes.count - 1 { return secret }
            return try? SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[first...last]))
        }
    }

    private static func refuse(error: String, suberror: String?, errorCode: Int?, retryAfter: Int?) throws(NativeAuthError) -> NativeAuthAnswer {
        if error == "temporarily_unavailable" || error == "server_error" {
            throw .provider(.unavailable(reason: "the issuer is \(error)", retryAfterSeconds: retryAfter))
        }
        throw .refused(error: error, suberror: suberror, errorCode: errorCode)
    }
}

extension String {
    /// Without leading and trailing spaces and tabs (issuers' documents have been seen with both).
    var trimmed: String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let first = self.firstIndex(where: { !isSpace($0) }), let last = self.lastIndex(where: { !isSpace($0) }) else {
            return ""
        }
        return String(self[first...last])
    }
}
