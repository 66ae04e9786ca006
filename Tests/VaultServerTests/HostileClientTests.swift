import Foundation
import Glibc
import Logging
import NIOCore
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultServer
import VaultTestIssuer
import VaultTestKit

/// Local clients that misbehave: each one gets nothing it should not, and
/// everyone else keeps being served.
@Suite(.timeLimit(.minutes(2)))
struct HostileClientTests {
    /// A client that pipelines requests and never reads a reply fills its
    /// socket, then the daemon stops reading from it; it does not keep
    /// decoding lines and queueing replies in memory.
    @Test func aClientThatNeverReadsCannotMakeTheDaemonBuffer() async throws {
        try await withVault { vault in
            let slow = try LineClient(path: vault.socketPath)
            let line = Array(#"{"id":1,"op":"hello"}"#.utf8) + [0x0A]
            let chunk = Array([[UInt8]](repeating: line, count: 4096).joined())
            let cap = 64 << 20
            let written = await blocking { () -> Int in
                _ = fcntl(slow.fd, F_SETFL, fcntl(slow.fd, F_GETFL) | O_NONBLOCK)
                var total = 0
                while total < cap {
                    let n = chunk.withUnsafeBytes { Glibc.send(slow.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    if n > 0 {
                        total += n
                        continue
                    }
                    guard errno == EAGAIN else { return -1 }
                    // Wait for the daemon to read more; a second with no room
                    // means it has stopped reading from us.
                    var entry = pollfd(fd: slow.fd, events: Int16(POLLOUT), revents: 0)
                    if poll(&entry, 1, 1000) == 0 { return total }
                }
                return total
            }
            #expect(written > 0)
            #expect(written < 16 << 20, "the daemon read \(written) bytes of requests it could not answer")
            // Everyone else is still served at once.
            let other = try LineClient(path: vault.socketPath)
            #expect(await other.call(#"{"id":2,"op":"hello"}"#)?["ok"] as? Bool == true)
        }
    }

    /// 200 connections pipelining requests and reading no reply: each one
    /// costs vaultd a few unwritten replies and one read buffer, not an answer
    /// to every line it read, and a new client is answered meanwhile.
    @Test func manyClientsThatNeverReadCannotGrowTheDaemon() async throws {
        try await using(DaemonProcess(folder: try temporaryFolder())) { daemon in
            #expect(await daemon.waitForLog("listening"))
            let hello = #"{"id":1,"op":"hello"}"#
            #expect(try await LineClient(path: daemon.socketPath).call(hello)?["ok"] as? Bool == true)
            let idle = try #require(residentBytes(of: daemon.pid))
            let clients = try (0..<200).map { _ in try LineClient(path: daemon.socketPath) }
            let descriptors = clients.map(\.fd)
            let pid = daemon.pid
            let chunk = Array([[UInt8]](repeating: Array((hello + "\n").utf8), count: 4096).joined())
            let stalled = await blocking { () -> Bool in
                for fd in descriptors { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
                var sent = [Int](repeating: 0, count: descriptors.count)
                var (queued, ticks) = (-1, -1)
                var quietSince = ContinuousClock.now
                // About 20 s on a quiet two-core machine; under the rest of the
                // suite, run beside it, more than twice that.
                let deadline = ContinuousClock.now + .seconds(100)
                while ContinuousClock.now < deadline {
                    var progress = false
                    for (index, fd) in descriptors.enumerated() {
                        while sent[index] < 8 << 20 {
                            let n = chunk.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                            guard n > 0 else { break }
                            sent[index] += n
                            progress = true
                        }
                    }
                    var entries = descriptors.map { pollfd(fd: $0, events: Int16(POLLOUT), revents: 0) }
                    _ = poll(&entries, nfds_t(entries.count), 100)
                    // Stalled once, for a whole second, vaultd has taken no byte
                    // from any of them and done no work: it waits for them to read.
                    let now = descriptors.reduce(0) { total, fd in
                        var unread: Int32 = 0
                        _ = ioctl(fd, UInt(TIOCOUTQ), &unread)
                        return total + Int(unread)
                    }
                    let worked = processorTicks(of: pid)
                    if progress || now != queued || worked != ticks {
                        (queued, ticks, quietSince) = (now, worked, ContinuousClock.now)
                    } else if ContinuousClock.now - quietSince >= .seconds(1) {
                        return true
                    }
                }
                return false
            }
            #expect(stalled, "vaultd kept reading from clients that read nothing")
            let grown = try #require(residentBytes(of: daemon.pid)) - idle
            #expect(grown < 64 << 20, "vaultd grew by \(grown >> 20) MiB for 200 clients that never read")
            let fresh = try LineClient(path: daemon.socketPath, timeoutSeconds: 1)
            #expect(await fresh.call(#"{"id":2,"op":"hello"}"#)?["ok"] as? Bool == true, "a new client is answered within a second")
            withExtendedLifetime(clients) {}
        }
    }

    /// Past the undecoded input all connections may leave vaultd holding, a
    /// connection that does not read its replies is closed; others are served.
    @Test func aStalledConnectionOverTheSharedBudgetIsClosed() async throws {
        try await withVault { vault in
            var configuration = SocketServer.Configuration(path: vault.folder + "/tight.sock")
            configuration.maximumHeldBytes = 1
            let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
            try await using(SocketServer.start(configuration, handler: vault.dispatcher, events: EventHub(), logger: logger)) { server in
                let slow = try LineClient(path: configuration.path)
                let line = Array(#"{"id":1,"op":"hello"}"#.utf8) + [0x0A]
                let chunk = Array([[UInt8]](repeating: line, count: 4096).joined())
                let closed = await blocking { () -> Bool in
                    _ = fcntl(slow.fd, F_SETFL, fcntl(slow.fd, F_GETFL) | O_NONBLOCK)
                    var total = 0
                    var stalls = 0
                    var replies = [UInt8](repeating: 0, count: 4096)
                    while total < 64 << 20 {
                        let n = chunk.withUnsafeBytes { Glibc.send(slow.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                        if n > 0 {
                            total += n
                        } else if errno == EAGAIN {
                            var entry = pollfd(fd: slow.fd, events: Int16(POLLOUT), revents: 0)
                            guard poll(&entry, 1, 1000) == 0 else { continue }
                            // Stalled. vaultd may have stopped at a line's end, holding
                            // nothing; take a few replies and stall it again.
                            stalls += 1
                            if stalls > 20 { return false }
                            let got = recv(slow.fd, &replies, replies.count, 0)
                            if got == 0 || (got < 0 && errno == ECONNRESET) { return true }
                        } else {
                            return errno == EPIPE || errno == ECONNRESET
                        }
                    }
                    return false
                }
                #expect(closed, "a connection holding input over the budget stayed open")
                #expect(try await LineClient(path: configuration.path).call(#"{"id":2,"op":"hello"}"#)?["ok"] as? Bool == true)
            }
        }
    }

    /// Bytes that never make a line are not activity: a client trickling one
    /// byte at a time is closed at the idle timeout like a silent one.
    @Test func aClientSendingOneByteAtATimeIsClosedWhenIdle() async throws {
        try await withVault(idleTimeout: .milliseconds(500)) { vault in
            let client = try LineClient(path: vault.socketPath)
            let started = ContinuousClock.now
            let closed = await blocking { () -> Bool in
                let deadline = ContinuousClock.now + .seconds(20)
                while ContinuousClock.now < deadline {
                    var byte: UInt8 = 0x20
                    guard Glibc.send(client.fd, &byte, 1, Int32(MSG_NOSIGNAL)) == 1 else { return true }
                    // The next byte goes 100 ms later unless the daemon hangs up first.
                    var entry = pollfd(fd: client.fd, events: Int16(POLLIN), revents: 0)
                    if poll(&entry, 1, 100) > 0 {
                        var buffer = [UInt8](repeating: 0, count: 16)
                        if recv(client.fd, &buffer, buffer.count, 0) <= 0 { return true }
                    }
                }
                return false
            }
            #expect(closed, "a byte every 100 ms kept the connection open past a 500 ms idle timeout")
            #expect(ContinuousClock.now - started >= .milliseconds(500))
        }
    }

    /// A request still being worked on is not idleness: its reply arrives
    /// even when it takes longer than the idle timeout.
    @Test func aSlowRequestOutlivesTheIdleTimeout() async throws {
        try await using(TestIssuer.start(), InProcessVault.start(idleTimeout: .seconds(1))) { issuer, vault in
            let configuration = AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"])
            _ = try await vault.broker.add(
                AccountAddition(configuration: configuration, refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken()))
            )
            issuer.setTokenBehaviour(.gate)
            let client = try LineClient(path: vault.socketPath)
            client.send(#"{"id":2,"op":"token","account":"work"}"# + "\n")
            try await eventually { issuer.refreshCount >= 1 }
            // A connection opened now and closed for idleness marks the moment
            // the held one has been quiet for longer than the timeout too.
            let silent = try LineClient(path: vault.socketPath)
            #expect(await silent.readLine() == nil)
            issuer.openGate()
            let reply = try #require(await client.readObject())
            #expect(reply["ok"] as? Bool == true)
            #expect(await client.readLine() == nil, "closed once idle with nothing in flight")
        }
    }

    /// Connections opened and dropped in a loop, some mid-line, leave no
    /// connection behind and never stop the daemon answering others.
    @Test func aClientOpeningConnectionsInALoopLeavesNothingBehind() async throws {
        try await withVault { vault in
            let bystander = try LineClient(path: vault.socketPath)
            let path = vault.socketPath
            let opened = await blocking { () -> Int in
                var count = 0
                for round in 0..<2000 {
                    guard let client = try? LineClient(path: path) else { continue }
                    count += 1
                    switch round % 3 {
                    case 0: client.send(#"{"id":1,"op":"hel"#)
                    case 1: client.send(#"{"id":1,"op":"status"}"# + "\n")
                    default: break
                    }
                }
                return count
            }
            #expect(opened == 2000)
            #expect(await bystander.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
            try await eventually { vault.server.openConnections <= 1 }
            #expect(vault.server.openConnections == 1, "only the bystander is left")
        }
    }

    /// A same-user program outside an account's `allowed_clients` is told
    /// `forbidden` over the socket, and the issuer is never asked.
    @Test func aProgramOutsideAllowedClientsIsForbidden() async throws {
        try await using(TestIssuer.start(), InProcessVault.start()) { issuer, vault in
            let client = try LineClient(path: vault.socketPath)
            let refreshToken = issuer.mintRefreshToken()
            let add = #"{"id":1,"op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","allowed_clients":["/usr/bin/only-this"],"refresh_token":"\#(refreshToken)"}"#
            #expect(await client.call(add)?["ok"] as? Bool == true)
            for op in ["token", "claims", "userinfo", "refresh_token"] {
                let line = try #require(await client.call(#"{"id":2,"op":"\#(op)","account":"work"}"#))
                #expect(line.errorCode == "forbidden", "\(op)")
                #expect(!"\(line)".contains(refreshToken))
            }
            #expect(issuer.refreshCount == 0)
        }
    }
}

/// User and system time of `pid` so far, in clock ticks (/proc/PID/stat).
func processorTicks(of pid: pid_t) -> Int {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
    else { return -1 }
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    return (Int(fields[11]) ?? 0) + (Int(fields[12]) ?? 0)
}

/// VmRSS of `pid`, from /proc/PID/status.
func residentBytes(of pid: pid_t) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
        let kilobytes = Int(line.split(whereSeparator: { $0 == " " || $0 == "\t" })[1])
    else { return nil }
    return kilobytes << 10
}
