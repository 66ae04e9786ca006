import Glibc
import Logging
import VaultCrypto
import VaultOIDC
import VaultProtocol
import VaultServer
import VaultStore

/// A client registered at the issuer for an account added without one
/// (RFC 7591), and deleted again with the account (RFC 7592).
extension Broker {
    /// Registers a public native client for `addition`, which names no
    /// client id: the issuer's discovery must offer registration. The
    /// redirect URI is the account's fixed one, else a free loopback port
    /// picked now and kept as the account's fixed one (issuers match the
    /// registered URI exactly, port included).
    func register(_ addition: AccountAddition) async throws(VaultError) -> (ClientRegistration, redirectURI: String) {
        let configuration = addition.configuration
        let name = configuration.name
        let metadata: ProviderMetadata
        do {
            metadata = try await self.oidc.metadata(for: configuration.issuer, now: self.clock.now())
        } catch {
            throw VaultError(error, account: name)
        }
        guard metadata.registrationEndpoint != nil else { throw VaultError.clientIDRequired(configuration.issuer) }
        guard let redirectURI = configuration.redirectURI ?? LoopbackListener.freeRedirectURI() else { throw VaultError.noRedirectPort }
        do {
            let registration = try await self.oidc.register(
                metadata: metadata,
                redirectURI: redirectURI,
                clientName: "tokenvault on \(Self.hostname)",
                initialAccessToken: addition.registrationToken
            )
            self.logger.notice(
                "client registered",
                metadata: [
                    "account": "\(name)", "client_id": "\(registration.clientID.escaped(for: .log))",
                    "client_secret": "\(registration.clientSecret != nil)", "deletable": "\(registration.accessToken != nil)",
                ]
            )
            return (registration, redirectURI)
        } catch {
            throw VaultError.registrationRefused(error, account: name)
        }
    }

    /// Deletes the registration held in `token` and `uri` (RFC 7592 §2.3):
    /// nil when done, else what is left at the issuer, in words.
    nonisolated func deleteRegistration(_ name: String, token: SecretBytes, uri: SecretBytes) async -> String? {
        defer {
            token.wipe()
            uri.wipe()
        }
        let (deleted, reason) = await self.oidc.deleteRegistration(clientURI: uri.unsafeString(), accessToken: token)
        self.logger.notice("client registration deleted", metadata: ["account": "\(name)", "deleted": "\(deleted)"])
        return deleted ? nil : "the client registered for it stays at the issuer (\(reason ?? "not deleted"))"
    }

    /// This machine's name, for the registered client's `client_name`.
    static var hostname: String {
        var bytes = [CChar](repeating: 0, count: 256)
        guard gethostname(&bytes, bytes.count - 1) == 0 else { return "this machine" }
        let name = String(decoding: bytes.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return name.isEmpty ? "this machine" : String(name.escaped(for: .log).prefix(64))
    }
}
