import VaultOIDC
import VaultProtocol
import VaultStore

// Failures become wire errors here: the daemon's, then the sign-in slice's.
// The errors that recur are built once; the store's and the issuers' errors
// are mapped once. VaultStore and VaultOIDC say what happened; only this
// layer adds what to run next, as every message a person reads ends with the
// next step (docs/protocol.md: Error codes).

extension VaultError {
    /// A passphrase vault before `unlock`, or any vault after `lock`.
    static let vaultLocked = VaultError(.locked, "the vault is locked; unlock it with: vaultctl unlock")

    /// What to do when the keyring cannot be reached, here and in `status`.
    static let keyringRemedy = "log in to the desktop session, then run: vaultctl unlock --no-passphrase"

    /// Still `locked`, as the remedy is the same: make the secrets reachable,
    /// then unlock.
    static func keyringUnreachable(_ reason: String) -> VaultError {
        VaultError(.locked, "the secrets are in the desktop keyring, which vaultd cannot reach (\(reason)); \(Self.keyringRemedy)")
    }

    static func unknownAccount(_ name: String) -> VaultError {
        VaultError(.unknownAccount, "there is no account named '\(name)'; see: vaultctl account list")
    }

    static func notSignedIn(_ name: String) -> VaultError {
        VaultError(.notSignedIn, "'\(name)' is not signed in; sign in with: vaultctl signin \(name)")
    }

    /// A refresh or sign-in whose account was signed out (or locked, or
    /// signed in anew) while it ran.
    static func signedOutMeanwhile(_ name: String) -> VaultError {
        VaultError(.notSignedIn, "'\(name)' was signed out meanwhile; sign in again with: vaultctl signin \(name)")
    }

    static func reauthRequired(_ name: String) -> VaultError {
        VaultError(
            .reauthRequired,
            "the issuer rejected the refresh token for '\(name)'; sign in again with: vaultctl signin \(name)"
        )
    }

    static func forbidden(_ name: String) -> VaultError {
        VaultError(.forbidden, "this program may not use '\(name)'; the account's allowed_clients (in accounts.json) name the programs that may")
    }

    // MARK: What a share refuses (the gate, Gate.swift)

    /// An account outside the share, or no longer the account shared: the
    /// same words whether it exists or not, so a share reveals no names.
    static func notShared(_ name: String) -> VaultError {
        VaultError(.forbidden, "this shared socket does not serve '\(name)'")
    }

    static func refreshTokenNotReleased(_ name: String) -> VaultError {
        VaultError(.forbidden, "'\(name)' does not release its refresh token; its release_refresh_token is off")
    }

    static func refreshTokenNotForThisProgram(_ name: String) -> VaultError {
        VaultError(.forbidden, "'\(name)' releases its refresh token only to the programs in its allowed_clients")
    }

    static let shareServesOnly = VaultError(
        .forbidden,
        "a shared socket serves only hello, status, token and subscribe (and dpop.proof and dpop.nonce when shared with --dpop)"
    )

    static let shareMakesNoProofs = VaultError(
        .forbidden,
        "this shared socket makes no DPoP proofs; share the account with: vaultctl share ACCOUNT --socket PATH --dpop"
    )

    static let shareCannotForceRefresh = VaultError(
        .forbidden,
        "a shared socket cannot force a refresh; ask again without force_refresh (the vault refreshes before a token expires)"
    )

    static let shareExpired = VaultError(.forbidden, "this share has expired; the user can open another with: vaultctl share")

    static func tooManyShareScopeSets(_ name: String, _ maximum: Int) -> VaultError {
        VaultError(
            .forbidden,
            "this share has asked '\(name)' for \(maximum) scope sets already, each a refresh at the issuer; ask for one of those, or for none (all the share's scopes)"
        )
    }

    static func beyondShareScopes(_ granted: [String]) -> VaultError {
        VaultError(.forbidden, "this share serves only the scopes \(granted.joined(separator: " "))")
    }

    /// The issuer's `scope` is not repeated: it is the issuer's text, of any length.
    static func widerThanShared(_ name: String, granted: [String]) -> VaultError {
        VaultError(
            .forbidden,
            "the issuer answered '\(name)' with scopes wider than this share grants (\(granted.joined(separator: " "))), "
                + "so the token is withheld; share a scope set the issuer keeps to"
        )
    }

