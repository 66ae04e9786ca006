import ArgumentParser
import FoundationEssentials
import Glibc
import Synchronization
import VaultClient
import VaultCrypto
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

/// One sign-in, from `signin.start` to `signed_in`: every state the daemon
/// answers with is handled here, until the last reply, which `run` returns
/// as the daemon sent it (for `--json`).
private final class SignInSession {
    let vault: VaultConnection
    let account: String
    /// The email address or username, once known; a login hint for the browser.
    var username: String?
    let interactive: Bool
    let openBrowser: Bool
    /// Replace the account's sign-in in progress rather than join it.
    let restart: Bool

    /// The flow in progress, to cancel when the command ends early.
    private var flow: String?
    /// Passwords the issuer refused so far.
    private var refusedPasswords = 0
    private static let maximumPasswordTries = 3
    /// Whether a `browser_required` answer already restarted in the browser.
    private var switchedToBrowser = false
    /// Children started to open the browser, reaped while waiting.
    private var children: [pid_t] = []
    /// The page that sends the browser on to the issuer; removed when the command ends.
    private var page: BrowserPage?

    init(vault: VaultConnection, account: String, username: String?, interactive: Bool, openBrowser: Bool, restart: Bool) {
        self.vault = vault
        self.account = account
        self.username = username
        self.interactive = interactive
        self.openBrowser = openBrowser
        self.restart = restart
    }

    struct Reply {
        var line: Data
        var result: SignInResult
    }

    /// The final `signed_in` reply line. Any other ending cancels the flow
    /// (best effort) and throws.
    func run(_ method: SignInMethod) throws(VaultError) -> Data {
        // The page holds the flow's state: it goes when the flow ends, either way.
        defer { self.page?.remove() }
        do throws(VaultError) {
            var reply = try self.start(method)
            while true {
                // Signed in is signed in, even when Ctrl-C came meanwhile.
                if reply.result.state == .signedIn { return reply.line }
                try self.checkInterrupt()
                switch reply.result.state {
                case .signedIn: return reply.line
                case .codeRequired: reply = try self.enterCode(reply.result)
                case .passwordRequired: reply = try self.enterPassword()
                case .openBrowser: reply = try self.awaitBrowser(reply.result)
                case .deviceCode: reply = try self.awaitDevice(reply.result)
                case .browserRequired: reply = try self.restartInBrowser(reply.result)
                }
            }
        } catch {
            // These end the flow at the daemon already.
            if ![.codeExpired, .tooManyAttempts, .flowNotFound, .userNotFound].contains(error.code) { self.cancel() }
            throw error
        }
    }

    // MARK: Start

    private func start(_ method: SignInMethod) throws(VaultError) -> Reply {
        if method == .password, self.username == nil {
            self.username = try self.askUsername()
        }
        // The password is asked for once the issuer says it wants one: a user
        // without a password gets a code instead.
        return try self.send(
            .signinStart(SignInStart(account: self.account, method: method, username: self.username, restart: self.restart))
        )
    }

    // MARK: Email code

    private func enterCode(_ first: SignInResult) throws(VaultError) -> Reply {
        Output.note(Self.codeSent(first, again: false))
        while true {
            let code = try self.askCode()
            let flow = try self.currentFlow()
            if Self.asksForNewCode(code) {
                let reply = try self.send(.signinResendCode(flow: flow))
                guard reply.result.state == .codeRequired else { return reply }
                Output.note(Self.codeSent(reply.result, again: true))
                continue
            }
            do throws(VaultError) {
                let reply = try self.send(.signinSubmitCode(flow: flow, code: code))
                guard reply.result.state == .codeRequired else { return reply }
            } catch let error where error.code == .invalidCode {
                Output.note("That code is not right; \(Self.attempts(error.attemptsLeft))")
            }
        }
    }

