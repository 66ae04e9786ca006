public import VaultCrypto

/// How `signin.start` signs a user in.
public enum SignInMethod: String, Codable, Sendable, CaseIterable {
    /// A one-time passcode sent by email (native authentication).
    case emailOTP = "email_otp"
    /// Username and password: native authentication where the issuer speaks
    /// it, else the resource-owner password grant.
    case password
    /// Authorization code with PKCE in the user's browser, loopback redirect.
    case browser
    /// The device authorization grant (RFC 8628), for machines with no browser.
    case device
}

/// `signin.start`'s request fields.
public struct SignInStart: Sendable {
    public var account: String
    public var method: SignInMethod
    public var username: String?
    public var password: SecretBytes?
    /// End the account's sign-in in progress and start this one; without
    /// it, a start for an account with a live flow joins that flow when it
    /// is the same sign-in, and is refused when it is another.
    public var restart: Bool

    public init(account: String, method: SignInMethod, username: String? = nil, password: SecretBytes? = nil, restart: Bool = false) {
        self.account = account
        self.method = method
        self.username = username
        self.password = password
        self.restart = restart
    }
}

/// Where a sign-in flow stands: the wire's `state`.
public enum SignInState: String, Codable, Sendable {
    /// A code was sent; submit it with `signin.submit_code`.
    case codeRequired = "code_required"
    /// Submit the password with `signin.submit_password`.
    case passwordRequired = "password_required"
    /// Open `url` in a browser, then `signin.wait`.
    case openBrowser = "open_browser"
    /// Enter `user_code` at `verification_uri`, then `signin.wait`.
    case deviceCode = "device_code"
    /// Done: the account holds a fresh refresh token.
    case signedIn = "signed_in"
    /// The issuer wants this user in a browser: start again with `method: browser`.
    case browserRequired = "browser_required"
}

/// The reply to every `signin.*` operation but `cancel`: the flow and its state's fields.
public struct SignInResult: ResultPayload, Equatable {
    public var flow: String
    public var state: SignInState
    public var account: String
    public var method: SignInMethod
    /// `signed_in`: who, from the validated ID token.
    public var username: String?
    /// `code_required`: the masked address, the channel, the code's length.
    public var sentTo: String?
    public var channel: String?
    public var codeLength: Int?
    /// `code_required`: wrong codes still allowed before the flow ends.
    public var attemptsLeft: Int?
    /// `open_browser`: the authorization request to open.
    public var url: String?
    /// `device_code`: what the user enters, and where.
    public var verificationURI: String?
    public var verificationURIComplete: String?
    public var userCode: String?
    public var interval: Int?
    /// Seconds until the flow ends by itself.
    public var expiresIn: Int?
    /// `browser_required`: the issuer's reason, when it gave one.
    public var reason: String?
    /// True when this `signin.start` joined a sign-in already in progress
    /// (another program started it: its browser is open, its code was sent).
    public var joined: Bool?

    public init(flow: String, state: SignInState, account: String, method: SignInMethod) {
        self.flow = flow
        self.state = state
        self.account = account
        self.method = method
    }

    enum CodingKeys: String, CodingKey {
        case flow, state, account, method, username, channel, interval, url, reason, joined
        case sentTo = "sent_to"
        case codeLength = "code_length"
        case attemptsLeft = "attempts_left"
        case verificationURI = "verification_uri"
        case verificationURIComplete = "verification_uri_complete"
        case userCode = "user_code"
        case expiresIn = "expires_in"
    }
}

/// `subscribe`: which accounts the connection now hears about (nil: all).
public struct SubscribeResult: ResultPayload, Equatable {
    public var accounts: [String]?

    public init(accounts: [String]?) {
        self.accounts = accounts
    }
}

/// One event line after `subscribe`: `{"event":…,"account":…,…}`, with no
/// `id` and no `ok`. It never carries a token, a code or a password.
public struct Event: Codable, Sendable, Equatable {
    public var event: Name
    public var account: String
    /// `signin`: the flow, its method and the step it reached.
    public var flow: String?
    public var method: SignInMethod?
    public var step: SignInStep?
    /// `signin` at `error`: the error's code.
    public var code: ErrorCode?
    /// `signed_in`: who.
    public var username: String?
    /// `token_refreshed`: when the new access token expires (Unix seconds).
    public var expiresAt: Int64?

    public init(_ event: Name, account: String) {
        self.event = event
        self.account = account
    }

    public struct Name: RawRepresentable, Hashable, Codable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public init(from decoder: any Decoder) throws {
            self.rawValue = try decoder.singleValueContainer().decode(String.self)
        }
        public func encode(to encoder: any Encoder) throws {
            var c = encoder.singleValueContainer()
            try c.encode(self.rawValue)
        }
        public var description: String { self.rawValue }

        /// A sign-in flow moved (see ``SignInStep``).
        public static let signin = Name(rawValue: "signin")
        public static let signedIn = Name(rawValue: "signed_in")
        public static let tokenRefreshed = Name(rawValue: "token_refreshed")
        public static let reauthRequired = Name(rawValue: "reauth_required")
        public static let signedOut = Name(rawValue: "signed_out")
    }

    enum CodingKeys: String, CodingKey {
        case event, account, flow, method, step, code, username
        case expiresAt = "expires_at"
    }
}

/// The steps of a sign-in as a companion shows them, after Privy's
/// `OtpFlowState`: every transition of a flow is one `signin` event.
public enum SignInStep: String, Codable, Sendable {
    case sendingCode = "sending_code"
    case awaitingCode = "awaiting_code"
    case submitting
    case incorrectCode = "incorrect_code"
    case awaitingPassword = "awaiting_password"
    case awaitingBrowser = "awaiting_browser"
    case awaitingDevice = "awaiting_device"
    case browserRequired = "browser_required"
    case done
    case error
    case cancelled
}
