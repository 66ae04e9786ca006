import ArgumentParser
import Glibc
import VaultProtocol

/// The program `vaultctl notify` runs (it checks its arguments, then execs
/// this one from its own folder): a long-lived session service on sd-bus,
/// which vaultctl, a static executable, cannot load. Its options are
/// vaultctl notify's.
@main
struct VaultctlNotify: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vaultctl-notify",
        abstract: "What vaultctl notify runs: a desktop notification while an account needs a sign-in.",
        discussion: "Run as vaultctl notify; see vaultctl notify --help.",
        version: TokenVault.version
    )

    @Option(help: "The socket path (default: $TOKENVAULT_SOCKET, else $XDG_RUNTIME_DIR/tokenvault/vaultd.sock).")
    var socket: String?

    @Argument(help: "Only these accounts (default: every account).")
    var accounts: [String] = []

    @Option(help: "Seconds between reminders while an account waits for its sign-in.")
    var every: Int = 900

    func validate() throws {
        guard (10...86_400).contains(self.every) else { throw ValidationError("--every is 10 to 86400 seconds") }
    }

    func run() throws {
        signal(SIGPIPE, SIG_IGN)
        var notifier = Notifier(accounts: self.accounts, every: Double(self.every), socket: self.socket)
        notifier.run()
    }
}
