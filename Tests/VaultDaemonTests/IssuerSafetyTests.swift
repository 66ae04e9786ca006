import Foundation
import Glibc
import Logging
import NIOCore
import Testing
import VaultCrypto
import VaultDaemon
import VaultOIDC
import VaultProtocol
import VaultTestIssuer
import VaultTestKit

/// What a hostile issuer, or a hostile local user at the browser sign-in's
/// listener, may try: redirects that carry secrets away, numbers that trap,
/// bodies that trickle, connections that are held, keys that were withdrawn.
@Suite(.timeLimit(.minutes(2)))
struct IssuerSafetyTests {
    // MARK: Redirects

    /// A 3xx from any issuer call is an error naming it; nothing is sent where it points.
    @Test(arguments: [
        (TestIssuer.tokenPath, 307), (TestIssuer.tokenPath, 308), (TestIssuer.tokenPath, 302),
        ("/.well-known/openid-configuration", 307), ("/jwks", 308),
    ] as [(String, Int)])
    func aRedirectIsNeverFollowed(path: String, status: Int) async throws {
        try await using(TestIssuer.start(), TestIssuer.start(), InProcessVault.start()) { issuer, thief, vault in
            try await self.addAccount(vault, issuer)
            issuer.setFault(.redirect(status, to: thief.issuer + "/steal?keep=secret"), at: path)
            if path == "/jwks" { thief.setFault(.redirect(status, to: thief.issuer + "/steal?keep=secret"), at: path) }

            let error = try #require(await vault.workTokenFailure(), "a token came through a redirect")
            #expect(error.code == .idpError, "\(error)")
            #expect(error.message.contains("HTTP \(status)") && error.message.contains(thief.issuer + "/steal"), "\(error.message)")
            #expect(!error.message.contains("secret"), "the Location's query is not quoted: \(error.message)")
            #expect(thief.requestCount(at: "/steal") == 0 && thief.requestCount(at: path) == 0, "nothing followed the redirect")
            #expect(thief.bodyBytesReceived(at: "/steal") == 0)
        }
    }

    /// Sign-out's revocation carries the refresh token too: not through a redirect either.
    @Test func aRevocationIsNotRedirected() async throws {
        try await using(TestIssuer.start(), TestIssuer.start(), InProcessVault.start()) { issuer, thief, vault in
            try await self.addAccount(vault, issuer)
            _ = try await vault.workToken()
            issuer.setFault(.redirect(308, to: thief.issuer + "/steal"), at: "/revoke")
            let client = try LineClient(path: vault.socketPath)
            let out = try #require(await client.call(#"{"id":1,"op":"signout","account":"work"}"#))
            let account = try #require((out["accounts"] as? [[String: Any]])?.first, "\(out)")
            #expect(account["revoked"] as? String == "failed", "\(out)")
            #expect((account["reason"] as? String)?.contains("HTTP 308") == true, "\(out)")
            #expect(thief.requestCount(at: "/steal") == 0)
        }
    }

    // MARK: OAuth metadata

    /// Where OpenID discovery names no revocation endpoint, RFC 8414 metadata
    /// may; it is used only when it names the same issuer.
    @Test(arguments: [(nil, "yes"), ("https://evil.example", "unsupported")] as [(String?, String)])
    func aRevocationEndpointFromOAuthMetadata(named: String?, revoked: String) async throws {
        try await using(TestIssuer.start(), InProcessVault.start()) { issuer, vault in
            issuer.setRevocationOnlyInOAuthMetadata(true, issuer: named)
            try await self.addAccount(vault, issuer)
            _ = try await vault.workToken()
            let client = try LineClient(path: vault.socketPath)
            let out = try #require(await client.call(#"{"id":1,"op":"signout","account":"work"}"#))
            let account = try #require((out["accounts"] as? [[String: Any]])?.first, "\(out)")
            #expect(account["revoked"] as? String == revoked, "\(out)")
            // The refresh token, and the access token handed out.
            #expect(issuer.revocationCount == (revoked == "yes" ? 2 : 0))
            #expect(issuer.requestCount(at: "/.well-known/oauth-authorization-server") == 1)
        }
    }

    // MARK: Numbers

    static let absurdLifetimes = [
        "9223372036854775807", #""9223372036854775807""#, "-5", "-9223372036854775808", "3599.9", "1e300", #""1e300""#,
        #""NaN""#, #""-inf""#, "18446744073709551616", "0", "null", #"{"a":1}"#,
    ]

