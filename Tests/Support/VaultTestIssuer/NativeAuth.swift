// Microsoft Entra native authentication (V1) sign-in endpoints for the test issuer:
// `POST /oauth2/v2.0/initiate`, `POST /oauth2/v2.0/challenge` and `POST /oauth2/v2.0/token`
// (grants `oob` and `password`; `refresh_token` is handed to the ordinary `/token` logic).
// Behaviour follows the "fake Entra native-auth server" contract of the wire-protocol reference
// (identity-protocols.md §1.12).

import NIOHTTP1
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// How a native-auth test user signs in; see ``TestIssuer/addNativeUser(_:_:)``.
public enum NativeUser: Sendable, Equatable {
    /// E-mail one-time code: `/challenge` answers `challenge_type=oob` (if the client offers `oob`).
    case otp
    /// Password: `/challenge` answers `challenge_type=password` (if the client offers `password`);
    /// `/token grant_type=password` accepts this password.
    case password(String)
    /// Needs the browser: `/initiate` (and `/challenge`) answer `{"challenge_type":"redirect",…}`.
    case browserOnly
}

/// A one-shot fault for the next native-auth request; see ``TestIssuer/failNextNativeCall(_:)``.
public enum NativeFault: Sendable, Equatable {
    /// `200 {"challenge_type":"redirect","redirect_reason":"…"}`.
    case redirect
    /// This HTTP status with a native-auth error body (`server_error` for 5xx, else `invalid_request`).
    case status(Int)
    /// Never answer; the connection stays open until the client gives up or the issuer stops.
    case hang
}

/// The paths of the native-auth endpoints, relative to the issuer root.
enum NativeAuthPath {
    static let initiate = "/oauth2/v2.0/initiate"
    static let challenge = "/oauth2/v2.0/challenge"
    static let token = "/oauth2/v2.0/token"
}

struct NativeUserRecord: Sendable {
    /// As configured (used for `sub`, `email` and `preferred_username`).
    var username: String
    var kind: NativeUser
    /// The user's object id (`client_info.uid`).
    var objectID: String
    var codesSent = 0
    var lastCode: String?
}

/// One continuation token. Every step issues a new one; the one it was given is then spent.
struct NativeContinuation: Sendable {
    enum Stage: Sendable {
        /// Issued by `/initiate`; only `/challenge` accepts it.
        case initiated
        /// Issued by `/challenge` together with an e-mailed code; `/challenge` (resend) and
        /// `/token grant_type=oob` accept it.
        case codeSent(code: String)
        /// Issued by `/challenge` for a password user; `/challenge` and `/token grant_type=password` accept it.
        case passwordRequired
    }

    /// Key into ``NativeAuthState/users``.
    var userKey: String
    var clientID: String
    var stage: Stage
    var issuedAt: Double
    var failedCodeAttempts = 0
    /// Set by ``TestIssuer/expireNativeFlows()``.
    var expired = false
    /// Superseded by a newer continuation token, or redeemed for tokens.
    var spent = false
}

/// Native-auth part of ``IssuerState``.
struct NativeAuthState: Sendable {
    /// The fixed tenant id (`client_info.utid`).
    static let tenantID = "9188040d-6c67-4c5b-b112-36a304b66dad"

    /// Keyed by the lowercased username.
    var users: [String: NativeUserRecord] = [:]
    var continuations: [String: NativeContinuation] = [:]
    var codeLength = 8
    var maxAttempts = 5
    var continuationTokenLifetime = 600
    var pendingFault: NativeFault?
    var requestCount = 0

    static func key(_ username: String) -> String { username.lowercased() }

    /// A new random object id (GUID form).
    static func makeObjectID() -> String { UUID().uuidString.lowercased() }
}

/// Builds native-auth replies: every one echoes `client-request-id` and errors use Entra's envelope.
struct NativeResponder: Sendable {
    let clientRequestID: String?
    let now: Double

    var headers: [(String, String)] {
        IssuerReply.noStore + (clientRequestID.map { [("client-request-id", $0)] } ?? [])
    }

    func ok(_ members: [(String, JSONValue)]) -> IssuerReply {
        .json(.ok, .object(members), headers: headers)
    }

