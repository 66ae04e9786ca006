import Logging
import NIOHTTP1
import Synchronization
import VaultOIDC
import VaultProtocol
import VaultServer

/// The browser driver (authorization code + PKCE, RFC 8252 loopback
/// redirect): a `LoopbackListener` takes the browser's answer and shows its
/// page, and the code is redeemed with the client and metadata kept on the
/// flow. The flow ends when the browser comes back, or when it expires.
extension SignIns {
    func startBrowser(_ id: String, _ context: SignInContext, loginHint: String?) async throws(VaultError) -> SignInResult {
        let name = context.name
        let box = RequestBox()
        let listener: LoopbackListener
        do {
            let chores = self.chores
            listener = try await LoopbackListener.start(fixed: context.configuration.redirectURI, run: { chores.soon($0) }) { query in
                await self.browserAnswered(id, query: query, request: box)
            }
        } catch {
            throw self.fail(id, SignInError.listener(error))
        }
        let request: AuthorizationRequest
        do {
            request = try await self.oidc.authorizationRequest(
                metadata: context.metadata,
                client: context.client,
                redirectURI: listener.redirectURI,
                scopes: context.configuration.scopes,
                loginHint: loginHint?.isEmpty == false ? loginHint : nil,
                dpopThumbprint: context.client.dpop?.thumbprint
            )
        } catch {
            listener.close()
            throw self.fail(id, SignInError.issuer(error, account: name))
        }
        box.set(request)
        var result = SignInResult(flow: id, state: .openBrowser, account: name, method: .browser)
        result.url = request.url
        guard self.flows[id] != nil else {
            listener.close()
            throw SignInError.cancelled
        }
        self.advance(id, to: .browser(listener: listener, result: result), lifetime: Self.browserLifetime)
        self.logger.info("browser sign-in started", metadata: ["account": "\(name)", "flow": "\(id)", "redirect": "\(listener.redirectURI)"])
        self.emit(id, .awaitingBrowser)
        return self.result(id, .openBrowser)
    }

    /// The browser came back to the loopback listener.
    private func browserAnswered(_ id: String, query: [String: String], request box: RequestBox) async -> LoopbackListener.Verdict {
        guard let flow = self.flows[id], flow.outcome == nil, !flow.busy, let context = flow.context, let request = box.get() else {
            return .init(status: .gone, title: "Sign-in over", message: "This sign-in has ended; start again from tokenvault.", done: true)
        }
        // RFC 6749 §10.12: an answer with another state is not ours; keep waiting for ours.
        guard query["state"] == request.state else {
            return .init(
                status: .badRequest, title: "Not this sign-in",
                message: "This answer does not belong to the sign-in in progress.", done: false
            )
        }
        self.markBusy(id)
        let outcome: Result<SignInResult, VaultError>
        if let error = query["error"] {
            outcome = .failure(SignInError.browserRefusal(error, account: flow.account))
        } else if let code = query["code"], !code.isEmpty {
            outcome = await self.redeem(id, code: code, request: request, context: context)
        } else {
            outcome = .failure(SignInError.browserWithoutCode)
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

    private func redeem(_ id: String, code: String, request: AuthorizationRequest, context: SignInContext) async -> Result<SignInResult, VaultError> {
        do throws(VaultError) {
            let response: TokenResponse
            do {
                response = try await self.oidc.exchangeCode(code, for: request, client: context.client, metadata: context.metadata)
            } catch {
                throw SignInError.issuer(error, account: context.name)
            }
            let username = try await self.broker.completeSignIn(context, response: response, nonce: request.nonce)
            var result = SignInResult(flow: id, state: .signedIn, account: context.name, method: .browser)
            result.username = username
            return .success(result)
        } catch {
            return .failure(error)
        }
    }
}

/// The authorization request, handed to the listener's handler once built.
private final class RequestBox: Sendable {
    private let request = Mutex<AuthorizationRequest?>(nil)
    func set(_ value: AuthorizationRequest) { self.request.withLock { $0 = value } }
    func get() -> AuthorizationRequest? { self.request.withLock { $0 } }
}