    static func idpUnavailable(_ name: String, reason: String, retryAfter: Double) -> VaultError {
        let milliseconds = Seconds.milliseconds(retryAfter)
        return VaultError(
            .idpUnavailable,
            "the issuer of '\(name)' cannot be reached (\(reason)); try again in \((milliseconds + 999) / 1000) s",
            retryAfterMs: milliseconds
        )
    }

    /// The issuer rotated the refresh token and the write of the new one
    /// failed: the store's failure, with the account's state.
    static func rotatedNotSaved(_ name: String, _ error: StoreError) -> VaultError {
        var wire = VaultError(error)
        wire.message = "the issuer rotated the refresh token for '\(name)'; vaultd keeps the new one in memory and writes it at the next "
            + "chance, but writing it failed: " + wire.message
        return wire
    }

    static let cancelled = VaultError(.internalError, "the request was cancelled: its connection closed")

    static let outOfGuardedMemory = VaultError(.internalError, "could not allocate guarded memory for the refresh token")

    static func noIDTokenYet(_ name: String) -> VaultError {
        VaultError(.notSignedIn, "the issuer has sent no ID token for '\(name)' yet; ask for a token first")
    }

    // MARK: DPoP

    static let proofNotMade = VaultError(.internalError, "vaultd could not make a DPoP proof (out of guarded memory)")

    static func notDPoPBound(_ name: String) -> VaultError {
        VaultError(
            .badRequest,
            "'\(name)' holds bearer tokens, not DPoP-bound ones: use vaultctl token \(name), "
                + "or set its dpop to auto or required and sign in again"
        )
    }

    /// `dpop` is `required`, and the issuer's discovery offers no algorithm vaultd makes keys for.
    static func dpopNotOffered(_ name: String) -> VaultError {
        VaultError(
            .idpError,
            "'\(name)' requires DPoP, and its issuer offers neither EdDSA nor ES256 proofs (dpop_signing_alg_values_supported); "
                + "enable DPoP with one of them at the issuer, or set the account's dpop to auto",
            error: "dpop_unsupported"
        )
    }

    /// `dpop` is `required`, and the issuer answered with bearer tokens.
    static func dpopNotBound(_ name: String) -> VaultError {
        VaultError(
            .idpError,
            "'\(name)' requires DPoP, and its issuer answered with bearer tokens, which were revoked; "
                + "enable DPoP for the client at the issuer, or set the account's dpop to auto",
            error: "dpop_not_bound"
        )
    }

    static func noRefreshToken(_ name: String) -> VaultError {
        VaultError(
            .idpError,
            "the issuer of '\(name)' sent no refresh token; add the offline_access scope to the account",
            error: "no_refresh_token"
        )
    }

    static func signedOutNotWiped(_ name: String, _ failures: [String]) -> VaultError {
        VaultError(.internalError, "'\(name)' is signed out, but \(failures.joined(separator: "; "))")
    }

    // MARK: Accounts and their configuration (AccountValidation, AccountDirectory)

    static func clientIDRequired(_ issuer: String) -> VaultError {
        VaultError(
            .clientIDRequired,
            "\(issuer.escaped(for: .terminal)) registers no clients (its discovery names no registration_endpoint); give the client id its admin made: vaultctl account add NAME --issuer URL --client-id ID"
        )
    }

    /// The issuer would not register a client for `name` (RFC 7591 §3.2.2).
    static func registrationRefused(_ error: ProviderError, account name: String) -> VaultError {
        guard case .rejected(let code, let description) = error else { return VaultError(error, account: name) }
        let because = description.map { " (\($0))" } ?? ""
        let remedy = code == "invalid_token"
            ? "give the initial access token its admin made: vaultctl account add \(name) --issuer URL --registration-token < token.txt"
            : "or give the client id its admin made: vaultctl account add \(name) --issuer URL --client-id ID"
        return VaultError(
            .idpError,
            "the issuer refused to register a client for '\(name)': \(code)\(because); \(remedy)",
            error: code,
            errorDescription: description
        )
    }

    static let noRedirectPort = VaultError(.internalError, "no port of 127.0.0.1 is free for the client's redirect URI")

    static func accountExists(_ name: String) -> VaultError {
        VaultError(.badRequest, "an account named '\(name)' exists; remove it first with: vaultctl account remove \(name)")
    }

