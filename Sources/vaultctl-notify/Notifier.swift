import FoundationEssentials
import Glibc
import VaultClient
import VaultProtocol

/// vaultctl-notify's loop: one thread, asleep in poll(2) on vaultd's socket
/// and the session bus until an event, an action or a reminder is due.
struct Notifier {
    let accounts: [String]
    let every: Double
    let socket: String?

    /// An account waiting for a sign-in.
    private struct Waiting {
        /// The notification showing (0: none).
        var id: UInt32 = 0
        /// The `Notify` sent and not answered yet (`Desktop.show`'s number):
        /// no other is sent meanwhile.
        var asking: UInt64?
        /// When to remind again.
        var remindAt: Double
    }

    private var waiting: [String: Waiting] = [:]
    /// Sign-ins started from a notification's action, by account.
    private var signIns: [String: pid_t] = [:]
    private var desktop: Desktop?
    /// Whether the bus had more to read than one turn of the loop took.
    private var desktopBusy = false
    private var usernames: [String: String] = [:]

    init(accounts: [String], every: Double, socket: String?) {
        self.accounts = accounts
        self.every = every
        self.socket = socket
    }

    mutating func run() -> Never {
        var delay = 1.0
        var said = false
        while true {
            do throws(VaultError) {
                let path = try TokenVault.socketPath(explicit: self.socket ?? TokenVault.environment("VAULTCTL_SOCKET"))
                let vault = try VaultConnection(path: path)
                try self.follow(vault)
                delay = 1
                said = false
                Self.say("vaultd closed the connection; connecting again")
            } catch {
                if !said { Self.say(error.message) }
                said = true
            }
            // A few seconds at most: socket activation answers as soon as vaultd's unit is back.
            var pause = timespec(tv_sec: Int(delay), tv_nsec: 0)
            nanosleep(&pause, nil)
            delay = min(delay * 2, 30)
        }
    }

    /// Subscribes, reads who waits for a sign-in now, then serves events,
    /// actions and reminders until vaultd closes the connection.
    private mutating func follow(_ vault: VaultConnection) throws(VaultError) {
        try vault.send(.subscribe(accounts: self.accounts.isEmpty ? nil : self.accounts))
        let status = try vault.call(.status, as: StatusResult.self)
        for account in status.accounts where self.accounts.isEmpty || self.accounts.contains(account.name) {
            self.usernames[account.name] = account.username
            if account.needsReauth { self.needs(account.name) } else { self.resolved(account.name) }
        }
        while true {
            self.reap()
            if vault.hasBufferedLine {
                guard let line = try vault.nextEvent() else { return }
                self.handle(line)
                continue
            }
            self.remind()
            var fds = [pollfd(fd: vault.descriptor, events: Int16(POLLIN), revents: 0)]
            if let desktop = self.desktop { fds.append(pollfd(fd: desktop.descriptor, events: desktop.pollEvents, revents: 0)) }
            // Asleep until an event, an action, the next reminder or a call's
            // time limit; with sign-ins running, waking now and then to collect
            // them. Not at all while the bus has more to read: it is served in
            // turn with vaultd's events, however much a peer sends.
            let now = Self.now()
            var timeout = min(self.waiting.values.map { max(0, $0.remindAt - now) }.min() ?? 3600, self.signIns.isEmpty ? 3600 : 5)
            if let due = self.desktop?.due { timeout = min(timeout, max(0, due - now)) }
            let ready = poll(&fds, nfds_t(fds.count), self.desktopBusy ? 0 : Int32(timeout * 1000) + 1) > 0
            if ready, fds[0].revents != 0 {
                guard let line = try vault.nextEvent() else { return }
                self.handle(line)
            }
            self.serveDesktop()
        }
    }

    private mutating func handle(_ line: Data) {
        guard let event = try? JSONDecoder().decode(Event.self, from: line) else { return }
        switch event.event {
        case .reauthRequired:
            self.needs(event.account)
        case .signedIn:
            self.usernames[event.account] = event.username
            self.resolved(event.account)
        case .signedOut:
            // Every sign-out is asked for by a person or their script: nothing to tell.
            self.resolved(event.account)
        default:
            break
        }
    }

