public import VaultProtocol

// What a client of vaultd is told when vaultd cannot be reached or answers
// nonsense: every such error of VaultConnection and VaultClient, once each.
// (What vaultd itself answers is built in vaultd: VaultDaemon/WireErrors.swift.)

extension VaultError {
    private static let seeTheLog = "see its log: journalctl --user -u vaultd"

    static let notADPoPTarget = VaultError(.badRequest, "a DPoP proof is for an HTTP method and an absolute http or https URL")

    static func noSocket(_ reason: String) -> VaultError {
        VaultError(.internalError, "cannot create a socket: \(reason)")
    }

    static func socketPathTooLong(_ path: String) -> VaultError {
        VaultError(.badRequest, "the socket path \(path) is too long for a Unix socket")
    }

    static func notRunning(_ path: String) -> VaultError {
        VaultError(.unavailable, "vaultd is not running (nothing listens on \(path)); start it with: systemctl --user start vaultd.socket")
    }

    static func socketNotYours(_ path: String) -> VaultError {
        VaultError(.forbidden, "no permission to open \(path); it belongs to another user: point TOKENVAULT_SOCKET (or vaultctl's VAULTCTL_SOCKET) at your own vaultd's socket")
    }

    static func cannotConnect(_ path: String, _ reason: String) -> VaultError {
        VaultError(.unavailable, "cannot connect to \(path): \(reason); see: systemctl --user status vaultd.socket vaultd")
    }

    static func unknownServer(_ path: String, _ reason: String) -> VaultError {
        VaultError(.unavailable, "cannot tell who serves \(path): \(reason)")
    }

    static func servedByAnotherUser(_ path: String, uid: UInt32, me: UInt32) -> VaultError {
        VaultError(
            .forbidden,
            "\(path) is served by uid \(uid), not by you (uid \(me)); nothing was sent to it. Check who made it, or use another socket"
        )
    }

    static let requestNotEncoded = VaultError(.internalError, "could not encode the request")
    public static let unreadableReply = VaultError(
        .internalError,
        "vaultd sent a reply this client cannot read; are both the same version? reinstall them together"
    )

    static func lineTooLongFromVaultd(_ limit: Int) -> VaultError {
        VaultError(.internalError, "vaultd sent a line longer than \(limit) bytes; the connection was closed")
    }

    static let closedByVaultd = VaultError(.unavailable, "vaultd closed the connection; \(seeTheLog)")
    static let closedBeforeAnswering = VaultError(.unavailable, "vaultd closed the connection before answering; \(seeTheLog)")

    static func closedWhileSending(_ reason: String) -> VaultError {
        VaultError(.unavailable, "vaultd closed the connection: \(reason); \(seeTheLog)")
    }

    /// `reason` is the system's, when there is one.
    static func connectionLost(_ reason: String?) -> VaultError {
        VaultError(.unavailable, "lost the connection to vaultd\(reason.map { ": " + $0 } ?? ""); \(seeTheLog)")
    }

    /// An error of a type the client does not expect: its type only, never its text.
    static func unexpected(_ error: any Error) -> VaultError {
        VaultError(.internalError, "\(type(of: error))")
    }
}