    static let invalidIdentity = VaultError(.badRequest, "an account's 'identity' is at most 64 printable characters")
    static let invalidAccountName = VaultError(
        .badRequest,
        "an account name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
    )
    static let invalidClientID = VaultError(.badRequest, "'client_id' must be a non-empty string")
    static let invalidScopes = VaultError(.badRequest, "each scope is one non-empty word without spaces")
    static let invalidAllowedClients = VaultError(.badRequest, "'allowed_clients' lists absolute executable paths")
    static let invalidRefreshAhead = VaultError(
        .badRequest,
        "'refresh_ahead' is a percentage of a token's lifetime from 10 to 100 (100: refresh only at expiry)"
    )
    static let invalidRedirectURI = VaultError(
        .badRequest,
        "'redirect_uri' must be a loopback URI with a port, like http://127.0.0.1:8400/callback or http://[::1]:8400/callback"
    )
    static let invalidIssuerURL = VaultError(.badRequest, "'issuer' must be an absolute URL without query or fragment")
    static let insecureIssuer = VaultError(
        .badRequest,
        "'issuer' must use https (plain http only on 127.0.0.1 or [::1]; not localhost, a name another local user may answer for)"
    )

    /// An account in accounts.json that account.add would refuse: what a neighbour may have written.
    static func refusedLoadedAccount(_ file: String, _ error: VaultError) -> VaultError {
        VaultError(.internalError, "\(file) holds an account vaultd refuses: \(error.message); fix or remove it, then start vaultd again")
    }

    static func accountsFileVersion(_ path: String, _ version: Int) -> VaultError {
        VaultError(.internalError, "\(path) has version \(version); this vaultd reads version 1")
    }

    static func accountsFileInvalid(_ path: String) -> VaultError {
        VaultError(.internalError, "\(path) is not valid account configuration; fix or move it")
    }

    static let accountsNotEncoded = VaultError(.internalError, "could not encode the account configuration")
    static let ioStopped = VaultError(.internalError, "the I/O thread pool has stopped")

    static func noHome(_ variable: String) -> VaultError {
        VaultError(.badRequest, "neither \(variable) nor HOME is set")
    }

    // MARK: Migration

    static func backendUnavailable(_ backend: Backend) -> VaultError {
        VaultError(
            .badRequest,
            "the \(backend) backend is not available to this vaultd\(backend == .keyring ? "; run it in a desktop session with a Secret Service" : "")"
        )
    }

    static func migratedMeanwhile(to backend: Backend) -> VaultError {
        VaultError(.badRequest, "another migration moved the secrets to \(backend.rawValue) meanwhile")
    }

    static func migrationStopped(at account: String, _ error: StoreError, to target: Backend, from source: Backend) -> VaultError {
        VaultError(
            .internalError,
            "migration stopped at '\(account)' (\(error.message)); accounts before it are in \(target.rawValue), the rest are still in \(source.rawValue); "
                + "once the cause is fixed, run the same vaultctl migrate again"
        )
    }

    // MARK: Shares

    static func shareExists(_ socket: String) -> VaultError {
        VaultError(.badRequest, "a share already serves \(socket); close it with: vaultctl unshare \(socket)")
    }

    static func tooManyShares(_ maximum: Int) -> VaultError {
        VaultError(.overloaded, "vaultd serves \(maximum) shares already; close one with: vaultctl unshare ID")
    }

    static func shareNotOpened(_ error: any Error) -> VaultError {
        VaultError(.badRequest, "cannot open the share's socket: \(error)")
    }

    static let noSuchShare = VaultError(.badRequest, "there is no such share; see: vaultctl share --list")

    /// The message names no path vaultd made up: its working directory is not the client's business.
    static let relativeSharePath = VaultError(.badRequest, "'socket' must be an absolute path, like $XDG_RUNTIME_DIR/tokenvault/share.sock")
    static let dottedSharePath = VaultError(.badRequest, "'socket' must name a socket file without '.' or '..' in its path")

    /// A store's failure, with what to do about it.
    init(_ error: StoreError) {
        switch error.kind {
        case .locked:
            self.init(.locked, "\(error.message); unlock it with: vaultctl unlock")
        case .wrongKey:
            self.init(.invalidCredentials, "\(error.message); try again with: vaultctl unlock")
        case .corrupt, .foreign:
            self.init(.internalError, "\(error.message); vaultd left it untouched: restore it from a backup, or move it away and sign in again")
        case .keySource:
            self.init(.internalError, "\(error.message); see the key sources in: vaultd --help")
        case .io, .unavailable:
            self.init(.internalError, "\(error.message); see vaultd's log: journalctl --user -u vaultd")
        case .noSpace:
            self.init(.storageFull, "\(error.message); free space on that file system (see: df -h), then run: vaultctl status")
        case .denied:
            self.init(
                .storageDenied,
                "\(error.message); make that folder and file yours and writable (see: ls -ld), then run: vaultctl status"
            )
        }
    }

