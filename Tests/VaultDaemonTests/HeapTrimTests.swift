import Foundation
import Testing

@testable import VaultDaemon
import VaultTestKit

/// When vaultd gives the C heap's free pages back.
@Suite(.timeLimit(.minutes(1)))
struct HeapTrimTests {
    /// A trim returns pages that the next request would fault in again: while
    /// clients keep reading, the trim waits for them to stop. Time is the
    /// test's: the clock moves by hand, and each step waits for the chores.
    @Test func noTrimRunsWhileClientsRead() async throws {
        let clock = ManualClock()
        let chores = Chores(clock: clock)
        let running = Task { await chores.run() }
        defer {
            chores.stop()
            running.cancel()
        }
        let trim = HeapTrim(delay: 2, chores: chores)
        trim.soon()
        // Reads every 0.1 s for 3 s, longer than the delay.
        for _ in 0..<30 {
            trim.reading()
            clock.advance(by: 0.1)
            try await eventually { chores.isQuiet }
        }
        #expect(trim.count == 0, "a trim ran while reads came")
        #expect(trim.isPending)
        // The reads stop: the next look notes the last one, the one after trims.
        clock.advance(by: 2)
        try await eventually { chores.isQuiet }
        clock.advance(by: 2)
        try await eventually { trim.count > 0 }
        #expect(trim.count == 1, "no trim once the reads stopped")
        #expect(!trim.isPending)
        #expect(chores.pending == 0, "a trim done leaves no chore behind")
    }
}