    /// Absurd numbers from the issuer: the daemon keeps running and
    /// answering, and the other account keeps being served.
    @Test func absurdNumbersNeverStopTheDaemon() async throws {
        try await using(TestIssuer.start(), TestIssuer.start(), DaemonProcess(folder: try temporaryFolder())) { hostile, healthy, daemon in
            #expect(await daemon.waitForLog("listening"))
            let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
            try await importAccount("work", from: hostile, environment: env)
            try await importAccount("home", from: healthy, environment: env)
            let client = try LineClient(path: daemon.socketPath)

            for (index, lifetime) in Self.absurdLifetimes.enumerated() {
                hostile.setExpiresInOverride(lifetime)
                let token = try #require(
                    await client.call(#"{"id":\#(index),"op":"token","account":"work","force_refresh":true}"#),
                    "vaultd answered nothing after expires_in \(lifetime)"
                )
                #expect(token["ok"] as? Bool == true, "expires_in \(lifetime): \(token)")
                let seconds = try #require(token["expires_in"] as? Int, "\(token)")
                #expect((0...315_360_000).contains(seconds), "expires_in \(lifetime) became \(seconds)")
                #expect(await client.call(#"{"id":"h\#(index)","op":"token","account":"home"}"#)?["ok"] as? Bool == true)
            }

            // A device answer with absurd numbers.
            for (index, number) in ["9223372036854775807", #""9223372036854775807""#, "-1", "1e300", #""NaN""#].enumerated() {
                let answer = #"{"device_code":"dc","user_code":"ABCD-EFGH","verification_uri":"\#(hostile.issuer)/activate","expires_in":\#(number),"interval":\#(number)}"#
                hostile.setFault(.answer(status: 200, headers: ["Content-Type": "application/json"], body: answer), at: "/device")
                let started = try #require(
                    await client.call(#"{"id":"d\#(index)","op":"signin.start","account":"work","method":"device"}"#),
                    "vaultd answered nothing after a device answer with \(number)"
                )
                #expect(started["state"] as? String == "device_code", "\(number): \(started)")
                let seconds = try #require(started["expires_in"] as? Int, "\(started)")
                #expect((0...315_360_000).contains(seconds), "device expires_in \(number) became \(seconds)")
                #expect((1...60).contains(started["interval"] as? Int ?? 0), "\(started)")
                if let flow = started["flow"] as? String {
                    _ = await client.call(#"{"id":"c\#(index)","op":"signin.cancel","flow":"\#(flow)"}"#)
                }
            }

            // A Retry-After past any sense.
            for (index, retryAfter) in ["9223372036854775807", "99999999999999999999999", "-1", "1e300"].enumerated() {
                hostile.setFault(.answer(status: 429, headers: ["Retry-After": retryAfter], body: ""), at: "/device")
                let refused = try #require(
                    await client.call(#"{"id":"r\#(index)","op":"signin.start","account":"work","method":"device"}"#),
                    "vaultd answered nothing after Retry-After \(retryAfter)"
                )
                #expect(refused.errorCode == "idp_unavailable", "\(refused)")
                let wait = ((refused["error"] as? [String: Any])?["retry_after_ms"] as? Int) ?? 0
                #expect((0...3_600_000).contains(wait), "Retry-After \(retryAfter) became \(wait) ms")
            }

            #expect(daemon.isRunning)
            #expect(await client.call(#"{"id":"last","op":"token","account":"home","force_refresh":true}"#)?["ok"] as? Bool == true)
        }
    }

    // MARK: Deadlines that cover the body

    /// A body trickled a byte every half second is cut at the issuer timeout.
    @Test func aTrickledTokenAnswerIsCutAtTheTimeout() async throws {
        try await using(TestIssuer.start(), InProcessVault.start(issuerTimeout: .seconds(3))) { issuer, vault in
            try await self.addAccount(vault, issuer)
            let body = #"{"access_token":"at-trickled","token_type":"Bearer","expires_in":3600}"#
            issuer.setFault(.trickle(body: body, everyMilliseconds: 500), at: TestIssuer.tokenPath)
            let started = ContinuousClock.now
            let error = try #require(await vault.workTokenFailure(), "a trickled answer was taken")
            #expect(error.code == .idpUnavailable, "\(error)")
            // Trickled whole, the body would take 35 s; every suite at once on
            // two cores has taken 11.6 s to cut it.
            #expect(ContinuousClock.now - started < .seconds(3 + 17), "cut at the 3 s timeout (plus discovery and slack)")
        }
    }

    /// Sign-out's revocation has its own bound (5 s), whatever the body does.
    @Test func aTrickledRevocationIsCutAtItsBound() async throws {
        try await using(TestIssuer.start(), InProcessVault.start()) { issuer, vault in
            try await self.addAccount(vault, issuer)
            _ = try await vault.workToken()
            issuer.setFault(.trickle(body: String(repeating: " ", count: 80), everyMilliseconds: 500), at: "/revoke")
            let client = try LineClient(path: vault.socketPath)
            let started = ContinuousClock.now
            let out = try #require(await client.call(#"{"id":1,"op":"signout","all":true}"#))
            // Trickled whole, the body would take 40 s.
            #expect(ContinuousClock.now - started < .seconds(5 + 17), "cut at the 5 s revocation bound")
            let account = try #require((out["accounts"] as? [[String: Any]])?.first, "\(out)")
            #expect(account["revoked"] as? String == "failed", "\(out)")
        }
    }

    // MARK: The loopback listener

    /// Half-sent requests from any local user: at most 16 are held, each
    /// for a few seconds, and cancelling the flow closes them all.
    @Test func theLoopbackListenerHoldsNoConnectionForever() async throws {
        try await using(TestIssuer.start(), InProcessVault.start()) { issuer, vault in
            let client = try LineClient(path: vault.socketPath)
            let add = #"{"id":1,"op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","offline_access"]}"#
            #expect(await client.call(add)?["ok"] as? Bool == true)

            // Only GET of the callback path.
            let (flow, port) = try await self.startBrowser(client)
            #expect(await blocking { exchange(port, "POST /callback HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n") }.hasPrefix("HTTP/1.1 405"))
            #expect(await blocking { exchange(port, "GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n") }.hasPrefix("HTTP/1.1 404"))

            // A cap: of 40 half-sent requests, at most 16 stay open.
            let held = try (0..<40).map { _ in try HeldConnection(port: port, send: "GET /callback?state=") }
            #expect(try await eventually { held.filter(\.isClosed).count >= 24 }, "the connections over the cap are closed at once")
            #expect(held.filter { !$0.isClosed }.count <= 16)
            // Cancelling the flow closes the rest.
            #expect(await client.call(#"{"id":2,"op":"signin.cancel","flow":"\#(flow)"}"#)?["ok"] as? Bool == true)
            #expect(try await eventually(seconds: 4) { held.allSatisfy(\.isClosed) }, "signin.cancel closes every connection")

            // A connection that never finishes its request is closed after a few seconds.
            let (second, secondPort) = try await self.startBrowser(client)
            let slow = try HeldConnection(port: secondPort, send: "GET /callback?sta")
            #expect(try await eventually(seconds: 20) { slow.isClosed }, "a half-sent request is not held forever")
            _ = await client.call(#"{"id":3,"op":"signin.cancel","flow":"\#(second)"}"#)
        }
    }

    private func startBrowser(_ client: LineClient) async throws -> (flow: String, port: Int) {
        let started = try #require(await client.call(#"{"id":"b","op":"signin.start","account":"work","method":"browser"}"#))
        let url = try #require(started["url"] as? String, "\(started)")
        let redirect = try #require(URLComponents(string: url)?.queryItems?.first { $0.name == "redirect_uri" }?.value)
        return (try #require(started["flow"] as? String), try #require(URLComponents(string: redirect)?.port))
    }

    // MARK: Signing keys

    /// Keys are kept no longer than the JWKS answer's max-age, a minute at least (an hour
    /// without one, a day at most): a key the issuer withdrew stops validating.
    @Test(arguments: [
        (nil, 3600.0), ("public, max-age=100", 100.0), ("max-age=99999999999", 86400.0), ("no-store, no-cache", 60.0),
    ] as [(String?, Double)])
    func aWithdrawnSigningKeyStopsValidating(cacheControl: String?, lifetime: Double) async throws {
        try await using(TestIssuer.start(accessTokenLifetime: 200_000)) { issuer in
            issuer.setJWKSCacheControl(cacheControl)
            let oidc = OIDCClient(logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
            let now = Date().timeIntervalSince1970
            let metadata = try await oidc.metadata(for: issuer.issuer, now: now)
            let client = ClientCredentials(clientID: TestIssuer.clientID, secret: nil)
            let response = try await oidc.refresh(
                try SecretBytes(utf8: issuer.mintRefreshToken()), scope: nil, client: client, metadata: metadata
            ).served()
            let idToken = try #require(response.idToken)
            let validate = { (at: Double) in
                try await oidc.validateIDToken(idToken, clientID: TestIssuer.clientID, nonce: nil, metadata: metadata, now: at)
            }
            _ = try await validate(now)
            #expect(issuer.jwksFetchCount == 1)
            issuer.rotateSigningKey()
            _ = try await validate(now + lifetime - 1)
            #expect(issuer.jwksFetchCount == 1, "within its lifetime the key set is not fetched again")
            await #expect(throws: ProviderError.self, "the withdrawn key validated after the key set's lifetime") {
                try await validate(now + lifetime + 1)
            }
            #expect(issuer.jwksFetchCount >= 2)
        }
    }

    // MARK: Helpers

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
}
