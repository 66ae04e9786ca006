// The programs vaultbench runs beside vaultd: the C load client and echo
// floor, Glewlwyd, oidc-agent, and plain processes it times.
import Foundation
import Glibc

/// The repository vaultbench was built from (its scripts and the load client's source).
let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().path

/// Runs a program to its end; its standard output, or an error naming it
/// (with its standard error) when it fails. Output goes through files, not
/// pipes: a daemon the program leaves behind (Glewlwyd, oidc-agent) keeps
/// its copy of them open.
@discardableResult
func output(of path: String, _ arguments: [String], environment: [String: String] = [:]) throws -> String {
    let base = NSTemporaryDirectory() + "vaultbench-\(getpid())-\(UUID().uuidString)"
    defer {
        try? FileManager.default.removeItem(atPath: base + ".out")
        try? FileManager.default.removeItem(atPath: base + ".err")
    }
    // posix_spawn and waitpid: Foundation's Process.waitUntilExit can miss
    // the exit of a child whose own child lives on.
    let pid = try spawn(path, arguments, environment: environment, output: base + ".out", errors: base + ".err")
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let data = (try? String(contentsOfFile: base + ".out", encoding: .utf8)) ?? ""
    guard status == 0 else {
        let errors = (try? String(contentsOfFile: base + ".err", encoding: .utf8)) ?? ""
        let said = errors.split(separator: "\n").suffix(3).joined(separator: " / ")
        throw BenchError("\((path as NSString).lastPathComponent) exited with status \(status): \(said)")
    }
    return data
}

/// posix_spawn with the given environment added; stdin from /dev/null,
/// stdout and stderr to the files given, else to /dev/null.
func spawn(
    _ path: String, _ arguments: [String], environment: [String: String] = [:],
    output: String = "/dev/null", errors: String = "/dev/null"
) throws -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_addopen(&actions, 2, errors, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    let variables = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    let envp = variables.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { envp.forEach { free($0) } }
    var pid: pid_t = 0
    guard posix_spawn(&pid, path, &actions, nil, argv, envp) == 0 else { throw BenchError("cannot run \(path)") }
    return pid
}

/// SIGTERM, then the exit (SIGKILL after 10 s).
func stop(_ pid: pid_t) {
    kill(pid, SIGTERM)
    let end = Clock.now() + 10
    var status: Int32 = 0
    while waitpid(pid, &status, WNOHANG) == 0 {
        if Clock.now() > end {
            kill(pid, SIGKILL)
            waitpid(pid, &status, 0)
            return
        }
        usleep(2_000)
    }
}

/// CPU time processes have used (user + system), from /proc/PID/stat.
func cpuSeconds(of pids: [Int32]) -> Double {
    pids.reduce(0) { total, pid in
        let used = cpuSeconds(of: pid)
        return total + used.user + used.system
    }
}

/// CPU time a process has used (user, system), from /proc/PID/stat.
func cpuSeconds(of pid: Int32) -> (user: Double, system: Double) {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")")
    else { return (0, 0) }
    // Fields after the command: state is field 3; utime 14, stime 15.
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    let tick = Double(sysconf(Int32(_SC_CLK_TCK)))
    return ((Double(fields[11]) ?? 0) / tick, (Double(fields[12]) ?? 0) / tick)
}

// MARK: - The C load client and echo floor

/// Benchmarks/load/vbload.c, compiled with the system's C compiler into `folder`.
struct Load {
    let path: String

    init(folder: String) throws {
        self.path = folder + "/vbload"
        try output(of: "/usr/bin/env", [
            "cc", "-O2", "-o", self.path, repository + "/Benchmarks/load/vbload.c", "-lsodium", "-lpthread",
        ])
    }

    struct Result {
        var values: [String: Double]
        var ok: Int { Int(values["ok"] ?? 0) }
        var errors: Int { Int(values["err"] ?? 0) }
        var rate: Double { values["rate"] ?? 0 }
        /// Microseconds.
        var p50: Double { values["p50"] ?? 0 }
        var p99: Double { values["p99"] ?? 0 }
        var max: Double { values["max"] ?? 0 }
    }

    private func parse(_ line: String) -> Result {
        var values: [String: Double] = [:]
        for pair in line.split(whereSeparator: { $0 == " " || $0 == "\n" }) {
            let parts = pair.split(separator: "=", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = Double(parts[1]) }
        }
        return Result(values: values)
    }

    /// `clients` threads in a closed loop for `seconds` (after 0.3 s of warm-up).
    func run(_ mode: String, _ socket: String, clients: Int, seconds: Double, request: String) throws -> Result {
        parse(try output(of: path, ["run", mode, socket, "\(clients)", "\(seconds)", request]))
    }

    /// `total` requests shared by `clients` threads.
    func many(_ mode: String, _ socket: String, clients: Int, total: Int, request: String) throws -> Result {
        parse(try output(of: path, ["many", mode, socket, "\(clients)", "\(total)", request]))
    }

    /// `clients` requests sent at one instant; their waits.
    func burst(_ mode: String, _ socket: String, clients: Int, request: String) throws -> Result {
        parse(try output(of: path, ["burst", mode, socket, "\(clients)", request]))
    }

