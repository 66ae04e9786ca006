public import Logging
import NIOHTTP1
import Synchronization
public import VaultCrypto
import VaultOIDC
public import VaultProtocol

/// The sign-in flows in progress: email code and native password (MSAL
/// native authentication), the password grant, the browser (code + PKCE,
/// loopback redirect) and the device grant. Each flow lives in memory only,
/// under a random id, moves through the states of docs/protocol.md (Sign-in), tells
/// subscribers of every step, and ends by itself when it expires, taking
/// its continuation token, verifier or device code with it.
public actor SignIns {
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

    let broker: Broker
    let clock: any WallClock
    let logger: Logger
    private var flows: [String: Flow] = [:]

    struct Flow {
        let id: String
        let account: String
        let method: SignInMethod
        /// The username the flow was started with, to tell a second start
        /// of the same sign-in from another.
        var username: String?
        /// The account's sign-in when the flow started (see `Broker.completeSignIn`).
        var generation = 0
        var step: Step
        var expiresAt: Double
        /// One call to the issuer at a time per flow.
        var busy = false
        /// How browser and device flows ended, for `signin.wait`.
        var outcome: Result<SignInResult, VaultError>?
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var expiry: Task<Void, Never>?
    }

    enum Step {
        /// The first calls to the issuer are under way.
        case starting
        case code(NativeCode)
        case nativePassword(NativePassword)
        case passwordGrant(username: String, scope: String)
        case browser(listener: LoopbackListener, result: SignInResult)
        case device(task: Task<Void, Never>, result: SignInResult)
    }

    struct NativeCode {
        var endpoints: NativeAuthEndpoints
        var continuation: SecretBytes
        var scope: String
        var sentTo: String
        var channel: String
        var codeLength: Int
        var attemptsLeft: Int
    }

    struct NativePassword {
        var endpoints: NativeAuthEndpoints
        var continuation: SecretBytes
        var username: String
        var scope: String
    }

    private var nextWaiter = 0

    public init(broker: Broker, clock: any WallClock = SystemClock(), logger: Logger) {
        self.broker = broker
        self.clock = clock
        self.logger = logger
    }

    private var oidc: OIDCClient { self.broker.oidc }

    // MARK: signin.start

    public func start(_ request: SignInStart) async throws(VaultError) -> SignInResult {
        let name = request.account
        let username = request.username.map { String($0.drop(while: \.isWhitespace).reversed().drop(while: \.isWhitespace).reversed()) }
        if request.method == .emailOTP || request.method == .password {
            guard let username, !username.isEmpty, username.count <= 256 else {
                throw VaultError(.badRequest, "signing in with \(request.method.rawValue) needs a 'username' (the email address)")
            }
        }
        if request.method == .emailOTP, username?.contains("@") != true {
            throw VaultError(.badRequest, "an email code needs an email address as 'username'")
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
                throw VaultError(
                    .badRequest,
                    "a \(live.method.rawValue) sign-in of '\(name)' is in progress (flow \(live.id)); finish or cancel it, or start over with: vaultctl signin \(name) --restart"
                )
            }
        }
        guard self.flows.count < Self.maximumFlows else {
            throw VaultError(.overloaded, "too many sign-ins are in progress; finish or cancel one first")
        }
        // The flow exists before the first suspension, so a concurrent start
        // finds it, and it can be cancelled and its steps heard.
        let id = Self.flowID()
        self.register(
            Flow(
                id: id, account: name, method: request.method, username: username, step: .starting,
                expiresAt: self.clock.now() + Self.codeLifetime, busy: true
            )
        )
        let account: SignInAccount
        let metadata: ProviderMetadata
        do {
            account = try await self.broker.signInAccount(name)
            metadata = try await self.broker.metadata(for: account)
        } catch {
            throw self.fail(id, error)
        }
        guard self.flows[id] != nil else { throw Self.cancelled }
        self.flows[id]?.generation = account.generation
        let scope = account.configuration.scopes.joined(separator: " ")
        switch request.method {
        case .emailOTP, .password:
            let username = username ?? ""
            guard let endpoints = NativeAuthEndpoints(metadata: metadata) else {
                guard request.method == .password else {
                    throw self.fail(
                        id,
                        VaultError(
                            .idpError,
                            "the issuer of '\(name)' does not send sign-in codes (it has no native authentication); sign in with --browser or --device",
                            error: "unsupported"
                        )
                    )
                }
                self.advance(id, to: .passwordGrant(username: username, scope: scope), lifetime: Self.passwordLifetime)
                if let password = request.password {
                    return try await self.submitFirstPassword(id, password)
                }
                self.emit(id, .awaitingPassword)
                return self.result(id, .passwordRequired)
            }
            return try await self.startNative(
                id: id, account: account, method: request.method, username: username,
                password: request.password, endpoints: endpoints, scope: scope
            )
        case .browser:
            return try await self.startBrowser(id: id, account: account, metadata: metadata, loginHint: username)
        case .device:
            return try await self.startDevice(id: id, account: account, metadata: metadata, scope: scope)
        }
    }

    /// A second start of the sign-in in progress: its state, once it has one.
    private func join(_ id: String) async throws(VaultError) -> SignInResult {
        if case .starting = self.flows[id]?.step {
            let ticket = self.nextWaiter
            self.nextWaiter += 1
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                self.flows[id]?.waiters[ticket] = continuation
            }
        }
        guard let flow = self.flows[id], flow.outcome == nil else {
            throw VaultError(.flowNotFound, "the sign-in in progress ended before it was ready; start again")
        }
        var result: SignInResult
        switch flow.step {
        case .starting: throw Self.busy(id)
        case .code(let step): result = self.codeResult(id, step)
        case .nativePassword, .passwordGrant: result = self.result(id, .passwordRequired)
        case .browser: result = self.result(id, .openBrowser)
        case .device: result = self.result(id, .deviceCode)
        }
        result.joined = true
        return result
    }

    /// The flow leaves `.starting` (or its previous step) for `step`, with a
    /// new deadline; callers that joined it hear the new state.
    private func advance(_ id: String, to step: Step, lifetime: Double) {
        guard var flow = self.flows[id] else { return }
        flow.step = step
        flow.busy = false
        flow.expiresAt = self.clock.now() + lifetime
        let waiters = flow.waiters
        flow.waiters = [:]
        self.flows[id] = flow
        self.schedule(id, at: flow.expiresAt)
        for waiter in waiters.values { waiter.resume() }
    }

    /// Marks the flow busy with a request to the issuer, checked and set in
    /// one step: a second request meanwhile is refused and never sent.
    private func claim(_ id: String) throws(VaultError) -> Flow {
        let flow = try self.flow(id)
        guard !flow.busy else { throw Self.busy(id) }
        self.flows[id]?.busy = true
        return flow
    }

    /// Gives a claimed flow back without having called the issuer.
    private func release(_ id: String) {
        self.flows[id]?.busy = false
    }

    private func startNative(
        id: String,
        account: SignInAccount,
        method: SignInMethod,
        username: String,
        password: SecretBytes?,
        endpoints: NativeAuthEndpoints,
        scope: String
    ) async throws(VaultError) -> SignInResult {
        let name = account.configuration.name
        let types = method == .password ? ["oob", "password"] : ["oob"]
        let clientID = account.configuration.clientID
        self.emit(id, .sendingCode)
        let answer: NativeAuthAnswer
        do throws(NativeAuthError) {
            var step = try await self.oidc.nativeInitiate(
                username: username, challengeTypes: types, clientID: clientID, endpoints: endpoints
            )
            if case .continuation(let continuation) = step {
                step = try await self.oidc.nativeChallenge(
                    continuation: continuation, challengeTypes: types, clientID: clientID, endpoints: endpoints
                )
            }
            answer = step
        } catch {
            throw self.fail(id, self.nativeError(error, account: name, stage: .start))
        }
        guard self.flows[id] != nil else { throw Self.cancelled }
        switch answer {
        case .codeSent(let continuation, let sentTo, let channel, let codeLength):
            let code = NativeCode(
                endpoints: endpoints, continuation: continuation, scope: scope, sentTo: sentTo, channel: channel,
                codeLength: codeLength, attemptsLeft: Self.maximumAttempts
            )
            self.advance(id, to: .code(code), lifetime: Self.codeLifetime)
            self.emit(id, .awaitingCode)
            return self.codeResult(id, code)
        case .passwordRequired(let continuation):
            let native = NativePassword(endpoints: endpoints, continuation: continuation, username: username, scope: scope)
            self.advance(id, to: .nativePassword(native), lifetime: Self.passwordLifetime)
            if let password {
                return try await self.submitFirstPassword(id, password)
            }
            self.emit(id, .awaitingPassword)
            return self.result(id, .passwordRequired)
        case .redirect(let reason):
            return self.browserRequired(id, reason: reason)
        case .continuation, .tokens:
            throw self.fail(
                id,
                VaultError(.idpError, "the issuer of '\(name)' answered the sign-in out of turn", error: "unexpected_response")
            )
        }
    }

    // MARK: Codes

    public func submitCode(flow id: String, code: SecretBytes) async throws(VaultError) -> SignInResult {
        var flow = try self.claim(id)
        guard case .code(var step) = flow.step else {
            self.release(id)
            throw VaultError(.badRequest, "flow \(id) does not take a code")
        }
        let wellFormed = code.withUnsafeBytes { bytes in
            bytes.count == step.codeLength && bytes.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
        }
        guard wellFormed else {
            self.release(id)
            throw VaultError(
                .invalidCode,
                "the code is \(step.codeLength) digits; \(step.attemptsLeft) attempts left",
                attemptsLeft: step.attemptsLeft
            )
        }
        let clientID = try await self.clientID(id, flow)
        self.emit(id, .submitting)
        let answer: NativeAuthAnswer
        do throws(NativeAuthError) {
            answer = try await self.oidc.nativeSubmitCode(
                code, continuation: step.continuation, scope: step.scope, clientID: clientID, endpoints: step.endpoints
            )
        } catch .refused(error: "invalid_grant", suberror: "invalid_oob_value", _) {
            guard self.flows[id] != nil else { throw Self.cancelled }
            self.flows[id]?.busy = false
            step.attemptsLeft -= 1
            guard step.attemptsLeft > 0 else {
                throw self.fail(
                    id,
                    VaultError(.tooManyAttempts, "too many wrong codes; start again with: vaultctl signin \(flow.account)")
                )
            }
            self.flows[id]?.step = .code(step)
            self.emit(id, .incorrectCode)
            throw VaultError(
                .invalidCode,
                "that code is not right; \(step.attemptsLeft) attempt\(step.attemptsLeft == 1 ? "" : "s") left",
                attemptsLeft: step.attemptsLeft
            )
        } catch {
            throw self.keepOrFail(id, self.nativeError(error, account: flow.account, stage: .code))
        }
        flow = try self.flow(id)
        return try await self.finishNative(id, answer, flow: flow)
    }

    public func resendCode(flow id: String) async throws(VaultError) -> SignInResult {
        let flow = try self.claim(id)
        guard case .code(var step) = flow.step else {
            self.release(id)
            throw VaultError(.badRequest, "flow \(id) has no code to send again")
        }
        let clientID = try await self.clientID(id, flow)
        self.emit(id, .sendingCode)
        let answer: NativeAuthAnswer
        do throws(NativeAuthError) {
            answer = try await self.oidc.nativeChallenge(
                continuation: step.continuation, challengeTypes: ["oob"], clientID: clientID, endpoints: step.endpoints
            )
        } catch {
            throw self.keepOrFail(id, self.nativeError(error, account: flow.account, stage: .resend))
        }
        guard self.flows[id] != nil else { throw Self.cancelled }
        self.flows[id]?.busy = false
        switch answer {
        case .codeSent(let continuation, let sentTo, let channel, let codeLength):
            step.continuation = continuation
            step.sentTo = sentTo
            step.channel = channel
            step.codeLength = codeLength
            step.attemptsLeft = Self.maximumAttempts
            self.flows[id]?.step = .code(step)
            self.flows[id]?.expiresAt = self.clock.now() + Self.codeLifetime
            self.emit(id, .awaitingCode)
            return self.codeResult(id, step)
        case .redirect(let reason):
            return self.browserRequired(id, reason: reason)
        default:
            self.emit(id, .awaitingCode)
            throw VaultError(.idpError, "the issuer did not send a new code; try again", error: "unexpected_response")
        }
    }

    // MARK: Passwords

    public func submitPassword(flow id: String, password: SecretBytes) async throws(VaultError) -> SignInResult {
        let flow = try self.claim(id)
        guard password.count > 0 else {
            self.release(id)
            throw Self.wrongPassword
        }
        switch flow.step {
        case .nativePassword(let step):
            let clientID = try await self.clientID(id, flow)
            self.emit(id, .submitting)
            let answer: NativeAuthAnswer
            do throws(NativeAuthError) {
                answer = try await self.oidc.nativeSubmitPassword(
                    password, username: step.username, continuation: step.continuation,
                    challengeTypes: ["oob", "password"], scope: step.scope, clientID: clientID, endpoints: step.endpoints
                )
            } catch {
                throw self.keepOrFail(id, self.nativeError(error, account: flow.account, stage: .password))
            }
            return try await self.finishNative(id, answer, flow: try self.flow(id))
        case .passwordGrant(let username, let scope):
            self.emit(id, .submitting)
            let account: SignInAccount
            let metadata: ProviderMetadata
            do {
                account = try await self.broker.signInAccount(flow.account)
                metadata = try await self.broker.metadata(for: account)
            } catch {
                throw self.keepOrFail(id, error)
            }
            let response: TokenResponse
            do {
                response = try await self.oidc.passwordGrant(
                    username: username, password: password, scope: scope, client: account.client, metadata: metadata
                )
            } catch .invalidGrant, .rejected(error: "http_400", _), .rejected(error: "http_401", _),
                .rejected(error: "http_403", _), .rejected(error: "invalid_credentials", _)
            {
                throw self.keepOrFail(id, Self.wrongPassword)
            } catch {
                throw self.keepOrFail(id, VaultError(error, account: flow.account))
            }
            return try await self.complete(id, response, nonce: nil, metadata: metadata)
        default:
            self.release(id)
            throw VaultError(.badRequest, "flow \(id) does not take a password")
        }
    }

    /// A password given with `signin.start`: the caller has no flow id yet,
    /// so a refusal ends the flow instead of keeping it for another try.
    private func submitFirstPassword(_ id: String, _ password: SecretBytes) async throws(VaultError) -> SignInResult {
        do {
            return try await self.submitPassword(flow: id, password: password)
        } catch {
            self.end(id, step: nil)
            throw error
        }
    }

    // MARK: Browser

    private func startBrowser(
        id: String,
        account: SignInAccount,
        metadata: ProviderMetadata,
        loginHint: String?
    ) async throws(VaultError) -> SignInResult {
        let name = account.configuration.name
        let box = RequestBox()
        let listener: LoopbackListener
        do {
            listener = try await LoopbackListener.start(fixed: account.configuration.redirectURI) { query in
                await self.browserAnswered(id, query: query, request: box)
            }
        } catch {
            throw self.fail(id, VaultError(.internalError, "\(error)"))
        }
        let request: AuthorizationRequest
        do {
            request = try self.oidc.authorizationRequest(
                metadata: metadata,
                clientID: account.configuration.clientID,
                redirectURI: listener.redirectURI,
                scopes: account.configuration.scopes,
                loginHint: loginHint?.isEmpty == false ? loginHint : nil
            )
        } catch {
            listener.close()
            throw self.fail(id, VaultError(error, account: name))
        }
        box.set(request)
        var result = SignInResult(flow: id, state: .openBrowser, account: name, method: .browser)
        result.url = request.url
        guard self.flows[id] != nil else {
            listener.close()
            throw Self.cancelled
        }
        self.advance(id, to: .browser(listener: listener, result: result), lifetime: Self.browserLifetime)
        self.logger.info("browser sign-in started", metadata: ["account": "\(name)", "flow": "\(id)", "redirect": "\(listener.redirectURI)"])
        self.emit(id, .awaitingBrowser)
        return self.result(id, .openBrowser)
    }

    /// The browser came back to the loopback listener.
    private func browserAnswered(_ id: String, query: [String: String], request box: RequestBox) async -> LoopbackListener.Verdict {
        guard let flow = self.flows[id], flow.outcome == nil, !flow.busy, let request = box.get() else {
            return .init(status: .gone, title: "Sign-in over", message: "This sign-in has ended; start again from tokenvault.", done: true)
        }
        // RFC 6749 §10.12: an answer with another state is not ours; keep waiting for ours.
        guard query["state"] == request.state else {
            return .init(
                status: .badRequest, title: "Not this sign-in",
                message: "This answer does not belong to the sign-in in progress.", done: false
            )
        }
        self.flows[id]?.busy = true
        let outcome: Result<SignInResult, VaultError>
        if let error = query["error"] {
            let clean = String(error.unicodeScalars.filter { $0.properties.isAlphabetic || $0 == "_" }.map(Character.init).prefix(64))
            outcome = .failure(
                clean == "access_denied"
                    ? VaultError(.idpError, "sign-in was declined in the browser", error: "access_denied")
                    : VaultError(.idpError, "the issuer of '\(flow.account)' refused the sign-in: \(clean)", error: clean)
            )
        } else if let code = query["code"], !code.isEmpty {
            outcome = await self.redeem(id, code: code, request: request, account: flow.account)
        } else {
            outcome = .failure(VaultError(.idpError, "the browser came back without a code", error: "invalid_request"))
        }
        self.settle(id, outcome)
        switch outcome {
        case .success(let result):
            let who = result.username.map { " as \($0)" } ?? ""
            return .init(status: .ok, title: "Signed in", message: "tokenvault signed '\(result.account)' in\(who). You can close this tab.", done: true)
        case .failure(let error):
            return .init(status: .ok, title: "Sign-in failed", message: error.message, done: true)
        }
    }

    private func redeem(_ id: String, code: String, request: AuthorizationRequest, account name: String) async -> Result<SignInResult, VaultError> {
        let generation = self.flows[id]?.generation ?? -1
        do throws(VaultError) {
            let account = try await self.broker.signInAccount(name)
            let metadata = try await self.broker.metadata(for: account)
            let response: TokenResponse
            do {
                response = try await self.oidc.exchangeCode(code, for: request, client: account.client, metadata: metadata)
            } catch {
                throw VaultError(error, account: name)
            }
            let username = try await self.broker.completeSignIn(
                name, generation: generation, response: response, nonce: request.nonce, metadata: metadata
            )
            var result = SignInResult(flow: id, state: .signedIn, account: name, method: .browser)
            result.username = username
            return .success(result)
        } catch {
            return .failure(error)
        }
    }

    // MARK: Device

    private func startDevice(
        id: String,
        account: SignInAccount,
        metadata: ProviderMetadata,
        scope: String
    ) async throws(VaultError) -> SignInResult {
        let name = account.configuration.name
        let device: DeviceAuthorization
        do {
            device = try await self.oidc.deviceAuthorization(scope: scope, client: account.client, metadata: metadata)
        } catch {
            throw self.fail(id, VaultError(error, account: name))
        }
        guard self.flows[id] != nil else { throw Self.cancelled }
        var result = SignInResult(flow: id, state: .deviceCode, account: name, method: .device)
        result.verificationURI = device.verificationURI
        result.verificationURIComplete = device.verificationURIComplete
        result.userCode = device.userCode
        result.interval = device.interval
        let task = Task { await self.poll(id, device: device, account: name) }
        self.advance(id, to: .device(task: task, result: result), lifetime: Double(device.expiresIn))
        self.emit(id, .awaitingDevice)
        return self.result(id, .deviceCode)
    }

    /// Polls the token endpoint as RFC 8628 §3.5 asks, until the user
    /// approves, declines, or the code expires.
    private func poll(_ id: String, device: DeviceAuthorization, account name: String) async {
        let generation = self.flows[id]?.generation ?? -1
        var polling = DevicePolling(interval: device.interval)
        while true {
            do {
                try await Task.sleep(for: .seconds(polling.interval))
            } catch {
                return
            }
            guard let flow = self.flows[id], flow.outcome == nil else { return }
            let outcome: Result<SignInResult, VaultError>
            do throws(VaultError) {
                let account = try await self.broker.signInAccount(name)
                let metadata = try await self.broker.metadata(for: account)
                let response: TokenResponse
                do {
                    response = try await self.oidc.pollDevice(device, client: account.client, metadata: metadata)
                } catch {
                    guard let failure = polling.next(after: error, account: name) else { continue }
                    throw failure
                }
                let username = try await self.broker.completeSignIn(
                    name, generation: generation, response: response, nonce: nil, metadata: metadata
                )
                var result = SignInResult(flow: id, state: .signedIn, account: name, method: .device)
                result.username = username
                outcome = .success(result)
            } catch {
                outcome = .failure(error)
            }
            self.settle(id, outcome)
            return
        }
    }

    // MARK: signin.wait and signin.cancel

    /// The flow's next state: at once for code and password flows; for
    /// browser and device flows when they end, or their current state once
    /// `timeoutMs` (default: until the flow expires) has passed.
    public func wait(flow id: String, timeoutMs: Int?) async throws(VaultError) -> SignInResult {
        let flow = try self.flow(id)
        if let outcome = flow.outcome { return try self.deliver(id, outcome) }
        switch flow.step {
        case .code(let step): return self.codeResult(id, step)
        case .nativePassword, .passwordGrant: return self.result(id, .passwordRequired)
        case .starting: throw Self.busy(id)
        case .browser, .device: break
        }
        let seconds = timeoutMs.map { Double($0) / 1000 } ?? max(0, flow.expiresAt - self.clock.now())
        let ticket = self.nextWaiter
        self.nextWaiter += 1
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            self.flows[id]?.waiters[ticket] = continuation
            Task {
                try? await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
                self.wake(id, ticket)
            }
        }
        guard let now = self.flows[id] else {
            throw VaultError(.flowNotFound, "sign-in \(id) ended while waiting; start again")
        }
        if let outcome = now.outcome { return try self.deliver(id, outcome) }
        return self.result(id, now.method == .browser ? .openBrowser : .deviceCode)
    }

    public func cancel(flow id: String) throws(VaultError) -> EmptyResult {
        _ = try self.flow(id)
        self.end(id, step: .cancelled)
        self.logger.info("sign-in cancelled", metadata: ["flow": "\(id)"])
        return EmptyResult()
    }

    /// Ends every flow of an account (it was removed or signed out), or of every account.
    public func cancelAll(account: String? = nil) {
        for flow in self.flows.values where account == nil || flow.account == account {
            self.end(flow.id, step: .cancelled)
        }
    }

    /// Flows in progress; tests wait on this instead of on time.
    public var count: Int { self.flows.count }

    // MARK: Endings

    private func finishNative(_ id: String, _ answer: NativeAuthAnswer, flow: Flow) async throws(VaultError) -> SignInResult {
        switch answer {
        case .tokens(let response):
            let account = try await self.broker.signInAccount(flow.account)
            let metadata = try await self.broker.metadata(for: account)
            return try await self.complete(id, response, nonce: nil, metadata: metadata)
        case .redirect(let reason):
            return self.browserRequired(id, reason: reason)
        default:
            throw self.fail(
                id,
                VaultError(.idpError, "the issuer of '\(flow.account)' answered the sign-in out of turn", error: "unexpected_response")
            )
        }
    }

    private func complete(_ id: String, _ response: TokenResponse, nonce: String?, metadata: ProviderMetadata) async throws(VaultError) -> SignInResult {
        let flow = try self.flow(id)
        let username: String?
        do {
            username = try await self.broker.completeSignIn(
                flow.account, generation: flow.generation, response: response, nonce: nonce, metadata: metadata
            )
        } catch {
            throw self.fail(id, error)
        }
        var result = SignInResult(flow: id, state: .signedIn, account: flow.account, method: flow.method)
        result.username = username
        self.end(id, step: .done)
        return result
    }

    private func browserRequired(_ id: String, reason: String?) -> SignInResult {
        var result = self.result(id, .browserRequired)
        result.reason = reason
        self.end(id, step: .browserRequired)
        return result
    }

    /// A browser or device flow ended: remember how, wake its waiters.
    private func settle(_ id: String, _ outcome: Result<SignInResult, VaultError>) {
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
        for waiter in waiters.values { waiter.resume() }
    }

    private func deliver(_ id: String, _ outcome: Result<SignInResult, VaultError>) throws(VaultError) -> SignInResult {
        self.end(id, step: nil)
        return try outcome.get()
    }

    /// Ends the flow now and reports `error`.
    private func fail(_ id: String, _ error: VaultError) -> VaultError {
        if self.flows[id] != nil {
            self.emit(id, .error, code: error.code)
            self.end(id, step: nil)
        }
        return error
    }

    /// An error the flow survives (the issuer was unreachable, a wrong
    /// password) keeps it; any other ends it.
    private func keepOrFail(_ id: String, _ error: VaultError) -> VaultError {
        guard [.idpUnavailable, .invalidCredentials].contains(error.code) else { return self.fail(id, error) }
        guard var flow = self.flows[id] else { return error }
        flow.busy = false
        self.flows[id] = flow
        switch flow.step {
        case .code: self.emit(id, .awaitingCode)
        default: self.emit(id, .awaitingPassword)
        }
        return error
    }

    /// Forgets the flow and every secret it held; tells subscribers `step`.
    private func end(_ id: String, step: SignInStep?) {
        guard let flow = self.flows.removeValue(forKey: id) else { return }
        flow.expiry?.cancel()
        switch flow.step {
        case .browser(let listener, _): listener.close()
        case .device(let task, _): task.cancel()
        default: break
        }
        for waiter in flow.waiters.values { waiter.resume() }
        if let step { self.emit(flow, step) }
    }

    private func register(_ flow: Flow) {
        self.flows[flow.id] = flow
        self.schedule(flow.id, at: flow.expiresAt)
    }


    /// Ends the flow at `deadline` unless something ends it first.
    private func schedule(_ id: String, at deadline: Double) {
        self.flows[id]?.expiry?.cancel()
        let delay = max(0, deadline - self.clock.now())
        self.flows[id]?.expiry = Task {
            do {
                try await Task.sleep(for: .milliseconds(Int(delay * 1000)))
            } catch {
                return
            }
            self.expire(id)
        }
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
            self.settle(id, .failure(Self.expired(flow)))
        default:
            self.emit(id, .error, code: .codeExpired)
            self.end(id, step: nil)
        }
    }

    private func wake(_ id: String, _ ticket: Int) {
        self.flows[id]?.waiters.removeValue(forKey: ticket)?.resume()
    }

    // MARK: Helpers

    /// The flow's client id; a flow whose account went away ends.
    private func clientID(_ id: String, _ flow: Flow) async throws(VaultError) -> String {
        do {
            return try await self.broker.signInAccount(flow.account).configuration.clientID
        } catch {
            throw self.fail(id, error)
        }
    }

    private func flow(_ id: String) throws(VaultError) -> Flow {
        guard let flow = self.flows[id] else {
            throw VaultError(.flowNotFound, "there is no sign-in \(id); it ended or expired; start again with: vaultctl signin")
        }
        if flow.outcome == nil, flow.expiresAt <= self.clock.now() {
            self.expire(id)
            throw Self.expired(flow)
        }
        return flow
    }

    private func result(_ id: String, _ state: SignInState) -> SignInResult {
        guard let flow = self.flows[id] else {
            return SignInResult(flow: id, state: state, account: "", method: .password)
        }
        var result: SignInResult
        switch flow.step {
        case .browser(_, let stored), .device(_, let stored): result = stored
        default: result = SignInResult(flow: id, state: state, account: flow.account, method: flow.method)
        }
        result.state = state
        result.expiresIn = max(0, Int((flow.expiresAt - self.clock.now()).rounded(.down)))
        return result
    }

    private func codeResult(_ id: String, _ step: NativeCode) -> SignInResult {
        var result = self.result(id, .codeRequired)
        result.sentTo = step.sentTo
        result.channel = step.channel
        result.codeLength = step.codeLength
        result.attemptsLeft = step.attemptsLeft
        return result
    }

    private func emit(_ id: String, _ step: SignInStep, code: ErrorCode? = nil) {
        guard let flow = self.flows[id] else { return }
        self.emit(flow, step, code: code)
    }

    private func emit(_ flow: Flow, _ step: SignInStep, code: ErrorCode? = nil) {
        var event = Event(.signin, account: flow.account)
        event.flow = flow.id
        event.method = flow.method
        event.step = step
        event.code = code
        self.broker.events.emit(event)
    }

    enum NativeStage { case start, code, resend, password }

    /// The one place native-authentication errors become wire errors (docs/protocol.md: Sign-in, Error codes).
    private func nativeError(_ error: NativeAuthError, account name: String, stage: NativeStage) -> VaultError {
        switch error {
        case .provider(let provider):
            if case .rejected(error: "unsupported", _) = provider {
                return VaultError(
                    .idpError,
                    "the issuer of '\(name)' does not offer native sign-in; sign in with --browser or --device",
                    error: "unsupported"
                )
            }
            return VaultError(provider, account: name)
        case .refused(let error, let suberror, let code):
            switch (error, suberror, code) {
            case ("user_not_found", _, _), ("invalid_grant", nil, 50034):
                return VaultError(.userNotFound, "the issuer of '\(name)' knows no such user; check the address")
            case ("expired_token", _, _), ("invalid_request", _, 55000), ("invalid_request", _, 55200):
                return VaultError(.codeExpired, "this sign-in expired; start again with: vaultctl signin \(name)")
            case ("invalid_grant", nil, 50126) where stage == .password:
                return Self.wrongPassword
            case ("invalid_grant", "mfa_required", _), ("invalid_grant", "registration_required", _):
                return VaultError(
                    .idpError,
                    "the issuer of '\(name)' asks for more than a code here; sign in with: vaultctl signin \(name) --browser",
                    error: "browser_required"
                )
            case ("invalid_grant", nil, _) where stage == .code:
                return VaultError(.tooManyAttempts, "the issuer will take no more codes for this sign-in; start again with: vaultctl signin \(name)")
            case ("invalid_client", _, _), ("unauthorized_client", _, _), ("unsupported_challenge_type", _, _),
                ("invalid_scope", _, _):
                return VaultError(
                    .idpError,
                    "the issuer of '\(name)' refused this client (\(error)); check the account's client_id and scopes",
                    error: error
                )
            default:
                return VaultError(.idpError, "the issuer of '\(name)' refused the sign-in: \(error)", error: error, errorDescription: suberror)
            }
        }
    }

    private static func flowID() -> String {
        let bytes = (try? randomBytes(8)) ?? (0..<8).map { _ in UInt8.random(in: 0...255) }
        return "f-" + bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
    }

    static let wrongPassword = VaultError(.invalidCredentials, "the issuer refused that username and password; try again")
    static let cancelled = VaultError(.flowNotFound, "this sign-in was cancelled")

    static func busy(_ id: String) -> VaultError {
        VaultError(.badRequest, "a request for sign-in \(id) is in progress; send the next step after its answer")
    }

    static func expired(_ flow: Flow) -> VaultError {
        VaultError(.codeExpired, "the sign-in took too long and expired; start again with: vaultctl signin \(flow.account)")
    }
}

