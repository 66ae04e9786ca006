import Crypto
import Foundation
import Testing
import VaultTestKit

/// `vaultctl account add` with no client id, against Glewlwyd with dynamic
/// client registration (RFC 7591) switched on: vaultd registers a public
/// native client, signs in with it, and deletes it with the account
/// (RFC 7592). The registration access token rests only in the sealed
/// record.
@Suite(.timeLimit(.minutes(2)))
struct RegistrationTests {
    static let scopes = ["--scope", "openid", "--scope", "offline_access", "--scope", "profile", "--scope", "email"]

    func daemon() async throws -> (DaemonProcess, [String: String]) {
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder, arguments: ["--log-level", "debug"])
        #expect(await daemon.waitForLog("listening"))
        return (daemon, ["TOKENVAULT_SOCKET": daemon.socketPath])
    }

    /// A browser sign-in of `work`, as a person would finish it.
    func signIn(_ provider: Glewlwyd, _ daemon: DaemonProcess) async throws {
        let client = try LineClient(path: daemon.socketPath)
        let started = try #require(await client.call(#"{"id":1,"op":"signin.start","account":"work","method":"browser"}"#))
        let url = try #require(started["url"] as? String, "\(started)")
        let flow = try #require(started["flow"] as? String)
        let page = try await provider.browse(url)
        #expect(page["status"] as? Int == 200, "\(page)")
        let done = try #require(await client.call(#"{"id":2,"op":"signin.wait","flow":"\#(flow)"}"#))
        #expect(done["state"] as? String == "signed_in", "\(done)")
    }

    /// Every run of 32 letters and digits in `text` (a Glewlwyd registration
    /// access token's shape) whose SHA-512 is one of `hashes`.
    static func tokens(in text: String, hashing hashes: [String]) -> [String] {
        let bytes = Array(text.utf8)
        var found: [String] = []
        var start = 0
        func isAlphanumeric(_ byte: UInt8) -> Bool {
            (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
        }
        for index in 0...bytes.count {
            if index < bytes.count, isAlphanumeric(bytes[index]) { continue }
            if index - start >= 32 {
                for offset in start...(index - 32) {
                    let candidate = Array(bytes[offset..<offset + 32])
                    let hash = "{SHA512}" + Data(SHA512.hash(data: candidate)).base64EncodedString()
                    if hashes.contains(hash) { found.append(String(decoding: candidate, as: UTF8.self)) }
                }
            }
            start = index + 1
        }
        return found
    }

    @Test func anAccountWithoutAClientIDRegistersOneSignsInAndDeletesItWhenRemoved() async throws {
        try await Glewlwyd.with(registration: "open") { provider in
            let (daemon, env) = try await self.daemon()
            let added = try await runTool("vaultctl", ["account", "add", "work", "--issuer", provider.issuer] + Self.scopes, environment: env)
            #expect(added.status == 0, "\(added.stderr)")
            #expect(added.stdout.contains("registered at the issuer"), "\(added.stdout)")
            let status = try await runTool("vaultctl", ["status", "--json"], environment: env)
            let row = try #require(
                ((try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])?["accounts"] as? [[String: Any]])?.first
            )
            #expect(row["registration"] as? String == "dynamic", "\(row)")
            let clientID = try #require(row["client_id"] as? String)
            #expect(try await provider.clients()[clientID] == true, "the client exists at the issuer")

            try await self.signIn(provider, daemon)
            let token = try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: env)
            #expect(token.status == 0, "the registered public client refreshes: \(token.stderr)")

            // The registration access token is in no reply, log line or file
            // but the sealed record. The search finds a token the provider
            // gave: one of a client registered here by hand.
            let script = """
                import json, sys, urllib.request
                body = json.dumps({"client_name": "probe", "redirect_uris": ["http://127.0.0.1:20000/callback"], "client_confidential": False}).encode()
                request = urllib.request.Request(sys.argv[1], data=body, headers={"Content-Type": "application/json"})
                print(json.load(urllib.request.urlopen(request))["registration_access_token"])
                """
            let probe = try await runTool("/usr/bin/python3", ["-c", script, try #require(provider.env["GLEWLWYD_REGISTRATION_ENDPOINT"])])
            let probeToken = probe.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            let hashes = try await provider.registrationTokenHashes()
            #expect(hashes.count == 2)
            #expect(Self.tokens(in: "a line with \(probeToken) in it", hashing: hashes) == [probeToken], "\(probe.stderr)")
            let accounts = (try? String(contentsOfFile: daemon.folder + "/config/tokenvault/accounts.json", encoding: .utf8)) ?? ""
            #expect(accounts.contains(clientID))
            for (place, text) in [
                ("the add reply", added.stdout + added.stderr), ("status", status.stdout), ("accounts.json", accounts),
                ("vaultd's log", daemon.output),
            ] {
                #expect(Self.tokens(in: text, hashing: hashes).isEmpty, "the registration access token is in \(place)")
            }

            let removed = try await runTool("vaultctl", ["account", "remove", "work"], environment: env)
            #expect(removed.status == 0, "\(removed.stderr)")
            #expect(removed.stdout.contains("registration deleted at the issuer"), "\(removed.stdout)")
            #expect(try await provider.clients()[clientID] == false, "the registration is deleted: the client is disabled")
            #expect(Self.tokens(in: daemon.output, hashing: hashes).isEmpty)
            #expect(await daemon.terminate() == 0)
        }
    }

    /// The issuer is gone when the account is removed: the account goes all
    /// the same, and the answer says what stays at the issuer.
    @Test func anAccountIsRemovedEvenWhenItsRegistrationCannotBeDeleted() async throws {
        let provider = try await Glewlwyd.start(registration: "open")
        let (daemon, env) = try await self.daemon()
        let added = try await runTool("vaultctl", ["account", "add", "work", "--issuer", provider.issuer] + Self.scopes, environment: env)
        #expect(added.status == 0, "\(added.stderr)")
        await provider.stop()
        let removed = try await runTool("vaultctl", ["account", "remove", "work", "--json"], environment: env)
        #expect(removed.status == 0, "\(removed.stderr)")
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(removed.stdout.utf8)) as? [String: Any])
        #expect(answer["registration_deleted"] as? Bool == false, "\(answer)")
        #expect((answer["registration_left"] as? String)?.contains("stays at the issuer") == true, "\(answer)")
        #expect(try await runTool("vaultctl", ["account", "list"], environment: env).stdout.isEmpty)
        #expect(await daemon.terminate() == 0)
    }

    /// An issuer that registers only with an initial access token: without
    /// one it is the issuer's refusal, with nothing added; with one read from
    /// stdin it registers.
    @Test func registrationWithAnInitialAccessTokenFromStdin() async throws {
        try await Glewlwyd.with(accessTokenSeconds: 60, registration: "token") { provider in
            let (daemon, env) = try await self.daemon()
            let refused = try await runTool("vaultctl", ["account", "add", "work", "--issuer", provider.issuer] + Self.scopes, environment: env)
            #expect(refused.status != 0)
            #expect(refused.stderr.contains("initial access token"), "\(refused.stderr)")
            let none = try await runTool("vaultctl", ["account", "list"], environment: env)
            #expect(none.stdout.isEmpty, "nothing was added: \(none.stdout)")

            let token = try await provider.initialAccessToken()
            let added = try await runTool(
                "vaultctl", ["account", "add", "work", "--issuer", provider.issuer, "--registration-token"] + Self.scopes,
                input: token + "\n",
                environment: env
            )
            #expect(added.status == 0, "\(added.stderr)")
            #expect(!daemon.output.contains(token), "the initial access token is in vaultd's log")
            try await self.signIn(provider, daemon)
            #expect(await daemon.terminate() == 0)
        }
    }

    /// No registration endpoint and no client id: exit 64, naming
    /// --client-id, and no account.
    @Test func anIssuerWithoutRegistrationNeedsAClientID() async throws {
        try await Glewlwyd.with { provider in
            let (daemon, env) = try await self.daemon()
            let refused = try await runTool("vaultctl", ["account", "add", "work", "--issuer", provider.issuer], environment: env)
            #expect(refused.status == 64, "\(refused.stderr)")
            #expect(refused.stderr.contains("--client-id"), "\(refused.stderr)")
            #expect(try await runTool("vaultctl", ["account", "list"], environment: env).stdout.isEmpty)
            #expect(await daemon.terminate() == 0)
        }
    }
}
