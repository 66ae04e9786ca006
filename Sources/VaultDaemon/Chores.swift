import Synchronization

/// The vault's work that answers no request of its own: a flow's or a
/// share's end, a `signin.wait` timeout, a device poll, a refresh ahead of
/// expiry, a heap trim. Each is a chore due at a time on the vault's clock.
/// `run`, part of the daemon's service, sleeps until the next chore is due
/// and runs it as a child of its task group: nothing outlives the daemon,
/// and a test moves its clock instead of waiting for real time.
///
/// A chore not yet begun can be cancelled by its ticket. One under way runs
/// to its end, so each chore checks what it acts on when it begins (the flow
/// or share may have ended). When the daemon stops, the chores not begun
/// are dropped and those under way are cancelled; but a chore that must
/// finish (`finish`: the revocation of a token the vault threw away, which
/// the issuer would otherwise keep live with nothing here holding it)
/// begins at the stop if it had not, and is never cancelled: it ends by its
/// own bound (the issuer timeout), and the daemon's stop waits for it.
package final class Chores: Sendable {
    package struct Ticket: Hashable, Sendable {
        fileprivate let number: UInt64
    }

    private struct Chore {
        let due: Double
        let work: @Sendable () async -> Void
        var mustFinish = false
    }

    private struct State {
        var next: UInt64 = 0
        var pending: [UInt64: Chore] = [:]
        /// Whether a chore came or went since `run` last looked.
        var changed = false
        var stopped = false
        var wake: CheckedContinuation<Void, Never>?
        /// Chores begun and not yet ended.
        var running = 0
    }

    let clock: any WallClock
    private let state = Mutex(State())

    package init(clock: any WallClock) {
        self.clock = clock
    }

    /// Runs `work` once the clock reaches `due`.
    @discardableResult
    package func at(_ due: Double, _ work: @escaping @Sendable () async -> Void) -> Ticket {
        self.add(Chore(due: due, work: work))
    }

    /// Runs `work` as soon as `run` gets to it, and at the stop if it had
    /// not begun by then; once begun it is not cancelled, so `work` must
    /// bound itself.
    @discardableResult
    package func finish(_ work: @escaping @Sendable () async -> Void) -> Ticket {
        self.add(Chore(due: -.infinity, work: work, mustFinish: true))
    }

    private func add(_ chore: Chore) -> Ticket {
        let (ticket, wake) = self.state.withLock { state -> (Ticket, CheckedContinuation<Void, Never>?) in
            state.next += 1
            // After `stop`, nothing would run it: it is not kept either, nor
            // what it holds.
            guard !state.stopped else { return (Ticket(number: state.next), nil) }
            state.pending[state.next] = chore
            state.changed = true
            return (Ticket(number: state.next), state.wake.take())
        }
        wake?.resume()
        return ticket
    }

    /// Runs `work` `seconds` from now.
    @discardableResult
    package func after(_ seconds: Double, _ work: @escaping @Sendable () async -> Void) -> Ticket {
        self.at(self.clock.now() + seconds, work)
    }

    /// Runs `work` as soon as `run` gets to it.
    @discardableResult
    package func soon(_ work: @escaping @Sendable () async -> Void) -> Ticket {
        self.at(-.infinity, work)
    }

    /// Drops the chore if it has not begun.
    package func cancel(_ ticket: Ticket?) {
        guard let ticket else { return }
        self.state.withLock { _ = $0.pending.removeValue(forKey: ticket.number) }
    }

    /// Chores not yet begun; for tests.
    package var pending: Int { self.state.withLock { $0.pending.count } }

    /// Whether no chore is due now and none is under way: a test that moved
    /// the clock waits for this.
    package var isQuiet: Bool {
        let now = self.clock.now()
        return self.state.withLock { state in
            state.running == 0 && !state.pending.values.contains { $0.due <= now }
        }
    }

    /// Runs the chores as they fall due, until `stop` or cancellation; then
    /// cancels those under way and returns once they have ended.
    package func run() async {
        await withDiscardingTaskGroup { group in
            running: while !Task.isCancelled {
                let next: Double?
                // Scoped, so the closures handed to the group (and what they
                // hold: a token to revoke) are let go before `run` sleeps.
                do {
                    let now = self.clock.now()
                    let (due, upcoming, stopped) = self.state.withLock { state in
                        state.changed = false
                        // After `stop` only chores that must finish are left: they begin now.
                        let due = state.pending.filter { state.stopped || $0.value.due <= now }.sorted { $0.key < $1.key }
                        for (number, _) in due { state.pending[number] = nil }
                        state.running += due.count
                        return (due.map(\.value), state.pending.values.map(\.due).min(), state.stopped)
                    }
                    for chore in due {
                        group.addTask {
                            if chore.mustFinish {
                                // Its own task: the group's cancellation at the stop does not reach it.
                                await Task { await chore.work() }.value
                            } else {
                                await chore.work()
                            }
                            self.state.withLock { $0.running -= 1 }
                        }
                    }
                    if stopped { break running }
                    next = upcoming
                }
                await self.sleep(until: next)
            }
            group.cancelAll()
        }
    }

    /// Ends `run`: no chore begins after this but those that must finish.
    package func stop() {
        let wake = self.state.withLock { state in
            state.stopped = true
            state.pending = state.pending.filter(\.value.mustFinish)
            return state.wake.take()
        }
        wake?.resume()
    }

    /// Until `deadline` (nil: none), a change to the chores, or cancellation.
    private func sleep(until deadline: Double?) async {
        await withTaskGroup(of: Void.self) { race in
            if let deadline {
                race.addTask { try? await self.clock.sleep(until: deadline) }
            }
            race.addTask { await self.change() }
            await race.next()
            race.cancelAll()
        }
    }

    private func change() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = self.state.withLock { state -> Bool in
                    // Checked under the lock the cancellation handler takes:
                    // a cancellation before this line finds no continuation.
                    if state.changed || state.stopped || Task.isCancelled { return true }
                    state.wake = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            self.state.withLock { $0.wake.take() }?.resume()
        }
    }
}
