import Foundation
import Glibc
import Logging
import Testing
import VaultDaemon
import VaultOIDC
import VaultTestKit

/// Browser, device and password sign-in against Glewlwyd, a real OpenID
/// provider; the test plays the user through its login and consent API.
@Suite(.timeLimit(.minutes(2)))
struct GlewlwydSignInTests {
    static let scopes = #"["openid","offline_access","profile","email"]"#

    func add(_ client: LineClient, _ provider: Glewlwyd, client id: String, secret: String? = nil, redirect: String? = nil) async {
        let secretField = secret.map { #","client_secret":"\#($0)""# } ?? ""
        let redirectField = redirect.map { #","redirect_uri":"\#($0)""# } ?? ""
        let line = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(provider.issuer)","client_id":"\#(id)","scopes":\#(Self.scopes)\#(secretField)\#(redirectField)}"#
        #expect(await client.call(line)?["ok"] as? Bool == true)
    }

    /// A loopback redirect URI on a port free right now, registered with the
    /// provider (Glewlwyd matches the port exactly). The port is below the
    /// kernel's ephemeral range, so no outgoing connection of a test running
    /// alongside takes it before the daemon listens on it.
    func registeredRedirect(_ provider: Glewlwyd, client: String) async throws -> String {
        var port: UInt16 = 0
        for _ in 0..<100 where port == 0 {
            let candidate = UInt16.random(in: 20000..<32000)
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = candidate.bigEndian
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            close(fd)
            if bound == 0 { port = candidate }
        }
        let uri = "http://127.0.0.1:\(try #require(port == 0 ? nil : port))/callback"
        let base = try #require(provider.env["GLEWLWYD_BASE_URL"])
        let result = try await runTool(packageRoot + "/demo/glewlwyd/provision.py", ["--base", base, "add-redirect-uri", client, uri])
        #expect(result.status == 0, "\(result.stderr)")
        return uri
    }

    @Test func theBrowserFlowSignsInWithPKCEThroughTheLoopbackListener() async throws {
        try await Glewlwyd.with { provider in
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                let redirect = try await self.registeredRedirect(provider, client: "public-app")
                await self.add(client, provider, client: "public-app", redirect: redirect)

                let started = try #require(await client.call(#"{"id":1,"op":"signin.start","account":"work","method":"browser"}"#))
                #expect(started["state"] as? String == "open_browser", "\(started)")
                let url = try #require(started["url"] as? String)
                #expect(url.contains("code_challenge_method=S256") && url.contains("state=") && url.contains("nonce="))
                let flow = try #require(started["flow"] as? String)

                // An answer with another state is refused and the flow keeps waiting.
                let forged = try await provider.browse(url, ["--wrong-state"])
                #expect(forged["status"] as? Int == 400, "\(forged)")
                let still = try #require(await client.call(#"{"id":2,"op":"signin.wait","flow":"\#(flow)","timeout_ms":0}"#))
                #expect(still["state"] as? String == "open_browser", "\(still)")

                let page = try await provider.browse(url)
                #expect(page["status"] as? Int == 200)
                #expect((page["body"] as? String)?.contains("Signed in") == true, "\(page)")
                let done = try #require(await client.call(#"{"id":3,"op":"signin.wait","flow":"\#(flow)"}"#))
                #expect(done["state"] as? String == "signed_in", "\(done)")
                #expect(done["username"] as? String == "ada@example.org")
                let token = try #require(await client.call(#"{"id":4,"op":"token","account":"work","force_refresh":true}"#))
                #expect(token["ok"] as? Bool == true, "the signed-in refresh token works: \(token)")
            }
        }
    }

    /// An issuer that takes only pushed authorization requests (RFC 9126):
    /// the request is pushed, and the browser sees only `client_id` and the
    /// `request_uri`, no PKCE challenge and no redirect URI.
    @Test func aPushedAuthorizationRequestSignsInWhereTheIssuerRequiresOne() async throws {
        try await Glewlwyd.with(par: "required") { provider in
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                let redirect = try await self.registeredRedirect(provider, client: "public-app")
                await self.add(client, provider, client: "public-app", redirect: redirect)
                let started = try #require(await client.call(#"{"id":1,"op":"signin.start","account":"work","method":"browser"}"#))
                let url = try #require(started["url"] as? String, "\(started)")
                #expect(url.contains("request_uri=") && url.contains("client_id=public-app"), "\(url)")
                #expect(!url.contains("code_challenge") && !url.contains("redirect_uri"), "\(url)")
                let flow = try #require(started["flow"] as? String)
                // The person's browser sees neither: the stand-in is told them for its consent page.
                let page = try await provider.browse(url, ["--redirect-uri", redirect, "--scope", "openid offline_access profile email"])
                #expect(page["status"] as? Int == 200, "\(page)")
                let done = try #require(await client.call(#"{"id":2,"op":"signin.wait","flow":"\#(flow)"}"#))
                #expect(done["state"] as? String == "signed_in", "\(done)")
            }
        }
    }