    /// The next code, without empty lines; throws at end of input.
    private func askCode() throws(VaultError) -> SecretBytes {
        while true {
            let code: SecretBytes?
            do throws(SodiumError) {
                code = try Prompt.secretLine("Code (or r to send a new one): ") { !Self.isSpace($0) }
            } catch {
                throw Self.memoryError
            }
            try self.checkInterrupt()
            guard let code else {
                throw VaultError(
                    .endOfInput,
                    self.interactive
                        ? "no code was entered; the sign-in was cancelled"
                        : "stdin ended before the issuer accepted a code; the sign-in was cancelled"
                )
            }
            if code.count > 0 { return code }
        }
    }

    private static func asksForNewCode(_ code: SecretBytes) -> Bool {
        code.withUnsafeBytes { $0.count == 1 && ($0[0] == UInt8(ascii: "r") || $0[0] == UInt8(ascii: "R")) }
    }

    /// "An 8-digit code was sent by email to a**@example.org."
    private static func codeSent(_ result: SignInResult, again: Bool) -> String {
        let length = result.codeLength.map { "\($0)-digit " } ?? ""
        let article = again ? "A new" : (length.hasPrefix("8") || length.hasPrefix("11-") || length.hasPrefix("18-") ? "An" : "A")
        let channel: String
        switch result.channel {
        case nil, "": channel = ""
        case "email": channel = " by email"
        case "sms": channel = " by text message"
        case let other?: channel = " by \(other)"
        }
        let to = result.sentTo.map { " to \($0)" } ?? ""
        return "\(article) \(length)code was sent\(channel)\(to)."
    }

    private static func attempts(_ left: Int?) -> String {
        guard let left else { return "try again." }
        return "\(left) attempt\(left == 1 ? "" : "s") left."
    }

    // MARK: Password

    private func enterPassword() throws(VaultError) -> Reply {
        while true {
            let password = try self.askPassword()
            do throws(VaultError) {
                return try self.send(.signinSubmitPassword(flow: try self.currentFlow(), password: password))
            } catch let error where error.code == .invalidCredentials && self.mayRetryPassword() {
                Output.note("The issuer refused that username and password.")
            }
        }
    }

    /// Counts a refused password; true when another may be asked for.
    private func mayRetryPassword() -> Bool {
        self.refusedPasswords += 1
        return self.interactive && self.refusedPasswords < Self.maximumPasswordTries
    }

    private func askUsername() throws(VaultError) -> String {
        while true {
            let line = Prompt.line("Username: ")
            try self.checkInterrupt()
            guard let line else {
                throw VaultError(.endOfInput, "no username was entered; the sign-in was cancelled")
            }
            let username = String(line.drop(while: \.isWhitespace).reversed().drop(while: \.isWhitespace).reversed())
            if !username.isEmpty { return username }
        }
    }

    private func askPassword() throws(VaultError) -> SecretBytes {
        while true {
            let password: SecretBytes?
            do throws(SodiumError) {
                password = try Prompt.secretLine("Password: ")
            } catch {
                throw Self.memoryError
            }
            try self.checkInterrupt()
            if let password, password.count > 0 { return password }
            if password == nil || !self.interactive {
                throw VaultError(
                    .endOfInput,
                    self.interactive ? "no password was entered; the sign-in was cancelled" : "stdin held no password"
                )
            }
        }
    }

    // MARK: Browser and device

    private func awaitBrowser(_ result: SignInResult) throws(VaultError) -> Reply {
        guard let url = result.url else {
            throw VaultError(.internalError, "vaultd sent no address for the browser sign-in")
        }
        if result.joined == true {
            Output.note("Another program started this sign-in and opened the browser; finish it there, or open:")
        } else {
            Output.note("Open this address in your browser to sign in:")
        }
        Output.note(url)
        // The page goes when the flow ends, and by the time it expires at the latest.
        let lifetime = min(max(result.expiresIn ?? 600, 0), 3600) + 10
        if self.openBrowser, result.joined != true, self.page == nil, let page = BrowserPage.open(url, removedAfter: lifetime) {
            self.page = page
            self.children.append(page.opener)
        }
        return try self.wait(while: .openBrowser, expiresIn: result.expiresIn, doing: "Waiting for the browser sign-in")
    }

