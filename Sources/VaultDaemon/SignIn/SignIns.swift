import Logging
import VaultCrypto
import VaultOIDC
package import VaultProtocol
import VaultServer

/// The sign-in flows in progress, and everything that happens to a flow
/// whatever its method: the registry, one interactive sign-in per account
/// (join, restart), one issuer call at a time (claim, release), expiry,
/// `signin.wait`'s waiters and the sign-in events. The methods are drivers
/// beside this file: `NativeSignIn` (email code and native password),
/// `PasswordGrantSignIn`, `BrowserSignIn` and `DeviceSignIn`; a flow's
/// fields, results and events are in `SignInFlow.swift`.
///
/// Each flow lives in memory only, under a random id, moves through the
/// states of docs/protocol.md (Sign-in), and ends by itself when it expires,
/// taking its continuation token, verifier or device code with it. What a
/// flow needs of its account is asked of the broker once, at start
/// (`SignInBroker.signInContext`), and kept on the flow; a flow that gets
/// tokens hands them to `SignInBroker.completeSignIn`. Those are the only
/// two calls into the broker.
package actor SignIns {
    /// How long a code flow lasts after the last code was sent.
    static let codeLifetime: Double = 600
    /// How long the browser may take.
    static let browserLifetime: Double = 300
    /// How long a password flow waits for its password.
    static let passwordLifetime: Double = 600
    /// Wrong codes allowed per code sent (Privy's five; Entra's is undocumented).
    static let maximumAttempts = 5
    /// Flows at once, across all accounts.
    static let maximumFlows = 64

    let broker: any SignInBroker
    let oidc: OIDCClient
    let events: any EventSink
    let clock: any WallClock
    /// Expiries, `signin.wait` timeouts and device polls run here.
    let chores: Chores
    let logger: Logger
    /// Written only in this file; the drivers read it and change a flow
    /// through the functions below.
    private(set) var flows: [String: Flow] = [:]
    private var nextWaiter = 0

    init(broker: any SignInBroker, oidc: OIDCClient, events: any EventSink, chores: Chores, logger: Logger) {
        self.broker = broker
        self.oidc = oidc
        self.events = events
        self.clock = chores.clock
        self.chores = chores
        self.logger = logger
    }

    // MARK: signin.start

    package func start(_ request: SignInStart) async throws(VaultError) -> SignInResult {
        let name = request.account
        let username = request.username.map { String($0.drop(while: \.isWhitespace).reversed().drop(while: \.isWhitespace).reversed()) }
        if request.method == .emailOTP || request.method == .password {
            guard let username, !username.isEmpty, username.count <= 256 else { throw SignInError.needsUsername(request.method) }
        }
        if request.method == .emailOTP, username?.contains("@") != true {
            throw SignInError.needsEmailAddress
        }
        // One interactive sign-in per account: the same one again joins it
        // (many companions meeting reauth_required at once send one code),
        // another is refused unless it asks to restart.
        if let live = self.flows.values.first(where: { $0.account == name && $0.outcome == nil }) {
            if request.restart {
                self.end(live.id, step: .cancelled)
            } else if live.method == request.method && (live.username ?? "") == (username ?? "") && request.password == nil {
                return try await self.join(live.id)
            } else {
                throw SignInError.inProgress(live.method, account: name, flow: live.id)
            }
        }
        guard self.flows.count < Self.maximumFlows else { throw SignInError.tooManyFlows }
        // The flow exists before the first suspension, so a concurrent start
        // finds it, and it can be cancelled and its steps heard.
        let id = Self.flowID()
        self.register(
            Flow(
                id: id, account: name, method: request.method, username: username, step: .starting,
                expiresAt: self.clock.now() + Self.codeLifetime, busy: true
            )
        )
        let context: SignInContext
        do {
            context = try await self.broker.signInContext(name)
        } catch {
            throw self.fail(id, error)
        }
        guard self.flows[id] != nil else { throw SignInError.cancelled }
        self.flows[id]?.context = context
        switch request.method {
        case .emailOTP, .password:
            return try await self.startNative(id, context, method: request.method, username: username ?? "", password: request.password)
        case .browser:
            return try await self.startBrowser(id, context, loginHint: username)
        case .device:
            return try await self.startDevice(id, context)
        }
    }

    /// A second start of the sign-in in progress: its state, once it has one.
    private func join(_ id: String) async throws(VaultError) -> SignInResult {
        if case .starting = self.flows[id]?.step {
            await self.park(id, timeout: nil)
        }
        guard let flow = self.flows[id], flow.outcome == nil else { throw SignInError.endedBeforeReady }
        var result: SignInResult
        switch flow.step {
        case .starting: throw SignInError.busy(id)
        case .code(let step): result = self.codeResult(id, step)
        case .nativePassword, .passwordGrant: result = self.result(id, .passwordRequired)
        case .browser: result = self.result(id, .openBrowser)
        case .device: result = self.result(id, .deviceCode)
        }
        result.joined = true
        return result
    }

    // MARK: signin.wait and signin.cancel

    /// The flow's next state: at once for code and password flows; for
    /// browser and device flows when they end, or their current state once
    /// `timeoutMs` (default: until the flow expires) has passed.
    package func wait(flow id: String, timeoutMs: Int?) async throws(VaultError) -> SignInResult {
        let flow = try self.flow(id)
        if let outcome = flow.outcome { return try self.deliver(id, outcome) }
        switch flow.step {
        case .code(let step): return self.codeResult(id, step)
        case .nativePassword, .passwordGrant: return self.result(id, .passwordRequired)
        case .starting: throw SignInError.busy(id)
        case .browser, .device: break
        }
        let seconds = timeoutMs.map { Double($0) / 1000 } ?? max(0, flow.expiresAt - self.clock.now())
        await self.park(id, timeout: seconds)
        guard let now = self.flows[id] else { throw SignInError.endedWhileWaiting(id) }
        if let outcome = now.outcome { return try self.deliver(id, outcome) }
        return self.result(id, now.method == .browser ? .openBrowser : .deviceCode)
    }

    package func cancel(flow id: String) throws(VaultError) -> EmptyResult {
        _ = try self.flow(id)
        self.end(id, step: .cancelled)
        self.logger.info("sign-in cancelled", metadata: ["flow": "\(id)"])
        return EmptyResult()
    }

    /// Ends every flow of an account, or of every account; the broker calls
    /// it when an account is signed out or removed (`Broker.endSignIns`).
    package func endFlows(account: String?) {
        for flow in self.flows.values where account == nil || flow.account == account {
            self.end(flow.id, step: .cancelled)
        }
    }

    /// Flows in progress; tests wait on this instead of on time.
    package var count: Int { self.flows.count }

    // MARK: Moving a flow on

    /// The flow leaves `.starting` (or its previous step) for `step`, with a
    /// new deadline; callers that joined it hear the new state.
    func advance(_ id: String, to step: Step, lifetime: Double) {
        guard var flow = self.flows[id] else { return }
        flow.step = step
        flow.busy = false
        flow.expiresAt = self.clock.now() + lifetime
        let waiters = flow.waiters
        flow.waiters = [:]
        self.flows[id] = flow
        self.schedule(id, at: flow.expiresAt)
        self.answer(waiters)
    }

    /// The flow's step changes in place; `expiresAt`, when given, moves its
    /// deadline: the one callers are told of, and the timer that ends it.
    func update(_ id: String, to step: Step, expiresAt: Double? = nil) {
        guard self.flows[id] != nil else { return }
        self.flows[id]?.step = step
        if let expiresAt {
            self.flows[id]?.expiresAt = expiresAt
            self.schedule(id, at: expiresAt)
        }
    }

    /// A device flow's next poll, cancelled when the flow ends.
    func setPoll(_ id: String, _ ticket: Chores.Ticket?) {
        guard self.flows[id] != nil else { return self.chores.cancel(ticket) }
        self.flows[id]?.poll = ticket
    }

    /// When the flow's timer will end it, by the vault's clock; for tests.
    package func expiryDeadline(of id: String) -> Double? {
        self.flows[id]?.expiryDeadline
    }

    /// Marks the flow busy with a request to the issuer, checked and set in
    /// one step: a second request meanwhile is refused and never sent.
    func claim(_ id: String) throws(VaultError) -> Flow {
        let flow = try self.flow(id)
        guard !flow.busy else { throw SignInError.busy(id) }
        self.flows[id]?.busy = true
        return flow
    }

    /// Marks busy a flow the caller found idle in this same actor turn.
    func markBusy(_ id: String) {
        self.flows[id]?.busy = true
    }

    /// Gives a claimed flow back (without having called the issuer, or after
    /// an answer that keeps it).
    func release(_ id: String) {
        self.flows[id]?.busy = false
    }

    // MARK: Endings

    /// Hands the tokens to the broker, which validates and keeps them; the
    /// flow ends signed in, or with the broker's refusal.
    func complete(_ id: String, _ response: TokenResponse, nonce: String?) async throws(VaultError) -> SignInResult {
        let flow = try self.flow(id)
        guard let context = flow.context else { throw SignInError.busy(id) }
        let username: String?
        do {
            username = try await self.broker.completeSignIn(context, response: response, nonce: nonce)
        } catch {
            throw self.fail(id, error)
        }
        var result = SignInResult(flow: id, state: .signedIn, account: flow.account, method: flow.method)
        result.username = username
        self.end(id, step: .done)
        return result
    }

    /// The issuer wants a browser: the flow ends, and says so.
    func browserRequired(_ id: String, reason: String?) -> SignInResult {
        var result = self.result(id, .browserRequired)
        result.reason = reason
        self.end(id, step: .browserRequired)
        return result
    }

    /// A browser or device flow ended: remember how, wake its waiters.
    func settle(_ id: String, _ outcome: Result<SignInResult, VaultError>) {
        guard var flow = self.flows[id] else { return }
        flow.busy = false
        flow.outcome = outcome
        if case .browser(let listener, _) = flow.step { listener.close() }
        let waiters = flow.waiters
        flow.waiters = [:]
        // Kept a minute so a late `signin.wait` still hears the outcome.
        flow.expiresAt = self.clock.now() + 60
        self.flows[id] = flow
        self.schedule(id, at: flow.expiresAt)
        switch outcome {
        case .success: self.emit(id, .done)
        case .failure(let error): self.emit(id, .error, code: error.code)
        }
        self.answer(waiters)
    }

    private func deliver(_ id: String, _ outcome: Result<SignInResult, VaultError>) throws(VaultError) -> SignInResult {
        self.end(id, step: nil)
        return try outcome.get()
    }

    /// Ends the flow now and reports `error`.
    func fail(_ id: String, _ error: VaultError) -> VaultError {
        if self.flows[id] != nil {
            self.emit(id, .error, code: error.code)
            self.end(id, step: nil)
        }
        return error
    }

    /// An error the flow survives (the issuer was unreachable, a wrong
    /// password) keeps it; any other ends it.
    func keepOrFail(_ id: String, _ error: VaultError) -> VaultError {
        guard [.idpUnavailable, .invalidCredentials].contains(error.code) else { return self.fail(id, error) }
        guard let flow = self.flows[id] else { return error }
        self.release(id)
        switch flow.step {
        case .code: self.emit(id, .awaitingCode)
        default: self.emit(id, .awaitingPassword)
        }
        return error
    }

    /// Forgets the flow and every secret it held; tells subscribers `step`.
    func end(_ id: String, step: SignInStep?) {
        guard let flow = self.flows.removeValue(forKey: id) else { return }
        self.chores.cancel(flow.expiry)
        self.chores.cancel(flow.poll)
        if case .browser(let listener, _) = flow.step { listener.close() }
        self.answer(flow.waiters)
        if let step { self.emit(flow, step) }
    }

    // MARK: Expiry

    private func register(_ flow: Flow) {
        self.flows[flow.id] = flow
        self.schedule(flow.id, at: flow.expiresAt)
    }

    /// Ends the flow at `deadline` unless something ends it first. This
    /// chore is how a flow expires; a flow read after its deadline, before
    /// the chore has run, is expired by the same `expire` then.
    private func schedule(_ id: String, at deadline: Double) {
        guard self.flows[id] != nil else { return }
        self.chores.cancel(self.flows[id]?.expiry)
        self.flows[id]?.expiryDeadline = deadline
        self.flows[id]?.expiry = self.chores.at(deadline) { await self.expire(id, at: deadline) }
    }

    /// The expiry chore for `deadline`: it does nothing when the flow has
    /// ended or its deadline moved since.
    private func expire(_ id: String, at deadline: Double) {
        guard self.flows[id]?.expiryDeadline == deadline else { return }
        self.expire(id)
    }

    private func expire(_ id: String) {
        guard let flow = self.flows[id] else { return }
        guard flow.outcome == nil else {
            self.end(id, step: nil)
            return
        }
        self.logger.info("sign-in expired", metadata: ["flow": "\(id)", "account": "\(flow.account)"])
        switch flow.step {
        case .browser, .device:
            self.settle(id, .failure(SignInError.expired(account: flow.account)))
        default:
            self.emit(id, .error, code: .codeExpired)
            self.end(id, step: nil)
        }
    }

    // MARK: Waiters

    /// Waits until the flow's state changes or it ends, or `timeout`
    /// seconds (nil: no limit) have passed. The waiter's one timer is
    /// cancelled as soon as it is answered otherwise.
    private func park(_ id: String, timeout seconds: Double?) async {
        let ticket = self.nextWaiter
        self.nextWaiter += 1
        let once = ResumeOnce()
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                guard self.flows[id] != nil, !Task.isCancelled else {
                    continuation.resume()
                    return
                }
                let timer = seconds.map { self.timer(waking: id, ticket, after: $0) }
                self.flows[id]?.waiters[ticket] = Waiter(resume: once, timer: timer)
                once.set(continuation)
            }
        } onCancel: {
            // The caller went away (its connection closed): answered here, on
            // whatever thread cancels, whether or not the chores still run;
            // the waiter's entry and timer go with the next chore.
            once.resume()
            self.chores.soon { await self.wake(id, ticket) }
        }
    }

    /// Wakes one waiter, before its time or at it, and stops its timer.
    private func wake(_ id: String, _ ticket: Int) {
        guard let waiter = self.flows[id]?.waiters.removeValue(forKey: ticket) else { return }
        self.chores.cancel(waiter.timer)
        waiter.resume.resume()
    }

    private func timer(waking id: String, _ ticket: Int, after seconds: Double) -> Chores.Ticket {
        self.chores.after(seconds) { await self.wake(id, ticket) }
    }

    /// `signin.wait` timers set (one per waiting call at most); for tests.
    package var waitTimers: Int {
        self.flows.values.reduce(0) { $0 + $1.waiters.values.count { $0.timer != nil } }
    }

    /// Wakes every waiter in `waiters` and stops their timers.
    private func answer(_ waiters: [Int: Waiter]) {
        for waiter in waiters.values {
            self.chores.cancel(waiter.timer)
            waiter.resume.resume()
        }
    }

    // MARK: Reading a flow

    func flow(_ id: String) throws(VaultError) -> Flow {
        guard let flow = self.flows[id] else { throw SignInError.noSuchFlow(id) }
        if flow.outcome == nil, flow.expiresAt <= self.clock.now() {
            self.expire(id)
            throw SignInError.expired(account: flow.account)
        }
        return flow
    }
}