    @Test func aDeclinedBrowserSignInFails() async throws {
        try await Glewlwyd.with { provider in
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                await self.add(client, provider, client: "public-app")
                let started = try #require(await client.call(#"{"id":1,"op":"signin.start","account":"work","method":"browser"}"#))
                let url = try #require(started["url"] as? String)
                let flow = try #require(started["flow"] as? String)
                let page = try await provider.browse(url, ["--deny"])
                #expect((page["body"] as? String)?.contains("declined") == true, "\(page)")
                let done = try #require(await client.call(#"{"id":2,"op":"signin.wait","flow":"\#(flow)"}"#))
                #expect(done.errorCode == "idp_error", "\(done)")
                #expect((done["error"] as? [String: Any])?["error"] as? String == "access_denied")
            }
        }
    }

    @Test func theDeviceFlowSignsInOnceTheUserApproves() async throws {
        try await Glewlwyd.with { provider in
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                await self.add(client, provider, client: "public-app")
                let started = try #require(await client.call(#"{"id":1,"op":"signin.start","account":"work","method":"device"}"#))
                #expect(started["state"] as? String == "device_code", "\(started)")
                let userCode = try #require(started["user_code"] as? String)
                #expect(started["verification_uri"] is String)
                let flow = try #require(started["flow"] as? String)
                // Before approval the flow is still waiting.
                let pending = try #require(await client.call(#"{"id":2,"op":"signin.wait","flow":"\#(flow)","timeout_ms":1500}"#))
                #expect(pending["state"] as? String == "device_code", "\(pending)")

                let approved = try await runTool(
                    packageRoot + "/demo/glewlwyd/approve-device.py",
                    ["--issuer", provider.issuer, "--user-code", userCode]
                )
                #expect(approved.status == 0, "\(approved.stderr)")
                let done = try #require(await client.call(#"{"id":3,"op":"signin.wait","flow":"\#(flow)"}"#))
                #expect(done["state"] as? String == "signed_in", "\(done)")
                #expect(done["username"] as? String == "ada@example.org")
                #expect(await client.call(#"{"id":4,"op":"token","account":"work"}"#)?["ok"] as? Bool == true)
            }
        }
    }

    @Test func thePasswordGrantSignsInAfterAWrongPassword() async throws {
        try await Glewlwyd.with { provider in
            let secret = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET"])
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                await self.add(client, provider, client: "confidential-app", secret: secret)
                let noCodes = try #require(await client.call(#"{"id":0,"op":"signin.start","account":"work","method":"email_otp","username":"ada@example.org"}"#))
                #expect((noCodes["error"] as? [String: Any])?["error"] as? String == "unsupported", "Glewlwyd has no native authentication: \(noCodes)")
                let wrong = try #require(await client.call(#"{"id":1,"op":"signin.start","account":"work","method":"password","username":"ada","password":"wrong horse"}"#))
                #expect(wrong.errorCode == "invalid_credentials", "\(wrong)")
                let started = try #require(await client.call(#"{"id":2,"op":"signin.start","account":"work","method":"password","username":"ada"}"#))
                #expect(started["state"] as? String == "password_required", "\(started)")
                let flow = try #require(started["flow"] as? String)
                let again = try #require(await client.call(#"{"id":3,"op":"signin.submit_password","flow":"\#(flow)","password":"wrong horse"}"#))
                #expect(again.errorCode == "invalid_credentials", "the flow survives a wrong password")
                let done = try #require(await client.call(#"{"id":4,"op":"signin.submit_password","flow":"\#(flow)","password":"correct horse"}"#))
                #expect(done["state"] as? String == "signed_in", "\(done)")
                #expect(await client.call(#"{"id":5,"op":"token","account":"work"}"#)?["ok"] as? Bool == true)
            }
        }
    }

    @Test func vaultctlSignsInWithAPasswordFromStdin() async throws {
        try await Glewlwyd.with { provider in
            let secret = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET"])
            try await using(DaemonProcess(folder: try temporaryFolder())) { daemon in
                #expect(await daemon.waitForLog("listening"))
                let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
                let added = try await runTool(
                    "vaultctl",
                    ["account", "add", "work", "--issuer", provider.issuer, "--client-id", "confidential-app", "--client-secret",
                     "--scope", "openid", "--scope", "offline_access", "--scope", "email"],
                    input: secret + "\n",
                    environment: env
                )
                #expect(added.status == 0, "\(added.stderr)")
                let refused = try await runTool("vaultctl", ["signin", "work", "--password", "--username", "ada"], input: "wrong horse\n", environment: env)
                #expect(refused.status == 77, "\(refused.stderr)")
                #expect(refused.stderr.contains("vaultctl: error:"), "\(refused.stderr)")
                let signedIn = try await runTool("vaultctl", ["signin", "work", "--password", "--username", "ada"], input: "correct horse\n", environment: env)
                #expect(signedIn.status == 0, "\(signedIn.stderr)")
                #expect(signedIn.stdout == "Signed in to work as ada@example.org.\n", "\(signedIn.stdout)")
                #expect(!signedIn.stderr.contains("correct horse"))
                let token = try await runTool("vaultctl", ["token", "work"], environment: env)
                #expect(token.status == 0, "\(token.stderr)")
            }
        }
    }
}