    private func awaitDevice(_ result: SignInResult) throws(VaultError) -> Reply {
        guard let uri = result.verificationURI, let code = result.userCode else {
            throw VaultError(.internalError, "vaultd sent no address or code for the device sign-in")
        }
        Output.note("On a phone or another computer, open")
        Output.note("    \(uri)")
        Output.note("and enter the code")
        Output.note("    \(code)")
        // The text goes on stdin: on the command line, every user could read the code.
        if isatty(2) == 1, let qrencode = Programs.find("qrencode"),
            let picture = Programs.output(qrencode, ["-t", "UTF8", "-o", "-"], input: result.verificationURIComplete ?? uri)
        {
            Output.note("or scan this with the phone's camera:")
            Output.toStderr(picture)
        }
        return try self.wait(while: .deviceCode, expiresIn: result.expiresIn, doing: "Waiting for the sign-in on the other device")
    }

    /// `signin.wait`, a second at a time, while the flow stays in `state`;
    /// a spinner and the time left on stderr when it is a terminal.
    private func wait(while state: SignInState, expiresIn: Int?, doing activity: String) throws(VaultError) -> Reply {
        let spinner = isatty(2) == 1 ? Spinner(activity) : nil
        defer { spinner?.clear() }
        var left = expiresIn
        while true {
            try self.checkInterrupt()
            spinner?.show(secondsLeft: left)
            let reply = try self.send(.signinWait(flow: try self.currentFlow(), timeoutMs: 1000))
            self.reapChildren()
            guard reply.result.state == state else { return reply }
            left = reply.result.expiresIn
        }
    }

    private func restartInBrowser(_ result: SignInResult) throws(VaultError) -> Reply {
        self.flow = nil
        let reason = result.reason.map { " (\($0))" } ?? ""
        Output.note("The issuer wants you to sign in with a browser\(reason).")
        guard self.interactive else {
            throw VaultError(
                .browserRequired,
                "stdin is not a terminal, so vaultctl does not switch to a browser; sign in with: vaultctl signin \(self.account) --browser"
            )
        }
        guard !self.switchedToBrowser else {
            throw VaultError(.idpError, "the issuer asked for a browser again; sign in with: vaultctl signin \(self.account) --browser")
        }
        self.switchedToBrowser = true
        return try self.send(.signinStart(SignInStart(account: self.account, method: .browser, username: self.username)))
    }

    private func reapChildren() {
        self.children.removeAll { waitpid($0, nil, WNOHANG) != 0 }
    }

    // MARK: The wire

    /// Sends a `signin.*` request and reads its reply; remembers the flow.
    private func send(_ command: Command) throws(VaultError) -> Reply {
        let line = try self.vault.send(command)
        let result = try Output.field(SignInResult.self, of: line)
        switch result.state {
        case .signedIn, .browserRequired: self.flow = nil
        default: self.flow = result.flow
        }
        return Reply(line: line, result: result)
    }

    private func currentFlow() throws(VaultError) -> String {
        guard let flow = self.flow else { throw VaultError(.internalError, "vaultctl lost track of the sign-in") }
        return flow
    }

    /// Best effort: a flow left behind would otherwise live until it expires.
    private func cancel() {
        guard let flow = self.flow else { return }
        self.flow = nil
        _ = try? self.vault.send(.signinCancel(flow: flow))
    }

    private func checkInterrupt() throws(VaultError) {
        if Interrupt.requested {
            throw VaultError(.interrupted, "the sign-in was cancelled")
        }
    }

    private static func isSpace(_ byte: UInt8) -> Bool {
        byte == 0x20 || (0x09...0x0D).contains(byte)
    }

    private static let memoryError = VaultError(.internalError, "could not get locked memory to hold the secret")
}

/// Ctrl-C: the first one asks the sign-in to stop at its next step (and
/// cancel its flow); a second one ends vaultctl at once.
enum Interrupt {
    private static let flag = Atomic<Bool>(false)

    static var requested: Bool { Self.flag.load(ordering: .relaxed) }

