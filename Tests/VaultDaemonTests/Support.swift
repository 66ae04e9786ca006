import Foundation
import Glibc
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization
import Testing
import VaultDaemon
import VaultOIDC
import VaultProtocol
import VaultServer
import VaultStore
import VaultTestIssuer

/// Runs blocking work (socket reads, waiting on a child process) on a thread
/// of its own, so it never ties up the cooperative pool that the in-process
/// daemon's tasks need. Not GCD: its pool grows by about one thread a second
/// while its threads block, which made parallel tests wait on each other.
func blocking<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread { continuation.resume(returning: body()) }.start()
    }
}

/// A fresh temporary folder, short enough for socket paths (108 bytes).
func temporaryFolder() throws -> String {
    let path = "/tmp/tv-" + String(UUID().uuidString.prefix(8)).lowercased()
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// The folder holding the built executables (vaultd, vaultctl): the test
/// bundle sits beside them.
let productsDirectory: String = {
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    let exe = String(decoding: buffer[0..<max(n, 0)].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return FileSystem.directory(of: exe)
}()

/// Something a test starts and must stop before it ends: a daemon, an
/// issuer, a set-up of both.
protocol Stoppable: Sendable {
    func stop() async
}

/// Runs `body` with `resource`, then stops it and awaits the stop, however
/// `body` ends: returning or throwing.
func using<R: Stoppable, T>(_ resource: R, _ body: (R) async throws -> T) async throws -> T {
    let result: T
    do {
        result = try await body(resource)
    } catch {
        await resource.stop()
        throw error
    }
    await resource.stop()
    return result
}

/// Two resources, stopped in the reverse order.
func using<A: Stoppable, B: Stoppable, T>(_ a: A, _ b: B, _ body: (A, B) async throws -> T) async throws -> T {
    try await using(a) { a in try await using(b) { b in try await body(a, b) } }
}

/// Three resources, stopped in the reverse order.
func using<A: Stoppable, B: Stoppable, C: Stoppable, T>(
    _ a: A,
    _ b: B,
    _ c: C,
    _ body: (A, B, C) async throws -> T
) async throws -> T {
    try await using(a) { a in try await using(b, c) { b, c in try await body(a, b, c) } }
}

/// `using(InProcessVault.start(...))`, for the commonest case.
func withVault<T>(
    folder: String? = nil,
    clock: any WallClock = SystemClock(),
    maximumConnections: Int = 4096,
    idleTimeout: TimeAmount = .minutes(10),
    issuerTimeout: TimeAmount = .seconds(15),
    events: EventHub = EventHub(),
    wrapStore: @escaping @Sendable (any SecretStore) -> any SecretStore = { $0 },
    _ body: (InProcessVault) async throws -> T
) async throws -> T {
    try await using(
        InProcessVault.start(
            folder: folder,
            clock: clock,
            maximumConnections: maximumConnections,
            idleTimeout: idleTimeout,
            issuerTimeout: issuerTimeout,
            events: events,
            wrapStore: wrapStore
        ),
        body
    )
}

extension TestIssuer: Stoppable {}

extension DaemonProcess: Stoppable {
    /// SIGTERM, and the exit awaited. A vaultd that has not stopped 10 s
    /// later is a failure of the test, and is killed so nothing hangs.
    func stop() async {
        guard self.isRunning else { return }
        let status = await self.terminate(within: 10)
        #expect(status != nil, "vaultd \(self.pid) did not stop on SIGTERM within 10 s: \(self.output)")
    }

    /// SIGTERM, then the exit status; nil, and SIGKILL, when vaultd has not
    /// exited `seconds` later.
    func terminate(within seconds: Double) async -> Int32? {
        if self.isRunning { kill(self.pid, SIGTERM) }
        let exited = (try? await within(seconds: seconds) { !self.isRunning }) ?? false
        if !exited { kill(self.pid, SIGKILL) }
        let status = await self.waitForExit()
        return exited ? status : nil
    }
}

extension SocketServer: Stoppable {
    func stop() async { await self.close() }
}

/// A vault served in this process, as vaultd serves it (the same `Daemon`,
/// run in a service group), on the file backend with a key file.
struct InProcessVault: Stoppable {
    let folder: String
    let socketPath: String
    let daemon: Daemon
    let server: SocketServer
    private let group: ServiceGroup
    private let running: Task<Void, any Error>

    var broker: Broker { self.daemon.broker }
    var dispatcher: Dispatcher { self.daemon.dispatcher }

    static func start(
        folder: String? = nil,
        clock: any WallClock = SystemClock(),
        maximumConnections: Int = 4096,
        idleTimeout: TimeAmount = .minutes(10),
        issuerTimeout: TimeAmount = .seconds(15),
        revocationTimeout: TimeAmount? = nil,
        events: EventHub = EventHub(),
        wrapStore: @escaping @Sendable (any SecretStore) -> any SecretStore = { $0 }
    ) async throws -> InProcessVault {
        let folder = try folder ?? temporaryFolder()
        let paths = DaemonPaths(stateDirectory: folder + "/state", configDirectory: folder + "/config")
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        var configuration = Daemon.Configuration(
            paths: paths,
            socket: folder + "/s.sock",
            keySource: .keyFile(paths.defaultKeyFile)
        )
        configuration.backend = .file
        configuration.asksKeyring = false
        configuration.socket.maximumConnections = maximumConnections
        configuration.socket.idleTimeout = idleTimeout
        configuration.oidc.timeout = issuerTimeout
        if let revocationTimeout { configuration.oidc.revocationTimeout = revocationTimeout }
        configuration.clock = clock
        configuration.events = events
        configuration.wrapStore = wrapStore
        let daemon = try await Self.open(configuration, logger: logger)
        let group = ServiceGroup(services: [daemon], logger: logger)
        let running = Task { try await group.run() }
        do {
            let server = try await daemon.listening()
            return InProcessVault(
                folder: folder,
                socketPath: configuration.socket.path,
                daemon: daemon,
                server: server,
                group: group,
                running: running
            )
        } catch {
            _ = await running.result
            throw error
        }
    }

    /// The daemon on `configuration`. A restart on the same folder may find
    /// the vault's lock still held for a moment after the stop: every process
    /// this test process is starting holds a copy of each descriptor from its
    /// fork to its exec, the lock's too (close-on-exec closes it only at exec).
    /// So "another vaultd holds" is tried again until a deadline.
    private static func open(_ configuration: Daemon.Configuration, logger: Logger) async throws -> Daemon {
        var daemon: Daemon?
        var held: StoreError?
        _ = try await within(seconds: 5) {
            do {
                daemon = try await Daemon(configuration, logger: logger)
                return true
            } catch let error as StoreError where error.message.hasPrefix("another vaultd holds") {
                held = error
                return false
            }
        }
        guard let daemon else { throw held ?? ToolFailure(message: "the vault did not open") }
        return daemon
    }

    /// Stops serving, as vaultd does on SIGTERM, and waits until it has; the
    /// files stay, so a new vault on the same folder is a restart. Stopping
    /// twice is stopping once.
    func stop() async {
        await self.group.triggerGracefulShutdown()
        _ = await self.running.result
    }

    var vaultFile: String { self.folder + "/state/vault.sealed" }
    var keyFile: String { self.folder + "/state/vault.key" }
}

extension InProcessVault {
    /// `work`'s access token for this test process, asked of the broker directly.
    func workToken(force: Bool = false) async throws -> TokenResult {
        try await self.broker.token(TokenRequest(account: "work", forceRefresh: force), for: testPeer)
    }

    /// Why asking for `work`'s token fails, or nil when it does not.
    func workTokenFailure(force: Bool = false) async -> VaultError? {
        do {
            _ = try await self.workToken(force: force)
            return nil
        } catch let error as VaultError {
            return error
        } catch {
            return VaultError(.internalError, "\(type(of: error))")
        }
    }
}

/// A test issuer and a vault served in this process, with a folder of the
/// test's own as `HOME`; stopped together.
struct IssuerAndVault: Stoppable {
    let issuer: TestIssuer
    let vault: InProcessVault
    let folder: String
    var environment: [String: String] { ["TOKENVAULT_SOCKET": self.vault.socketPath, "HOME": self.folder] }

    func stop() async {
        await self.vault.stop()
        await self.issuer.stop()
    }
}

/// A value an escaping closure can share (a `Mutex` it cannot capture).
final class Shared<Value: Sendable>: Sendable {
    let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
}

/// This test process as a peer, for calling the broker directly.
let testPeer = Peer(pid: getpid(), uid: getuid(), gid: getgid(), executable: "/usr/bin/test-companion")

/// A clock the test moves by hand.
final class ManualClock: WallClock, Sendable {
    private struct State {
        var seconds: Double
        var next = 0
        var sleepers: [Int: (deadline: Double, continuation: CheckedContinuation<Void, any Error>)] = [:]
    }

    private let state: Mutex<State>

    /// Starts at the real time, so tokens signed by a test issuer are current.
    init(_ seconds: Double = Date().timeIntervalSince1970) {
        self.state = Mutex(State(seconds: seconds))
    }

    func now() -> Double {
        self.state.withLock { $0.seconds }
    }

    /// Moves time on, and wakes every sleep whose deadline it reached.
    func advance(by delta: Double) {
        let woken = self.state.withLock { state in
            state.seconds += delta
            let due = state.sleepers.filter { $0.value.deadline <= state.seconds }
            for key in due.keys { state.sleepers[key] = nil }
            return due.values.map(\.continuation)
        }
        for continuation in woken { continuation.resume() }
    }

    /// Sleeps now waiting for the clock to move.
    var sleepers: Int { self.state.withLock { $0.sleepers.count } }

    func sleep(until deadline: Double) async throws {
        let ticket = self.state.withLock { state -> Int in
            state.next += 1
            return state.next
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let now = self.state.withLock { state -> Result<Void, any Error>? in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if deadline <= state.seconds { return .success(()) }
                    state.sleepers[ticket] = (deadline, continuation)
                    return nil
                }
                if let now { continuation.resume(with: now) }
            }
        } onCancel: {
            self.state.withLock { $0.sleepers.removeValue(forKey: ticket) }?.continuation.resume(throwing: CancellationError())
        }
    }
}

/// Chores on the real clock, run as long as the test process: for parts
/// tested without a daemon around them.
let runningChores: Chores = {
    let chores = Chores(clock: SystemClock())
    Task.detached { await chores.run() }
    return chores
}()

/// The package's root folder, for its scripts.
let packageRoot: String = {
    var path = #filePath
    for _ in 0..<3 { path = FileSystem.directory(of: path) }
    return path
}()

/// Glewlwyd, a third-party OpenID provider, started on 127.0.0.1 from
/// demo/glewlwyd with a fresh database for one test.
struct Glewlwyd {
    let folder: String
    let env: [String: String]
    var issuer: String { self.env["GLEWLWYD_ISSUER"] ?? "" }

    static func start(accessTokenSeconds: Int = 3) async throws -> Glewlwyd {
        let folder = try temporaryFolder()
        let started = try await runTool(
            packageRoot + "/demo/glewlwyd/start.sh",
            [folder],
            environment: ["GLEWLWYD_ACCESS_TOKEN_SECONDS": String(accessTokenSeconds)]
        )
        guard started.status == 0 else { throw ToolFailure(message: "glewlwyd did not start: \(started.stderr)") }
        var env: [String: String] = [:]
        for line in try String(contentsOfFile: folder + "/env", encoding: .utf8).split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            env[String(line[..<equals])] = String(line[line.index(after: equals)...]).trimmingCharacters(in: CharacterSet(charactersIn: "'"))
        }
        return Glewlwyd(folder: folder, env: env)
    }

    func stop() async {
        _ = try? await runTool(packageRoot + "/demo/glewlwyd/stop.sh", [self.folder])
    }

    /// Runs `body` with a fresh provider and stops it afterwards, whatever happens.
    static func with(accessTokenSeconds: Int = 3, _ body: (Glewlwyd) async throws -> Void) async throws {
        let provider = try await Glewlwyd.start(accessTokenSeconds: accessTokenSeconds)
        do {
            try await body(provider)
        } catch {
            await provider.stop()
            throw error
        }
        await provider.stop()
    }

    /// Signs `ada` in headlessly and returns the token response.
    func login(client: String, secret: String? = nil, grant: String = "code") async throws -> [String: Any] {
        var arguments = [
            "--issuer", self.issuer, "--client-id", client, "--grant", grant,
            "--username", "ada", "--password", "correct horse",
            "--scope", "openid offline_access profile email",
        ]
        if let secret { arguments += ["--client-secret", secret] }
        let result = try await runTool(packageRoot + "/demo/glewlwyd/login.py", arguments)
        guard result.status == 0,
            let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
        else { throw ToolFailure(message: "login failed: \(result.stderr)") }
        return object
    }

    /// Revokes a token at the provider (RFC 7009).
    func revoke(_ token: String, client: String, secret: String) async throws {
        let result = try await runTool(
            packageRoot + "/demo/glewlwyd/introspect.py",
            ["--issuer", self.issuer, "--client-id", client, "--client-secret", secret, "--revoke"],
            input: token
        )
        guard result.status == 0 else { throw ToolFailure(message: "revoke failed: \(result.stderr)") }
    }
}

