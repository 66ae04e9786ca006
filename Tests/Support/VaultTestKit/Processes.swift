import Foundation
package import Glibc
import Testing
package import VaultTestIssuer

extension DaemonProcess: Stoppable {
    /// SIGTERM, and the exit awaited. A vaultd that has not stopped 10 s
    /// later is a failure of the test, and is killed so nothing hangs.
    package func stop() async {
        guard self.isRunning else { return }
        let status = await self.terminate(within: 10)
        #expect(status != nil, "vaultd \(self.pid) did not stop on SIGTERM within 10 s: \(self.output)")
    }

    /// SIGTERM, then the exit status; nil, and SIGKILL, when vaultd has not
    /// exited `seconds` later.
    package func terminate(within seconds: Double) async -> Int32? {
        if self.isRunning { kill(self.pid, SIGTERM) }
        let exited = (try? await within(seconds: seconds) { !self.isRunning }) ?? false
        if !exited { kill(self.pid, SIGKILL) }
        let status = await self.waitForExit()
        return exited ? status : nil
    }
}

/// vaultd as a child process. Its stderr goes to a file, not a pipe: a pipe's
/// end-of-file would also wait for any other child that inherited it.
package final class DaemonProcess: @unchecked Sendable {
    package let pid: pid_t
    package let folder: String
    package let socketPath: String
    package let logPath: String
    private let lock = NSLock()
    private var exitStatus: Int32?

    /// `launcher`, when given, runs vaultd (a command and its arguments
    /// that end where vaultd's path goes, like systemd-socket-activate).
    /// Spawned and reaped with posix_spawn and waitpid: Foundation's
    /// Process left children unreaped and spun when many tests ran at once.
    package init(
        folder: String,
        socketPath: String? = nil,
        arguments: [String] = [],
        environment: [String: String] = [:],
        launcher: [String] = []
    ) throws {
        self.folder = folder
        self.socketPath = socketPath ?? folder + "/d.sock"
        self.logPath = folder + "/vaultd-\(UUID().uuidString.prefix(8)).log"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: self.logPath, contents: nil)
        let command = launcher + [productsDirectory + "/vaultd", "--socket", self.socketPath] + arguments
        var env = ProcessInfo.processInfo.environment
        env["XDG_STATE_HOME"] = folder + "/state"
        env["XDG_CONFIG_HOME"] = folder + "/config"
        env["XDG_RUNTIME_DIR"] = folder
        env["JOURNAL_STREAM"] = nil
        // No desktop keyring unless a test brings its own: the auto backend
        // is then the file, whatever session this test runs in.
        env["DBUS_SESSION_BUS_ADDRESS"] = "unix:path=" + folder + "/no-bus"
        env.merge(environment) { _, new in new }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, self.logPath, O_WRONLY | O_APPEND, 0)
        closeInheritedDescriptors(&actions)
        var attributes = defaultSignalsAttributes()
        defer { posix_spawnattr_destroy(&attributes) }
        let argv = command.map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, command[0], &actions, &attributes, argv, envp)
        guard status == 0 else { throw ToolFailure(message: "cannot run \(command[0]): \(String(cString: strerror(status)))") }
        self.pid = pid
    }

    /// Whether vaultd has not exited yet (asked without reaping it).
    package var isRunning: Bool {
        if self.lock.withLock({ self.exitStatus }) != nil { return false }
        var info = siginfo_t()
        guard waitid(P_PID, id_t(self.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 else { return false }
        return info._sifields._sigchld.si_pid != self.pid
    }

    /// Waits, with a deadline, until the log contains `text` or the daemon
    /// has exited; whether it contains `text`.
    @discardableResult
    package func waitForLog(_ text: String, seconds: Double = 30) async -> Bool {
        _ = try? await within(seconds: seconds) { self.output.contains(text) || !self.isRunning }
        return self.output.contains(text)
    }

    /// Waits for the process to end (an event: its exit) and returns its
    /// exit status, or 128 + the signal that ended it.
    package func waitForExit() async -> Int32 {
        await blocking {
            if let status = self.lock.withLock({ self.exitStatus }) { return status }
            var raw: Int32 = 0
            var reaped: pid_t
            repeat { reaped = waitpid(self.pid, &raw, 0) } while reaped < 0 && errno == EINTR
            return self.lock.withLock {
                if let status = self.exitStatus { return status }
                let status = reaped == self.pid ? ((raw & 0x7F) == 0 ? (raw >> 8) & 0xFF : 128 + (raw & 0x7F)) : -1
                self.exitStatus = status
                return status
            }
        }
    }

    package var output: String {
        (try? String(contentsOfFile: self.logPath, encoding: .utf8)) ?? ""
    }

    package func terminate() async -> Int32 {
        if self.isRunning { kill(self.pid, SIGTERM) }
        return await self.waitForExit()
    }
}

/// A child gets standard input, output and error only. NIO accepts
/// connections without close-on-exec, so without this a child spawned by one
/// test would hold another test's server-side sockets open after vaultd
/// closed them, and that test's client would never see the close.
package func closeInheritedDescriptors(_ actions: inout posix_spawn_file_actions_t) {
    _ = addCloseFrom(&actions, 3)
}

/// glibc's posix_spawn_file_actions_addclosefrom_np (2.34+), which Swift's
/// Glibc module does not import.
private let addCloseFrom: @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32 = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
        fatalError("this glibc has no posix_spawn_file_actions_addclosefrom_np")
    }
    return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
}()

/// Spawn attributes for a child that starts with no signal blocked and every
/// signal at its default, whatever this test process set up.
package func defaultSignalsAttributes() -> posix_spawnattr_t {
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    var none = sigset_t()
    var all = sigset_t()
    sigemptyset(&none)
    sigfillset(&all)
    posix_spawnattr_setsigmask(&attributes, &none)
    posix_spawnattr_setsigdefault(&attributes, &all)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    return attributes
}