    /// An issuer's answer to a call made for `name`, with what to do about it.
    init(_ error: ProviderError, account name: String) {
        switch error {
        case .invalidGrant:
            self = .reauthRequired(name)
        case .unavailable(let reason, let retryAfter):
            self = .idpUnavailable(name, reason: reason, retryAfter: Double(retryAfter ?? 1))
        case .rejected("unsupported", let description):
            // A grant or endpoint the issuer does not have (no device endpoint, no revocation).
            self.init(
                .idpError,
                "the issuer of '\(name)' does not offer this (\(description ?? "it has no endpoint for it")); "
                    + "sign in another way: vaultctl signin \(name) with --browser, --device or --password",
                error: "unsupported",
                errorDescription: description
            )
        case .rejected(let code, let description):
            // The issuer's own words say why; the code alone rarely does
            // (VaultOIDC keeps them to 200 printable characters).
            let because = description.map { " (\($0))" } ?? ""
            self.init(
                .idpError,
                "the issuer of '\(name)' refused: \(code)\(because); check the account's client and scopes in accounts.json, "
                    + "or sign in again with: vaultctl signin \(name)",
                error: code,
                errorDescription: description
            )
        case .untrusted(let reason):
            self.init(
                .idpError,
                "the issuer of '\(name)' sent an answer tokenvault does not trust: \(reason); nothing was kept",
                error: "untrusted_response"
            )
        }
    }
}

// MARK: - Sign-in

/// Every wire error the sign-in slice answers with, and how the issuer's
/// refusals during a sign-in become wire errors (docs/protocol.md: Sign-in,
/// Error codes). Issuer failures outside sign-in map in `VaultError.init(_:account:)`.
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
        VaultError(error, account: name)
    }

    static func nativeCannotBindKey(account name: String) -> VaultError {
        VaultError(
            .idpError,
            "'\(name)' requires DPoP, which email sign-in does not bind here; sign in with --browser, --device or --password",
            error: "dpop_not_bound"
        )
    }

    static func noCodes(account name: String) -> VaultError {
        VaultError(
            .idpError,
            "the issuer of '\(name)' does not send sign-in codes (it has no native authentication); sign in with --browser or --device",
            error: "unsupported"
        )
    }

    static func outOfTurn(account name: String) -> VaultError {
        VaultError(
            .idpError,
            "the issuer of '\(name)' answered the sign-in out of turn; start again with: vaultctl signin \(name)",
            error: "unexpected_response"
        )
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
            return VaultError(provider, account: name)
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
                    // The issuer's reason; `browser_required` is a sign-in step, never an error.
                    error: suberror
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
                return VaultError(
                    .idpError,
                    "the issuer of '\(name)' refused the sign-in: \(error); try another way: vaultctl signin \(name) --browser",
                    error: error,
                    errorDescription: suberror
                )
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
            return VaultError(error, account: name)
        }
    }

    /// The `error` the browser came back with (RFC 6749 §4.1.2.1), cleaned of anything but a name.
    static func browserRefusal(_ raw: String, account name: String) -> VaultError {
        let clean = String(raw.unicodeScalars.filter { $0.properties.isAlphabetic || $0 == "_" }.map(Character.init).prefix(64))
        return clean == "access_denied"
            ? VaultError(.idpError, "sign-in was declined in the browser; to try again: vaultctl signin \(name)", error: "access_denied")
            : VaultError(
                .idpError,
                "the issuer of '\(name)' refused the sign-in: \(clean); check the account's client and scopes, then: vaultctl signin \(name)",
                error: clean
            )
    }

    static let browserWithoutCode = VaultError(.idpError, "the browser came back without a code", error: "invalid_request")

    /// A device poll's answer that ends the flow (the ones that poll again are `DevicePolling`'s).
    static func devicePoll(_ error: ProviderError, account name: String) -> VaultError {
        switch error {
        case .rejected(error: "access_denied", _), .rejected(error: "authorization_declined", _):
            return VaultError(.idpError, "sign-in was declined on the other device; to try again: vaultctl signin \(name) --device", error: "access_denied")
        case .rejected(error: "expired_token", _):
            return VaultError(.codeExpired, "the device code expired; start again with: vaultctl signin \(name) --device")
        default:
            return VaultError(error, account: name)
        }
    }
}
