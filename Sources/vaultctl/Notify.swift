import ArgumentParser
import FoundationEssentials
import Glibc
import VaultClient
import VaultJSON
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
            runs it in a graphical session.
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

    func run() throws {
        signal(SIGPIPE, SIG_IGN)
        var notifier = Notifier(accounts: self.accounts, every: Double(self.every), socket: self.socket)
        notifier.run()
    }
}

/// `vaultctl notify`'s loop: one thread, asleep in poll(2) on vaultd's
/// socket and the session bus until an event, an action or a reminder is due.
struct Notifier {
    let accounts: [String]
    let every: Double
    let socket: String?

    /// Accounts waiting for a sign-in: the notification showing (0: none) and
    /// when to remind again.
    private var waiting: [String: (id: UInt32, remindAt: Double)] = [:]
    /// Sign-ins started from a notification's action, by account.
    private var signIns: [String: pid_t] = [:]
    private var desktop: Desktop?
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
            if let desktop = self.desktop { fds.append(pollfd(fd: desktop.descriptor, events: Int16(POLLIN), revents: 0)) }
            // Asleep until an event, an action or the next reminder; with
            // sign-ins running, waking now and then to collect them. Not at
            // all while the bus has messages in memory: they are served in
            // turn with vaultd's events, however many a peer sends.
            let buffered = self.desktop?.hasBuffered == true
            let due = self.waiting.values.map { max(0, $0.remindAt - Self.now()) }.min() ?? 3600
            let timeout = min(due, self.signIns.isEmpty ? 3600 : 5)
            let ready = poll(&fds, nfds_t(fds.count), buffered ? 0 : Int32(timeout * 1000) + 1) > 0
            if ready, fds[0].revents != 0 {
                guard let line = try vault.nextEvent() else { return }
                self.handle(line)
            }
            if buffered || (ready && fds.count > 1 && fds[1].revents != 0) { self.serveDesktop() }
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

    /// Reads the desktop's signals: an action starts the account's sign-in, a
    /// dismissal leaves the reminder due as it was.
    private mutating func serveDesktop() {
        guard let desktop = self.desktop else { return }
        let signals: [Desktop.Signal]
        do {
            signals = try desktop.signals()
        } catch {
            Self.say("the notification service went away (\(error)); printing instead")
            self.desktop = nil
            return
        }
        for signal in signals {
            switch signal {
            case .action(let id, _):
                // "default" (a click) and "signin" (the menu) both start the sign-in.
                guard let account = self.waiting.first(where: { $0.value.id == id })?.key else { continue }
                desktop.close(id)
                self.waiting[account]?.id = 0
                self.startSignIn(account)
            case .closed(let id):
                guard let account = self.waiting.first(where: { $0.value.id == id })?.key else { continue }
                self.waiting[account]?.id = 0
            }
        }
    }

    private mutating func needs(_ account: String) {
        guard self.waiting[account] == nil else { return }
        self.waiting[account] = (0, Self.now())
    }

    private mutating func resolved(_ account: String) {
        guard let entry = self.waiting.removeValue(forKey: account) else { return }
        if entry.id != 0 { self.desktop?.close(entry.id) }
    }

    /// Shows (or shows again, in place) every reminder that is due.
    private mutating func remind() {
        let now = Self.now()
        for (account, entry) in self.waiting.sorted(by: { $0.key < $1.key }) where entry.remindAt <= now {
            let summary = "Sign in to \(account)"
            let who = self.usernames[account].map { " as \($0)" } ?? ""
            let body = "tokenvault: the issuer asks you to sign in to '\(account)'\(who) again."
            var id: UInt32 = 0
            if self.desktop == nil { self.desktop = Desktop.connect() }
            if let desktop = self.desktop {
                do {
                    id = try desktop.show(summary: summary, body: Desktop.markup(body), replacing: entry.id)
                } catch {
                    Self.say("the notification service refused (\(error)); printing instead")
                    self.desktop = nil
                }
            }
            // The username is the issuer's text: escaped, as every line vaultctl prints.
            if id == 0 { Output.line("\(summary): \(body) Run: vaultctl signin \(account)") }
            self.waiting[account] = (id, now + self.every)
        }
    }

