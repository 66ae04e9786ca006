import ArgumentParser
import FoundationEssentials
import Glibc
import VaultClient
import VaultJSON
import VaultProtocol

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print vaultd's events, one line each, until interrupted; or run a command for each.",
        discussion: """
            Text lines are EVENT ACCOUNT then the event's other fields as NAME=VALUE, sorted by name, \
            each value escaped to one field (a space is \\x20). With --json, the event objects as vaultd \
            sends them. With --exec, CMD runs through /bin/sh once per event, one at a time and in order, \
            with TOKENVAULT_EVENT, TOKENVAULT_ACCOUNT and TOKENVAULT_<FIELD> for each other field set; \
            it is killed after --exec-timeout seconds. TOKENVAULT_USERNAME is the issuer's text, as it \
            sent it and not escaped: untrusted, so quote it ("$TOKENVAULT_USERNAME"), never eval it, and \
            escape it before it reaches a terminal. No event carries a token. Exits 75 when vaultd \
            closes the stream because this reader fell behind (overloaded), 69 when vaultd stops: a \
            supervisor restarts it.
            """
    )

    @OptionGroup var connection: Connection

    @Argument(help: "Only these accounts' events (default: every account's).")
    var accounts: [String] = []

    @Option(help: "A shell command to run for each event, with the event in its environment.")
    var exec: String?

    @Option(help: "Seconds an --exec command may run before it is killed.")
    var execTimeout: Int = 30

    func validate() throws {
        guard (1...3600).contains(self.execTimeout) else { throw ValidationError("--exec-timeout is 1 to 3600 seconds") }
        if self.exec != nil, self.connection.json { throw ValidationError("--exec and --json: choose one") }
    }

    func run() throws {
        try self.connection.run { (vault) throws(VaultError) in
            try vault.send(.subscribe(accounts: self.accounts.isEmpty ? nil : self.accounts))
            while let line = try vault.nextEvent() {
                if self.connection.json {
                    Output.verbatim(String(decoding: line, as: UTF8.self))
                    continue
                }
                guard let event = try? JSONDecoder().decode([String: JSONValue].self, from: line) else { continue }
                let fields = WatchedEvent(event)
                if let command = self.exec {
                    WatchedEvent.run(command, with: fields.environment, timeout: self.execTimeout)
                } else {
                    Output.verbatim(fields.text)
                }
            }
            throw VaultError(.unavailable, "vaultd closed the event stream (it stopped); watch again once it is back")
        }
    }
}

/// One event as `watch` shows it and hands it to a command.
struct WatchedEvent {
    var name: String
    var account: String
    /// The other fields, by name, as text.
    var fields: [(String, String)]

    init(_ object: [String: JSONValue]) {
        self.name = object["event"]?.stringValue ?? "?"
        self.account = object["account"]?.stringValue ?? ""
        self.fields = object.keys.sorted().filter { $0 != "event" && $0 != "account" }.compactMap { key in
            switch object[key] {
            case .string(let value): (key, value)
            case .number(let value): (key, value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value))
            case .bool(let value): (key, String(value))
            default: nil
            }
        }
    }

    /// `EVENT ACCOUNT NAME=VALUE...`, every part one field of one line.
    var text: String {
        ([self.name, self.account] + self.fields.map { "\($0.0)=\($0.1)" }).map { $0.escaped(for: .log) }.joined(separator: " ")
    }

    var environment: [String: String] {
        var environment = ["TOKENVAULT_EVENT": self.name, "TOKENVAULT_ACCOUNT": self.account]
        for (key, value) in self.fields {
            let name = String(key.uppercased().map { $0.isLetter || $0.isNumber ? $0 : "_" })
            environment["TOKENVAULT_" + name] = value
        }
        return environment
    }

    /// Runs `command` through /bin/sh with `environment` added, in a process
    /// group of its own, and waits for it: at most `timeout` seconds, after
    /// which the group is killed. Waits on SIGCHLD, never by polling.
    static func run(_ command: String, with environment: [String: String], timeout: Int) {
        var chld = sigset_t()
        sigemptyset(&chld)
        sigaddset(&chld, SIGCHLD)
        pthread_sigmask(SIG_BLOCK, &chld, nil)
        guard let pid = Programs.start("/bin/sh", ["-c", command], environment: environment) else {
            Output.error("could not run /bin/sh for --exec")
            return
        }
        var start = timespec()
        clock_gettime(CLOCK_MONOTONIC, &start)
        var status: Int32 = 0
        while true {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid || (reaped < 0 && errno != EINTR) { return }
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            let left = Double(timeout) - (Double(now.tv_sec - start.tv_sec) + Double(now.tv_nsec - start.tv_nsec) / 1e9)
            guard left > 0 else {
                kill(-pid, SIGKILL)
                while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                Output.error("--exec: the command ran past \(timeout) s and was killed")
                return
            }
            var wait = timespec(tv_sec: Int(left), tv_nsec: Int((left - left.rounded(.down)) * 1e9))
            _ = sigtimedwait(&chld, nil, &wait)
        }
    }
}
