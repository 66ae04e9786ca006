import Foundation
import Glibc
import NIOCore
import NIOHTTP1
import Testing
import VaultServer
import VaultTestKit

/// The browser sign-in's redirect listener, alone: its cap, its request
/// deadline, and that close() ends every connection, not just the listening one.
@Suite(.timeLimit(.minutes(1)))
struct LoopbackListenerTests {
    private func start(deadline: TimeAmount = .seconds(60), maximum: Int = 4) async throws -> (LoopbackListener, Int) {
        let listener = try await LoopbackListener.start(fixed: nil, requestDeadline: deadline, maximumConnections: maximum, run: { Task(operation: $0) }) { _ in
            .init(status: .ok, title: "Signed in", message: "ok", done: true)
        }
        return (listener, try #require(URLComponents(string: listener.redirectURI)?.port))
    }

    @Test func closeEndsEveryHeldConnection() async throws {
        let (listener, port) = try await self.start(maximum: 8)
        let held = try (0..<8).map { _ in try HeldConnection(port: port, send: "GET /callback?state=") }
        #expect(try await eventually { listener.openConnections == 8 })
        #expect(held.allSatisfy { !$0.isClosed }, "held within the cap and the 60 s deadline")
        listener.close()
        #expect(try await eventually { held.allSatisfy(\.isClosed) })
        #expect(try await eventually { listener.openConnections == 0 })
    }

    @Test func connectionsOverTheCapAreClosedAtOnce() async throws {
        let (listener, port) = try await self.start(maximum: 4)
        defer { listener.close() }
        let held = try (0..<12).map { _ in try HeldConnection(port: port, send: "GET /callback?state=") }
        #expect(try await eventually { held.filter(\.isClosed).count == 8 })
        #expect(listener.openConnections == 4)
        withExtendedLifetime(held) {}
    }

    @Test func aRequestThatNeverEndsIsCutAtItsDeadline() async throws {
        // 5 s, not 2: the whole request below must be read before its own
        // deadline, and once, in a cold run of the whole suite on two cores,
        // it was not read within 2 s.
        let (listener, port) = try await self.start(deadline: .seconds(5))
        defer { listener.close() }
        let slow = try HeldConnection(port: port, send: "GET /callback?sta")
        #expect(try await eventually { slow.isClosed })
        let answer = await blocking { exchange(port, "GET /callback?state=x HTTP/1.1\r\nHost: x\r\n\r\n") }
        #expect(answer.hasPrefix("HTTP/1.1 200"), "a whole request within the deadline is answered: \(answer)")
    }

    /// The answer that ends the flow closes the listener while its own page is being written: that page still arrives.
    @Test func theAnswerThatEndsTheFlowStillGetsItsPage() async throws {
        let box = ListenerBox()
        let listener = try await LoopbackListener.start(fixed: nil, run: { Task(operation: $0) }) { _ in
            box.listener?.close()
            return .init(status: .ok, title: "Signed in", message: "done", done: true)
        }
        box.listener = listener
        let port = try #require(URLComponents(string: listener.redirectURI)?.port)
        let answer = await blocking { exchange(port, "GET /callback?state=x HTTP/1.1\r\nHost: x\r\n\r\n") }
        #expect(answer.hasPrefix("HTTP/1.1 200") && answer.contains("Signed in"), "\(answer)")
        #expect(try await eventually { listener.openConnections == 0 })
    }
}

private final class ListenerBox: @unchecked Sendable {
    var listener: LoopbackListener?
}

/// Another user of the machine cannot hold the redirect listener's slots
/// for the life of a browser sign-in: their connections are closed at accept.
@Suite(.timeLimit(.minutes(1)))
struct LoopbackListenerOwnerTests {
    @Test(.enabled(if: getuid() == 0, "needs root to connect as another user"))
    func anotherUsersConnectionsAreClosedAndTheUsersRedirectGetsThrough() async throws {
        let listener = try await LoopbackListener.start(fixed: nil, requestDeadline: .seconds(60), maximumConnections: 4, run: { Task(operation: $0) }) { _ in
            .init(status: .ok, title: "Signed in", message: "ok", done: true)
        }
        defer { listener.close() }
        let port = try #require(URLComponents(string: listener.redirectURI)?.port)
        // 16 connections as nobody, each sending the start of a request and
        // waiting to be closed: each prints how it ended.
        let script = """
            import socket, sys
            def ended(s):
                try:
                    s.sendall(b"GET /callback?state=")
                    return s.recv(1) == b""
                except (ConnectionResetError, BrokenPipeError):
                    return True
            held = [socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20) for _ in range(16)]
            print(f"closed {sum(1 for s in held if ended(s))}")
            """
        let nobody = try await runTool(
            "/usr/bin/setpriv", ["--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c", script, String(port)]
        )
        #expect(nobody.stdout.contains("closed 16"), "\(nobody.stdout) \(nobody.stderr)")
        let answer = await blocking { exchange(port, "GET /callback?state=x HTTP/1.1\r\nHost: x\r\n\r\n") }
        #expect(answer.hasPrefix("HTTP/1.1 200"), "the user's own redirect is answered: \(answer)")
    }

    @Test func procAddressesAreWrittenAsTheKernelWritesThem() throws {
        let v4 = try SocketAddress(ipAddress: "127.0.0.1", port: 8080)
        #expect(TCPOwner.procText(v4) == "0100007F:1F90")
        let v6 = try SocketAddress(ipAddress: "::1", port: 443)
        #expect(TCPOwner.procText(v6) == "00000000000000000000000001000000:01BB")
    }
}
