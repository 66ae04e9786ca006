package import VaultCrypto
import VaultOIDC
package import VaultProtocol

/// The email-code and native-password driver (MSAL native authentication):
/// initiate and challenge at start, then codes, new codes and the password,
/// each one call to the issuer with the endpoints and client kept on the flow.
/// An issuer without native authentication takes the password grant instead
/// (`PasswordGrantSignIn.swift`).
extension SignIns {
    struct NativeCode {
        var endpoints: NativeAuthEndpoints
        var continuation: SecretBytes
        var sentTo: String
        var channel: String
        var codeLength: Int
        var attemptsLeft: Int
    }

    struct NativePassword {
        var endpoints: NativeAuthEndpoints
        var continuation: SecretBytes
        var username: String
    }

    func startNative(
        _ id: String,
        _ context: SignInContext,
        method: SignInMethod,
        username: String,
        password: SecretBytes?
    ) async throws(VaultError) -> SignInResult {
        let name = context.name
        guard let endpoints = NativeAuthEndpoints(metadata: context.metadata) else {
            guard method == .password else { throw self.fail(id, SignInError.noCodes(account: name)) }
            return try await self.startPasswordGrant(id, username: username, password: password)
        }
        // Native authentication's token exchange carries no proof here: it cannot bind a key.
        guard context.configuration.dpop != .required else { throw self.fail(id, SignInError.nativeCannotBindKey(account: name)) }
        let types = method == .password ? ["oob", "password"] : ["oob"]
        let clientID = context.client.clientID
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
            throw self.fail(id, SignInError.native(error, account: name, stage: .start))
        }
        guard self.flows[id] != nil else { throw SignInError.cancelled }
        switch answer {
        case .codeSent(let continuation, let sentTo, let channel, let codeLength):
            let code = NativeCode(
                endpoints: endpoints, continuation: continuation, sentTo: sentTo, channel: channel,
                codeLength: codeLength, attemptsLeft: Self.maximumAttempts
            )
            self.advance(id, to: .code(code), lifetime: Self.codeLifetime)
            self.emit(id, .awaitingCode)
            return self.codeResult(id, code)
        case .passwordRequired(let continuation):
            let native = NativePassword(endpoints: endpoints, continuation: continuation, username: username)
            self.advance(id, to: .nativePassword(native), lifetime: Self.passwordLifetime)
            if let password {
                return try await self.submitFirstPassword(id, password)
            }
            self.emit(id, .awaitingPassword)
            return self.result(id, .passwordRequired)
        case .redirect(let reason):
            return self.browserRequired(id, reason: reason)
        case .continuation, .tokens:
            throw self.fail(id, SignInError.outOfTurn(account: name))
        }
    }

    // MARK: Codes

    package func submitCode(flow id: String, code: SecretBytes) async throws(VaultError) -> SignInResult {
        let flow = try self.claim(id)
        guard case .code(var step) = flow.step, let context = flow.context else {
            self.release(id)
            throw SignInError.takesNoCode(id)
        }
        let wellFormed = code.withUnsafeBytes { bytes in
            bytes.count == step.codeLength && bytes.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
        }
        guard wellFormed else {
            self.release(id)
            throw SignInError.malformedCode(length: step.codeLength, attemptsLeft: step.attemptsLeft)
        }
        self.emit(id, .submitting)
        let answer: NativeAuthAnswer
        do throws(NativeAuthError) {
            answer = try await self.oidc.nativeSubmitCode(
                code, continuation: step.continuation, scope: context.scope, clientID: context.client.clientID,
                endpoints: step.endpoints
            )
        } catch .refused(error: "invalid_grant", suberror: "invalid_oob_value", _) {
            guard self.flows[id] != nil else { throw SignInError.cancelled }
            self.release(id)
            step.attemptsLeft -= 1
            guard step.attemptsLeft > 0 else { throw self.fail(id, SignInError.tooManyWrongCodes(account: flow.account)) }
            self.update(id, to: .code(step))
            self.emit(id, .incorrectCode)
            throw SignInError.wrongCode(attemptsLeft: step.attemptsLeft)
        } catch {
            throw self.keepOrFail(id, SignInError.native(error, account: flow.account, stage: .code))
        }
        return try await self.finishNative(id, answer, flow: try self.flow(id))
    }

    package func resendCode(flow id: String) async throws(VaultError) -> SignInResult {
        let flow = try self.claim(id)
        guard case .code(var step) = flow.step, let context = flow.context else {
            self.release(id)
            throw SignInError.noCodeToResend(id)
        }
        self.emit(id, .sendingCode)
        let answer: NativeAuthAnswer
        do throws(NativeAuthError) {
            answer = try await self.oidc.nativeChallenge(
                continuation: step.continuation, challengeTypes: ["oob"], clientID: context.client.clientID,
                endpoints: step.endpoints
            )
        } catch {
            throw self.keepOrFail(id, SignInError.native(error, account: flow.account, stage: .resend))
        }
        guard self.flows[id] != nil else { throw SignInError.cancelled }
        self.release(id)
        switch answer {
        case .codeSent(let continuation, let sentTo, let channel, let codeLength):
            step.continuation = continuation
            step.sentTo = sentTo
            step.channel = channel
            step.codeLength = codeLength
            step.attemptsLeft = Self.maximumAttempts
            self.update(id, to: .code(step), expiresAt: self.clock.now() + Self.codeLifetime)
            self.emit(id, .awaitingCode)
            return self.codeResult(id, step)
        case .redirect(let reason):
            return self.browserRequired(id, reason: reason)
        default:
            self.emit(id, .awaitingCode)
            throw SignInError.noNewCode
        }
    }

    // MARK: Passwords

    package func submitPassword(flow id: String, password: SecretBytes) async throws(VaultError) -> SignInResult {
        let flow = try self.claim(id)
        guard password.count > 0 else {
            self.release(id)
            throw SignInError.wrongPassword
        }
        switch (flow.step, flow.context) {
        case (.nativePassword(let step), let context?):
            self.emit(id, .submitting)
            let answer: NativeAuthAnswer
            do throws(NativeAuthError) {
                answer = try await self.oidc.nativeSubmitPassword(
                    password, username: step.username, continuation: step.continuation,
                    challengeTypes: ["oob", "password"], scope: context.scope, clientID: context.client.clientID,
                    endpoints: step.endpoints
                )
            } catch {
                throw self.keepOrFail(id, SignInError.native(error, account: flow.account, stage: .password))
            }
            return try await self.finishNative(id, answer, flow: try self.flow(id))
        case (.passwordGrant(let username), let context?):
            return try await self.submitGrantPassword(id, context, username: username, password: password)
        default:
            self.release(id)
            throw SignInError.takesNoPassword(id)
        }
    }

    /// A password given with `signin.start`: the caller has no flow id yet,
    /// so a refusal ends the flow instead of keeping it for another try.
    func submitFirstPassword(_ id: String, _ password: SecretBytes) async throws(VaultError) -> SignInResult {
        do {
            return try await self.submitPassword(flow: id, password: password)
        } catch {
            self.end(id, step: nil)
            throw error
        }
    }

    private func finishNative(_ id: String, _ answer: NativeAuthAnswer, flow: Flow) async throws(VaultError) -> SignInResult {
        switch answer {
        case .tokens(let response):
            return try await self.complete(id, response, nonce: nil)
        case .redirect(let reason):
            return self.browserRequired(id, reason: reason)
        default:
            throw self.fail(id, SignInError.outOfTurn(account: flow.account))
        }
    }

    func codeResult(_ id: String, _ step: NativeCode) -> SignInResult {
        var result = self.result(id, .codeRequired)
        result.sentTo = step.sentTo
        result.channel = step.channel
        result.codeLength = step.codeLength
        result.attemptsLeft = step.attemptsLeft
        return result
    }
}