    func redirect(_ reason: String) -> IssuerReply {
        ok([("challenge_type", .string("redirect")), ("redirect_reason", .string(reason))])
    }

    /// `{error, error_description, error_codes, suberror?, timestamp, trace_id, correlation_id}`.
    func error(
        _ error: String,
        _ codes: [Int],
        _ message: String,
        suberror: String? = nil,
        status: HTTPResponseStatus = .badRequest
    ) -> IssuerReply {
        let traceID = UUID().uuidString.lowercased()
        let correlationID = clientRequestID ?? UUID().uuidString.lowercased()
        let timestamp = Self.timestamp(now)
        let prefix = codes.first.map { "AADSTS\($0): " } ?? ""
        var members: [(String, JSONValue)] = [
            ("error", .string(error)),
            (
                "error_description",
                .string("\(prefix)\(message) Trace ID: \(traceID) Correlation ID: \(correlationID) Timestamp: \(timestamp)")
            ),
            ("error_codes", .array(codes.map { .int($0) })),
        ]
        if let suberror { members.append(("suberror", .string(suberror))) }
        members += [
            ("timestamp", .string(timestamp)),
            ("trace_id", .string(traceID)),
            ("correlation_id", .string(correlationID)),
        ]
        return .json(status, .object(members), headers: headers)
    }

    func missing(_ parameter: String) -> IssuerReply {
        error("invalid_request", [900144], "The request body must contain the following parameter: '\(parameter)'.")
    }

    func invalidContinuationToken(_ detail: String) -> IssuerReply {
        error("invalid_request", [55200], "The continuation_token is invalid: \(detail).")
    }

    /// `yyyy-mm-dd hh:mm:ssZ` (UTC), the format of Entra's `timestamp` field.
    static func timestamp(_ epochSeconds: Double) -> String {
        let seconds = Int(epochSeconds.rounded(.down))
        var days = seconds / 86_400
        var secondOfDay = seconds % 86_400
        if secondOfDay < 0 {
            secondOfDay += 86_400
            days -= 1
        }
        // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        func two(_ n: Int) -> String { n < 10 ? "0\(n)" : String(n) }
        return "\(year)-\(two(month))-\(two(day)) \(two(secondOfDay / 3600)):\(two(secondOfDay / 60 % 60)):\(two(secondOfDay % 60))Z"
    }
}

extension IssuerCore {
    /// Handles a request to one of the three native-auth paths (already known to be a POST).
    func handleNative(_ request: IssuerRequest, makeRelease: () -> @Sendable () -> Void) -> IssuerAction {
        let responder = NativeResponder(
            clientRequestID: request.headers.first(name: "client-request-id"),
            now: Self.now()
        )
        let fault = state.withLock { s -> NativeFault? in
            s.native.requestCount += 1
            defer { s.native.pendingFault = nil }
            return s.native.pendingFault
        }
        switch fault {
        case .redirect:
            return .reply(responder.redirect("Injected by the test issuer"))
        case .status(let code):
            let status = HTTPResponseStatus(statusCode: code)
            let error = code >= 500 ? "server_error" : "invalid_request"
            return .reply(responder.error(error, [], "Injected HTTP \(code) by the test issuer.", status: status))
        case .hang:
            return .hang
        case nil:
            break
        }

        guard Self.isFormEncoded(request.headers) else {
            return .reply(
                responder.error("invalid_request", [90100], "Content-Type must be application/x-www-form-urlencoded.")
            )
        }
        let form: [String: String]
        do {
            form = try FormCoding.parse(request.body)
        } catch FormDecodingError.duplicateParameter(let name) {
            return .reply(responder.error("invalid_request", [90100], "Parameter '\(name)' given more than once."))
        } catch {
            return .reply(responder.error("invalid_request", [90100], "Malformed form body."))
        }

        switch request.path {
        case NativeAuthPath.initiate:
            return .reply(self.nativeInitiate(form, responder))
        case NativeAuthPath.challenge:
            return .reply(self.nativeChallenge(form, responder))
        default:
            if form["grant_type"] == "refresh_token" {
                // Ordinary refresh (what MSAL does after a native sign-in): the `/token` logic,
                // including the configured ``TokenBehaviour`` and ``TestIssuer/refreshCount``.
                return self.planToken(request, makeRelease: makeRelease)
            }
            switch self.nativeToken(form, responder) {
            case .reply(let reply): return .reply(reply)
            case .sign(let pending): return .sign(pending)
            }
        }
    }

