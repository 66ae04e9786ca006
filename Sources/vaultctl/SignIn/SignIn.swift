import ArgumentParser
import VaultClient
import VaultProtocol

struct SignIn: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "signin",
        abstract: "Sign in to an account.",
        discussion: """
            Without a method, sign in with a browser. --email sends a one-time code to the address: \
            type it at the prompt (no echo), or, when stdin is not a terminal, give one code per line \
            of stdin. --password reads the password from the terminal (no echo) or the next line of \
            stdin, never from the command line. --device lets you sign in on a phone or another \
            computer. Ctrl-C cancels the sign-in.
            """
    )

    @Argument(help: "The account.")
    var account: String

    @Option(help: ArgumentHelp("Sign in with a one-time code sent to this email address.", valueName: "addr"))
    var email: String?

    @Flag(help: "Sign in with a username and password.")
    var password = false

    @Flag(help: "Sign in with a browser (the default).")
    var browser = false

    @Flag(help: "Sign in on a phone or another computer.")
    var device = false

    @Option(help: ArgumentHelp("The username to sign in as (asked for when --password has none).", valueName: "user"))
    var username: String?

    @Flag(help: "Do not open the browser; only print the address to open.")
    var noOpen = false

    @Flag(help: "End the account's sign-in in progress (another program's too) and start this one.")
    var restart = false

    @OptionGroup var connection: Connection

    var method: SignInMethod {
        if self.email != nil { return .emailOTP }
        if self.password { return .password }
        if self.device { return .device }
        return .browser
    }

    func validate() throws {
        guard [self.email != nil, self.password, self.browser, self.device].filter({ $0 }).count <= 1 else {
            throw ValidationError("choose one of --email, --password, --browser and --device")
        }
        if let email = self.email, !email.contains("@") {
            throw ValidationError("--email takes an email address, like ada@example.org")
        }
        if self.username != nil, self.email != nil {
            throw ValidationError("--email takes the address to sign in as; leave out --username")
        }
        if self.username != nil, self.device {
            throw ValidationError("--device takes no --username; you choose who signs in on the other device")
        }
        if let username = self.username, username.allSatisfy(\.isWhitespace) {
            throw ValidationError("--username is empty")
        }
        if self.password, self.username == nil, !Prompt.isInteractive {
            throw ValidationError("--password needs --username when stdin is not a terminal")
        }
    }

    func run() throws {
        Interrupt.install()
        try self.connection.run { (vault) throws(VaultError) in
            let session = SignInSession(
                vault: vault,
                account: self.account,
                username: self.email ?? self.username,
                interactive: Prompt.isInteractive,
                openBrowser: !self.noOpen,
                restart: self.restart
            )
            let reply = try session.run(self.method)
            if self.connection.json { return self.connection.printJSON(reply) }
            let result = try Output.field(SignInResult.self, of: reply)
            if let username = result.username, !username.isEmpty {
                Output.line("Signed in to \(result.account) as \(username).")
            } else {
                Output.line("Signed in to \(result.account).")
            }
        }
    }
}

extension ErrorCode {
    /// Client side only: stdin or the terminal ended before the sign-in did.
    static let endOfInput = ErrorCode(rawValue: "end_of_input")
    /// Client side only: Ctrl-C.
    static let interrupted = ErrorCode(rawValue: "interrupted")
    /// Client side only: the issuer wants a browser and nobody is at the terminal.
    static let browserRequired = ErrorCode(rawValue: "browser_required")
}
