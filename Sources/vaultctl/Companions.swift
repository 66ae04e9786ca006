import ArgumentParser
import FoundationEssentials
import Glibc
import VaultClient
import VaultCrypto
import VaultProtocol

/// `vaultctl exec`: runs a program with an access token in its environment.
struct Exec: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exec",
        abstract: "Run a command with an access token in its environment.",
        discussion: """
            Gets an access token for ACCOUNT (refreshed when it lives less than --min-ttl more \
            seconds), puts it in the environment variable --env and replaces vaultctl with COMMAND, \
            searched for in PATH. Every other variable is passed on as it is, and the token never \
            appears on a command line:

              vaultctl exec work -- ./deploy.sh --to staging
              vaultctl exec work --env GITLAB_TOKEN -- glab repo list

            The exit status is COMMAND's. When vaultd cannot give a token nothing is run, and \
            the exit status says why (69 vaultd not running, 67 unknown account, 77 sign in \
            again…). A COMMAND that cannot be run exits 127 (126 when it is not executable), \
            as in the shell.
            """
    )

    @OptionGroup var connection: Connection

    @Argument(help: "The account.")
    var account: String

    @Option(name: .customLong("env"), help: ArgumentHelp("The environment variable that carries the token.", valueName: "name"))
    var variable = "TOKENVAULT_TOKEN"

    @Option(name: .customLong("scope"), help: "A scope to ask for (default: the account's); repeat for more.")
    var scopes: [String] = []

    @Option(help: "Refresh unless the token lives at least this many more seconds.")
    var minTTL: Int = TokenRequest.defaultMinTTL

    @Argument(parsing: .postTerminator, help: ArgumentHelp("The command to run, and its arguments, after --.", valueName: "command"))
    var command: [String] = []

    func validate() throws {
        if self.connection.json { throw ValidationError("--json does not apply to exec; the command's output is its own") }
        guard TokenRequest.minTTLRange.contains(self.minTTL) else { throw ValidationError("--min-ttl is 0 to 86400 seconds") }
        guard Self.isVariableName(self.variable) else {
            throw ValidationError("--env takes a variable name: letters, digits and _, not starting with a digit")
        }
        guard !Self.isInterpreted(self.variable) else {
            throw ValidationError(
                "--env \(self.variable): the loader or a shell reads that variable, and would run or print the token; choose another name"
            )
        }
        guard let program = self.command.first, !program.isEmpty else {
            throw ValidationError("give the command to run after --, as in: vaultctl exec \(self.account) -- CMD [ARGS...]")
        }
    }

    func run() throws {
        try ExecJob(
            socket: self.connection.socket,
            account: self.account,
            variable: self.variable,
            scopes: self.scopes,
            minTTL: self.minTTL,
            command: self.command
        ).run()
    }

    /// A name a shell can read: `[A-Za-z_][A-Za-z0-9_]*`.
    static func isVariableName(_ name: String) -> Bool {
        guard let first = name.utf8.first, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else { return false }
        return name.utf8.allSatisfy { byte in
            byte == UInt8(ascii: "_") || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
                || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
        }
    }

    /// Variables the dynamic loader, a shell or a common runtime reads as a
    /// path, a program or options: a token there is loaded, run or quoted
    /// in an error message (ld.so prints what it could not load).
    static func isInterpreted(_ name: String) -> Bool {
        let exact: Set<String> = [
            "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH", "PATH", "HOME",
            "SHELL", "PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT",
            "RUBYLIB", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "GCONV_PATH", "LOCPATH", "TMPDIR",
            "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH", "GIT_CONFIG_PARAMETERS", "EDITOR", "VISUAL", "PAGER",
        ]
        return exact.contains(name) || name.hasPrefix("LD_") || name.hasPrefix("BASH_FUNC_") || name.hasPrefix("MALLOC_")
            || name.hasPrefix("GLIBC_") || name.hasPrefix("DYLD_")
    }

    /// Sets `name` to the token through a wiped C string (`setenv` keeps its
    /// own copy, which the exec then discards). False when the token has a NUL.
    static func setVariable(_ name: String, to token: SecretBytes) -> Bool {
        var value = [CChar](repeating: 0, count: token.count + 1)
        defer { value.withUnsafeMutableBytes { secureZero($0) } }
        let clean = token.withUnsafeBytes { bytes in
            for (index, byte) in bytes.enumerated() {
                guard byte != 0 else { return false }
                value[index] = CChar(bitPattern: byte)
            }
            return true
        }
        return clean && setenv(name, value, 1) == 0
    }
}