    // MARK: Endpoints

    private func nativeInitiate(_ form: [String: String], _ responder: NativeResponder) -> IssuerReply {
        state.withLock { s -> IssuerReply in
            let clientID: String
            switch Self.nativeClient(form, s.clients, responder) {
            case .success(let id): clientID = id
            case .failure(let failure): return failure.reply
            }
            if let reply = Self.checkChallengeTypes(form["challenge_type"], responder) { return reply }
            guard let username = form["username"] else {
                return responder.error("invalid_request", [90100], "username parameter is empty or not valid.")
            }
            let key = NativeAuthState.key(username)
            guard let user = s.native.users[key] else {
                return responder.error("user_not_found", [50034], "The user account does not exist in the directory.")
            }
            if case .browserOnly = user.kind {
                return responder.redirect("The test issuer requires a web-based sign-in for this user.")
            }
            let token = s.native.issue(
                NativeContinuation(userKey: key, clientID: clientID, stage: .initiated, issuedAt: responder.now)
            )
            return responder.ok([("continuation_token", .string(token))])
        }
    }

    private func nativeChallenge(_ form: [String: String], _ responder: NativeResponder) -> IssuerReply {
        state.withLock { s -> IssuerReply in
            let clientID: String
            switch Self.nativeClient(form, s.clients, responder) {
            case .success(let id): clientID = id
            case .failure(let failure): return failure.reply
            }
            if let reply = Self.checkChallengeTypes(form["challenge_type"], responder) { return reply }
            let offered = Self.spaceSeparated(form["challenge_type"])
            let token: String
            let flow: NativeContinuation
            switch s.native.validate(form["continuation_token"], clientID: clientID, responder) {
            case .success(let found): (token, flow) = found
            case .failure(let failure): return failure.reply
            }
            guard var user = s.native.users[flow.userKey] else {
                return responder.error("user_not_found", [50034], "The user account does not exist in the directory.")
            }
            switch user.kind {
            case .otp where offered.contains("oob"):
                let code = Self.makeCode(length: s.native.codeLength, differentFrom: user.lastCode)
                user.lastCode = code
                user.codesSent += 1
                s.native.users[flow.userKey] = user
                s.native.continuations[token]?.spent = true
                let next = s.native.issue(
                    NativeContinuation(
                        userKey: flow.userKey, clientID: clientID, stage: .codeSent(code: code), issuedAt: responder.now
                    )
                )
                return responder.ok([
                    ("continuation_token", .string(next)),
                    ("challenge_type", .string("oob")),
                    ("binding_method", .string("prompt")),
                    ("challenge_channel", .string("email")),
                    ("challenge_target_label", .string(Self.maskedEmail(user.username))),
                    ("code_length", .int(code.count)),
                    ("interval", .int(300)),
                ])
            case .password where offered.contains("password"):
                s.native.continuations[token]?.spent = true
                let next = s.native.issue(
                    NativeContinuation(
                        userKey: flow.userKey, clientID: clientID, stage: .passwordRequired, issuedAt: responder.now
                    )
                )
                return responder.ok([
                    ("continuation_token", .string(next)),
                    ("challenge_type", .string("password")),
                ])
            default:
                return responder.redirect("None of the offered challenge types can be used for this user.")
            }
        }
    }

