import Synchronization
import VaultCrypto
import VaultProtocol
import VaultServer

/// A flow as the registry keeps it, and what is read off it: its result
/// for the wire and its events for subscribers.
extension SignIns {
    struct Flow {
        let id: String
        let account: String
        let method: SignInMethod
        /// The username the flow was started with, to tell a second start
        /// of the same sign-in from another.
        var username: String?
        /// What the flow needs of its account, from the broker at start
        /// (nil while that call is under way).
        var context: SignInContext?
        var step: Step
        var expiresAt: Double
        /// One call to the issuer at a time per flow.
        var busy = false
        /// How browser and device flows ended, for `signin.wait`.
        var outcome: Result<SignInResult, VaultError>?
        var waiters: [Int: Waiter] = [:]
        /// The chore that ends the flow, and the deadline it was set for.
        var expiry: Chores.Ticket?
        var expiryDeadline: Double?
        /// A device flow's next poll.
        var poll: Chores.Ticket?
    }

    enum Step {
        /// The first calls to the issuer are under way.
        case starting
        case code(NativeCode)
        case nativePassword(NativePassword)
        case passwordGrant(username: String)
        case browser(listener: LoopbackListener, result: SignInResult)
        case device(result: SignInResult)
    }

    /// A caller waiting for the flow's next state, and the one chore that
    /// answers it when it waited long enough (nil: until the state changes).
    struct Waiter {
        var resume: ResumeOnce
        var timer: Chores.Ticket?
    }

    /// A waiter's continuation, resumed once by whichever comes first: its
    /// answer, its timer, or its caller's cancellation (which cannot wait
    /// for the actor).
    final class ResumeOnce: Sendable {
        private let state = Mutex<(continuation: CheckedContinuation<Void, Never>?, done: Bool)>((nil, false))

        /// Holds `continuation` until `resume`; resumes it at once if that came first.
        func set(_ continuation: CheckedContinuation<Void, Never>) {
            let already = self.state.withLock { state -> Bool in
                if state.done { return true }
                state.continuation = continuation
                return false
            }
            if already { continuation.resume() }
        }

        func resume() {
            self.state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.done = true
                return state.continuation.take()
            }?.resume()
        }
    }

    // MARK: Results

    func result(_ id: String, _ state: SignInState) -> SignInResult {
        guard let flow = self.flows[id] else {
            return SignInResult(flow: id, state: state, account: "", method: .password)
        }
        var result: SignInResult
        switch flow.step {
        case .browser(_, let stored), .device(let stored): result = stored
        default: result = SignInResult(flow: id, state: state, account: flow.account, method: flow.method)
        }
        result.state = state
        result.expiresIn = max(0, Int((flow.expiresAt - self.clock.now()).rounded(.down)))
        return result
    }

    // MARK: Events

    func emit(_ id: String, _ step: SignInStep, code: ErrorCode? = nil) {
        guard let flow = self.flows[id] else { return }
        self.emit(flow, step, code: code)
    }

    func emit(_ flow: Flow, _ step: SignInStep, code: ErrorCode? = nil) {
        var event = Event(.signin, account: flow.account)
        event.flow = flow.id
        event.method = flow.method
        event.step = step
        event.code = code
        self.events.emit(event)
    }

    static func flowID() -> String {
        randomID("f-", bytes: 8)
    }
}
