import Synchronization

extension Task where Failure == Never {
    /// This task's value, or nil as soon as the task awaiting it is cancelled
    /// (its connection closed). This task runs on: others may wait on it too,
    /// as every caller of one refresh does.
    func valueUnlessCancelled() async -> Success? {
        let waiter = Waiter<Success>()
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                if waiter.install(continuation) {
                    Task<Void, Never> { waiter.resume(await self.value) }
                }
            }
        } onCancel: {
            waiter.resume(nil)
        }
    }
}

/// One continuation, resumed once: by the value or by cancellation, whichever comes first.
private final class Waiter<Value: Sendable>: Sendable {
    private enum State {
        case idle
        case waiting(CheckedContinuation<Value?, Never>)
        case cancelled
        case done
    }

    private let state = Mutex<State>(.idle)

    /// Keeps `continuation` for `resume`; false (and resumed with nil) when
    /// the waiter was cancelled before it got here.
    func install(_ continuation: CheckedContinuation<Value?, Never>) -> Bool {
        let cancelled = self.state.withLock { state -> Bool in
            guard case .idle = state else {
                state = .done
                return true
            }
            state = .waiting(continuation)
            return false
        }
        if cancelled { continuation.resume(returning: nil) }
        return !cancelled
    }

    func resume(_ value: Value?) {
        let continuation = self.state.withLock { state -> CheckedContinuation<Value?, Never>? in
            switch state {
            case .waiting(let continuation):
                state = .done
                return continuation
            case .idle:
                state = .cancelled
                return nil
            case .cancelled, .done:
                return nil
            }
        }
        continuation?.resume(returning: value)
    }
}