struct ToolFailure: Error, CustomStringConvertible {
    var message: String
    var description: String { self.message }
}

/// A raw line client: writes bytes, reads lines, with a receive deadline so
/// a missing answer fails the test instead of hanging it.
final class LineClient: @unchecked Sendable {
    let fd: Int32
    private var buffer: [UInt8] = []

    init(path: String, timeoutSeconds: Int = 30) throws {
        // The descriptor becomes `self.fd` only once connected: a throw after
        // every property is set would run deinit and close it a second time,
        // closing whatever else in this process had been given that number.
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let status = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard status == 0 else {
            let code = errno
            close(fd)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        self.fd = fd
    }

    deinit { close(self.fd) }

    func send(_ text: String) { self.send(Array(text.utf8)) }

    func send(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(self.fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            offset += n
        }
    }

    /// The next line, or nil at end of stream, on error or at the deadline.
    func readLine() async -> String? {
        await blocking { self.blockingReadLine() }
    }

    private func blockingReadLine() -> String? {
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            if let newline = self.buffer.firstIndex(of: 0x0A) {
                let line = String(decoding: self.buffer[..<newline], as: UTF8.self)
                self.buffer.removeSubrange(...newline)
                return line
            }
            let n = recv(self.fd, &chunk, chunk.count, 0)
            if n <= 0 { return nil }
            self.buffer.append(contentsOf: chunk[0..<n])
        }
    }

