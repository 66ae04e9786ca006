import Foundation
import Testing

@testable import VaultDaemon

/// When vaultd gives the C heap's free pages back.
@Suite(.timeLimit(.minutes(1)))
struct HeapTrimTests {
    /// A trim returns pages that the next request would fault in again: while
    /// clients keep reading, the trim waits for them to stop.
    @Test func noTrimRunsWhileClientsRead() async throws {
        let trim = HeapTrim(delay: .seconds(2))
        trim.soon()
        let busyUntil = ContinuousClock.now + .seconds(3)
        while ContinuousClock.now < busyUntil {
            trim.reading()
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(trim.count == 0, "a trim ran while reads came")
        #expect(trim.isPending)
        try await eventually { trim.count > 0 }
        #expect(trim.count == 1, "no trim once the reads stopped")
        #expect(!trim.isPending)
    }
}
