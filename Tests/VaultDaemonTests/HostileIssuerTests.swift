import Foundation
import NIOCore
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultTestIssuer
import VaultTestKit

/// Issuers that fail or lie. For each: no crash and no hang, a clear error
/// code, the cached token keeps being served, and the account recovers once
/// the issuer heals.
@Suite(.timeLimit(.minutes(1)))
struct HostileIssuerTests {
    struct Fault: Sendable, CustomTestStringConvertible {
        var name: String
        var code: ErrorCode
        var apply: @Sendable (TestIssuer) -> Void
        var testDescription: String { self.name }
    }

    static let faults: [Fault] = [
        Fault(name: "hangs past every timeout", code: .idpUnavailable) { $0.setTokenBehaviour(.hang) },
        Fault(name: "resets the connection", code: .idpUnavailable) { $0.setTokenBehaviour(.resetConnection) },
        Fault(name: "answers 502", code: .idpUnavailable) { $0.setTokenBehaviour(.status(502, body: "<html>bad gateway</html>")) },
        Fault(name: "answers 429 with Retry-After", code: .idpUnavailable) {
            $0.setTokenBehaviour(.tooManyRequests(retryAfterSeconds: 2))
        },
        Fault(name: "sends garbage JSON", code: .idpUnavailable) { $0.setTokenBehaviour(.malformedJSON) },
        Fault(name: "sends a 4 MiB body", code: .idpUnavailable) {
            $0.setTokenBehaviour(.status(200, body: #"{"access_token":""# + String(repeating: "x", count: 4 << 20) + #""}"#))
        },
        // A refused proof is not a dead grant (Glewlwyd keeps the chain): no sign-in is asked for.
        Fault(name: "refuses the DPoP proof", code: .idpError) {
            $0.setTokenBehaviour(.status(403, body: #"{"error":"invalid_dpop_proof","error_description":"iat in the future"}"#))
        },
        Fault(name: "sends a DPoP token for a request without a proof", code: .idpError) {
            $0.setTokenBehaviour(.status(200, body: #"{"access_token":"at","token_type":"DPoP","expires_in":60}"#))
        },
        // An access token goes into headers, SASL strings and environments: visible ASCII without space, or nothing.
        Fault(name: "sends an access token with CR/LF", code: .idpError) { $0.setAnsweredAccessTokenJSON(#""at\r\nX-Injected: 1""#) },
        Fault(name: "sends an access token with ^A", code: .idpError) { $0.setAnsweredAccessTokenJSON(#""at\u0001auth=x""#) },
        Fault(name: "sends an access token with a space", code: .idpError) { $0.setAnsweredAccessTokenJSON(#""at x""#) },
        Fault(name: "sends an access token with non-ASCII text", code: .idpError) { $0.setAnsweredAccessTokenJSON(#""at\u00e9""#) },
        // The "wider than granted" check of a share reads `scope`: it is a string or the answer is refused.
        Fault(name: "answers scope as a list", code: .idpError) { $0.setAnsweredScopeJSON(#"["openid","admin"]"#) },
        Fault(name: "answers scope as null", code: .idpError) { $0.setAnsweredScopeJSON("null") },
        Fault(name: "signs the ID token with an unknown key", code: .idpError) { $0.setIDTokenOverrides(signWithUnknownKey: true) },
        Fault(name: "names another iss in the ID token", code: .idpError) {
            $0.setIDTokenOverrides(issuer: "https://evil.example")
        },
        Fault(name: "names another aud in the ID token", code: .idpError) { $0.setIDTokenOverrides(audience: "someone-else") },
    ]

    @Test(arguments: faults)
    func aFailingIssuer(fault: Fault) async throws {
        let clock = ManualClock()
        try await using(TestIssuer.start(accessTokenLifetime: 100), InProcessVault.start(clock: clock, issuerTimeout: .seconds(5))) { issuer, vault in
            try await self.addAccount(vault, issuer)
            let first = try await self.firstToken(vault, clock)

            fault.apply(issuer)
            let started = ContinuousClock.now
            if fault.code == .idpUnavailable {
                // While the cached token lives it is the answer, even to a forced refresh.
                #expect(try await vault.workToken(force: true).accessToken == first.accessToken)
                clock.advance(by: 101)
            }
            let error = try #require(await vault.workTokenFailure(force: true), "a refresh succeeded against an issuer that \(fault.name)")
            #expect(error.code == fault.code)
            #expect(ContinuousClock.now - started < .seconds(20), "each refresh ended within the 5 s issuer timeout")
            #expect(!error.message.contains("xxxx"), "no body is quoted back")
            if fault.name.contains("MiB") { #expect(error.message.contains("over the 1024 KiB limit"), "\(error.message)") }
            if fault.code == .idpError {
                #expect(try await vault.workToken().accessToken == first.accessToken, "the cached token keeps serving")
            }

            if fault.code == .idpError, fault.name.contains("access token") || fault.name.contains("scope") {
                #expect(error.error == "untrusted_response", "\(error.message)")
            }
            issuer.setTokenBehaviour(.normal)
            issuer.setIDTokenOverrides()
            issuer.setAnsweredAccessTokenJSON(nil)
            issuer.setAnsweredScopeJSON(nil)
            // ID tokens are signed on the real clock; keep them current for the moved one.
            issuer.setAccessTokenLifetime(1000)
            clock.advance(by: 120)  // past any backoff or Retry-After
            let healed = try await self.firstToken(vault, clock, force: true)
            #expect(healed.accessToken != first.accessToken)
            #expect(await vault.broker.status().accounts.first?.needsReauth == false)
        }
    }

    /// Discovery is the root of trust for every endpoint and key: a document
    /// naming another issuer, or sending tokens over plain http off loopback,
    /// is refused until the issuer serves a true one.
    @Test(arguments: [
        ("names another issuer", "https://evil.example", nil),
        ("sends the token endpoint over plain http", nil, "http://id.example.org/token"),
    ] as [(String, String?, String?)])
    func aDiscoveryDocumentThatPointsElsewhere(name: String, issuerOverride: String?, tokenEndpoint: String?) async throws {
        try await using(TestIssuer.start(), InProcessVault.start()) { issuer, vault in
            issuer.setDiscoveryOverrides(issuer: issuerOverride, tokenEndpoint: tokenEndpoint)
            try await self.addAccount(vault, issuer)
            #expect(await vault.workTokenFailure()?.code == .idpError, "\(name)")
            #expect(issuer.refreshCount == 0, "no refresh token went to an endpoint it pointed at")
            issuer.setDiscoveryOverrides()
            _ = try await vault.workToken()
        }
    }

    /// An answer refused for its access token still carried the rotated
    /// refresh token, which replaced the spent one: it is kept, and the next
    /// refresh presents it (an issuer that detects reuse would otherwise
    /// revoke the whole chain).
    @Test func aRefusedAnswerKeepsItsRotation() async throws {
        try await using(TestIssuer.start(accessTokenLifetime: 100, rotateRefreshTokens: true), InProcessVault.start()) { issuer, vault in
            try await self.addAccount(vault, issuer)
            let first = try await vault.workToken()
            issuer.setAnsweredAccessTokenJSON(#""at\r\nX-Injected: 1""#)
            let error = try #require(await vault.workTokenFailure(force: true))
            #expect(error.code == .idpError && error.error == "untrusted_response", "\(error.message)")
            #expect(try await vault.workToken().accessToken == first.accessToken, "the cached token keeps serving")
            issuer.setAnsweredAccessTokenJSON(nil)
            let healed = try await vault.workToken(force: true)
            #expect(healed.accessToken != first.accessToken)
            #expect(issuer.reusedRefreshTokens == 0, "the spent refresh token was presented again")
        }
    }

    /// No `scope`, or `""`: the issuer granted what was asked (RFC 6749
    /// §5.1), but it may have ignored a narrowed ask; the token is taken to
    /// carry the account's whole grant.
    @Test(arguments: ["", #""""#])
    func anUnsaidScopeIsTheWholeGrant(scope: String) async throws {
        try await using(TestIssuer.start(), InProcessVault.start()) { issuer, vault in
            try await self.addAccount(vault, issuer)
            issuer.setAnsweredScopeJSON(scope)
            let narrow = try await vault.rooms.token(TokenRequest(account: "work", scopes: ["openid"]), for: testPeer)
            #expect(narrow.scope == "openid offline_access")
        }
    }

    private func addAccount(_ vault: InProcessVault, _ issuer: TestIssuer) async throws {
        let configuration = AccountConfiguration(
            name: "work",
            issuer: issuer.issuer,
            clientID: TestIssuer.clientID,
            scopes: ["openid", "offline_access"]
        )
        _ = try await vault.broker.add(
            AccountAddition(configuration: configuration, refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken()))
        )
    }

    /// A token from a healthy issuer. Under a loaded test run an exchange
    /// may still miss the 5 s timeout: try again past the backoff, until a deadline.
    private func firstToken(_ vault: InProcessVault, _ clock: ManualClock, force: Bool = false) async throws -> TokenResult {
        let deadline = ContinuousClock.now + .seconds(40)
        while true {
            do {
                return try await vault.workToken(force: force)
            } catch let error as VaultError where error.code == .idpUnavailable && ContinuousClock.now < deadline {
                clock.advance(by: 61)
            }
        }
    }
}
