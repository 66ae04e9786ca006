import Logging
import VaultCrypto
import VaultOIDC
public import VaultProtocol
import VaultStore

extension Broker {
    /// Signs an account out everywhere (DESIGN "Sign-out wipes every copy"):
    /// its secrets and tokens leave memory at once, every store that holds
    /// them is emptied, the refresh token is revoked at the issuer, and
    /// subscribers are told. A revocation that fails still wipes, and says so.
    /// Returns the receipt and how many subscribers were told.
    public func signOut(_ name: String) async throws(VaultError) -> (SignOutReceipt, notified: Int) {
        guard let account = self.accounts[name] else { throw Self.unknownAccount(name) }
        if self.store.isLocked { throw Self.lockedError }
        let configuration = account.configuration
        let secrets = account.secrets
        // Nothing is served from here on, and no refresh in flight writes back.
        self.forgetSecrets(of: name)
        var wiped = ["memory"]
        for store in [self.store] + self.alsoWipe {
            do {
                if try await store.remove(name) { wiped.append(store.backend.rawValue) }
            } catch {
                self.logger.error("secrets not removed", metadata: ["account": "\(name)", "backend": "\(store.backend.rawValue)", "reason": "\(error.message)"])
                throw VaultError(
                    .internalError,
                    "'\(name)' is wiped from memory but its \(store.backend.rawValue) copy could not be removed: \(error.message)"
                )
            }
        }
        var revoked = "no"
        var reason: String?
        var endSession: String?
        let client = ClientCredentials(clientID: configuration.clientID, secret: secrets.clientSecret)
        if let refreshToken = secrets.refreshToken {
            do {
                let metadata = try await self.oidc.metadata(for: configuration.issuer, now: self.clock.now())
                let outcome = await self.oidc.revoke(refreshToken: refreshToken, client: client, metadata: metadata)
                revoked = outcome.0.rawValue
                reason = outcome.reason
                endSession = self.oidc.endSessionURL(metadata: metadata, clientID: configuration.clientID, idToken: secrets.idToken)
            } catch {
                revoked = Revocation.failed.rawValue
                reason = Self.wire(error, account: name).message
            }
        }
        // The client secret is configuration the user gave; it stays unless the account goes.
        if let clientSecret = secrets.clientSecret {
            let kept = AccountSecrets(clientSecret: clientSecret)
            do {
                try await self.store.save(kept, for: name)
                self.accounts[name]?.secrets = kept
            } catch {
                self.logger.error("client secret not kept", metadata: ["account": "\(name)", "reason": "\(error.message)"])
            }
        }
        let notified = self.events.emit(Event(.signedOut, account: name))
        self.logger.notice(
            "signed out",
            metadata: ["account": "\(name)", "revoked": "\(revoked)", "wiped": "\(wiped)", "notified": "\(notified)"]
        )
        return (SignOutReceipt(name: name, revoked: revoked, reason: reason, wiped: wiped, endSessionURL: endSession), notified)
    }

    /// `signout` for one account or all of them.
    public func signOut(_ target: SignOutTarget) async throws(VaultError) -> SignOutResult {
        let names: [String]
        switch target {
        case .account(let name): names = [name]
        case .all: names = self.accounts.keys.sorted()
        }
        var receipts: [SignOutReceipt] = []
        var notified = 0
        for name in names {
            let (receipt, told) = try await self.signOut(name)
            receipts.append(receipt)
            notified += told
        }
        return SignOutResult(accounts: receipts, notified: notified)
    }
}