    private func nativeToken(_ form: [String: String], _ responder: NativeResponder) -> TokenOutcome {
        state.withLock { s -> TokenOutcome in
            let clientID: String
            switch Self.nativeClient(form, s.clients, responder) {
            case .success(let id): clientID = id
            case .failure(let failure): return .reply(failure.reply)
            }
            // MSAL sends `challenge_type` on the password grant but not on the oob grant.
            if form["challenge_type"] != nil, let reply = Self.checkChallengeTypes(form["challenge_type"], responder) {
                return .reply(reply)
            }
            guard let grantType = form["grant_type"] else { return .reply(responder.missing("grant_type")) }
            guard grantType == "oob" || grantType == "password" else {
                return .reply(
                    responder.error(
                        "unsupported_grant_type", [70003], "The app requested an unsupported grant type '\(grantType)'."
                    )
                )
            }
            let token: String
            let flow: NativeContinuation
            switch s.native.validate(form["continuation_token"], clientID: clientID, responder) {
            case .success(let found): (token, flow) = found
            case .failure(let failure): return .reply(failure.reply)
            }
            guard let user = s.native.users[flow.userKey] else {
                return .reply(
                    responder.error("user_not_found", [50034], "The user account does not exist in the directory.")
                )
            }
            if let username = form["username"], NativeAuthState.key(username) != flow.userKey {
                return .reply(responder.invalidContinuationToken("it belongs to another user"))
            }
            guard let scope = form["scope"] else { return .reply(responder.missing("scope")) }

            if grantType == "oob" {
                guard case .codeSent(let code) = flow.stage else {
                    return .reply(responder.invalidContinuationToken("no one-time code was sent in this flow"))
                }
                guard let submitted = form["oob"] else { return .reply(responder.missing("oob")) }
                guard flow.failedCodeAttempts < s.native.maxAttempts else {
                    return .reply(
                        responder.error(
                            "invalid_grant", [50053], "Too many incorrect one-time codes were submitted in this flow."
                        )
                    )
                }
                guard submitted == code else {
                    s.native.continuations[token]?.failedCodeAttempts += 1
                    return .reply(
                        responder.error(
                            "invalid_grant", [50181], "Unable to validate the otp.", suberror: "invalid_oob_value"
                        )
                    )
                }
            } else {
                guard case .passwordRequired = flow.stage, case .password(let expected) = user.kind else {
                    return .reply(responder.invalidContinuationToken("no password challenge was issued in this flow"))
                }
                guard let password = form["password"] else { return .reply(responder.missing("password")) }
                guard password == expected else {
                    return .reply(
                        responder.error(
                            "invalid_grant", [50126], "Error validating credentials due to invalid username or password."
                        )
                    )
                }
            }
            s.native.continuations[token]?.spent = true
            return .sign(s.issueNativeTokens(user: user, clientID: clientID, scope: scope, responder: responder))
        }
    }

    // MARK: Checks

    /// The registered client named by `client_id` (any registered client; a secret is not needed).
    private static func nativeClient(
        _ form: [String: String],
        _ clients: [String: ClientRecord],
        _ responder: NativeResponder
    ) -> Result<String, NativeFailure> {
        guard let clientID = form["client_id"] else { return .failure(NativeFailure(responder.missing("client_id"))) }
        guard clients[clientID] != nil else {
            return .failure(
                NativeFailure(
                    responder.error(
                        "unauthorized_client", [700016],
                        "Application with identifier '\(clientID)' was not found in the directory."
                    )
                )
            )
        }
        return .success(clientID)
    }

    /// The items of a space-separated list (`challenge_type`, `scope`).
    static func spaceSeparated(_ value: String?) -> [String] {
        (value ?? "").split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
    }

    /// `redirect` must be in every `challenge_type` list (AADSTS901007).
    private static func checkChallengeTypes(_ value: String?, _ responder: NativeResponder) -> IssuerReply? {
        guard spaceSeparated(value).contains("redirect") else {
            return responder.error(
                "invalid_request", [901007], "The challenge_type list parameter must include 'redirect'."
            )
        }
        return nil
    }

    /// `length` random decimal digits, never equal to `previous` (so a resend always changes the code).
    static func makeCode(length: Int, differentFrom previous: String?) -> String {
        var generator = SystemRandomNumberGenerator()
        while true {
            let code = String((0..<max(1, length)).map { _ in Character(String(Int.random(in: 0...9, using: &generator))) })
            if code != previous { return code }
        }
    }

    /// `ada@example.org` → `a**@example.org`.
    static func maskedEmail(_ email: String) -> String {
        guard let at = email.lastIndex(of: "@"), at != email.startIndex else {
            return String(email.prefix(1)) + "***"
        }
        let local = email[..<at]
        return String(local.prefix(1)) + String(repeating: "*", count: max(1, local.count - 1)) + String(email[at...])
    }
}