    /// The next line as a JSON object.
    func readObject() async -> [String: Any]? {
        guard let line = await self.readLine(), let data = line.data(using: .utf8) else { return nil }
        return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
    }

    func call(_ text: String) async -> [String: Any]? {
        self.send(text + "\n")
        return await self.readObject()
    }
}

extension Dictionary where Key == String, Value == Any {
    var errorCode: String? { (self["error"] as? [String: Any])?["code"] as? String }
}

/// vaultd as a child process. Its stderr goes to a file, not a pipe: a pipe's
/// end-of-file would also wait for any other child that inherited it.
final class DaemonProcess: @unchecked Sendable {
    let pid: pid_t
    let folder: String
    let socketPath: String
    let logPath: String
    private let lock = NSLock()
    private var exitStatus: Int32?

    /// `launcher`, when given, runs vaultd (a command and its arguments
    /// that end where vaultd's path goes, like systemd-socket-activate).
    /// Spawned and reaped with posix_spawn and waitpid: Foundation's
    /// Process left children unreaped and spun when many tests ran at once.
    init(
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
    var isRunning: Bool {
        if self.lock.withLock({ self.exitStatus }) != nil { return false }
        var info = siginfo_t()
        guard waitid(P_PID, id_t(self.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 else { return false }
        return info._sifields._sigchld.si_pid != self.pid
    }

    /// Waits, with a deadline, until the log contains `text` or the daemon
    /// has exited; whether it contains `text`.
    @discardableResult
    func waitForLog(_ text: String, seconds: Double = 30) async -> Bool {
        _ = try? await within(seconds: seconds) { self.output.contains(text) || !self.isRunning }
        return self.output.contains(text)
    }

    /// Waits for the process to end (an event: its exit) and returns its
    /// exit status, or 128 + the signal that ended it.
    func waitForExit() async -> Int32 {
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

    var output: String {
        (try? String(contentsOfFile: self.logPath, encoding: .utf8)) ?? ""
    }

    func terminate() async -> Int32 {
        if self.isRunning { kill(self.pid, SIGTERM) }
        return await self.waitForExit()
    }
}

/// A child gets standard input, output and error only. NIO accepts
/// connections without close-on-exec, so without this a child spawned by one
/// test would hold another test's server-side sockets open after vaultd
/// closed them, and that test's client would never see the close.
func closeInheritedDescriptors(_ actions: inout posix_spawn_file_actions_t) {
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
func defaultSignalsAttributes() -> posix_spawnattr_t {
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
func importAccount(_ name: String = "work", from issuer: TestIssuer, environment env: [String: String]) async throws -> String {
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

/// The one wait for what happens on another process's or thread's time (a
/// socket closing, a child exiting, a request reaching an issuer): checks
/// `condition` every 5 ms until it holds, and fails the test (recorded, and
/// thrown) after `seconds`. Time the vault reads is a parameter the tests
/// move instead (`ManualClock`).
@discardableResult
func eventually(
    seconds: Double = 20,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () async throws -> Bool
) async throws -> Bool {
    guard try await within(seconds: seconds, condition) else {
        Issue.record("not within \(seconds) s", sourceLocation: sourceLocation)
        throw ToolFailure(message: "timed out")
    }
    return true
}

/// `eventually`'s loop, for a caller that handles the timeout itself:
/// whether `condition` held within `seconds`.
func within(seconds: Double, _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while try await !condition() {
        guard ContinuousClock.now < deadline else { return false }
        try await Task.sleep(for: .milliseconds(5))
    }
    return true
}

/// Runs a built tool to completion, with `input` on stdin.
struct ToolResult: Sendable {
    var status: Int32
    var stdout: String
    var stderr: String
}

func runTool(
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

extension Dispatcher {
    /// `command` from `peer`, answered as a socket answers it: through the gate.
    func answer(_ command: Command, from peer: Peer) async -> Response {
        switch self.handle(Request(id: .number(1), command: command), from: peer) {
        case .ready(let response): return response
        case .pending(let body): return await body()
        case .subscribe(let response, _): return response
        }
    }

    /// The error `command` from `peer` is answered with, or nil when it succeeds.
    func refusal(_ command: Command, from peer: Peer) async -> VaultError? {
        guard case .failure(let error) = await self.answer(command, from: peer).outcome else { return nil }
        return error
    }
}
