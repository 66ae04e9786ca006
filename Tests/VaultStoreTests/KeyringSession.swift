import Foundation
import Glibc
import Testing
import VaultCrypto
import VaultStore

/// A private, headless Secret Service (Tests/Support/keyring/session.sh): its own
/// session bus and a gnome-keyring with an unlocked `login` collection.
struct KeyringSession: Sendable {
    let folder: String
    /// DBUS_SESSION_BUS_ADDRESS, HOME, XDG_* of the session, for secret-tool.
    let environment: [String: String]

    /// The session of the suite running now (see `PrivateKeyring`).
    @TaskLocal static var current: KeyringSession?

    static let script = keyringPackageRoot + "/Tests/Support/keyring/session.sh"

    /// Starts a session and points this process's libsecret at it.
    ///
    /// libsecret (GLib) reads DBUS_SESSION_BUS_ADDRESS when it first connects
    /// and KeyringStore keeps that connection for the life of the process, so
    /// the variable is set only around the first call and then restored:
    /// tools other tests spawn meanwhile do not find this keyring.
    static func start() async throws -> KeyringSession {
        let folder = "/tmp/tv-kr-" + String(UUID().uuidString.prefix(8)).lowercased()
        let started = try await runTool(Self.script, ["start", folder])
        guard started.status == 0 else {
            throw ToolFailure(message: "the keyring session did not start: \(started.errorText)")
        }
        let environment = try Self.readEnvironment(folder + "/env")
        guard let address = environment["DBUS_SESSION_BUS_ADDRESS"] else {
            throw ToolFailure(message: "\(folder)/env has no DBUS_SESSION_BUS_ADDRESS")
        }
        let previous = getenv("DBUS_SESSION_BUS_ADDRESS").map { String(cString: $0) }
        setenv("DBUS_SESSION_BUS_ADDRESS", address, 1)
        let probed = await KeyringStore.probe()
        if let previous { setenv("DBUS_SESSION_BUS_ADDRESS", previous, 1) } else { unsetenv("DBUS_SESSION_BUS_ADDRESS") }
        let session = KeyringSession(folder: folder, environment: environment)
        do {
            if case .failure(let error) = probed {
                throw ToolFailure(message: "the fresh keyring does not answer: \(error.message)")
            }
            try await session.checkThisProcessUsesIt()
        } catch {
            await session.stop()
            throw error
        }
        return session
    }

    /// Had this process connected to another session bus before (a desktop's,
    /// with the user's own keyring), it would still use that one: a marker
    /// item stored through KeyringStore must show up in this session.
    private func checkThisProcessUsesIt() async throws {
        let marker = "session-check-" + String(UUID().uuidString.prefix(8)).lowercased()
        let store = KeyringStore()
        try await store.save(AccountSecrets(refreshToken: try SecretBytes(utf8: "marker")), for: marker)
        let found = try await self.secretTool(["lookup", "application", "tokenvault", "account", marker])
        _ = try await store.remove(marker)
        guard found.status == 0, !found.stdout.isEmpty else {
            throw ToolFailure(
                message: "this test process talks to another session bus than its private keyring's; "
                    + "it connected to one before the keyring suite started"
            )
        }
    }

    func stop() async {
        _ = try? await runTool(Self.script, ["stop", self.folder])
    }

    /// Runs one of the script's commands on this session: `lock` (the
    /// Secret Service's Lock method on the default collection), `unlock`
    /// (restarts the keyring with its password), `stop-keyring` (no Secret
    /// Service on the bus any more), `start-keyring`, `freeze` (SIGSTOP: the
    /// keyring keeps its name and never answers), `thaw`.
    func run(_ command: String) async throws {
        let result = try await runTool(Self.script, [command, self.folder])
        guard result.status == 0 else { throw ToolFailure(message: "\(command) failed: \(result.errorText)") }
    }

    /// The real `secret-tool`, run inside the session.
    func secretTool(_ arguments: [String], input: [UInt8] = []) async throws -> ToolResult {
        try await runTool("/usr/bin/secret-tool", arguments, input: input, environment: self.environment, removing: ["DISPLAY", "WAYLAND_DISPLAY"])
    }

    private static func readEnvironment(_ path: String) throws -> [String: String] {
        var environment: [String: String] = [:]
        for line in try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            let value = line[line.index(after: equals)...]
            environment[String(line[..<equals])] = String(value.dropFirst().dropLast())  // 'VALUE'
        }
        return environment
    }
}

