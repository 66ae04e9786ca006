import Foundation
import NIOCore
import NIOHTTP1
import Testing
@testable import VaultDaemon

/// The browser sign-in's redirect listener, alone: its cap, its request
/// deadline, and that close() ends every connection, not just the listening one.
@Suite(.timeLimit(.minutes(1)))
struct LoopbackListenerTests {
    private func start(deadline: TimeAmount = .seconds(60), maximum: Int = 4) async throws -> (LoopbackListener, Int) {
        let listener = try await LoopbackListener.start(fixed: nil, requestDeadline: deadline, maximumConnections: maximum) { _ in
            .init(status: .ok, title: "Signed in", message: "ok", done: true)
        }
        return (listener, try #require(URLComponents(string: listener.redirectURI)?.port))
    }

    @Test func closeEndsEveryHeldConnection() async throws {
        let (listener, port) = try await self.start(maximum: 8)
        let held = try (0..<8).map { _ in try HeldConnection(port: port, send: "GET /callback?state=") }
        #expect(await IssuerSafetyTests.eventually { listener.openConnections == 8 })
        #expect(held.allSatisfy { !$0.isClosed }, "held within the cap and the 60 s deadline")
        listener.close()
        #expect(await IssuerSafetyTests.eventually { held.allSatisfy(\.isClosed) })
        #expect(await IssuerSafetyTests.eventually { listener.openConnections == 0 })
    }

    @Test func connectionsOverTheCapAreClosedAtOnce() async throws {
        let (listener, port) = try await self.start(maximum: 4)
        defer { listener.close() }
        let held = try (0..<12).map { _ in try HeldConnection(port: port, send: "GET /callback?state=") }
        #expect(await IssuerSafetyTests.eventually { held.filter(\.isClosed).count == 8 })
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
        #expect(await IssuerSafetyTests.eventually { slow.isClosed })
        let answer = await blocking { IssuerSafetyTests.exchange(port, "GET /callback?state=x HTTP/1.1\r\nHost: x\r\n\r\n") }
        #expect(answer.hasPrefix("HTTP/1.1 200"), "a whole request within the deadline is answered: \(answer)")
    }

    /// The answer that ends the flow closes the listener while its own page is being written: that page still arrives.
    @Test func theAnswerThatEndsTheFlowStillGetsItsPage() async throws {
        let box = ListenerBox()
        let listener = try await LoopbackListener.start(fixed: nil) { _ in
            box.listener?.close()
            return .init(status: .ok, title: "Signed in", message: "done", done: true)
        }
        box.listener = listener
        let port = try #require(URLComponents(string: listener.redirectURI)?.port)
        let answer = await blocking { IssuerSafetyTests.exchange(port, "GET /callback?state=x HTTP/1.1\r\nHost: x\r\n\r\n") }
        #expect(answer.hasPrefix("HTTP/1.1 200") && answer.contains("Signed in"), "\(answer)")
        #expect(await IssuerSafetyTests.eventually { listener.openConnections == 0 })
    }
}

private final class ListenerBox: @unchecked Sendable {
    var listener: LoopbackListener?
}
