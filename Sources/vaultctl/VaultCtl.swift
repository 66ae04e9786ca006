import ArgumentParser
import FoundationEssentials
import Glibc
import VaultClient
import VaultCrypto
import VaultProtocol

@main
struct VaultCtl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vaultctl",
        abstract: "Talk to vaultd, the tokenvault daemon.",
        version: TokenVault.version,
        subcommands: [Status.self, SignIn.self, SignOut.self, Migrate.self, Token.self, DPoP.self, Account.self, Import.self, Claims.self, Userinfo.self, Lock.self, Unlock.self, Exec.self, GitCredential.self, ExecCredential.self, Share.self, Unshare.self, Watch.self, Notify.self]
    )

    /// The hot commands in their plain spellings skip ArgumentParser
    /// (see `QuickStart`); everything else is ArgumentParser's.
    static func main() {
        QuickStart.runIfPlain(Array(CommandLine.arguments.dropFirst()))
        Self.main(nil)
    }
}

/// Options every command takes.
struct Connection: ParsableArguments {
    @Option(help: "The socket path (default: $TOKENVAULT_SOCKET, else $XDG_RUNTIME_DIR/tokenvault/vaultd.sock).")
    var socket: String?

    @Flag(help: "Print the daemon's JSON reply instead of text.")
    var json = false

    /// Runs `body` against the daemon; a wire error becomes one line on
    /// stderr and the matching exit code.
    func run(_ body: (VaultConnection) throws(VaultError) -> Void) throws {
        try Self.run(socket: self.socket, body)
    }

    /// `run` for commands whose `--socket` means something else (`share`):
    /// the daemon is then found through the environment.
    static func run(socket: String?, _ body: (VaultConnection) throws(VaultError) -> Void) throws {
        do throws(VaultError) {
            let path = try TokenVault.socketPath(explicit: socket ?? TokenVault.environment("VAULTCTL_SOCKET"))
            try body(try VaultConnection(path: path))
        } catch {
            Output.error(error.message)
            throw ExitCode(error.exitCode)
        }
    }

    func printJSON(_ reply: Data) {
        Output.verbatim(String(decoding: reply, as: UTF8.self))
    }
}

extension TokenResult {
    /// The token, when it is a bearer token: a DPoP-bound one goes only with
    /// a proof for its one request, which a header, a variable, git or
    /// kubectl cannot carry.
    func bearer(_ account: String) throws(VaultError) -> TokenResult {
        guard self.tokenType == "Bearer" else { throw VaultError.dpopTokenNeedsProof(account) }
        return self
    }
}

extension VaultError {
    static func dpopTokenNeedsProof(_ account: String) -> VaultError {
        VaultError(.badRequest, "'\(account)' holds DPoP-bound tokens, which go only with a proof: vaultctl dpop \(account) METHOD URL")
    }

    /// Exit codes follow sysexits(3); docs/protocol.md lists them.
    var exitCode: Int32 {
        switch (self.code, self.error) {
        // The person signing in said no, in the browser or on the other device.
        case (.idpError, "access_denied"): 77  // EX_NOPERM
        // The issuer's answer broke the protocol's rules; nothing was kept.
        case (.idpError, "untrusted_response"): 76  // EX_PROTOCOL
        // The issuer refused, or does not offer what was asked.
        case (.idpError, _): 69  // EX_UNAVAILABLE
        default: self.code.exitCode
        }
    }
}

extension ErrorCode {
    /// Exit codes follow sysexits(3), by code alone.
    var exitCode: Int32 {
        switch self {
        case .clientIDRequired: 64  // EX_USAGE: the command needs --client-id
        case .badRequest, .unknownOp, .lineTooLong: 65  // EX_DATAERR
        case .endOfInput: 66  // EX_NOINPUT
        case .unknownAccount, .notSignedIn, .flowNotFound, .userNotFound: 67  // EX_NOUSER
        case .unavailable: 69  // EX_UNAVAILABLE
        case .idpUnavailable, .overloaded, .codeExpired: 75  // EX_TEMPFAIL
        case .forbidden, .locked, .reauthRequired, .invalidCredentials, .invalidCode, .tooManyAttempts,
            .browserRequired:
            77  // EX_NOPERM
        case .storageDenied: 73  // EX_CANTCREAT
        case .storageFull: 74  // EX_IOERR
        case .interrupted: 130  // 128 + SIGINT, as the shell reports it
        default: 70  // EX_SOFTWARE
        }
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "status", abstract: "Show the vault's state and its accounts.")

    @OptionGroup var connection: Connection

    func run() throws {
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.status)
            if self.connection.json { return self.connection.printJSON(reply) }
            let status = try Output.field(StatusResult.self, of: reply)
            let key = status.backend == .file ? status.keySource.map { ", key from \($0)" } ?? "" : ""
            // A share says nothing of where the secrets rest.
            let backend = status.backend.map { " (\($0.rawValue) backend\(key))" } ?? " (through a share)"
            Output.line("vault: \(status.locked ? "locked" : "unlocked")\(backend)")
            if let reason = status.backendReason { Output.line("  \(reason)") }
            if let failure = status.storageError { Output.line("  cannot write the vault: \(failure)") }
            if status.accounts.isEmpty {
                Output.line("no accounts; add one with: vaultctl account add NAME --issuer URL --client-id ID")
            }
            for account in status.accounts {
                let state =
                    account.needsReauth ? "needs sign-in again" : account.signedIn ? "signed in" : "not signed in"
                let user = account.username.map { " as \($0)" } ?? ""
                Output.line("\(account.name): \(state)\(user) at \(account.issuer)")
            }
        }
    }
}

struct Lock: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "lock", abstract: "Forget the vault's key until the next unlock.")

    @OptionGroup var connection: Connection

    func run() throws {
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.lock)
            if self.connection.json { return self.connection.printJSON(reply) }
            Output.line("vault locked")
        }
    }
}

struct Unlock: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unlock",
        abstract: "Unlock the vault.",
        discussion: """
            A passphrase vault asks for its passphrase on the terminal, without echo, or reads \
            one line from standard input when that is not a terminal. Other vaults reload their key.
            """
    )

    @OptionGroup var connection: Connection

    @Flag(help: "Do not ask for a passphrase (for vaults keyed by a file or credential).")
    var noPassphrase = false

    func run() throws {
        let passphrase = self.noPassphrase ? nil : try Prompt.secret("passphrase: ")
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.unlock(passphrase: passphrase))
            if self.connection.json { return self.connection.printJSON(reply) }
            Output.line("vault unlocked")
        }
    }
}
