import ArgumentParser
import Glibc
import VaultClient
import VaultProtocol

struct Notify: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "notify",
        abstract: "Tell the person at the desktop when an account needs a sign-in, until it is signed in.",
        discussion: """
            Follows vaultd's events. When the issuer rejects an account's refresh token (reauth_required), \
            it shows a desktop notification naming the account, with a "Sign in" action that runs \
            vaultctl signin ACCOUNT (the browser flow); it shows it again every --every seconds until the \
            account is signed in, one notification per account at a time. A sign-out on purpose is quiet. \
            Without a session bus or a notification service it prints what it would have shown. When \
            vaultd stops it connects again (socket activation starts it). systemd/vaultctl-notify.service \
            runs it in a graphical session. The notifier is its own program, vaultctl-notify (it speaks to \
            the session bus with libsystemd's sd-bus), which this runs from vaultctl's folder.
            """
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

    /// Becomes vaultctl-notify, with these options.
    func run() throws {
        guard let program = TokenVault.program("vaultctl-notify") else {
            Output.error("cannot find vaultctl-notify: /proc/self/exe cannot be read")
            throw ExitCode(ErrorCode.unavailable.exitCode)
        }
        var arguments = [program, "--every", String(self.every)]
        if let socket = self.socket { arguments += ["--socket", socket] }
        arguments += ["--"] + self.accounts
        let argv = arguments.map { strdup($0) } + [nil]
        execv(program, argv)
        let code = errno
        argv.forEach { free($0) }
        Output.error("cannot run \(program): \(String(cString: strerror(code))); vaultctl notify needs it beside vaultctl (scripts/install.sh installs both)")
        throw ExitCode(ErrorCode.unavailable.exitCode)
    }
}
