import FoundationEssentials
import Glibc
import VaultClient
import VaultCrypto
import VaultProtocol

/// One sign-in, from `signin.start` to `signed_in`: every state the daemon
/// answers with is handled here, until the last reply, which `run` returns
/// as the daemon sent it (for `--json`).
final class SignInSession {
    let vault: VaultConnection
    let account: String
    /// The email address or username, once known; a login hint for the browser.
    var username: String?
    let terminal: SignInTerminal
    var interactive: Bool { self.terminal.interactive }
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
        self.terminal = SignInTerminal(interactive: interactive)
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
                try self.terminal.checkInterrupt()
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
            self.username = try self.terminal.askUsername()
        }
        // The password is asked for once the issuer says it wants one: a user
        // without a password gets a code instead.
        return try self.send(
            .signinStart(SignInStart(account: self.account, method: method, username: self.username, restart: self.restart))
        )
    }

    // MARK: Email code

    private func enterCode(_ first: SignInResult) throws(VaultError) -> Reply {
        Output.note(SignInTerminal.codeSent(first, again: false))
        while true {
            let code = try self.terminal.askCode()
            let flow = try self.currentFlow()
            if SignInTerminal.asksForNewCode(code) {
                let reply = try self.send(.signinResendCode(flow: flow))
                guard reply.result.state == .codeRequired else { return reply }
                Output.note(SignInTerminal.codeSent(reply.result, again: true))
                continue
            }
            do throws(VaultError) {
                let reply = try self.send(.signinSubmitCode(flow: flow, code: code))
                guard reply.result.state == .codeRequired else { return reply }
            } catch let error where error.code == .invalidCode {
                Output.note("That code is not right; \(SignInTerminal.attempts(error.attemptsLeft))")
            }
        }
    }

    // MARK: Password

    private func enterPassword() throws(VaultError) -> Reply {
        while true {
            let password = try self.terminal.askPassword()
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
        if self.terminal.drawsOnStderr, let picture = Programs.qrCode(result.verificationURIComplete ?? uri) {
            Output.note("or scan this with the phone's camera:")
            Output.toStderr(picture)
        }
        return try self.wait(while: .deviceCode, expiresIn: result.expiresIn, doing: "Waiting for the sign-in on the other device")
    }

    /// `signin.wait`, a second at a time, while the flow stays in `state`;
    /// a spinner and the time left on stderr when it is a terminal.
    private func wait(while state: SignInState, expiresIn: Int?, doing activity: String) throws(VaultError) -> Reply {
        let spinner = self.terminal.spinner(activity)
        defer { spinner?.clear() }
        var left = expiresIn
        while true {
            try self.terminal.checkInterrupt()
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
}