/// `vaultctl import NAME` of a fresh refresh token from `issuer` into the
/// daemon at `env`'s socket; returns that refresh token.
@discardableResult
package func importAccount(_ name: String = "work", from issuer: TestIssuer, environment env: [String: String]) async throws -> String {
    let refreshToken = issuer.mintRefreshToken()
    let imported = try await runTool(
        "vaultctl",
        ["import", name, "--issuer", issuer.issuer, "--client-id", TestIssuer.clientID, "--scope", "openid"],
        input: refreshToken + "\n",
        environment: env
    )
    #expect(imported.status == 0, "\(imported.stderr)")
    return refreshToken
}

/// Runs a built tool to completion, with `input` on stdin.
package struct ToolResult: Sendable {
    package var status: Int32
    package var stdout: String
    package var stderr: String
}

package func runTool(
    _ name: String,
    _ arguments: [String],
    input: String = "",
    environment: [String: String] = [:]
) async throws -> ToolResult {
    let result: Result<ToolResult, any Error> = await blocking {
        Result { try blockingRunTool(name, arguments, input: input, environment: environment) }
    }
    return try result.get()
}

/// posix_spawn and waitpid, not Foundation's Process: its waitUntilExit spun
/// forever here when several tests ran tools at once.
private func blockingRunTool(
    _ name: String,
    _ arguments: [String],
    input: String,
    environment: [String: String]
) throws -> ToolResult {
    let path = name.hasPrefix("/") ? name : productsDirectory + "/" + name
    var env = ProcessInfo.processInfo.environment
    env.merge(environment) { _, new in new }
    var stdin: [Int32] = [0, 0]
    var stdout: [Int32] = [0, 0]
    var stderr: [Int32] = [0, 0]
    // Socket pairs rather than pipes: SOCK_CLOEXEC makes them close-on-exec
    // atomically, so no child spawned meanwhile by another test inherits them.
    let kind = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
    guard socketpair(AF_UNIX, kind, 0, &stdin) == 0, socketpair(AF_UNIX, kind, 0, &stdout) == 0,
        socketpair(AF_UNIX, kind, 0, &stderr) == 0
    else {
        throw ToolFailure(message: "socketpair failed")
    }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, stdin[0], 0)
    posix_spawn_file_actions_adddup2(&actions, stdout[1], 1)
    posix_spawn_file_actions_adddup2(&actions, stderr[1], 2)
    closeInheritedDescriptors(&actions)
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer {
        argv.forEach { free($0) }
        envp.forEach { free($0) }
    }
    // Else a daemon the tool starts (gnome-keyring) may ignore the SIGTERM meant to stop it.
    var attributes = defaultSignalsAttributes()
    defer { posix_spawnattr_destroy(&attributes) }
    var pid: pid_t = 0
    let status = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
    close(stdin[0])
    close(stdout[1])
    close(stderr[1])
    guard status == 0 else {
        close(stdin[1])
        close(stdout[0])
        close(stderr[0])
        throw ToolFailure(message: "cannot run \(path): \(String(cString: strerror(status)))")
    }
    let bytes = Array(input.utf8)
    _ = bytes.withUnsafeBytes { write(stdin[1], $0.baseAddress, $0.count) }
    close(stdin[1])
    let group = DispatchGroup()
    let out = Collected()
    let err = Collected()
    for (fd, sink) in [(stdout[0], out), (stderr[0], err)] {
        group.enter()
        Thread {
            var data = Data()
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = read(fd, &chunk, chunk.count)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                data.append(contentsOf: chunk[0..<n])
            }
            close(fd)
            sink.set(data)
            group.leave()
        }.start()
    }
    group.wait()
    var exit: Int32 = 0
    while waitpid(pid, &exit, 0) < 0 && errno == EINTR {}
    let code = (exit & 0x7F) == 0 ? (exit >> 8) & 0xFF : 128 + (exit & 0x7F)
    return ToolResult(
        status: code,
        stdout: String(decoding: out.get(), as: UTF8.self),
        stderr: String(decoding: err.get(), as: UTF8.self)
    )
}

private final class Collected: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()

    func set(_ data: Data) {
        self.lock.lock()
        self.data = data
        self.lock.unlock()
    }

    func get() -> Data {
        self.lock.lock()
        defer { self.lock.unlock() }
        return self.data
    }
}

/// A test issuer and vaultd as a child process, with the account `work`
/// imported and the access token it then serves; stopped together.
package struct IssuerAndDaemon: Stoppable {
    package let issuer: TestIssuer
    package let daemon: DaemonProcess
    package let folder: String
    package let env: [String: String]
    package let token: String

    /// `arguments`: vaultd's, after `--socket`.
    package static func start(arguments: [String] = []) async throws -> IssuerAndDaemon {
        let issuer = try await TestIssuer.start()
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder, arguments: arguments)
        #expect(await daemon.waitForLog("listening"))
        let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
        try await importAccount(from: issuer, environment: env)
        let token = try await runTool("vaultctl", ["token", "work"], environment: env)
        #expect(token.status == 0, "\(token.stderr)")
        let accessToken = token.stdout.trimmingCharacters(in: .newlines)
        #expect(accessToken.hasPrefix("at-"))
        return IssuerAndDaemon(issuer: issuer, daemon: daemon, folder: folder, env: env, token: accessToken)
    }

    /// vaultd stopped (if the test has not stopped it) and exited 0, then the issuer.
    package func stop() async {
        #expect(await self.daemon.terminate() == 0)
        await self.issuer.stop()
        try? FileManager.default.removeItem(atPath: self.folder)
    }
}
