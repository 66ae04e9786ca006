// The wire errors of VaultProtocol: a line that is no request, or a request
// whose fields break the protocol's rules (docs/protocol.md). The daemon's
// own are in VaultDaemon/WireErrors.swift, the socket layer's in
// VaultServer/ServerErrors.swift.

extension VaultError {
    public static let notARequest = VaultError(.badRequest, "a request is one JSON object per line")
    static let notUTF8 = VaultError(.badRequest, "a request line must be valid UTF-8")
    static let requestOutOfMemory = VaultError(.internalError, "vaultd is out of guarded memory")
    static let replyNotEncoded = VaultError(.internalError, "vaultd could not encode its reply")

    /// A secret field named twice: which one counts is not for a decoder to guess.
    static func namedTwice(_ name: String) -> VaultError {
        VaultError(.badRequest, "a request names '\(name)' once, not twice")
    }

    /// A field of the wrong type or missing, in JSONDecoder's words made plain.
    static func malformed(_ sentence: String) -> VaultError { VaultError(.badRequest, sentence) }

    static let noOp = VaultError(.badRequest, "every request needs an 'op'")

    /// `shown` is the op's name in quotes when it is short and plain, else empty.
    static func unknownOp(_ shown: String) -> VaultError {
        VaultError(.unknownOp, "vaultd does not know the operation\(shown); see the 'op' table in docs/protocol.md")
    }

    static let badBackend = VaultError(.badRequest, "'to' is file or keyring")
    static let badMinTTL = VaultError(.badRequest, TokenRequest.minTTLRule)
    static let badDPoPTarget = VaultError(
        .badRequest,
        "'htm' is an HTTP method (GET, POST, ...) and 'htu' an absolute http or https URL, as the request sends them"
    )
    static let badDPoPOrigin = VaultError(.badRequest, "'origin' is a scheme and host, as in https://rs.example or http://127.0.0.1:8080")
    static let badDPoPNonce = VaultError(.badRequest, "'nonce' is the resource server's DPoP-Nonce, 1 to 512 printable characters without quotes or backslashes")

    static func required(_ field: String) -> VaultError {
        VaultError(.badRequest, "the field '\(field)' is required")
    }

    static let badWaitTimeout = VaultError(.badRequest, "'timeout_ms' is a number of milliseconds from 0 to 600000")
    static let signoutTarget = VaultError(.badRequest, "signout takes an 'account' or 'all': true, not both")
    static let shareWithoutAccounts = VaultError(.badRequest, "a share needs at least one account in 'accounts'")
    static let badShareTTL = VaultError(.badRequest, "'ttl' is a number of seconds from 1 to \(ShareOpen.maximumTTL)")
    static let shareCloseTarget = VaultError(.badRequest, "share.close takes a 'share' id or a 'socket' path, not both")

    static func badScopeList(_ field: String) -> VaultError {
        VaultError(.badRequest, "'\(field)' is a non-empty list of scopes")
    }

    /// Not a wire error, but the protocol's rule for finding the socket.
    static let noRuntimeDirectory = VaultError(
        .badRequest,
        "XDG_RUNTIME_DIR is not set, so the socket cannot be found; pass --socket PATH or set TOKENVAULT_SOCKET"
    )
}
