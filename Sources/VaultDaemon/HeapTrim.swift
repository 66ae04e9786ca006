import CVaultSystem
import Synchronization
import VaultServer

/// Gives the C heap's free pages back to the system once a burst of work is
/// over: `delay` after the last closed connection, refresh or account
/// change, with no read from a client in that time either.
///
/// A burst leaves holes between the allocations that stay (a connection's
/// buffers around the few objects created while it was open), and glibc
/// keeps the pages for reuse. After 1,000 connections and 100,000 requests
/// that is about 4 MB, which one `malloc_trim` returns; after a refresh at
/// each of 1,000 accounts, 1.2 MB. A trim takes 0.1 to 0.4 ms on a
/// background thread, holding the heap's locks, and the pages it returns
/// are faulted in again by the next burst: so no trim runs while requests
/// come, and each `soon()` only moves the time it is due.
final class HeapTrim: ConnectionObserver {
    let delay: Duration
    /// When the pending trim is due; nil when none is pending.
    private let due = Mutex<ContinuousClock.Instant?>(nil)
    private let trims = Atomic<Int>(0)
    /// Whether a client read since the pending trim last looked; a trim
    /// waits for the reads to stop.
    private let read = Atomic<Bool>(false)

    init(delay: Duration = .milliseconds(250)) {
        self.delay = delay
    }

    /// Trims done so far; for tests.
    var count: Int { self.trims.load(ordering: .relaxed) }

    /// Whether a trim is due; for tests.
    var isPending: Bool { self.due.withLock { $0 != nil } }

    /// Notes a read from a client: a trim that is due waits until `delay`
    /// passes without one. Once noted, a read only loads the flag: the event
    /// loops, on their cores, do not take its cache line from each other.
    /// A connection closed: its buffers leave holes in the heap.
    func closed() { self.soon() }

    func reading() {
        if !self.read.load(ordering: .relaxed) { self.read.store(true, ordering: .relaxed) }
    }

    /// Trims once `delay` has passed with no other call and no read.
    func soon() {
        let first = self.due.withLock { due -> Bool in
            defer { due = .now + self.delay }
            return due == nil
        }
        guard first else { return }
        Task.detached {
            while true {
                // Only this task clears it.
                guard let when = self.due.withLock({ $0 }) else { return }
                if when > .now {
                    try? await Task.sleep(until: when, clock: .continuous)
                    continue
                }
                if self.read.exchange(false, ordering: .relaxed) {
                    self.due.withLock { $0 = .now + self.delay }
                    continue
                }
                _ = vault_trim_heap()
                self.trims.add(1, ordering: .relaxed)
                let done = self.due.withLock { due -> Bool in
                    // Work that came during the trim gets a trim of its own.
                    if let later = due, later > when { return false }
                    due = nil
                    return true
                }
                if done { return }
            }
        }
    }
}