    static func install() {
        // Initialise the flag before the handler can be the first to touch it.
        _ = Self.flag.load(ordering: .relaxed)
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in
            if Interrupt.flag.exchange(true, ordering: .relaxed) { _exit(130) }
        }
        sigemptyset(&action.sa_mask)
        // No SA_RESTART: a read at a prompt returns, so the prompt ends.
        action.sa_flags = 0
        sigaction(SIGINT, &action, nil)
    }
}

/// "⠹ Waiting for the browser sign-in… 4:37 left" on one line of stderr.
private final class Spinner {
    private let activity: String
    private var frame = 0
    private static let frames = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"]

    init(_ activity: String) {
        self.activity = activity
    }

    func show(secondsLeft: Int?) {
        let left = secondsLeft.map { " \($0 / 60):\($0 % 60 < 10 ? "0" : "")\($0 % 60) left" } ?? ""
        Output.toStderr("\r\(Self.frames[self.frame % Self.frames.count]) \(self.activity)…\(left)\u{1B}[K")
        self.frame += 1
    }

    func clear() {
        Output.toStderr("\r\u{1B}[K")
    }
}

/// Other programs: the browser opener and the QR code printer.
enum Programs {
    /// The executable `name` on $PATH.
    static func find(_ name: String) -> String? {
        guard let path = TokenVault.environment("PATH") else { return nil }
        for directory in path.split(separator: ":") {
            let candidate = "\(directory)/\(name)"
            var info = stat()
            if stat(candidate, &info) == 0, info.st_mode & S_IFMT == S_IFREG, access(candidate, X_OK) == 0 {
                return candidate
            }
        }
        return nil
    }

    /// Starts `path` in its own process group (Ctrl-C here does not reach
    /// it), with stdin, stdout and stderr on /dev/null, and does not wait.
    static func launch(_ path: String, _ arguments: [String]) -> pid_t? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        return Self.spawn(path, arguments, &actions, newGroup: true)
    }

    /// What `path` writes on stdout when given `input` on stdin, when it
    /// exits 0 (stderr stays ours). `input` is small: written whole before
    /// the output is read.
    static func output(_ path: String, _ arguments: [String], input: String) -> [UInt8]? {
        // Socket pairs rather than pipes: SOCK_CLOEXEC, where pipe2 is not imported.
        var pipe: [Int32] = [-1, -1]
        var feed: [Int32] = [-1, -1]
        let kind = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard input.utf8.count <= 4096, socketpair(AF_UNIX, kind, 0, &pipe) == 0 else { return nil }
        guard socketpair(AF_UNIX, kind, 0, &feed) == 0 else {
            pipe.forEach { close($0) }
            return nil
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, feed[1], 0)
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 1)
        let pid = Self.spawn(path, arguments, &actions, newGroup: false)
        close(pipe[1])
        close(feed[1])
        defer { close(pipe[0]) }
        // Written before anything is read: 4 KiB fit in the socket's buffer.
        let bytes = Array(input.utf8)
        var offset = 0
        while pid != nil && offset < bytes.count {
            let n = bytes.withUnsafeBytes { send(feed[0], $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            offset += n
        }
        close(feed[0])
        guard let pid else { return nil }
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while output.count < 1 << 20 {
            let n = chunk.withUnsafeMutableBytes { read(pipe[0], $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            output.append(contentsOf: chunk[0..<n])
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // WIFEXITED and WEXITSTATUS, which Swift does not import.
        return status & 0x7F == 0 && (status >> 8) & 0xFF == 0 ? output : nil
    }

    private static func spawn(
        _ path: String,
        _ arguments: [String],
        _ actions: inout posix_spawn_file_actions_t,
        newGroup: Bool
    ) -> pid_t? {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        if newGroup {
            posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))
            posix_spawnattr_setpgroup(&attributes, 0)
        }
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let envp = ProcessInfo.processInfo.environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        guard posix_spawn(&pid, path, &actions, &attributes, argv, envp) == 0 else { return nil }
        return pid
    }
}
