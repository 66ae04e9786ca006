import Foundation
import Glibc
import NIOCore
import Testing
import VaultCrypto
import VaultProtocol
import VaultTestIssuer

/// Local clients that misbehave: each one gets nothing it should not, and
/// everyone else keeps being served.
@Suite(.timeLimit(.minutes(1)))
struct HostileClientTests {
    /// A client that pipelines requests and never reads a reply fills its
    /// socket, then the daemon stops reading from it; it does not keep
    /// decoding lines and queueing replies in memory.
    @Test func aClientThatNeverReadsCannotMakeTheDaemonBuffer() async throws {
        let vault = try await InProcessVault.start()
        defer { Task { await vault.stop() } }
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

    /// Bytes that never make a line are not activity: a client trickling one
    /// byte at a time is closed at the idle timeout like a silent one.
    @Test func aClientSendingOneByteAtATimeIsClosedWhenIdle() async throws {
        let vault = try await InProcessVault.start(idleTimeout: .milliseconds(500))
        defer { Task { await vault.stop() } }
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

    /// A request still being worked on is not idleness: its reply arrives
    /// even when it takes longer than the idle timeout.
    @Test func aSlowRequestOutlivesTheIdleTimeout() async throws {
        let issuer = try await TestIssuer.start()
        let vault = try await InProcessVault.start(idleTimeout: .seconds(1))
        defer { Task { await vault.stop(); await issuer.stop() } }
        let configuration = AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"])
        _ = try await vault.broker.add(
            AccountAddition(configuration: configuration, refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken()))
        )
        issuer.setTokenBehaviour(.gate)
        let client = try LineClient(path: vault.socketPath)
        client.send(#"{"id":2,"op":"token","account":"work"}"# + "\n")
        let deadline = ContinuousClock.now + .seconds(20)
        while issuer.refreshCount < 1, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        // A connection opened now and closed for idleness marks the moment
        // the held one has been quiet for longer than the timeout too.
        let silent = try LineClient(path: vault.socketPath)
        #expect(await silent.readLine() == nil)
        issuer.openGate()
        let reply = try #require(await client.readObject())
        #expect(reply["ok"] as? Bool == true)
        #expect(await client.readLine() == nil, "closed once idle with nothing in flight")
    }

    /// Connections opened and dropped in a loop, some mid-line, leave no
    /// connection behind and never stop the daemon answering others.
    @Test func aClientOpeningConnectionsInALoopLeavesNothingBehind() async throws {
        let vault = try await InProcessVault.start()
        defer { Task { await vault.stop() } }
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
        let deadline = ContinuousClock.now + .seconds(20)
        while vault.server.openConnections > 1, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(vault.server.openConnections == 1, "only the bystander is left")
    }

    /// A same-user program outside an account's `allowed_clients` is told
    /// `forbidden` over the socket, and the issuer is never asked.
    @Test func aProgramOutsideAllowedClientsIsForbidden() async throws {
        let issuer = try await TestIssuer.start()
        let vault = try await InProcessVault.start()
        defer { Task { await vault.stop(); await issuer.stop() } }
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