/// An error reply as a `Result` failure.
struct NativeFailure: Error {
    let reply: IssuerReply
    init(_ reply: IssuerReply) { self.reply = reply }
}

extension NativeAuthState {
    /// Stores `continuation` under a new random token and returns the token.
    mutating func issue(_ continuation: NativeContinuation) -> String {
        let token = RandomToken.make(prefix: "ct-", byteCount: 32)
        continuations[token] = continuation
        return token
    }

    /// The live continuation named by `token`, or the error reply for a missing, unknown,
    /// expired, spent or foreign one.
    func validate(
        _ token: String?,
        clientID: String,
        _ responder: NativeResponder
    ) -> Result<(String, NativeContinuation), NativeFailure> {
        guard let token else { return .failure(NativeFailure(responder.missing("continuation_token"))) }
        guard let flow = continuations[token] else {
            return .failure(NativeFailure(responder.invalidContinuationToken("unknown token")))
        }
        if flow.expired || responder.now - flow.issuedAt > Double(continuationTokenLifetime) {
            return .failure(
                NativeFailure(responder.error("expired_token", [552003], "The continuation_token has expired."))
            )
        }
        if flow.spent {
            return .failure(NativeFailure(responder.invalidContinuationToken("it was already used or superseded")))
        }
        if flow.clientID != clientID {
            return .failure(NativeFailure(responder.invalidContinuationToken("it was issued to another client")))
        }
        return .success((token, flow))
    }
}

extension IssuerState {
    /// Records an access token (and a refresh token if `offline_access` was requested) for `user`
    /// and returns the token response, with an ID token if `openid` was requested.
    mutating func issueNativeTokens(
        user: NativeUserRecord,
        clientID: String,
        scope: String,
        responder: NativeResponder
    ) -> PendingTokenResponse {
        let scopes = IssuerCore.spaceSeparated(scope)
        let now = responder.now
        let lifetime = accessTokenLifetime
        let accessToken = RandomToken.make(prefix: "at-")
        accessTokens[accessToken] = AccessRecord(
            subject: user.username,
            email: user.username,
            expiresAt: now + Double(lifetime)
        )
        issuedAccessTokens += 1

        var fields: [(String, JSONValue)] = [
            ("token_type", .string(tokenTypeSpelling)),
            ("scope", .string(scopes.joined(separator: " "))),
        ]
        if includeExpiresIn {
            fields += [("expires_in", expiresInOverride.map { .raw($0) } ?? .int(lifetime)), ("ext_expires_in", .int(lifetime))]
        }
        fields.append(("access_token", .string(accessToken)))
        if scopes.contains("offline_access") {
            let refreshToken = RandomToken.make(prefix: "rt-")
            refreshTokens[refreshToken] = RefreshRecord(
                subject: user.username,
                email: user.username,
                scope: scopes,
                clientID: clientID,
                family: RandomToken.make(prefix: "fam-", byteCount: 8),
                status: .active
            )
            fields.append(("refresh_token", .string(refreshToken)))
        }
        let clientInfo: JSONValue = .object([
            ("uid", .string(user.objectID)),
            ("utid", .string(NativeAuthState.tenantID)),
        ])
        fields.append(("client_info", .string(Self.base64URL(clientInfo.bytes))))

        var claims: IDTokenClaims?
        if scopes.contains("openid") {
            let issuedAt = Int(now)
            claims = IDTokenClaims(
                iss: idTokenIssuerOverride ?? issuer,
                sub: user.username,
                aud: idTokenAudienceOverride ?? clientID,
                exp: issuedAt + lifetime,
                iat: issuedAt,
                email: user.username,
                preferredUsername: user.username,
                nonce: nil
            )
        }
        var pending = PendingTokenResponse(
            fields: fields,
            claims: claims,
            signingKey: signWithUnknownKey ? unknownKey : signingKey
        )
        pending.extraHeaders = responder.clientRequestID.map { [("client-request-id", $0)] } ?? []
        return pending
    }

    static func base64URL(_ bytes: [UInt8]) -> String {
        String(
            Data(bytes).base64EncodedString().compactMap { c -> Character? in
                switch c {
                case "+": "-"
                case "/": "_"
                case "=": nil
                default: c
                }
            }
        )
    }
}
