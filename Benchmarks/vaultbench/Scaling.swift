// How vaultd's cost grows with the number of accounts, and how long it takes
// to start: exec to READY=1, and a socket-activated start to the first answer.
import Foundation
import Glibc
import VaultTestIssuer

/// At 1, 100 and 1,000 accounts, each with a cached token: the cached-token
/// latency, RSS, and a restart's time to open the vault and answer.
func scaling(bin: String, folder: String, load: Load, rows: inout [(String, String)]) async throws {
    let issuer = try await TestIssuer.start(accessTokenLifetime: 3600)
    var rssAt: [Int: Int] = [:]
    var rssRestarted: [Int: Int] = [:]
    for count in [1, 100, 1_000] {
        let dir = folder + "/\(count)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let socket = dir + "/v.sock"
        let daemon = try startVaultd(bin: bin, socket: socket, folder: dir)
        let client = try Client.connect(socket, deadline: 10)
        let began = Clock.now()
        for index in 0..<count {
            let add = #"{"id":1,"op":"account.add","name":"a\#(index)","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","offline_access"],"refresh_token":"\#(issuer.mintRefreshToken())"}"#
            guard try client.call(add).contains(#""ok":true"#) else { throw BenchError("account.add a\(index) failed") }
        }
        let added = Clock.now()
        for index in 0..<count {
            guard try client.call(#"{"id":1,"op":"token","account":"a\#(index)"}"#).contains(#""ok":true"#) else {
                throw BenchError("token a\(index) failed")
            }
        }
        let cached = Clock.now()
        // The refreshes' write-backs run after their answers: wait until vaultd is idle.
        let drained = settle(daemon.processIdentifier) - cached
        let request = #"{"id":1,"op":"token","account":"a\#(count / 2)"}"#
        let latency = try load.run("line", socket, clients: 1, seconds: 1, request: request)
        let memory = try memory(of: daemon.processIdentifier)
        rssAt[count] = memory.rssKB
        stop(daemon.processIdentifier)

        // Restart on the same vault: exec → `status` answered (the vault is
        // open), → a token answered (access tokens live in memory only: one refresh).
        let start = Clock.now()
        let pid = try spawn(bin + "/vaultd", ["--socket", socket, "--log-level", "warning"], environment: vaultdEnvironment(dir))
        let again = try quickConnect(socket, deadline: 30)
        let status = try again.call(#"{"id":1,"op":"status"}"#)
        let opened = Clock.now()
        guard status.contains(#""ok":true"#), status.components(separatedBy: #""signed_in":true"#).count - 1 == count else {
            throw BenchError("after a restart, status does not list \(count) signed-in accounts")
        }
        _ = try again.call(request)
        let answered = Clock.now()
        // RSS once every account has its token again, without the history of
        // the vault file's rewrites as accounts were added one by one.
        for index in 0..<count { _ = try again.call(#"{"id":1,"op":"token","account":"a\#(index)"}"#) }
        _ = settle(pid)
        let restarted = try vaultbench.memory(of: pid)
        let maps = mappings(of: pid)
        rssRestarted[count] = restarted.rssKB
        stop(pid)
        rows.append((
            "\(count) account\(count == 1 ? "" : "s"), each with a cached token: cached token, 1 client, median (p99) / RSS (after a restart, every token fetched again; memory mappings then) / restart: exec → `status` answered, → first token (one refresh)",
            "\(usv(latency.p50)) (\(usv(latency.p99))) / \(mb(memory.rssKB)) (\(mb(restarted.rssKB)); \(maps) maps) / \(ms(opened - start)), \(ms(answered - start))"
        ))
        rows.append((
            "\(count) account\(count == 1 ? "" : "s"): set-up: account.add each / first token each (a refresh) / until vaultd is idle after them",
            "\(ms((added - began) / Double(count))) / \(ms((cached - added) / Double(count))) / \(ms(drained))"
        ))
    }
    if let one = rssAt[1], let thousand = rssAt[1_000], let oneAgain = rssRestarted[1], let thousandAgain = rssRestarted[1_000] {
        rows.append((
            "memory per account: (RSS at 1,000 − at 1) ÷ 999: as added / after a restart",
            String(format: "%.1f KB / %.1f KB", Double(thousand - one) * 1.024 / 999, Double(thousandAgain - oneAgain) * 1.024 / 999)
        ))
    }
    await issuer.stop()
}

/// When a process stopped using CPU: the first 200 ms in which it used
/// under 10 ms (at most 60 s from now).
func settle(_ pid: pid_t) -> Double {
    let end = Clock.now() + 60
    var last = cpuSeconds(of: [pid])
    while Clock.now() < end {
        let start = Clock.now()
        usleep(200_000)
        let now = cpuSeconds(of: [pid])
        if now - last < 0.01 { return start }
        last = now
    }
    return Clock.now()
}

/// The number of memory mappings of a process (each `sodium_malloc`
/// allocation makes its own, between guard pages). Read to the end with
/// read(2): a /proc file says it is empty, and a reader that trusts that
/// stops after its first buffer.
func mappings(of pid: pid_t) -> Int {
    let fd = open("/proc/\(pid)/maps", O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return 0 }
    defer { close(fd) }
    var lines = 0
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let n = read(fd, &chunk, chunk.count)
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { return lines }
        lines += chunk[0..<n].reduce(0) { $0 + ($1 == 0x0A ? 1 : 0) }
    }
}

/// Connects as soon as the socket accepts (polling every millisecond).
func quickConnect(_ path: String, deadline seconds: Double) throws -> Client {
    let end = Clock.now() + seconds
    while true {
        if let client = try? Client(path) { return client }
        guard Clock.now() < end else { throw BenchError("nothing listens on \(path)") }
        usleep(1_000)
    }
}

/// exec → READY=1 on $NOTIFY_SOCKET, and a socket-activated start → the
/// first connection's answer.
func startUp(bin: String, folder: String, rows: inout [(String, String)]) throws {
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    var ready: [Double] = []
    for round in 0..<5 {
        let dir = folder + "/ready\(round)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let notify = try NotifySocket(path: dir + "/notify")
        let start = Clock.now()
        let pid = try spawn(
            bin + "/vaultd", ["--socket", dir + "/v.sock", "--log-level", "warning"],
            environment: vaultdEnvironment(dir).merging(["NOTIFY_SOCKET": notify.path]) { $1 }
        )
        guard notify.wait(for: "READY=1") else {
            stop(pid)
            throw BenchError("vaultd sent no READY=1")
        }
        ready.append(Clock.now() - start)
        stop(pid)
    }
    rows.append(("start: exec → READY=1 (sd_notify on NOTIFY_SOCKET), empty vault: median / max of 5", "\(ms(percentile(ready, 0.5))) / \(ms(ready.max() ?? 0))"))

    let launcher = "/usr/bin/systemd-socket-activate"
    if FileManager.default.isExecutableFile(atPath: launcher) {
        var activated: [Double] = []
        for round in 0..<5 {
            let dir = folder + "/activated\(round)"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            let socket = dir + "/a.sock"
            let variables = vaultdEnvironment(dir).merging(["XDG_RUNTIME_DIR": dir, "HOME": dir]) { $1 }
            let pid = try spawn(
                launcher,
                ["-l", socket, "--fdname=vaultd"] + variables.map { "-E\($0.key)=\($0.value)" }
                    + [bin + "/vaultd", "--socket", socket, "--log-level", "warning"]
            )
            // systemd-socket-activate listens; the first connection starts vaultd.
            let end = Clock.now() + 5
            while !FileManager.default.fileExists(atPath: socket) && Clock.now() < end { usleep(1_000) }
            usleep(100_000)
            let start = Clock.now()
            let client = try quickConnect(socket, deadline: 10)
            let hello = try client.call(#"{"id":1,"op":"hello"}"#)
            activated.append(Clock.now() - start)
            stop(pid)
            guard hello.contains(#""ok":true"#) else { throw BenchError("the socket-activated vaultd did not answer hello") }
        }
        rows.append((
            "start: socket-activated (systemd-socket-activate), first connection → its `hello` answered: median / max of 5",
            "\(ms(percentile(activated, 0.5))) / \(ms(activated.max() ?? 0))"
        ))
    }
    rows.append((
        "start: `systemctl --user start` → READY",
        "not measured here: no user service manager (PID 1 is not systemd); it waits for the READY=1 above"
    ))
}

/// A datagram socket playing the service manager's end of $NOTIFY_SOCKET.
final class NotifySocket {
    let path: String
    let fd: Int32

    init(path: String) throws {
        self.path = path
        self.fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(self.fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else { throw BenchError("cannot bind \(path)") }
        var timeout = timeval(tv_sec: 20, tv_usec: 0)
        setsockopt(self.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(self.fd) }

    /// Waits for a datagram containing `text`; false after 20 s without one.
    func wait(for text: String) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = recv(self.fd, &buffer, buffer.count, 0)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }
            if String(decoding: buffer[0..<n], as: UTF8.self).contains(text) { return true }
        }
    }
}
