/// A wire error code. An open set of strings rather than an enum, so an older
/// client still decodes codes a newer daemon adds; clients branch on it and
/// never on `message`.
public struct ErrorCode: RawRepresentable, Hashable, Codable, Sendable, CustomStringConvertible {
    public let rawValue: String

    public init(rawValue: String) {
        self.rawValue = rawValue
    }

    public init(from decoder: any Decoder) throws {
        self.rawValue = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(self.rawValue)
    }

    public var description: String { self.rawValue }

    public static let badRequest = ErrorCode(rawValue: "bad_request")
    public static let unknownOp = ErrorCode(rawValue: "unknown_op")
    public static let lineTooLong = ErrorCode(rawValue: "line_too_long")
    public static let forbidden = ErrorCode(rawValue: "forbidden")
    public static let unknownAccount = ErrorCode(rawValue: "unknown_account")
    public static let notSignedIn = ErrorCode(rawValue: "not_signed_in")
    public static let reauthRequired = ErrorCode(rawValue: "reauth_required")
    public static let locked = ErrorCode(rawValue: "locked")
    /// Retryable; the error carries `retry_after_ms`.
    public static let idpUnavailable = ErrorCode(rawValue: "idp_unavailable")
    /// The issuer said no; the error carries its `error` and `error_description`.
    public static let idpError = ErrorCode(rawValue: "idp_error")
    public static let invalidCode = ErrorCode(rawValue: "invalid_code")
    public static let codeExpired = ErrorCode(rawValue: "code_expired")
    public static let tooManyAttempts = ErrorCode(rawValue: "too_many_attempts")
    public static let invalidCredentials = ErrorCode(rawValue: "invalid_credentials")
    public static let userNotFound = ErrorCode(rawValue: "user_not_found")
    public static let flowNotFound = ErrorCode(rawValue: "flow_not_found")
    public static let overloaded = ErrorCode(rawValue: "overloaded")
    public static let internalError = ErrorCode(rawValue: "internal")
    /// The vault could not be written: no space left where it lives.
    public static let storageFull = ErrorCode(rawValue: "storage_full")
    /// The vault could not be written: its file or folder is not writable.
    public static let storageDenied = ErrorCode(rawValue: "storage_denied")
    /// `account.add` without a `client_id`, at an issuer that offers no registration.
    public static let clientIDRequired = ErrorCode(rawValue: "client_id_required")
}

/// The only error that crosses the socket. `message` is a sentence for a
/// person saying what to do; it never holds token material or echoes input.
public struct VaultError: Error, Hashable, Codable, Sendable, CustomStringConvertible {
    public var code: ErrorCode
    public var message: String
    /// With `invalid_code`: tries left before the flow ends.
    public var attemptsLeft: Int?
    /// With `idp_unavailable`: when a retry may succeed.
    public var retryAfterMs: Int?
    /// With `idp_error`: the issuer's own `error` and `error_description`.
    public var error: String?
    public var errorDescription: String?

    public init(
        _ code: ErrorCode,
        _ message: String,
        attemptsLeft: Int? = nil,
        retryAfterMs: Int? = nil,
        error: String? = nil,
        errorDescription: String? = nil
    ) {
        self.code = code
        self.message = message
        self.attemptsLeft = attemptsLeft
        self.retryAfterMs = retryAfterMs
        self.error = error
        self.errorDescription = errorDescription
    }

    public var description: String { "\(self.code): \(self.message)" }

    enum CodingKeys: String, CodingKey {
        case code, message, error
        case attemptsLeft = "attempts_left"
        case retryAfterMs = "retry_after_ms"
        case errorDescription = "error_description"
    }
}
