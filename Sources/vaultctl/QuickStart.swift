import ArgumentParser
import Glibc
import VaultClient
import VaultProtocol

/// The commands programs run in loops (`token`, `exec`, `git-credential`,
/// `exec-credential`), parsed by hand before ArgumentParser is touched.
///
/// ArgumentParser builds its whole command tree, and asks the Swift runtime
/// for protocol conformances, on every start: most of what a `vaultctl token`
/// process costs. This parser accepts only the plain spellings of these
/// commands (`--name value`, `--name=value`, known flags, each single-valued
/// option at most once, values that do not start with `-`, and arguments in
/// range) and declines everything else: help, unknown or repeated options,
/// anything ArgumentParser would refuse or read differently. Declined
/// arguments go to ArgumentParser, so help, completions and error messages
/// are ArgumentParser's, and both paths run the same jobs.
///
/// `VAULTCTL_PARSER=full` skips this parser; `VAULTCTL_PARSER=quick` makes
/// a declined command line exit 64 without running (both for tests).
enum QuickStart {
    enum Job {
        case token(TokenJob)
        case execCredential(ExecCredentialJob)
        case gitCredential(GitCredentialJob)
        case exec(ExecJob)

        func run() throws {
            switch self {
            case .token(let job): try job.run()
            case .execCredential(let job): try job.run()
            case .gitCredential(let job): try job.run()
            case .exec(let job): try job.run()
            }
        }
    }

    /// Runs the command and exits when this parser takes `arguments`
    /// (without the program name); returns when ArgumentParser should.
    static func runIfPlain(_ arguments: [String]) {
        let mode = TokenVault.environment("VAULTCTL_PARSER")
        if mode == "full" { return }
        guard let job = Self.parse(arguments) else {
            if mode == "quick" {
                Output.error("the quick parser declined these arguments")
                exit(64)
            }
            return
        }
        do {
            try job.run()
        } catch let error as ExitCode {
            exit(error.rawValue)
        } catch {
            VaultCtl.exit(withError: error)
        }
        exit(0)
    }

    /// The job for `arguments`, or nil when ArgumentParser should read them.
    static func parse(_ arguments: [String]) -> Job? {
        guard let name = arguments.first else { return nil }
        let rest = arguments.dropFirst()
        switch name {
        case "token":
            guard
                let plain = Plain(
                    rest,
                    options: ["socket", "scope", "min-ttl"],
                    flags: ["json", "force-refresh", "header"]
                ),
                plain.positionals.count == 1, plain.afterTerminator == nil,
                let minTTL = plain.minTTL
            else { return nil }
            return .token(
                TokenJob(
                    socket: plain.single("socket"),
                    json: plain.flags.contains("json"),
                    account: plain.positionals[0],
                    scopes: plain.values("scope") ?? [],
                    minTTL: minTTL,
                    forceRefresh: plain.flags.contains("force-refresh"),
                    header: plain.flags.contains("header")
                )
            )
        case "exec-credential":
            guard
                let plain = Plain(rest, options: ["socket", "scope", "min-ttl"], flags: ["json"]),
                plain.positionals.count == 1, plain.afterTerminator == nil,
                let minTTL = plain.minTTL
            else { return nil }
            return .execCredential(
                ExecCredentialJob(
                    socket: plain.single("socket"),
                    account: plain.positionals[0],
                    scopes: plain.values("scope") ?? [],
                    minTTL: minTTL
                )
            )
        case "git-credential":
            // No --json: ArgumentParser refuses it here, with its own message.
            guard
                let plain = Plain(rest, options: ["socket", "username", "host"], flags: []),
                plain.positionals.count == 2, plain.afterTerminator == nil,
                let hosts = plain.values("host"), !hosts.isEmpty
            else { return nil }
            let username = plain.single("username")
            if let username, username.utf8.contains(where: { $0 == 0x0A || $0 == 0x0D }) { return nil }
            return .gitCredential(
                GitCredentialJob(
                    socket: plain.single("socket"),
                    account: plain.positionals[0],
                    username: username,
                    hosts: hosts,
                    operation: plain.positionals[1]
                )
            )
        case "exec":
            guard
                let plain = Plain(rest, options: ["socket", "scope", "min-ttl", "env"], flags: [], terminator: true),
                plain.positionals.count == 1,
                let command = plain.afterTerminator, let program = command.first, !program.isEmpty,
                let minTTL = plain.minTTL
            else { return nil }
            let variable = plain.single("env") ?? "TOKENVAULT_TOKEN"
            guard Exec.isVariableName(variable), !Exec.isInterpreted(variable) else { return nil }
            return .exec(
                ExecJob(
                    socket: plain.single("socket"),
                    account: plain.positionals[0],
                    variable: variable,
                    scopes: plain.values("scope") ?? [],
                    minTTL: minTTL,
                    command: command
                )
            )
        default:
            return nil
        }
    }