    /// The C echo server: each line in gets `replyBytes` bytes and a newline back.
    func echoServer(_ socket: String, replyBytes: Int) throws -> pid_t {
        let pid = try spawn(path, ["echo", socket, "\(replyBytes)"])
        _ = try Client.connect(socket, deadline: 5)
        return pid
    }
}

// MARK: - Glewlwyd, the issuer both daemons use

struct Glewlwyd {
    let folder: String
    let issuer: String
    static let script = repository + "/demo/glewlwyd"
    static var installed: Bool { FileManager.default.isExecutableFile(atPath: "/usr/bin/glewlwyd") }

    /// `dpop`: as demo/glewlwyd/start.sh's GLEWLWYD_DPOP (off, on, nonce:N).
    static func start(folder: String, accessTokenSeconds: Int, dpop: String = "off") throws -> Glewlwyd {
        let issuer = try output(
            of: script + "/start.sh", [folder],
            environment: ["GLEWLWYD_ACCESS_TOKEN_SECONDS": "\(accessTokenSeconds)", "GLEWLWYD_DPOP": dpop]
        ).trimmingCharacters(in: .whitespacesAndNewlines)
        return Glewlwyd(folder: folder, issuer: issuer)
    }

    func stop() { _ = try? output(of: Glewlwyd.script + "/stop.sh", [folder]) }

    /// Token answers Glewlwyd has given `client` (sign-ins and refreshes), from its log.
    func tokensIssued(to client: String) -> Int {
        let log = (try? String(contentsOfFile: folder + "/glewlwyd.log", encoding: .utf8)) ?? ""
        let needle = "Access token generated for client '\(client)'"
        return log.split(separator: "\n").filter { $0.contains(needle) }.count
    }
}

// MARK: - oidc-agent, the peer

/// A private oidc-agent (Debian's oidc-agent-cli) on its own socket and
/// configuration folder.
struct OidcAgent {
    let socket: String
    let configFolder: String
    /// The encryption password of the account files, for this run only.
    private let password = UUID().uuidString

    static var installed: Bool {
        ["oidc-agent", "oidc-gen", "oidc-token"].allSatisfy { FileManager.default.isExecutableFile(atPath: "/usr/bin/" + $0) }
    }

    static func start(folder: String) throws -> OidcAgent {
        let config = folder + "/oidc-agent"
        try FileManager.default.createDirectory(atPath: config, withIntermediateDirectories: true)
        let socket = folder + "/oidc-agent.sock"
        // It daemonizes; the socket is there once it serves.
        try output(
            of: "/usr/bin/oidc-agent", ["--no-autoload", "--socket-path=" + socket, "--quiet"],
            environment: ["OIDC_CONFIG_DIR": config, "TMPDIR": folder]
        )
        let agent = OidcAgent(socket: socket, configFolder: config)
        _ = try quickConnect(socket, deadline: 10)
        guard !agent.pids.isEmpty else { throw BenchError("oidc-agent is not running") }
        return agent
    }

    var environment: [String: String] {
        ["OIDC_SOCK": socket, "OIDC_CONFIG_DIR": configFolder, "VB_OIDC_PW": password]
    }

    /// An account signed in with the password grant, as `oidc-gen` does it
    /// without prompting; it stays loaded in the agent.
    func add(_ name: String, issuer: String, clientID: String, clientSecret: String) throws {
        try output(of: "/usr/bin/oidc-gen", [
            name, "--issuer=" + issuer + "/", "--client-id=" + clientID, "--client-secret=" + clientSecret,
            "--flow=password", "--op-username=ada", "--op-password=correct horse", "--prompt=none",
            "--pw-env=VB_OIDC_PW", "--scope=openid offline_access", "--no-url-call", "--confirm-default",
        ], environment: environment)
    }

    /// The access-token request of oidc-agent's IPC API.
    static func request(_ account: String, minValid: Int = 60) -> String {
        #"{"request":"access_token","account":"\#(account)","min_valid_period":\#(minValid),"application_hint":"vaultbench"}"#
    }

    /// oidc-agent runs as two processes (a proxy that owns the socket and
    /// the IPC encryption, and the agent that holds the tokens): every
    /// process started with this socket, so memory and CPU count both.
    var pids: [pid_t] {
        let needle = "--socket-path=" + socket
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { Int32($0) }.filter { candidate in
            guard let data = FileManager.default.contents(atPath: "/proc/\(candidate)/cmdline") else { return false }
            return String(decoding: data, as: UTF8.self).split(separator: "\0").contains { $0 == needle }
        }
    }

    /// RSS and threads summed over its processes.
    func memory() throws -> Memory {
        let each = try pids.map { try vaultbench.memory(of: $0) }
        guard !each.isEmpty else { throw BenchError("oidc-agent is not running") }
        return each.dropFirst().reduce(each[0]) { sum, next in
            Memory(
                rssKB: sum.rssKB + next.rssKB, peakKB: sum.peakKB + next.peakKB, threads: sum.threads + next.threads,
                anonKB: sum.anonKB + next.anonKB, fileKB: sum.fileKB + next.fileKB
            )
        }
    }

    /// It blocks SIGTERM while it waits on its socket: SIGKILL (nothing of
    /// this private agent is worth keeping).
    func stop() { for pid in pids { kill(pid, SIGKILL) } }
}