/// PKCE as Glewlwyd enforces it: a code redeems only with its own verifier.
@Suite(.timeLimit(.minutes(2)))
struct GlewlwydPKCETests {
    @Test func aCodeDoesNotRedeemWithAnotherVerifier() async throws {
        try await Glewlwyd.with { provider in
            let oidc = OIDCClient(logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
            let metadata = try await oidc.metadata(for: provider.issuer, now: Date().timeIntervalSince1970)
            let redirect = try #require(provider.env["GLEWLWYD_REDIRECT_URI"])
            let client = ClientCredentials(clientID: "public-app", secret: nil)
            func request() async throws -> AuthorizationRequest {
                try await oidc.authorizationRequest(metadata: metadata, client: client, redirectURI: redirect, scopes: ["openid", "offline_access"])
            }
            func code(for request: AuthorizationRequest) async throws -> String {
                try await provider.authorizationCode(for: request.url)
            }
            let first = try await request()
            let other = try await request()
            await #expect(throws: ProviderError.self, "another request's verifier is refused") {
                try await oidc.exchangeCode(try await code(for: first), for: other, client: client, metadata: metadata)
            }
            let second = try await request()
            let tokens = try await oidc.exchangeCode(try await code(for: second), for: second, client: client, metadata: metadata)
            #expect(tokens.refreshToken != nil)
        }
    }
}