/// What `vaultctl exec` does once its arguments are parsed and checked, by
/// ArgumentParser or by `QuickStart`.
struct ExecJob {
    var socket: String?
    var account: String
    var variable = "TOKENVAULT_TOKEN"
    var scopes: [String] = []
    var minTTL = TokenRequest.defaultMinTTL
    /// The program and its arguments; not empty.
    var command: [String]

    func run() throws {
        let request = TokenRequest(
            account: self.account,
            scopes: self.scopes.isEmpty ? nil : self.scopes,
            minTTL: self.minTTL
        )
        var token: SecretBytes?
        try Connection.run(socket: self.socket) { (vault) throws(VaultError) in
            token = try Output.field(TokenResult.self, of: try vault.send(.token(request))).bearer(self.account).accessToken
        }
        // The connection is closed by now (and close-on-exec in any case).
        guard let token, Exec.setVariable(self.variable, to: token) else {
            Output.error("vaultd sent an access token that cannot go in an environment variable")
            throw ExitCode(ErrorCode.internalError.exitCode)
        }
        let program = self.command[0]
        var argv: [UnsafeMutablePointer<CChar>?] = self.command.map { strdup($0) } + [nil]
        execvp(program, &argv)
        // Only reached when the command could not be run.
        let code = errno
        argv.forEach { free($0) }
        unsetenv(self.variable)
        Output.error("cannot run \(program): \(String(cString: strerror(code)))")
        throw ExitCode(code == EACCES ? 126 : 127)
    }
}