/// RFC 8628 §3.5 polling: wait `interval`, 5 s more after each `slow_down`,
/// twice as long after the issuer could not be reached; never over a minute,
/// however often the issuer says so.
struct DevicePolling: Sendable {
    var interval: Int

    /// The wire error that ends the flow, or nil to poll again.
    mutating func next(after error: ProviderError, account name: String) -> VaultError? {
        switch error {
        case .rejected(error: "authorization_pending", _):
            return nil
        case .rejected(error: "slow_down", _):
            self.interval = min(self.interval + 5, 60)
            return nil
        case .unavailable:
            self.interval = min(self.interval * 2, 60)
            return nil
        case .rejected(error: "access_denied", _), .rejected(error: "authorization_declined", _):
            return VaultError(.idpError, "sign-in was declined on the other device", error: "access_denied")
        case .rejected(error: "expired_token", _):
            return VaultError(.codeExpired, "the device code expired; start again with: vaultctl signin \(name) --device")
        default:
            return VaultError(error, account: name)
        }
    }
}

/// The authorization request, handed to the listener's handler once built.
private final class RequestBox: Sendable {
    private let request = Mutex<AuthorizationRequest?>(nil)
    func set(_ value: AuthorizationRequest) { self.request.withLock { $0 = value } }
    func get() -> AuthorizationRequest? { self.request.withLock { $0 } }
}