/// Starts a private keyring before the suite and stops it after, whatever
/// happens; the tests read it from `KeyringSession.current`. Its folder
/// (/tmp/tv-kr-*) is removed when the suite passes and kept when it fails.
struct PrivateKeyring: SuiteTrait, TestScoping {
    func provideScope(
        for test: Test,
        testCase: Test.Case?,
        performing function: @Sendable () async throws -> Void
    ) async throws {
        let session = try await KeyringSession.start()
        do {
            try await KeyringSession.$current.withValue(session) { try await function() }
        } catch {
            await session.stop()  // the folder stays, for its logs
            throw error
        }
        await session.stop()
        try? FileManager.default.removeItem(atPath: session.folder)
    }
}

extension Trait where Self == PrivateKeyring {
    static var privateKeyring: Self { Self() }
}

/// The package's root folder, for its scripts.
let keyringPackageRoot: String = {
    var path = #filePath
    for _ in 0..<3 { path = (path as NSString).deletingLastPathComponent }
    return path
}()

struct ToolFailure: Error, CustomStringConvertible {
    var message: String
    var description: String { self.message }
}

struct ToolResult: Sendable {
    var status: Int32
    var stdout: [UInt8]
    var stderr: [UInt8]
    var text: String { String(decoding: self.stdout, as: UTF8.self) }
    var errorText: String { String(decoding: self.stderr, as: UTF8.self) }
}

/// Runs a program to completion on a thread of its own (never the
/// cooperative pool). Output goes to close-on-exec temporary files, not
/// pipes: the session script leaves daemons behind, and no daemon must keep
/// a descriptor of this process open.
func runTool(
    _ path: String,
    _ arguments: [String],
    input: [UInt8] = [],
    environment: [String: String] = [:],
    removing: [String] = []
) async throws -> ToolResult {
    let result: Result<ToolResult, ToolFailure> = await withCheckedContinuation { continuation in
        Thread {
            continuation.resume(returning: Result { () throws(ToolFailure) in
                try blockingRunTool(path, arguments, input: input, environment: environment, removing: removing)
            })
        }.start()
    }
    return try result.get()
}

private func blockingRunTool(
    _ path: String,
    _ arguments: [String],
    input: [UInt8],
    environment: [String: String],
    removing: [String]
) throws(ToolFailure) -> ToolResult {
    var env = ProcessInfo.processInfo.environment
    env.merge(environment) { _, new in new }
    for name in removing { env[name] = nil }

    func temporary(_ role: String) throws(ToolFailure) -> (Int32, String) {
        let name = "/tmp/tv-tool-\(role)-" + UUID().uuidString
        let fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw ToolFailure(message: "cannot create \(name): errno \(errno)") }
        unlink(name)
        return (fd, name)
    }
    let (stdinFD, _) = try temporary("in")
    let (stdoutFD, _) = try temporary("out")
    let (stderrFD, _) = try temporary("err")
    defer {
        close(stdinFD)
        close(stdoutFD)
        close(stderrFD)
    }
    if !input.isEmpty {
        _ = input.withUnsafeBytes { pwrite(stdinFD, $0.baseAddress, $0.count, 0) }
    }

    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, stdinFD, 0)
    posix_spawn_file_actions_adddup2(&actions, stdoutFD, 1)
    posix_spawn_file_actions_adddup2(&actions, stderrFD, 2)
    // Standard streams only: other tests' sockets must not outlive them in a
    // child. (glibc's addclosefrom_np, which Swift's Glibc module does not import.)
    if let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") {
        typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        _ = unsafeBitCast(symbol, to: AddCloseFrom.self)(&actions, 3)
    }
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer {
        argv.forEach { free($0) }
        envp.forEach { free($0) }
    }
    // Daemons the script leaves behind must answer SIGTERM: reset the signal
    // mask and dispositions this process's threads may have changed.
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var none = sigset_t()
    sigemptyset(&none)
    var all = sigset_t()
    sigfillset(&all)
    posix_spawnattr_setsigmask(&attributes, &none)
    posix_spawnattr_setsigdefault(&attributes, &all)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    var pid: pid_t = 0
    let status = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
    guard status == 0 else {
        throw ToolFailure(message: "cannot run \(path): \(String(cString: strerror(status)))")
    }
    var exit: Int32 = 0
    while waitpid(pid, &exit, 0) < 0 && errno == EINTR {}
    let code = (exit & 0x7F) == 0 ? (exit >> 8) & 0xFF : 128 + (exit & 0x7F)

    func contents(_ fd: Int32) -> [UInt8] {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        var offset: off_t = 0
        while true {
            let n = pread(fd, &chunk, chunk.count, offset)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
            offset += off_t(n)
        }
        return bytes
    }
    return ToolResult(status: code, stdout: contents(stdoutFD), stderr: contents(stderrFD))
}
