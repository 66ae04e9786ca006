import VaultOIDC
import VaultProtocol

/// The device driver (RFC 8628): the device authorization at start, then
/// one poll at a time, each a chore on the vault's clock, until the user
/// approves, declines, or the code expires.
extension SignIns {
    func startDevice(_ id: String, _ context: SignInContext) async throws(VaultError) -> SignInResult {
        let name = context.name
        let device: DeviceAuthorization
        do {
            device = try await self.oidc.deviceAuthorization(scope: context.scope, client: context.client, metadata: context.metadata)
        } catch {
            throw self.fail(id, SignInError.issuer(error, account: name))
        }
        guard self.flows[id] != nil else { throw SignInError.cancelled }
        var result = SignInResult(flow: id, state: .deviceCode, account: name, method: .device)
        result.verificationURI = device.verificationURI
        result.verificationURIComplete = device.verificationURIComplete
        result.userCode = device.userCode
        result.interval = device.interval
        self.advance(id, to: .device(result: result), lifetime: Double(device.expiresIn))
        self.schedulePoll(id, device: device, context: context, polling: DevicePolling(interval: device.interval))
        self.emit(id, .awaitingDevice)
        return self.result(id, .deviceCode)
    }

    /// The flow's next poll, `polling.interval` from now, as a chore.
    private func schedulePoll(_ id: String, device: DeviceAuthorization, context: SignInContext, polling: DevicePolling) {
        guard self.flows[id] != nil else { return }
        self.setPoll(id, self.chores.after(Double(polling.interval)) {
            await self.poll(id, device: device, context: context, polling: polling)
        })
    }

    /// Polls the token endpoint once, as RFC 8628 §3.5 asks, and ends the
    /// flow when the user approved or declined or the code expired; else
    /// schedules the next poll.
    private func poll(_ id: String, device: DeviceAuthorization, context: SignInContext, polling: DevicePolling) async {
        guard let flow = self.flows[id], flow.outcome == nil else { return }
        self.setPoll(id, nil)
        var polling = polling
        let outcome: Result<SignInResult, VaultError>
        do throws(VaultError) {
            let response: TokenResponse
            do {
                response = try await self.oidc.pollDevice(device, client: context.client, metadata: context.metadata)
            } catch {
                guard let failure = polling.next(after: error, account: context.name) else {
                    self.schedulePoll(id, device: device, context: context, polling: polling)
                    return
                }
                throw failure
            }
            // Cancelled or expired while the issuer answered: nothing is kept.
            guard let now = self.flows[id], now.outcome == nil else { return }
            let username = try await self.broker.completeSignIn(context, response: response, nonce: nil)
            var result = SignInResult(flow: id, state: .signedIn, account: context.name, method: .device)
            result.username = username
            outcome = .success(result)
        } catch {
            outcome = .failure(error)
        }
        self.settle(id, outcome)
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
        default:
            return SignInError.devicePoll(error, account: name)
        }
    }
}
