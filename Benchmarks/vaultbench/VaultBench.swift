// vaultbench: starts a release vaultd against the project's test issuer on
// 127.0.0.1 and measures what a companion meets. Run:
//   swift run -c release vaultbench
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
            throw BenchError("\(bin)/\(tool) is missing; build first: swift build -c release --static-swift-stdlib")
        }
        let folder = "/tmp/vb-\(getpid())"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let socket = folder + "/v.sock"

        let issuer = try await TestIssuer.start(accessTokenLifetime: 3600)
        let burstIssuer = try await TestIssuer.start(accessTokenLifetime: 3600)
        let rotatingIssuer = try await TestIssuer.start(accessTokenLifetime: 3600, rotateRefreshTokens: true)
        let hangingIssuer = try await TestIssuer.start(accessTokenLifetime: 3600)

        let daemon = Process()
        daemon.executableURL = URL(fileURLWithPath: bin + "/vaultd")
        daemon.arguments = ["--socket", socket, "--log-level", "warning"]
        var env = ProcessInfo.processInfo.environment
        env["XDG_STATE_HOME"] = folder + "/state"
        env["XDG_CONFIG_HOME"] = folder + "/config"
        daemon.environment = env
        try daemon.run()
        defer { daemon.terminate() }
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

        var rows: [(String, String)] = []
        rows.append((
            "vaultd idle after set-up (5 accounts, 1 token): RSS = anonymous + file pages; threads",
            "\(setUp.rssKB / 1024) MiB = \(setUp.anonKB / 1024) + \(setUp.fileKB / 1024) MiB; \(setUp.threads) threads"
        ))

        // 0. The codec alone, in this process: decode a token request, encode its reply.
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

        // The floor on this machine today: a blocking POSIX echo server, same line, same socket kind.
        let echo = try echoFloor(path: folder + "/echo.sock", line: tokenLine)
        rows.append(("floor: POSIX echo over a Unix socket, median / p99", "\(us(percentile(echo, 0.5))) / \(us(percentile(echo, 0.99)))"))

        // 1. Cached-token latency, one client.
        for _ in 0..<2_000 { _ = try client.call(tokenLine) }
        var samples: [Double] = []
        for _ in 0..<20_000 {
            let start = Clock.now()
            _ = try client.call(tokenLine)
            samples.append(Clock.now() - start)
        }
        rows.append(("cached token, 1 client: median / p99", "\(us(percentile(samples, 0.5))) / \(us(percentile(samples, 0.99)))"))

        // 2. Throughput with 8 and 64 clients.
        for clients in [8, 64] {
            let (rate, errors) = try throughput(socket: socket, clients: clients, line: tokenLine, seconds: 3)
            rows.append(("cached token, \(clients) clients", "\(Int(rate)) requests/s, \(errors) errors"))
        }

        // 3. 50 clients right after expiry: how many refreshes reach the issuer, how long they wait.
        _ = try client.call(#"{"id":1,"op":"token","account":"burst"}"#)
        let before = burstIssuer.refreshCount
        burstIssuer.setTokenBehaviour(.delay(milliseconds: 20))
        let burst = try concurrent(socket: socket, clients: 50, line: #"{"id":1,"op":"token","account":"burst","min_ttl":7200}"#)
        burstIssuer.setTokenBehaviour(.normal)
        rows.append((
            "50 clients after expiry (issuer answers in 20 ms)",
            "\(burstIssuer.refreshCount - before) refresh, wait median \(ms(percentile(burst, 0.5))) / max \(ms(burst.max() ?? 0))"
        ))

        // 4. Rotation write-back: forced refreshes with and without a rotated token to store.
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

        // 5. Account B while account A's issuer hangs.
        hangingIssuer.setTokenBehaviour(.hang)
        let stuck = try Client.connect(socket, deadline: 5)
        try stuck.send(#"{"id":1,"op":"token","account":"hanging","force_refresh":true}"#)
        var during: [Double] = []
        for _ in 0..<5_000 { during.append(try timed(client, tokenLine)) }
        rows.append(("cached token for B while A's issuer hangs: median / p99", "\(us(percentile(during, 0.5))) / \(us(percentile(during, 0.99)))"))

        // 6. Memory after the runs above.
        rows.append(("vaultd RSS after the runs above", "\(try memory(of: daemon.processIdentifier).rssKB / 1024) MiB"))

        // 7. Load: 1,000 connections held open, 100,000 token requests spread
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
                "\(Int(load.rate)) requests/s, \(load.errors) errors, \(load.connected) connected, RSS \(loaded.rssKB / 1024) MiB while held"
            ))
        }
        rows.append((
            "vaultd RSS: before / after round 1 / after round 2 / peak",
            "\(idle.rssKB / 1024) / \(afterRounds[0].rssKB / 1024) / \(afterRounds[1].rssKB / 1024) / \(afterRounds[1].peakKB / 1024) MiB"
        ))

        // 8. A client that sends requests and never reads a reply.
        let beforeSlow = try memory(of: daemon.processIdentifier)
        let written = try slowReader(socket: socket, line: tokenLine)
        let withSlow = try memory(of: daemon.processIdentifier)
        rows.append((
            "a client that never reads: bytes of requests vaultd took before it stopped reading",
            "\(written / 1024) KiB, RSS +\(max(0, withSlow.rssKB - beforeSlow.rssKB) / 1024) MiB"
        ))

        // 9. vaultctl token, whole process.
        var cli: [Double] = []
        for _ in 0..<200 {
            let start = Clock.now()
            try spawnAndWait(bin + "/vaultctl", ["token", "bench", "--socket", socket])
            cli.append(Clock.now() - start)
        }
        rows.append(("vaultctl token, whole process: median / p99", "\(ms(percentile(cli, 0.5))) / \(ms(percentile(cli, 0.99)))"))
        // The floor for a whole process on this machine: spawning /bin/true.
        var floor: [Double] = []
        for _ in 0..<200 {
            let start = Clock.now()
            try spawnAndWait("/bin/true", [])
            floor.append(Clock.now() - start)
        }
        rows.append(("floor: /bin/true, whole process: median / p99", "\(ms(percentile(floor, 0.5))) / \(ms(percentile(floor, 0.99)))"))

        print("| measure | result |\n|---|---|")
        for (name, value) in rows { print("| \(name) | \(value) |") }
        await issuer.stop()
        await burstIssuer.stop()
        await rotatingIssuer.stop()
        hangingIssuer.setTokenBehaviour(.normal)
        await hangingIssuer.stop()
    }
}

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