    /// Reads the desktop: an action starts the account's sign-in, a
    /// dismissal leaves the reminder due as it was, an answer to `Notify`
    /// is the id of an account's notification (or, refused, the reminder
    /// is printed instead).
    private mutating func serveDesktop() {
        guard let desktop = self.desktop else { return }
        var failure: String?
        do {
            self.desktopBusy = try desktop.serve()
        } catch {
            failure = "the notification service went away (\(error)); printing instead"
        }
        for event in desktop.take() {
            switch event {
            case .signal(.action(let id, _)):
                // "default" (a click) and "signin" (the menu) both start the sign-in.
                guard let account = self.account(showing: id) else { continue }
                desktop.close(id)
                self.waiting[account]?.id = 0
                self.startSignIn(account)
            case .signal(.closed(let id)):
                guard let account = self.account(showing: id) else { continue }
                self.waiting[account]?.id = 0
            case .shown(let call, .success(let id)):
                guard let account = self.account(asking: call) else {
                    // The account was signed in (or out) before the answer came.
                    desktop.close(id)
                    continue
                }
                self.waiting[account]?.asking = nil
                self.waiting[account]?.id = id
            case .shown(let call, .failure(let why)):
                failure = failure ?? "the notification service refused (\(why)); printing instead"
                guard let account = self.account(asking: call) else { continue }
                self.waiting[account]?.asking = nil
                self.waiting[account]?.id = 0
                self.print(account)
            }
        }
        if let failure {
            Self.say(failure)
            self.dropDesktop()
        }
    }

    /// Forgets the desktop; the reminders it did not answer are printed.
    private mutating func dropDesktop() {
        self.desktop = nil
        self.desktopBusy = false
        for (account, entry) in self.waiting.sorted(by: { $0.key < $1.key }) where entry.asking != nil {
            self.waiting[account]?.asking = nil
            self.waiting[account]?.id = 0
            self.print(account)
        }
    }

    private func account(showing id: UInt32) -> String? {
        guard id != 0 else { return nil }
        return self.waiting.first { $0.value.id == id }?.key
    }

    private func account(asking call: UInt64) -> String? {
        self.waiting.first { $0.value.asking == call }?.key
    }

    private mutating func needs(_ account: String) {
        guard self.waiting[account] == nil else { return }
        self.waiting[account] = Waiting(remindAt: Self.now())
    }

    /// The account needs no sign-in: its notification goes (one still
    /// unanswered goes when its id comes, `serveDesktop`).
    private mutating func resolved(_ account: String) {
        guard let entry = self.waiting.removeValue(forKey: account) else { return }
        if entry.id != 0 { self.desktop?.close(entry.id) }
    }

    /// Shows (or shows again, in place) every reminder that is due.
    private mutating func remind() {
        let now = Self.now()
        for (account, entry) in self.waiting.sorted(by: { $0.key < $1.key }) where entry.remindAt <= now && entry.asking == nil {
            self.waiting[account]?.remindAt = now + self.every
            if self.desktop == nil { self.desktop = Desktop.connect() }
            if let desktop = self.desktop {
                let (summary, body) = self.reminder(account)
                do {
                    self.waiting[account]?.asking = try desktop.show(summary: summary, body: Desktop.markup(body), replacing: entry.id)
                    continue
                } catch {
                    Self.say("the notification service refused (\(error)); printing instead")
                    self.dropDesktop()
                }
            }
            self.waiting[account]?.id = 0
            self.print(account)
        }
    }

    private func reminder(_ account: String) -> (summary: String, body: String) {
        let who = self.usernames[account].map { " as \($0)" } ?? ""
        return ("Sign in to \(account)", "tokenvault: the issuer asks you to sign in to '\(account)'\(who) again.")
    }

    /// The reminder on stdout, for want of a desktop. The username is the
    /// issuer's text: escaped, as every line vaultctl prints.
    private func print(_ account: String) {
        let (summary, body) = self.reminder(account)
        Output.line("\(summary): \(body) Run: vaultctl signin \(account)")
    }

    /// Runs `vaultctl signin ACCOUNT` with the vaultctl beside this program,
    /// once at a time per account.
    private mutating func startSignIn(_ account: String) {
        guard self.signIns[account] == nil else { return }
        let vaultctl = TokenVault.program("vaultctl") ?? "vaultctl"
        var arguments = [vaultctl, "signin", account]
        if let socket = self.socket { arguments += ["--socket", socket] }
        var pid: pid_t = 0
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let failed = posix_spawn(&pid, vaultctl, nil, nil, argv, environ)
        guard failed == 0 else {
            Self.say("could not start \(vaultctl) signin \(account): \(String(cString: strerror(failed)))")
            return
        }
        self.signIns[account] = pid
    }

    /// Collects the sign-ins that ended.
    private mutating func reap() {
        for (account, pid) in self.signIns where waitpid(pid, nil, WNOHANG) != 0 {
            self.signIns[account] = nil
        }
    }

    private static func now() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }

    private static func say(_ text: String) {
        Output.error(text)
    }
}
