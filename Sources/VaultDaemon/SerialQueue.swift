import Synchronization

/// Runs work one piece after another, in the order it was enqueued.
///
/// `enqueue` is synchronous, so an actor that enqueues A and then B in its
/// own order gets A done before B starts, whatever threads the work later
/// runs on. The broker writes secrets and `accounts.json` through these:
/// a save and a sign-out's remove take effect in the order they were asked.
final class SerialQueue: Sendable {
    private let tail = Mutex<Task<Void, Never>?>(nil)

    init() {}

    func enqueue<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> Task<T, Never> {
        self.tail.withLock { tail in
            let previous = tail
            let task = Task {
                await previous?.value
                return await body()
            }
            tail = Task { _ = await task.value }
            return task
        }
    }
}