/// `clients` connections, each a thread asking in a closed loop for `seconds`.
func throughput(socket: String, clients: Int, line: String, seconds: Double) throws -> (Double, Int) {
    let connections = try (0..<clients).map { _ in try Client.connect(socket, deadline: 5) }
    let counts = Slots<Int>(count: clients * 2, initial: 0)
    let end = Clock.now() + seconds
    let start = Clock.now()
    // One real thread per client: concurrentPerform would run only as many
    // at once as there are cores.
    let done = DispatchGroup()
    for index in 0..<clients {
        done.enter()
        let client = connections[index]
        Thread {
            while Clock.now() < end {
                if let reply = try? client.call(line), reply.contains(#""ok":true"#) {
                    counts.buffer[index * 2] += 1
                } else {
                    counts.buffer[index * 2 + 1] += 1
                }
            }
            done.leave()
        }.start()
    }
    done.wait()
    let elapsed = Clock.now() - start
    let ok = (0..<clients).reduce(0) { $0 + counts.buffer[$1 * 2] }
    let errors = (0..<clients).reduce(0) { $0 + counts.buffer[$1 * 2 + 1] }
    return (Double(ok) / elapsed, errors)
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

func spawnAndWait(_ path: String, _ arguments: [String]) throws {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var pid: pid_t = 0
    guard posix_spawn(&pid, path, &actions, nil, argv, environ) == 0 else { throw BenchError("cannot run \(path)") }
    var status: Int32 = 0
    waitpid(pid, &status, 0)
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

/// Round trips to a plain blocking echo server in this process: what the
/// machine's Unix sockets and scheduler cost before any daemon work.
func echoFloor(path: String, line: String) throws -> [Double] {
    let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
    _ = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    listen(listener, 1)
    Thread {
        let connection = accept(listener, nil, nil)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(connection, &buffer, buffer.count)
            if n <= 0 { break }
            _ = write(connection, buffer, n)
        }
        close(connection)
        close(listener)
    }.start()
    let client = try Client(path)
    var samples: [Double] = []
    for round in 0..<22_000 {
        let start = Clock.now()
        _ = try client.call(line)
        if round >= 2_000 { samples.append(Clock.now() - start) }
    }
    return samples
}
