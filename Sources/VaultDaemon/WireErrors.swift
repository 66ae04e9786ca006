import VaultOIDC
import VaultProtocol
import VaultStore

// Failures become wire errors here. The errors that recur are built once; the
// store's and the issuers' errors are mapped once. VaultStore and VaultOIDC
// say what happened; only this layer adds what to run next, as every message
// a person reads ends with the next step (docs/protocol.md: Error codes).

extension VaultError {
    /// A passphrase vault before `unlock`, or any vault after `lock`.
    static let vaultLocked = VaultError(.locked, "the vault is locked; unlock it with: vaultctl unlock")

    /// Still `locked`, as the remedy is the same: make the secrets reachable,
    /// then unlock.
    static func keyringUnreachable(_ reason: String) -> VaultError {
        VaultError(
            .locked,
            "the secrets are in the desktop keyring, which vaultd cannot reach (\(reason)); "
                + "log in to the desktop session, then run: vaultctl unlock --no-passphrase"
        )
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

    static func idpUnavailable(_ name: String, reason: String, retryAfter: Double) -> VaultError {
        let milliseconds = Seconds.milliseconds(retryAfter)
        return VaultError(
            .idpUnavailable,
            "the issuer of '\(name)' cannot be reached (\(reason)); try again in \((milliseconds + 999) / 1000) s",
            retryAfterMs: milliseconds
        )
    }

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
            // The issuer's own words say why; the code alone rarely does.
            let because = description.map { " (\(String($0.prefix(200))))" } ?? ""
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