    /// A command's arguments in their plain spellings; nil for anything else.
    ///
    /// Arrays, not sets or dictionaries: building the `Set<String>`s this
    /// parser had took 6 % of a whole `vaultctl token` process (perf), most
    /// of it the Swift runtime instantiating generic metadata.
    struct Plain {
        struct Option {
            var name: String
            var values: [String]
        }

        var positionals: [String] = []
        var options: [Option] = []
        var flags: [String] = []
        /// What follows `--`, for a command that takes it.
        var afterTerminator: [String]?

        init?(_ arguments: ArraySlice<String>, options: [String], flags: [String], terminator: Bool = false) {
            var index = arguments.startIndex
            while index < arguments.endIndex {
                let argument = arguments[index]
                index += 1
                // "help" is a word ArgumentParser may read as a request for help.
                guard !argument.isEmpty, argument != "help" else { return nil }
                if argument == "--" {
                    guard terminator else { return nil }
                    self.afterTerminator = Array(arguments[index...])
                    return
                }
                guard argument.hasPrefix("-") else {
                    self.positionals.append(argument)
                    continue
                }
                guard argument.hasPrefix("--") else { return nil }
                var name = Substring(argument.utf8.dropFirst(2))
                var value: String?
                if let equals = name.firstIndex(of: "=") {
                    value = String(name[name.index(after: equals)...])
                    name = name[..<equals]
                }
                let key = String(name)
                if flags.contains(key) {
                    guard value == nil, !self.flags.contains(key) else { return nil }
                    self.flags.append(key)
                    continue
                }
                guard options.contains(key) else { return nil }
                if value == nil {
                    guard index < arguments.endIndex else { return nil }
                    value = arguments[index]
                    index += 1
                }
                guard let value, !value.isEmpty, !value.hasPrefix("-"), value != "help" else { return nil }
                if let seen = self.options.firstIndex(where: { $0.name == key }) {
                    // Only --scope and --host repeat; ArgumentParser keeps the
                    // last of the others, which a plain command line does not rely on.
                    guard key == "scope" || key == "host" else { return nil }
                    self.options[seen].values.append(value)
                } else {
                    self.options.append(Option(name: key, values: [value]))
                }
            }
        }

        func values(_ key: String) -> [String]? { self.options.first { $0.name == key }?.values }

        func single(_ key: String) -> String? { self.values(key)?.first }

        /// `--min-ttl` when absent or plain digits in range; nil otherwise
        /// (ArgumentParser then says what is wrong).
        var minTTL: Int? {
            guard let text = self.single("min-ttl") else { return TokenRequest.defaultMinTTL }
            guard text.utf8.count <= 5, text.utf8.allSatisfy({ (0x30...0x39).contains($0) }), let value = Int(text),
                TokenRequest.minTTLRange.contains(value)
            else { return nil }
            return value
        }
    }
}
