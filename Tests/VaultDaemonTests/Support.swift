import Foundation
import Glibc
import Logging
import NIOCore
import VaultDaemon
import VaultProtocol
import VaultStore

/// Runs blocking work (socket reads, waiting on a child process) on a GCD
/// thread, so it never ties up the cooperative pool that the in-process
/// daemon's tasks need.
func blocking<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        DispatchQueue.global().async { continuation.resume(returning: body()) }
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

/// A vault served in this process: real store, real socket.
struct InProcessVault {
    let folder: String
    let socketPath: String
    let server: SocketServer
    let broker: Broker

    static func start(
        maximumConnections: Int = 4096,
        idleTimeout: TimeAmount = .minutes(10)
    ) async throws -> InProcessVault {
        let folder = try temporaryFolder()
        let paths = DaemonPaths(stateDirectory: folder + "/state", configDirectory: folder + "/config")
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        let store = try SealedFileStore(path: paths.vaultFile, keySource: .keyFile(paths.defaultKeyFile))
        let broker = try Broker(
            store: store,
            directory: AccountDirectory(path: paths.accountsFile),
            keySource: .keyFile(paths.defaultKeyFile),
            logger: logger
        )
        try await broker.start()
        var configuration = SocketServer.Configuration(path: folder + "/s.sock")
        configuration.maximumConnections = maximumConnections
        configuration.idleTimeout = idleTimeout
        let server = try await SocketServer.start(
            configuration,
            dispatcher: Dispatcher(broker: broker, logger: logger),
            logger: logger
        )
        return InProcessVault(folder: folder, socketPath: configuration.path, server: server, broker: broker)
    }

    func stop() async {
        await self.server.close()
        try? FileManager.default.removeItem(atPath: self.folder)
    }
}

/// A raw line client: writes bytes, reads lines, with a receive deadline so
/// a missing answer fails the test instead of hanging it.
final class LineClient: @unchecked Sendable {
    let fd: Int32
    private var buffer: [UInt8] = []

    init(path: String, timeoutSeconds: Int = 10) throws {
        self.fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let status = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(self.fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard status == 0 else {
            close(self.fd)
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(self.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
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
    let process = Process()
    let folder: String
    let socketPath: String
    let logPath: String

    init(folder: String, socketPath: String? = nil, arguments: [String] = [], environment: [String: String] = [:]) throws {
        self.folder = folder
        self.socketPath = socketPath ?? folder + "/d.sock"
        self.logPath = folder + "/vaultd-\(UUID().uuidString.prefix(8)).log"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: self.logPath, contents: nil)
        self.process.executableURL = URL(fileURLWithPath: productsDirectory + "/vaultd")
        self.process.arguments = ["--socket", self.socketPath] + arguments
        var env = ProcessInfo.processInfo.environment
        env["XDG_STATE_HOME"] = folder + "/state"
        env["XDG_CONFIG_HOME"] = folder + "/config"
        env["XDG_RUNTIME_DIR"] = folder
        env["JOURNAL_STREAM"] = nil
        env.merge(environment) { _, new in new }
        self.process.environment = env
        self.process.standardError = FileHandle(forWritingAtPath: self.logPath)
        self.process.standardOutput = FileHandle.nullDevice
        try self.process.run()
    }

    /// Polls the log, with a deadline, until it contains `text` or the
    /// daemon has exited.
    @discardableResult
    func waitForLog(_ text: String, seconds: Double = 30) async -> Bool {
        await blocking {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if self.output.contains(text) { return true }
                if !self.process.isRunning { return self.output.contains(text) }
                Thread.sleep(forTimeInterval: 0.01)
            }
            return false
        }
    }

    /// Waits for the process to end (an event: its exit).
    func waitForExit() async -> Int32 {
        await blocking {
            self.process.waitUntilExit()
            return self.process.terminationStatus
        }
    }

    var output: String {
        (try? String(contentsOfFile: self.logPath, encoding: .utf8)) ?? ""
    }

    func terminate() async -> Int32 {
        if self.process.isRunning { kill(self.process.processIdentifier, SIGTERM) }
        return await self.waitForExit()
    }
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

private func blockingRunTool(
    _ name: String,
    _ arguments: [String],
    input: String,
    environment: [String: String]
) throws -> ToolResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: name.hasPrefix("/") ? name : productsDirectory + "/" + name)
    process.arguments = arguments
    var env = ProcessInfo.processInfo.environment
    env.merge(environment) { _, new in new }
    process.environment = env
    let stdin = Pipe()
    let stdout = Pipe()
    let stderr = Pipe()
    for pipe in [stdin, stdout, stderr] {
        _ = fcntl(pipe.fileHandleForWriting.fileDescriptor, F_SETFD, FD_CLOEXEC)
        _ = fcntl(pipe.fileHandleForReading.fileDescriptor, F_SETFD, FD_CLOEXEC)
    }
    process.standardInput = stdin
    process.standardOutput = stdout
    process.standardError = stderr
    try process.run()
    stdin.fileHandleForWriting.write(Data(input.utf8))
    try stdin.fileHandleForWriting.close()
    let out = stdout.fileHandleForReading.readDataToEndOfFile()
    let err = stderr.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return ToolResult(
        status: process.terminationStatus,
        stdout: String(decoding: out, as: UTF8.self),
        stderr: String(decoding: err, as: UTF8.self)
    )
}
