import CVaultSystem
import Synchronization

/// Gives the C heap's free pages back to the system a moment after a burst
/// of refreshes or account changes. Their HTTP answers, JSON and rewritten
/// files leave holes between the allocations that stay, which glibc keeps
/// for reuse: at 1,000 accounts, each after one refresh, 1.2 MB of
/// resident memory that one `malloc_trim` returns (in about 0.1 to 0.4 ms,
/// on a background thread). Cached tokens never come here; a refresh only
/// checks a flag, and at most one trim runs per `delay`.
final class HeapTrim: Sendable {
    let delay: Duration
    private let scheduled = Mutex(false)
    private let trims = Atomic<Int>(0)

    init(delay: Duration = .seconds(1)) {
        self.delay = delay
    }

    /// Trims done so far; for tests.
    var count: Int { self.trims.load(ordering: .relaxed) }

    /// Trims once `delay` from now, unless a trim is already due.
    func soon() {
        let first = self.scheduled.withLock { scheduled -> Bool in
            defer { scheduled = true }
            return !scheduled
        }
        guard first else { return }
        Task.detached {
            try? await Task.sleep(for: self.delay)
            self.scheduled.withLock { $0 = false }
            _ = vault_trim_heap()
            self.trims.add(1, ordering: .relaxed)
        }
    }
}
