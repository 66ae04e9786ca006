/// Why a call to the issuer did not give what was asked. Never carries a
/// token, a request body or the text of a lower-level error (which may
/// quote a body): only what the issuer said in its `error` fields.
public enum ProviderError: Error, Hashable, Sendable {
    /// The issuer rejected the refresh token (`invalid_grant`, or 400 with no body).
    case invalidGrant
    /// Could not reach the issuer, or it answered 5xx / 429 /
    /// `temporarily_unavailable` / something unreadable. Retry later.
    case unavailable(reason: String, retryAfterSeconds: Int?)
    /// The issuer refused with an OAuth error other than `invalid_grant`.
    case rejected(error: String, description: String?)
    /// The issuer's answer breaks the protocol in a way retrying won't fix
    /// (wrong issuer in discovery, an ID token that fails validation).
    case untrusted(reason: String)
}
