import Synchronization
import Testing

@testable import VaultDaemon
import VaultTestKit

/// The vault's chores: run when the clock reaches them, in the order they
/// were asked for, never once cancelled, and never after the daemon stops.
@Suite(.timeLimit(.minutes(1)))
struct ChoresTests {
    private struct Running {
        let clock = ManualClock(1_000)
        let chores: Chores
        let task: Task<Void, Never>
        let done = Shared<[String]>([])

        init() {
            let chores = Chores(clock: self.clock)
            self.chores = chores
            self.task = Task { await chores.run() }
        }

        func note(_ name: String) -> @Sendable () async -> Void {
            { [done] in done.value.withLock { $0.append(name) } }
        }

        var names: [String] { self.done.value.withLock { $0 } }
    }

    @Test func choresRunWhenTheClockReachesThemAndNotBefore() async throws {
        let running = Running()
        running.chores.at(1_010, running.note("b"))
        running.chores.at(1_005, running.note("a"))
        let dropped = running.chores.at(1_007, running.note("cancelled"))
        running.chores.cancel(dropped)
        running.clock.advance(by: 4.9)
        try await eventually { running.chores.isQuiet }
        #expect(running.names.isEmpty, "nothing was due")
        running.clock.advance(by: 0.1)
        try await eventually { running.names == ["a"] }
        running.clock.advance(by: 10)
        try await eventually { running.names == ["a", "b"] }
        #expect(running.chores.pending == 0)
        running.chores.stop()
        await running.task.value
    }

    @Test func aChoreAskedForWhileRunSleepsWakesIt() async throws {
        let running = Running()
        running.chores.at(2_000, running.note("late"))
        try await eventually { running.clock.sleepers == 1 }
        running.chores.soon(running.note("soon"))
        try await eventually { running.names == ["soon"] }
        running.chores.stop()
        await running.task.value
        running.chores.soon(running.note("after stop"))
        #expect(running.chores.pending == 0, "a chore asked for after stop is not kept")
        running.clock.advance(by: 5_000)
        #expect(running.names == ["soon"], "no chore begins after stop")
    }

    @Test func stoppingCancelsTheChoresUnderWay() async throws {
        let running = Running()
        let started = Shared(false)
        let cancelled = Shared(false)
        running.chores.soon {
            started.value.withLock { $0 = true }
            // Waits on the clock, which the test never moves.
            let outcome: Void? = try? await running.clock.sleep(until: 1_000_000)
            cancelled.value.withLock { $0 = outcome == nil }
        }
        try await eventually { started.value.withLock { $0 } }
        running.chores.stop()
        await running.task.value
        #expect(cancelled.value.withLock { $0 }, "the chore under way was cancelled, and run waited for it")
    }

    /// A revocation of a token the vault threw away is not lost at the stop:
    /// one not yet begun begins then, and one under way is not cancelled.
    @Test func choresThatMustFinishOutliveTheStop() async throws {
        let clock = ManualClock(1_000)
        let chores = Chores(clock: clock)
        let done = Shared<[String]>([])
        let began = Shared(false)
        let release = Shared<CheckedContinuation<Void, Never>?>(nil)
        chores.finish {
            began.value.withLock { $0 = true }
            await withCheckedContinuation { continuation in release.value.withLock { $0 = continuation } }
            done.value.withLock { $0.append("under way") }
        }
        let task = Task { await chores.run() }
        try await eventually { release.value.withLock { $0 != nil } }
        // Asked for as the daemon stops: begun at the latest then.
        chores.finish { done.value.withLock { $0.append("not begun") } }
        chores.at(2_000) { done.value.withLock { $0.append("dropped") } }
        chores.stop()
        #expect(began.value.withLock { $0 })
        release.value.withLock { $0.take() }?.resume()
        await task.value
        #expect(done.value.withLock { Set($0) } == ["under way", "not begun"])
    }

    /// After the stop nothing runs a chore, one that must finish included, and none is kept.
    @Test func aChoreAskedForAfterTheStopIsNotKept() async throws {
        let chores = Chores(clock: ManualClock(1_000))
        chores.stop()
        chores.finish {}
        #expect(chores.pending == 0)
    }
}
