// vaultbench: measures vaultd beside its peer, oidc-agent, in one run, with
// one C load client (Benchmarks/load/vbload.c, compiled at run time) and a C
// echo server as the floor. Build the products it runs, then run it:
//   "$(scripts/release.sh vaultd vaultctl vaultbench)/vaultbench"   (or Benchmarks/bench.sh)
// Side by side (needs glewlwyd, and oidc-agent-cli for the peer's column):
// both serve cached tokens from the same Glewlwyd (demo/glewlwyd).
// Then vaultd alone against the project's in-process test issuer: hostile
// and failing issuers, load, scaling with the number of accounts, start-up.
import Foundation
import Glibc
import VaultCrypto
import VaultProtocol
import VaultTestIssuer

@main
struct VaultBench {
    static func main() async throws {
        let bin = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent().path
        for tool in ["vaultd", "vaultctl"] where !FileManager.default.isExecutableFile(atPath: bin + "/" + tool) {
            throw BenchError("\(bin)/\(tool) is missing; build first: scripts/release.sh vaultd vaultctl vaultbench")
        }
        let folder = "/tmp/vb-\(getpid())"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let began = Clock.now()
        let load = try Load(folder: folder)

        let side = try await sideBySide(bin: bin, folder: folder + "/side", load: load)
        var rows: [(String, String)] = []
        try await alone(bin: bin, folder: folder + "/alone", rows: &rows)
        try await scaling(bin: bin, folder: folder + "/scaling", load: load, rows: &rows)
        try startUp(bin: bin, folder: folder + "/start", rows: &rows)
        try proofSigning(rows: &rows)

        print("| figure | vaultd | oidc-agent | vaultd ÷ oidc-agent | goal: where vaultd stands |\n|---|---|---|---|---|")
        for row in side { print("| " + row.joined(separator: " | ") + " |") }
        print("\n| vaultd alone | result |\n|---|---|")
        for (name, value) in rows { print("| \(name) | \(value) |") }
        print(String(format: "\nvaultbench took %.0f s", Clock.now() - began))
    }
}

