public import VaultCrypto

/// One request line, decoded. `command` is already the typed operation, or
/// the error its line earned (unknown op, a missing or mistyped field); the
/// `id` survives either way so the error can be answered by id.
public struct Request: Sendable {
    public var id: RequestID?
    public var command: Result<Command, VaultError>

    public init(id: RequestID?, command: Command) {
        self.id = id
        self.command = .success(command)
    }
}

/// The operations of protocol version 1. The `op` strings live in `Op` only.
public enum Command: Sendable {
    case hello
    case status
    case accountAdd(AccountAddition)
    case accountRemove(name: String)
    case lock
    case unlock(passphrase: SecretBytes?)
    case token(TokenRequest)
    /// A DPoP proof for one request of a companion, with the access token it pairs with.
    case dpopProof(DPoPProofRequest)
    /// A resource server's nonce for the account's later proofs to `origin`.
    case dpopNonce(account: String, origin: String, nonce: String)
    case claims(account: String)
    case userinfo(account: String)
    case signinStart(SignInStart)
    case signinSubmitCode(flow: String, code: SecretBytes)
    case signinResendCode(flow: String)
    case signinSubmitPassword(flow: String, password: SecretBytes)
    case signinWait(flow: String, timeoutMs: Int?)
    case signinCancel(flow: String)
    case subscribe(accounts: [String]?)
    case signout(SignOutTarget)
    case refreshToken(account: String)
    /// Moves every account's secrets to the backend named `to` (`file` or `keyring`).
    case migrate(to: Backend)
    case shareOpen(ShareOpen)
    case shareList
    case shareClose(ShareTarget)
}

/// `account.add`: the configuration plus the secrets that come with it.
public struct AccountAddition: Sendable {
    public var configuration: AccountConfiguration
    public var clientSecret: SecretBytes?
    public var refreshToken: SecretBytes?
    /// With no `client_id`: the initial access token an issuer may ask
    /// before it registers a client (RFC 7591 §3).
    public var registrationToken: SecretBytes?

    public init(
        configuration: AccountConfiguration,
        clientSecret: SecretBytes? = nil,
        refreshToken: SecretBytes? = nil,
        registrationToken: SecretBytes? = nil
    ) {
        self.configuration = configuration
        self.clientSecret = clientSecret
        self.refreshToken = refreshToken
        self.registrationToken = registrationToken
    }
}

/// The wire names of the operations, and nowhere else.
public enum Op: String, CaseIterable, Sendable {
    case hello
    case status
    case accountAdd = "account.add"
    case accountRemove = "account.remove"
    case lock
    case unlock
    case token
    case dpopProof = "dpop.proof"
    case dpopNonce = "dpop.nonce"
    case claims
    case userinfo
    case signinStart = "signin.start"
    case signinSubmitCode = "signin.submit_code"
    case signinResendCode = "signin.resend_code"
    case signinSubmitPassword = "signin.submit_password"
    case signinWait = "signin.wait"
    case signinCancel = "signin.cancel"
    case subscribe
    case signout
    case refreshToken = "refresh_token"
    case migrate
    case shareOpen = "share.open"
    case shareList = "share.list"
    case shareClose = "share.close"
}
