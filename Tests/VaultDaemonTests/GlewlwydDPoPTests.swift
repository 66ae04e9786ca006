import Foundation
import Logging
import Testing
import VaultCrypto
import VaultOIDC
import VaultTestKit

/// DPoP (RFC 9449) from the OIDC client to Glewlwyd with DPoP on: tokens
/// bound to a key made here, refreshes that need a proof from it, and
/// server nonces met by one retry that spends nothing.
@Suite(.timeLimit(.minutes(2)))
struct GlewlwydDPoPTests {
    static let client = "confidential-rotating"
    static let secret = "s3cret-rotating"
    static let scope = "openid offline_access profile email"

    struct Setup {
        let oidc = OIDCClient(logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        let metadata: ProviderMetadata
        let key: DPoPKey

        func client(_ key: DPoPKey?) throws -> ClientCredentials {
            ClientCredentials(clientID: GlewlwydDPoPTests.client, secret: try SecretBytes(utf8: GlewlwydDPoPTests.secret), dpop: key)
        }

        func signIn() async throws -> TokenResponse {
            try await self.oidc.passwordGrant(
                username: "ada", password: try SecretBytes(utf8: "correct horse"), scope: GlewlwydDPoPTests.scope,
                client: try self.client(self.key), metadata: self.metadata
            )
        }

        func refresh(_ token: SecretBytes, with key: DPoPKey?) async throws -> TokenResponse {
            try await self.oidc.refresh(token, scope: nil, client: try self.client(key), metadata: self.metadata).served()
        }
    }

    /// `algorithm`: the one the vault's key is of (Glewlwyd takes both; the vault prefers EdDSA).
    func setUp(_ provider: Glewlwyd, algorithm: String = "EdDSA") async throws -> Setup {
        let oidc = OIDCClient(logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        let metadata = try await oidc.metadata(for: provider.issuer, now: Date().timeIntervalSince1970)
        let supported = try #require(metadata.dpopSigningAlgValuesSupported)
        #expect(supported.contains("EdDSA") && supported.contains("ES256"), "\(supported)")
        let key = try #require(try DPoPKey.generate(supported: [algorithm]))
        #expect(key.algorithm.rawValue == algorithm)
        return Setup(metadata: metadata, key: key)
    }

    /// The `cnf.jkt` of a JWT access token.
    func boundThumbprint(_ accessToken: SecretBytes) throws -> String? {
        try Self.boundThumbprint(accessToken.unsafeString())
    }

    static func boundThumbprint(_ token: String) throws -> String? {
        (try Self.claims(of: token)["cnf"] as? [String: Any])?["jkt"] as? String
    }

    /// The payload of a JWT (an access token, a DPoP proof), unverified.
    static func claims(of jwt: String) throws -> [String: Any] {
        let parts = jwt.split(separator: ".")
        try #require(parts.count == 3)
        var base64 = parts[1].map { $0 == "-" ? "+" : $0 == "_" ? "/" : String($0) }.joined()
        while base64.count % 4 != 0 { base64 += "=" }
        let payload = try #require(Data(base64Encoded: base64))
        return try #require(try JSONSerialization.jsonObject(with: payload) as? [String: Any])
    }

    @Test(arguments: ["EdDSA", "ES256"])
    func tokensAreBoundToTheVaultsKeyAndRefreshOnlyWithIt(algorithm: String) async throws {
        try await Glewlwyd.with(dpop: "on") { provider in
            let setup = try await self.setUp(provider, algorithm: algorithm)
            let signedIn = try await setup.signIn()
            #expect(signedIn.tokenType == "DPoP")
            #expect(try self.boundThumbprint(signedIn.accessToken) == setup.key.thumbprint)
            let first = try #require(signedIn.refreshToken)

            // Without a proof, or with another key's: refused, and the chain is not burned.
            await #expect(throws: ProviderError.self, "a refresh without a proof") { try await setup.refresh(first, with: nil) }
            let stranger = try #require(try DPoPKey.generate(supported: ["EdDSA"]))
            await #expect(throws: ProviderError.self, "a refresh with another key") { try await setup.refresh(first, with: stranger) }

            let refreshed = try await setup.refresh(first, with: setup.key)
            #expect(refreshed.tokenType == "DPoP")
            #expect(try self.boundThumbprint(refreshed.accessToken) == setup.key.thumbprint)
            let rotated = try #require(refreshed.refreshToken)
            #expect(rotated != first, "the confidential-rotating client rotates")
            let again = try await setup.refresh(rotated, with: setup.key)
            #expect(again.tokenType == "DPoP", "the rotated token stays bound to the same key")
        }
    }

    /// Nonces mandatory, rotating after 2 uses: the first request of each
    /// nonce's life is answered `use_dpop_nonce` and retried once with the
    /// nonce, reusing the same refresh token; a new nonce can come on a 200.
    @Test func serverNoncesAreMetWithOneRetryThatSpendsNothing() async throws {
        try await Glewlwyd.with(dpop: "nonce:2") { provider in
            let setup = try await self.setUp(provider)
            let signedIn = try await setup.signIn()
            #expect(signedIn.tokenType == "DPoP")
            var refreshToken = try #require(signedIn.refreshToken)
            for round in 1...5 {
                let refreshed = try await setup.refresh(refreshToken, with: setup.key)
                #expect(refreshed.tokenType == "DPoP", "refresh \(round)")
                refreshToken = try #require(refreshed.refreshToken)
            }
        }
    }

    /// The browser flow of a public client: `dpop_jkt` binds the code to the
    /// key (another key cannot redeem it), and the public client's refresh
    /// token is bound too.
    @Test func aCodeAskedForWithTheKeysThumbprintRedeemsOnlyWithThatKey() async throws {
        try await Glewlwyd.with(dpop: "on") { provider in
            let setup = try await self.setUp(provider)
            let redirect = try #require(provider.env["GLEWLWYD_REDIRECT_URI"])
            func request() async throws -> AuthorizationRequest {
                try await setup.oidc.authorizationRequest(
                    metadata: setup.metadata, client: ClientCredentials(clientID: "public-rotating", secret: nil), redirectURI: redirect,
                    scopes: ["openid", "offline_access"], dpopThumbprint: setup.key.thumbprint
                )
            }
            func code(for request: AuthorizationRequest) async throws -> String {
                #expect(request.url.contains("dpop_jkt=" + setup.key.thumbprint))
                return try await provider.authorizationCode(for: request.url)
            }
            func client(_ key: DPoPKey?) -> ClientCredentials { ClientCredentials(clientID: "public-rotating", secret: nil, dpop: key) }
            let stranger = try #require(try DPoPKey.generate(supported: ["EdDSA"]))
            let first = try await request()
            await #expect(throws: ProviderError.self, "a code bound to the vault's key, redeemed with another") {
                try await setup.oidc.exchangeCode(try await code(for: first), for: first, client: client(stranger), metadata: setup.metadata)
            }
            let second = try await request()
            let tokens = try await setup.oidc.exchangeCode(try await code(for: second), for: second, client: client(setup.key), metadata: setup.metadata)
            #expect(tokens.tokenType == "DPoP")
            let refreshToken = try #require(tokens.refreshToken)
            await #expect(throws: ProviderError.self, "a public client's refresh without a proof") {
                try await setup.oidc.refresh(refreshToken, scope: nil, client: client(nil), metadata: setup.metadata).served()
            }
            let refreshed = try await setup.oidc.refresh(refreshToken, scope: nil, client: client(setup.key), metadata: setup.metadata).served()
            #expect(refreshed.tokenType == "DPoP")
        }
    }
}
