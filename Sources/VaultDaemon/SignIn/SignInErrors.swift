import VaultOIDC
import VaultProtocol

/// Every wire error the sign-in slice answers with, and how the issuer's
/// refusals during a sign-in become wire errors (docs/protocol.md: Sign-in,
/// Error codes). Issuer failures outside sign-in map in `Broker.wire`.
enum SignInError {
    // MARK: The request

    static func needsUsername(_ method: SignInMethod) -> VaultError {
        VaultError(.badRequest, "signing in with \(method.rawValue) needs a 'username' (the email address)")
    }

    static let needsEmailAddress = VaultError(.badRequest, "an email code needs an email address as 'username'")

    static func inProgress(_ method: SignInMethod, account name: String, flow id: String) -> VaultError {
        VaultError(
            .badRequest,
            "a \(method.rawValue) sign-in of '\(name)' is in progress (flow \(id)); finish or cancel it, or start over with: vaultctl signin \(name) --restart"
        )
    }

    static let tooManyFlows = VaultError(.overloaded, "too many sign-ins are in progress; finish or cancel one first")

    static func busy(_ id: String) -> VaultError {
        VaultError(.badRequest, "a request for sign-in \(id) is in progress; send the next step after its answer")
    }

    static func takesNoCode(_ id: String) -> VaultError { VaultError(.badRequest, "flow \(id) does not take a code") }
    static func noCodeToResend(_ id: String) -> VaultError { VaultError(.badRequest, "flow \(id) has no code to send again") }
    static func takesNoPassword(_ id: String) -> VaultError { VaultError(.badRequest, "flow \(id) does not take a password") }

    // MARK: The flow

    static func noSuchFlow(_ id: String) -> VaultError {
        VaultError(.flowNotFound, "there is no sign-in \(id); it ended or expired; start again with: vaultctl signin")
    }

    static let cancelled = VaultError(.flowNotFound, "this sign-in was cancelled")
    static let endedBeforeReady = VaultError(.flowNotFound, "the sign-in in progress ended before it was ready; start again")

    static func endedWhileWaiting(_ id: String) -> VaultError {
        VaultError(.flowNotFound, "sign-in \(id) ended while waiting; start again")
    }

    static func expired(account name: String) -> VaultError {
        VaultError(.codeExpired, "the sign-in took too long and expired; start again with: vaultctl signin \(name)")
    }

    static func listener(_ error: any Error) -> VaultError { VaultError(.internalError, "\(error)") }

    // MARK: Codes and passwords

    static func malformedCode(length: Int, attemptsLeft: Int) -> VaultError {
        VaultError(.invalidCode, "the code is \(length) digits; \(attemptsLeft) attempts left", attemptsLeft: attemptsLeft)
    }

    static func wrongCode(attemptsLeft left: Int) -> VaultError {
        VaultError(.invalidCode, "that code is not right; \(left) attempt\(left == 1 ? "" : "s") left", attemptsLeft: left)
    }

    static func tooManyWrongCodes(account name: String) -> VaultError {
        VaultError(.tooManyAttempts, "too many wrong codes; start again with: vaultctl signin \(name)")
    }

    static let noNewCode = VaultError(.idpError, "the issuer did not send a new code; try again", error: "unexpected_response")
    static let wrongPassword = VaultError(.invalidCredentials, "the issuer refused that username and password; try again")

    // MARK: The issuer's answers

    /// Any issuer failure, as everywhere in the daemon.
    static func issuer(_ error: ProviderError, account name: String) -> VaultError {
        Broker.wire(error, account: name)
    }

    static func noCodes(account name: String) -> VaultError {
        VaultError(
            .idpError,
            "the issuer of '\(name)' does not send sign-in codes (it has no native authentication); sign in with --browser or --device",
            error: "unsupported"
        )
    }

    static func outOfTurn(account name: String) -> VaultError {
        VaultError(.idpError, "the issuer of '\(name)' answered the sign-in out of turn", error: "unexpected_response")
    }

    enum NativeStage { case start, code, resend, password }

    /// Native authentication's refusals (docs/protocol.md: Sign-in, Error codes).
    static func native(_ error: NativeAuthError, account name: String, stage: NativeStage) -> VaultError {
        switch error {
        case .provider(let provider):
            if case .rejected(error: "unsupported", _) = provider {
                return VaultError(
                    .idpError,
                    "the issuer of '\(name)' does not offer native sign-in; sign in with --browser or --device",
                    error: "unsupported"
                )
            }
            return Broker.wire(provider, account: name)
        case .refused(let error, let suberror, let code):
            switch (error, suberror, code) {
            case ("user_not_found", _, _), ("invalid_grant", nil, 50034):
                return VaultError(.userNotFound, "the issuer of '\(name)' knows no such user; check the address")
            case ("expired_token", _, _), ("invalid_request", _, 55000), ("invalid_request", _, 55200):
                return VaultError(.codeExpired, "this sign-in expired; start again with: vaultctl signin \(name)")
            case ("invalid_grant", nil, 50126) where stage == .password:
                return Self.wrongPassword
            case ("invalid_grant", "mfa_required", _), ("invalid_grant", "registration_required", _):
                return VaultError(
                    .idpError,
                    "the issuer of '\(name)' asks for more than a code here; sign in with: vaultctl signin \(name) --browser",
                    error: "browser_required"
                )
            case ("invalid_grant", nil, _) where stage == .code:
                return VaultError(.tooManyAttempts, "the issuer will take no more codes for this sign-in; start again with: vaultctl signin \(name)")
            case ("invalid_client", _, _), ("unauthorized_client", _, _), ("unsupported_challenge_type", _, _),
                ("invalid_scope", _, _):
                return VaultError(
                    .idpError,
                    "the issuer of '\(name)' refused this client (\(error)); check the account's client_id and scopes",
                    error: error
                )
            default:
                return VaultError(.idpError, "the issuer of '\(name)' refused the sign-in: \(error)", error: error, errorDescription: suberror)
            }
        }
    }

    /// The password grant: a refusal of the credentials is a wrong password.
    static func passwordGrant(_ error: ProviderError, account name: String) -> VaultError {
        switch error {
        case .invalidGrant, .rejected(error: "http_400", _), .rejected(error: "http_401", _), .rejected(error: "http_403", _),
            .rejected(error: "invalid_credentials", _):
            return Self.wrongPassword
        default:
            return Broker.wire(error, account: name)
        }
    }

    /// The `error` the browser came back with (RFC 6749 §4.1.2.1), cleaned of anything but a name.
    static func browserRefusal(_ raw: String, account name: String) -> VaultError {
        let clean = String(raw.unicodeScalars.filter { $0.properties.isAlphabetic || $0 == "_" }.map(Character.init).prefix(64))
        return clean == "access_denied"
            ? VaultError(.idpError, "sign-in was declined in the browser", error: "access_denied")
            : VaultError(.idpError, "the issuer of '\(name)' refused the sign-in: \(clean)", error: clean)
    }

    static let browserWithoutCode = VaultError(.idpError, "the browser came back without a code", error: "invalid_request")

    /// A device poll's answer that ends the flow (the ones that poll again are `DevicePolling`'s).
    static func devicePoll(_ error: ProviderError, account name: String) -> VaultError {
        switch error {
        case .rejected(error: "access_denied", _), .rejected(error: "authorization_declined", _):
            return VaultError(.idpError, "sign-in was declined on the other device", error: "access_denied")
        case .rejected(error: "expired_token", _):
            return VaultError(.codeExpired, "the device code expired; start again with: vaultctl signin \(name) --device")
        default:
            return Broker.wire(error, account: name)
        }
    }
}
