import VaultCrypto
import VaultOIDC
import VaultProtocol

/// The password-grant driver (RFC 6749 §4.3), for a `password` sign-in at an
/// issuer without native authentication: the flow waits for the password,
/// then sends it once with the client and metadata kept on the flow.
extension SignIns {
    func startPasswordGrant(_ id: String, username: String, password: SecretBytes?) async throws(VaultError) -> SignInResult {
        self.advance(id, to: .passwordGrant(username: username), lifetime: Self.passwordLifetime)
        if let password {
            return try await self.submitFirstPassword(id, password)
        }
        self.emit(id, .awaitingPassword)
        return self.result(id, .passwordRequired)
    }

    /// The flow is claimed; a wrong password or an unreachable issuer keeps it.
    func submitGrantPassword(
        _ id: String,
        _ context: SignInContext,
        username: String,
        password: SecretBytes
    ) async throws(VaultError) -> SignInResult {
        self.emit(id, .submitting)
        let response: TokenResponse
        do {
            response = try await self.oidc.passwordGrant(
                username: username, password: password, scope: context.scope, client: context.client, metadata: context.metadata
            )
        } catch {
            throw self.keepOrFail(id, SignInError.passwordGrant(error, account: context.name))
        }
        return try await self.complete(id, response, nonce: nil)
    }
}