    /// Runs `vaultctl signin ACCOUNT` beside this one, once at a time per account.
    private mutating func startSignIn(_ account: String) {
        guard self.signIns[account] == nil else { return }
        var arguments = [CommandLine.arguments.first ?? "vaultctl", "signin", account]
        if let socket = self.socket { arguments += ["--socket", socket] }
        var pid: pid_t = 0
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        guard posix_spawn(&pid, "/proc/self/exe", nil, nil, argv, environ) == 0 else {
            Self.say("could not start vaultctl signin \(account)")
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

/// The desktop's notification service (org.freedesktop.Notifications), on
/// the session bus.
final class Desktop {
    enum Signal {
        case action(UInt32, String)
        case closed(UInt32)
    }

    private let bus: DBusConnection
    /// Whether the first signal of another peer than the service was said on stderr.
    private var saidStranger = false
    private static let service = "org.freedesktop.Notifications"
    private static let path = "/org/freedesktop/Notifications"

    var descriptor: Int32 { self.bus.descriptor }
    var hasBuffered: Bool { self.bus.hasBuffered }

    private init(bus: DBusConnection) {
        self.bus = bus
    }

    /// The service, or nil when there is no session bus (said once on stderr).
    static func connect() -> Desktop? {
        do {
            let bus = try DBusConnection(environment: ProcessInfo.processInfo.environment)
            // Only the service's broadcasts are routed here (the bus matches
            // `sender` against the name's owner); a signal addressed to this
            // connection comes whatever the rule, and `signalsFrom` drops it.
            let rule = "type='signal',sender='\(Self.service)',interface='\(Self.service)',path='\(Self.path)'"
            try bus.call(
                destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                member: "AddMatch", signature: "s"
            ) { $0.string(rule) }
            return Desktop(bus: bus)
        } catch {
            Output.error("\(error); printing instead")
            return nil
        }
    }

    /// Shows a notification with a "Sign in" action, in place of `replacing` when it still shows.
    func show(summary: String, body: String, replacing: UInt32) throws(DBusConnection.Failure) -> UInt32 {
        var reply = try self.bus.call(
            destination: Self.service, path: Self.path, interface: Self.service, member: "Notify", signature: "susssasa{sv}i"
        ) { w in
            w.string("tokenvault")
            w.uint32(replacing)
            w.string("dialog-password")
            w.string(summary)
            w.string(body)
            w.array(alignment: 4) { actions in
                for action in ["default", "Sign in", "signin", "Sign in"] { actions.string(action) }
            }
            w.array(alignment: 8) { _ in }
            w.int32(0)  // never expires: the reminder replaces it
        }
        guard reply.signature == "u", let id = reply.body.uint32() else { throw .protocolError("Notify answered \(reply.signature)") }
        // The peer that answered is the service: its actions and dismissals
        // are the only ones that count. Any other peer on the bus can send
        // the same signals (a `dbus-send` would start a sign-in).
        self.bus.signalsFrom = reply.sender
        return id
    }

    /// `text` for a notification's body, which servers read as markup.
    static func markup(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            default: out.append(character)
            }
        }
        return out
    }

    func close(_ id: UInt32) {
        _ = try? self.bus.call(destination: Self.service, path: Self.path, interface: Self.service, member: "CloseNotification", signature: "u") {
            $0.uint32(id)
        }
    }

    /// The actions and dismissals readable now, of the service that
    /// answered `Notify` only (`DBusConnection.readSignals`: one read of the
    /// bus at most).
    func signals() throws(DBusConnection.Failure) -> [Signal] {
        var signals: [Signal] = []
        let messages = try self.bus.readSignals()
        if !self.saidStranger, let stranger = self.bus.firstStranger {
            Output.error("ignoring signals from \(stranger) on the session bus: only the notification service's are acted on")
            self.saidStranger = true
        }
        for var message in messages where message.interface == Self.service {
            switch (message.member, message.signature) {
            case ("ActionInvoked", "us"):
                guard let id = message.body.uint32(), let key = message.body.string() else { continue }
                signals.append(.action(id, key))
            case ("NotificationClosed", "uu"):
                guard let id = message.body.uint32() else { continue }
                signals.append(.closed(id))
            default:
                continue
            }
        }
        return signals
    }
}