/// vaultd alone against the in-process test issuer: the codec, refresh
/// coalescing, write-back, a hanging issuer, held connections, a client
/// that never reads.
func alone(bin: String, folder: String, rows: inout [(String, String)]) async throws {
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    let socket = folder + "/v.sock"

    let issuer = try await TestIssuer.start(accessTokenLifetime: 3600)
    let burstIssuer = try await TestIssuer.start(accessTokenLifetime: 3600)
    let rotatingIssuer = try await TestIssuer.start(accessTokenLifetime: 3600, rotateRefreshTokens: true)
    let hangingIssuer = try await TestIssuer.start(accessTokenLifetime: 3600)

    let daemon = try startVaultd(bin: bin, socket: socket, folder: folder)
    defer { stop(daemon.processIdentifier) }
    let client = try Client.connect(socket, deadline: 10)

    func add(_ name: String, _ issuer: TestIssuer) throws {
        let line = #"{"id":1,"op":"account.add","name":"\#(name)","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","offline_access"],"refresh_token":"\#(issuer.mintRefreshToken())"}"#
        guard try client.call(line).contains(#""ok":true"#) else { throw BenchError("account.add \(name) failed") }
    }
    try add("bench", issuer)
    try add("burst", burstIssuer)
    try add("rotating", rotatingIssuer)
    try add("plain", burstIssuer)
    try add("hanging", hangingIssuer)
    let tokenLine = #"{"id":1,"op":"token","account":"bench"}"#
    _ = try client.call(tokenLine)
    let setUp = try memory(of: daemon.processIdentifier)
    rows.append((
        "idle after set-up (5 accounts, 1 token): RSS = anonymous + file pages; threads",
        "\(mb(setUp.rssKB)) = \(mb(setUp.anonKB)) + \(mb(setUp.fileKB)); \(setUp.threads) threads"
    ))

    // The codec alone, in this process: decode a token request, encode its reply.
    let requestBytes = Array(tokenLine.utf8)
    let reply = TokenResult(
        accessToken: try SecretBytes(utf8: String(repeating: "a", count: 40)),
        tokenType: "Bearer",
        expiresAt: 1_900_000_000,
        expiresIn: 3600,
        scope: "openid offline_access"
    )
    var codec: [Double] = []
    for round in 0..<22_000 {
        let start = Clock.now()
        let request = LineCodec.request(from: requestBytes)
        let line = LineCodec.line(for: Response(id: request.id, reply))
        if round >= 2_000 { codec.append(Clock.now() - start) }
        precondition(!line.isEmpty)
    }
    rows.append(("codec only (decode request + encode reply): median", us(percentile(codec, 0.5))))

    // 50 clients right after expiry: how many refreshes reach the issuer, how long they wait.
    _ = try client.call(#"{"id":1,"op":"token","account":"burst"}"#)
    let before = burstIssuer.refreshCount
    burstIssuer.setTokenBehaviour(.delay(milliseconds: 20))
    let burst = try concurrent(socket: socket, clients: 50, line: #"{"id":1,"op":"token","account":"burst","min_ttl":7200}"#)
    burstIssuer.setTokenBehaviour(.normal)
    rows.append((
        "50 clients asking for more than the cached token has left (issuer answers in 20 ms)",
        "\(burstIssuer.refreshCount - before) refresh, wait median \(ms(percentile(burst, 0.5))) / max \(ms(burst.max() ?? 0))"
    ))

    // Rotation write-back: forced refreshes with and without a rotated token to store.
    var plain: [Double] = []
    var rotating: [Double] = []
    for _ in 0..<100 {
        plain.append(try timed(client, #"{"id":1,"op":"token","account":"plain","force_refresh":true}"#))
        rotating.append(try timed(client, #"{"id":1,"op":"token","account":"rotating","force_refresh":true}"#))
    }
    rows.append((
        "forced refresh, median: no rotation / rotation (durable write)",
        "\(ms(percentile(plain, 0.5))) / \(ms(percentile(rotating, 0.5))) (write-back \(ms(percentile(rotating, 0.5) - percentile(plain, 0.5))))"
    ))

    // Account B while account A's issuer hangs.
    hangingIssuer.setTokenBehaviour(.hang)
    let stuck = try Client.connect(socket, deadline: 5)
    try stuck.send(#"{"id":1,"op":"token","account":"hanging","force_refresh":true}"#)
    var during: [Double] = []
    for _ in 0..<5_000 { during.append(try timed(client, tokenLine)) }
    rows.append(("cached token for B while A's issuer hangs (Swift client): median / p99", "\(us(percentile(during, 0.5))) / \(us(percentile(during, 0.99)))"))

    // Load: 1,000 connections held open, 100,000 token requests spread
    // over them; twice, so a leak would show as growth between the rounds.
    let idle = try memory(of: daemon.processIdentifier)
    var afterRounds: [Memory] = []
    for round in 1...2 {
        var loaded = idle
        let load = try heldConnections(socket: socket, connections: 1_000, requests: 100_000, line: tokenLine, workers: 50) {
            loaded = try memory(of: daemon.processIdentifier)
        }
        // The connections are closed; give vaultd a moment to see them go.
        _ = try client.call(#"{"id":1,"op":"status"}"#)
        usleep(1_000_000)
        afterRounds.append(try memory(of: daemon.processIdentifier))
        rows.append((
            "1,000 connections held + 100,000 token requests (round \(round))",
            "\(Int(load.rate)) requests/s, \(load.errors) errors, \(load.connected) connected, RSS \(mb(loaded.rssKB)) while held"
        ))
    }
    rows.append((
        "RSS: before / after round 1 / after round 2 / peak",
        "\(mb(idle.rssKB)) / \(mb(afterRounds[0].rssKB)) / \(mb(afterRounds[1].rssKB)) / \(mb(afterRounds[1].peakKB))"
    ))

    // A client that sends requests and never reads a reply.
    let beforeSlow = try memory(of: daemon.processIdentifier)
    let written = try slowReader(socket: socket, line: tokenLine)
    let withSlow = try memory(of: daemon.processIdentifier)
    rows.append((
        "a client that never reads: bytes of requests vaultd took before it stopped reading",
        "\(written / 1024) KiB, RSS +\(mb(max(0, withSlow.rssKB - beforeSlow.rssKB)))"
    ))

    await issuer.stop()
    await burstIssuer.stop()
    await rotatingIssuer.stop()
    hangingIssuer.setTokenBehaviour(.normal)
    await hangingIssuer.stop()
}

/// A release vaultd on `socket`, its state and configuration under `folder`.
func startVaultd(bin: String, socket: String, folder: String, environment extra: [String: String] = [:]) throws -> Process {
    let daemon = Process()
    daemon.executableURL = URL(fileURLWithPath: bin + "/vaultd")
    daemon.arguments = ["--socket", socket, "--log-level", "warning"]
    daemon.environment = ProcessInfo.processInfo.environment.merging(vaultdEnvironment(folder)) { $1 }.merging(extra) { $1 }
    try daemon.run()
    return daemon
}

func vaultdEnvironment(_ folder: String) -> [String: String] {
    ["XDG_STATE_HOME": folder + "/state", "XDG_CONFIG_HOME": folder + "/config"]
}

/// Megabytes (10^6 bytes) from KiB, as the goals are written.
func mb(_ kib: Int) -> String { String(format: "%.1f MB", Double(kib) * 1024 / 1e6) }

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

enum Clock {
    static func now() -> Double {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
    }
}

func percentile(_ values: [Double], _ p: Double) -> Double {
    guard !values.isEmpty else { return 0 }
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

func us(_ seconds: Double) -> String { String(format: "%.1f µs", seconds * 1e6) }
func ms(_ seconds: Double) -> String { String(format: "%.2f ms", seconds * 1e3) }

func timed(_ client: Client, _ line: String) throws -> Double {
    let start = Clock.now()
    _ = try client.call(line)
    return Clock.now() - start
}

/// `connections` connections opened and held; `workers` threads each own a
/// slice of them and send `requests` in all, round-robin over their slice;
/// `whileHeld` runs after the last reply, before the connections close.
func heldConnections(
    socket: String,
    connections: Int,
    requests: Int,
    line: String,
    workers: Int,
    whileHeld: () throws -> Void
) throws -> (rate: Double, errors: Int, connected: Int) {
    let clients = try (0..<connections).map { _ in try Client.connect(socket, deadline: 5) }
    // Every connection has spoken once, so all 1,000 are accepted and live.
    for client in clients { _ = try client.call(#"{"id":0,"op":"hello"}"#) }
    let counts = Slots<Int>(count: workers * 2, initial: 0)
    let perWorker = requests / workers
    let start = Clock.now()
    let done = DispatchGroup()
    for worker in 0..<workers {
        done.enter()
        let mine = stride(from: worker, to: connections, by: workers).map { clients[$0] }
        Thread {
            for index in 0..<perWorker {
                if let reply = try? mine[index % mine.count].call(line), reply.contains(#""ok":true"#) {
                    counts.buffer[worker * 2] += 1
                } else {
                    counts.buffer[worker * 2 + 1] += 1
                }
            }
            done.leave()
        }.start()
    }
    done.wait()
    let elapsed = Clock.now() - start
    try whileHeld()
    let ok = (0..<workers).reduce(0) { $0 + counts.buffer[$1 * 2] }
    let errors = (0..<workers).reduce(0) { $0 + counts.buffer[$1 * 2 + 1] } + (requests - perWorker * workers)
    return (Double(ok) / elapsed, errors, clients.count)
}

/// Sends token requests on one connection without reading a reply until a
/// second passes with no room to write; the bytes vaultd took meanwhile.
func slowReader(socket: String, line: String) throws -> Int {
    let client = try Client.connect(socket, deadline: 5)
    _ = fcntl(client.fd, F_SETFL, fcntl(client.fd, F_GETFL) | O_NONBLOCK)
    let chunk = Array(String(repeating: line + "\n", count: 1024).utf8)
    var total = 0
    while total < 1 << 30 {
        let n = chunk.withUnsafeBytes { send(client.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if n > 0 {
            total += n
            continue
        }
        guard errno == EAGAIN else { throw BenchError("the slow reader's connection failed") }
        var entry = pollfd(fd: client.fd, events: Int16(POLLOUT), revents: 0)
        if poll(&entry, 1, 1000) == 0 { return total }
    }
    throw BenchError("vaultd read 1 GiB from a client that never reads")
}

struct Memory {
    var rssKB: Int
    var peakKB: Int
    var threads: Int
    /// RSS split: anonymous memory, and pages of files (the executable, libraries).
    var anonKB: Int
    var fileKB: Int
}

/// VmRSS, VmHWM and Threads from /proc/PID/status.
func memory(of pid: Int32) throws -> Memory {
    let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
    func field(_ name: String) -> Int {
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(name + ":") }) else { return -1 }
        return Int(line.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces).split(separator: " ")[0]) ?? -1
    }
    return Memory(
        rssKB: field("VmRSS"), peakKB: field("VmHWM"), threads: field("Threads"),
        anonKB: field("RssAnon"), fileKB: field("RssFile")
    )
}

/// `clients` connections each sending one request at the same moment (all
/// sent before any reply is read); each one's wait for its reply.
func concurrent(socket: String, clients: Int, line: String) throws -> [Double] {
    let connections = try (0..<clients).map { _ in try Client.connect(socket, deadline: 5) }
    let start = Clock.now()
    for connection in connections { try connection.send(line) }
    let waits = Slots<Double>(count: clients, initial: 0)
    let done = DispatchGroup()
    for (index, connection) in connections.enumerated() {
        done.enter()
        Thread {
            _ = try? connection.receive()
            waits.buffer[index] = Clock.now() - start
            done.leave()
        }.start()
    }
    done.wait()
    return Array(waits.buffer)
}

/// A program to time as a whole process.
struct Command {
    var path: String
    var arguments: [String]
    var environment: [String: String] = [:]
}

/// Runs each command `rounds` times, taking turns (A, B, C, A, B, C, …) so
/// that whatever else the machine does falls on all of them alike; each
/// command's wall times from spawn to exit.
func wholeProcess(_ commands: [Command], rounds: Int) throws -> [[Double]] {
    var times = Array(repeating: [Double](), count: commands.count)
    for _ in 0..<rounds {
        for (index, command) in commands.enumerated() {
            let start = Clock.now()
            let pid = try spawn(command.path, command.arguments, environment: command.environment)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            times[index].append(Clock.now() - start)
            guard status == 0 else {
                throw BenchError("\(command.path) \(command.arguments.first ?? "") failed (status \(status))")
            }
        }
    }
    return times
}

/// A blocking line client on one connection.
final class Client: @unchecked Sendable {
    let fd: Int32
    private var buffer = [UInt8](repeating: 0, count: 1 << 16)
    private var pending: [UInt8] = []

    static func connect(_ path: String, deadline seconds: Double) throws -> Client {
        let end = Clock.now() + seconds
        while true {
            if let client = try? Client(path) { return client }
            guard Clock.now() < end else { throw BenchError("vaultd did not start listening on \(path)") }
            usleep(10_000)
        }
    }

    init(_ path: String) throws {
        // Set `self.fd` only once connected, so a failed connect is closed once.
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let status = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard status == 0 else {
            close(fd)
            throw BenchError("connect failed")
        }
        self.fd = fd
    }

    deinit { close(self.fd) }

    func send(_ line: String) throws {
        let bytes = Array((line + "\n").utf8)
        guard bytes.withUnsafeBytes({ Glibc.send(self.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == bytes.count else {
            throw BenchError("send failed")
        }
    }

    func call(_ line: String) throws -> String {
        try self.send(line)
        return try self.receive()
    }

    func receive() throws -> String {
        while true {
            if let newline = self.pending.firstIndex(of: 0x0A) {
                let reply = String(decoding: self.pending[..<newline], as: UTF8.self)
                self.pending.removeSubrange(...newline)
                return reply
            }
            let n = recv(self.fd, &self.buffer, self.buffer.count, 0)
            guard n > 0 else { throw BenchError("connection closed") }
            self.pending.append(contentsOf: self.buffer[0..<n])
        }
    }
}

/// One slot per thread; each thread writes only its own.
final class Slots<T>: @unchecked Sendable {
    let buffer: UnsafeMutableBufferPointer<T>

    init(count: Int, initial: T) {
        self.buffer = .allocate(capacity: count)
        self.buffer.initialize(repeating: initial)
    }

    deinit { self.buffer.deallocate() }
}