/// `vaultctl git-credential`: git's credential helper protocol, answered
/// from the vault.
struct GitCredential: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "git-credential",
        abstract: "A git credential helper that answers with the account's access token.",
        discussion: """
            Set it up for one host with:

              git config --global \\
                credential.https://git.example.org.helper '!vaultctl git-credential work --host git.example.org'

            It answers only for the hosts named by --host (git's host, with its :port when \
            git sends one), over https, or plain http on 127.0.0.1 or [::1]; for any other \
            request it prints nothing and exits 0, so git goes on to its next helper and the \
            token never reaches a host it was not meant for, even from a helper set for every URL.

            For 'get', git's request is read from stdin and the answer is username= and \
            password= (the access token) lines, with password_expiry_utc= (git 2.41 and later \
            use it; older ones ignore it). The username is --username, else the one git sent, \
            else oauth2, which GitLab, Gitea, Forgejo and Bitbucket accept with an OAuth token \
            as the password; GitHub wants x-access-token: \
            '!vaultctl git-credential work --username x-access-token'. 'store' and 'erase' read \
            their input and do nothing: the vault owns the token. Other operations are ignored, \
            as git asks of helpers.

            On an error nothing is printed on stdout, so git goes on to its next helper or \
            prompt; the reason goes to stderr and the exit status follows sysexits(3).
            """
    )

    @OptionGroup var connection: Connection

    @Argument(help: "The account.")
    var account: String

    @Option(help: "The username to give git (default: the one git sent, else oauth2).")
    var username: String?

    @Option(name: .customLong("host"), help: ArgumentHelp("A host the token is for (repeat for more); no other host gets it.", valueName: "host[:port]"))
    var hosts: [String] = []

    @Argument(help: ArgumentHelp("What git asks: get, store or erase.", valueName: "operation"))
    var operation: String

    func validate() throws {
        if self.connection.json { throw ValidationError("--json does not apply to git-credential; git reads key=value lines") }
        guard !self.hosts.isEmpty else {
            throw ValidationError("--host HOST: the host the token is for, so that no other host gets it")
        }
        if let username = self.username {
            guard !username.isEmpty, !username.utf8.contains(where: { $0 == 0x0A || $0 == 0x0D || $0 == 0 }) else {
                throw ValidationError("--username must be one non-empty line")
            }
        }
    }

    func run() throws {
        try GitCredentialJob(
            socket: self.connection.socket,
            account: self.account,
            username: self.username,
            hosts: self.hosts,
            operation: self.operation
        ).run()
    }

    /// What git asked, of what this helper reads: the protocol, the host
    /// and the username.
    struct Request {
        var scheme: String?
        var host: String?
        var username: String?

        /// The token goes only to a host named by `--host`, over https, or
        /// plain http to a loopback address.
        func isFor(_ hosts: [String]) -> Bool {
            guard let host = self.host, hosts.contains(host) else { return false }
            switch self.scheme {
            case "https": return true
            case "http": return Loopback.isAddress(withPort: host)
            default: return false
            }
        }
    }

    /// Reads `key=value` lines from stdin up to a blank line or the end of
    /// input, and returns what git asked (`protocol`, `host`, `username`).
    /// Every other byte (git sends the password back with `store`) is wiped.
    static func readRequest() -> Request {
        let maximumLine = 65_536
        var request = Request()
        var line: [UInt8] = []
        line.reserveCapacity(maximumLine)
        var chunk = [UInt8](repeating: 0, count: 4096)
        defer {
            line.secureZero()
            chunk.secureZero()
        }
        var overlong = false
        func take(_ line: [UInt8]) {
            for (key, field) in [("username=", \Request.username), ("host=", \Request.host), ("protocol=", \Request.scheme)] {
                let key = Array(key.utf8)
                if line.starts(with: key) { request[keyPath: field] = String(decoding: line[key.count...], as: UTF8.self) }
            }
        }
        reading: while true {
            let n = read(0, &chunk, chunk.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            for byte in chunk[0..<n] {
                guard byte == 0x0A else {
                    if line.count < maximumLine { line.append(byte) } else { overlong = true }
                    continue
                }
                if line.last == 0x0D { line.removeLast() }
                if line.isEmpty && !overlong { break reading }
                if !overlong { take(line) }
                line.secureZero()
                line.removeAll(keepingCapacity: true)
                overlong = false
            }
        }
        // A last line without its newline, at the end of input.
        if !overlong { take(line) }
        return request
    }

    static func writeAll(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { write(1, $0.baseAddress?.advanced(by: offset), $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return }
            offset += n
        }
    }
}

/// What `vaultctl git-credential` does once its arguments are parsed and
/// checked, by ArgumentParser or by `QuickStart`.
struct GitCredentialJob {
    var socket: String?
    var account: String
    var username: String?
    var hosts: [String]
    var operation: String

    func run() throws {
        // Always read git's request to its end, so git never writes into a
        // closed pipe; only the protocol, host and username are kept.
        let sent = GitCredential.readRequest()
        guard self.operation == "get" else { return }
        // Not a host of this account's: no answer, and git asks its next helper.
        guard sent.isFor(self.hosts) else { return }
        let username = self.username ?? sent.username.flatMap { $0.isEmpty ? nil : $0 } ?? "oauth2"
        let request = TokenRequest(account: self.account)
        try Connection.run(socket: self.socket) { (vault) throws(VaultError) in
            let token = try Output.field(TokenResult.self, of: try vault.send(.token(request))).bearer(self.account)
            var answer = Array("username=\(username)\npassword=".utf8)
            defer { answer.secureZero() }
            answer.reserveCapacity(answer.count + token.accessToken.count + 64)
            // vaultd hands on only visible ASCII without space (its one rule
            // for an issuer's access token): nothing here can end the line.
            token.accessToken.withUnsafeBytes { answer.append(contentsOf: $0) }
            answer.append(0x0A)
            if token.expiresAt > 0 { answer.append(contentsOf: "password_expiry_utc=\(token.expiresAt)\n".utf8) }
            GitCredential.writeAll(answer)
        }
    }
}
