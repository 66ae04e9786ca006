/// How `POST /token` answers, set with ``TestIssuer/setTokenBehaviour(_:)``.
///
/// A behaviour stays in effect until it is changed. Request counters
/// (``TestIssuer/refreshCount``, ``TestIssuer/lastClientAuthentication``,
/// ``TestIssuer/lastRequestedScope``) are updated on arrival whatever the behaviour.
/// Only `.normal`, `.delay` and `.gate` ever run the real grant logic (and so can
/// consume or rotate a refresh token); every other case answers without touching state.
public enum TokenBehaviour: Sendable, Equatable {
    /// Answer normally.
    case normal
    /// Answer normally after a delay (scheduled on the event loop, never blocking).
    case delay(milliseconds: Int)
    /// Never answer; the connection stays open until the client gives up or the issuer stops.
    case hang
    /// Answer with this status and raw body, e.g. `.status(503, body: "")`.
    /// The body is sent as `application/json` if it starts with `{`, else `text/plain`.
    case status(Int, body: String)
    /// `200` with the truncated body `{"access_token": `.
    case malformedJSON
    /// `400 {"error":"temporarily_unavailable","error_description":"..."}`.
    case temporarilyUnavailable
    /// `400 {"error":"invalid_grant","error_description":"..."}` (refresh token is left untouched).
    case invalidGrant
    /// `400` with an empty body (what Glewlwyd does for a revoked refresh token).
    case emptyBody400
    /// `429 {"error":"too_many_requests"}` with a `Retry-After: <seconds>` header.
    case tooManyRequests(retryAfterSeconds: Int)
    /// Close the connection (with an RST where possible) without answering.
    case resetConnection
    /// Hold every token request until ``TestIssuer/openGate()``, then answer them normally.
    case gate
}

/// What any one path answers instead of its normal answer, set with
/// ``TestIssuer/setFault(_:at:)``; it stays until cleared. The request is
/// still counted (``TestIssuer/requestCount(at:)``) but changes no state.
public enum EndpointFault: Sendable {
    /// This status, these headers and this raw body.
    case answer(status: Int, headers: [String: String] = [:], body: String)
    /// `200` with this body, its head at once and then one byte every `everyMilliseconds`.
    case trickle(body: String, everyMilliseconds: Int)

    /// A redirect to `location` (a 307 or 308 keeps the method and body).
    public static func redirect(_ status: Int = 307, to location: String) -> EndpointFault {
        .answer(status: status, headers: ["Location": location], body: "")
    }
}
