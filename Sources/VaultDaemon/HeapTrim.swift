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
/// each of 1,000 accounts, 1.2 MB. A trim takes 0.1 to 0.4 ms, holding the
/// heap's locks, and the pages it returns are faulted in again by the next
/// burst: so no trim runs while requests come, and each `soon()` only moves
/// the time it is due. The trim is a chore, on the vault's clock.
package final class HeapTrim: ConnectionObserver {
    /// Seconds.
    let delay: Double
    let chores: Chores
    /// When the pending trim is due; nil when none is pending.
    private let due = Mutex<Double?>(nil)
    private let trims = Atomic<Int>(0)
    /// Whether a client read since the pending trim last looked; a trim
    /// waits for the reads to stop.
    private let read = Atomic<Bool>(false)

    init(delay: Double = 0.25, chores: Chores) {
        self.delay = delay
        self.chores = chores
    }

    /// Trims done so far; for tests.
    package var count: Int { self.trims.load(ordering: .relaxed) }

    /// Whether a trim is due; for tests.
    package var isPending: Bool { self.due.withLock { $0 != nil } }

    /// A connection closed: its buffers leave holes in the heap.
    func closed() { self.soon() }

    /// Notes a read from a client: a trim that is due waits until `delay`
    /// passes without one. Once noted, a read only loads the flag: the event
    /// loops, on their cores, do not take its cache line from each other.
    func reading() {
        if !self.read.load(ordering: .relaxed) { self.read.store(true, ordering: .relaxed) }
    }

    /// Trims once `delay` has passed with no other call and no read.
    func soon() {
        let now = self.chores.clock.now()
        let first = self.due.withLock { due -> Bool in
            defer { due = now + self.delay }
            return due == nil
        }
        if first { self.chores.at(now + self.delay) { self.look() } }
    }

    /// The pending trim's chore: only it clears `due`, and it leaves exactly
    /// one chore behind while a trim is pending.
    private func look() {
        guard let when = self.due.withLock({ $0 }) else { return }
        let now = self.chores.clock.now()
        if when > now {
            self.chores.at(when) { self.look() }
            return
        }
        if self.read.exchange(false, ordering: .relaxed) {
            self.due.withLock { $0 = now + self.delay }
            self.chores.at(now + self.delay) { self.look() }
            return
        }
        _ = vault_trim_heap()
        self.trims.add(1, ordering: .relaxed)
        let later = self.due.withLock { due -> Double? in
            // Work that came during the trim gets a trim of its own.
            if let later = due, later > when { return later }
            due = nil
            return nil
        }
        if let later { self.chores.at(later) { self.look() } }
    }
}
