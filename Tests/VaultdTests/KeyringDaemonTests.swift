import Foundation
import Glibc
import Testing
import VaultCrypto
import VaultStore
import VaultTestIssuer
import VaultTestKit

/// vaultd with a real Secret Service: gnome-keyring, headless, on a private
/// session bus (Tests/Support/keyring/session.sh), checked with secret-tool.
@Suite(.timeLimit(.minutes(2)))
struct KeyringDaemonTests {
    func status(_ env: [String: String]) async throws -> [String: Any] {
        let result = try await runTool("vaultctl", ["status", "--json"], environment: env)
        return try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
    }

    @Test func autoChoosesTheKeyringAndSignOutAtGlewlwydLeavesNothing() async throws {
        try await DaemonKeyring.with { keyring in
            try await Glewlwyd.with { provider in
                let secret = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET"])
                let login = try await provider.login(client: "confidential-app", secret: secret, grant: "password")
                let refreshToken = try #require(login["refresh_token"] as? String)
                let folder = try temporaryFolder()
                var daemon = try DaemonProcess(folder: folder, environment: ["DBUS_SESSION_BUS_ADDRESS": keyring.bus])
                #expect(await daemon.waitForLog("listening"))
                let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
                let status = try await self.status(env)
                #expect(status["backend"] as? String == "keyring", "\(status)")
                #expect((status["backend_reason"] as? String)?.contains("Secret Service answered") == true)

                let imported = try await runTool(
                    "vaultctl",
                    ["import", "work", "--issuer", provider.issuer, "--client-id", "confidential-app", "--client-secret",
                     "--scope", "openid", "--scope", "offline_access", "--scope", "email"],
                    input: refreshToken + "\n" + secret + "\n",
                    environment: env
                )
                #expect(imported.status == 0, "\(imported.stderr)")
                #expect(try await keyring.search("work").contains("tokenvault: work"), "one item, named for a person")
                #expect(try await runTool("vaultctl", ["token", "work"], environment: env).status == 0)

                let subscriber = try LineClient(path: daemon.socketPath)
                #expect(await subscriber.call(#"{"id":1,"op":"subscribe"}"#)?["ok"] as? Bool == true)
                let out = try await runTool("vaultctl", ["signout", "work", "--json"], environment: env)
                let reply = try #require(try JSONSerialization.jsonObject(with: Data(out.stdout.utf8)) as? [String: Any])
                let receipt = try #require((reply["accounts"] as? [[String: Any]])?.first)
                #expect(receipt["revoked"] as? String == "yes", "\(reply)")
                #expect(receipt["wiped"] as? [String] == ["memory", "keyring"])
                #expect(reply["notified"] as? Int == 1)
                #expect(await subscriber.readObject()?["event"] as? String == "signed_out")
                let introspection = try await runTool(
                    packageRoot + "/demo/glewlwyd/introspect.py",
                    ["--issuer", provider.issuer, "--client-id", "confidential-app", "--client-secret", secret],
                    input: refreshToken
                )
                #expect(introspection.stdout.contains(#""active": false"#), "\(introspection.stdout)")

                // After a restart: no token anywhere.
                #expect(await daemon.terminate() == 0)
                daemon = try DaemonProcess(folder: folder, environment: ["DBUS_SESSION_BUS_ADDRESS": keyring.bus])
                try await using(daemon) { restarted in
                    #expect(await daemon.waitForLog("listening"))
                    let token = try await runTool("vaultctl", ["token", "work"], environment: ["TOKENVAULT_SOCKET": daemon.socketPath])
                    #expect(token.status == 67, "not signed in: \(token.stderr)")
                    #expect(!(try await keyring.search("work")).contains(refreshToken))
                    let file = try SealedFileStore(
                        path: folder + "/state/tokenvault/vault.sealed",
                        keySource: .keyFile(folder + "/state/tokenvault/vault.key")
                    )
                    #expect(try await file.load("work")?.refreshToken == nil, "nor in the file")
                }
            }
        }
    }

    @Test func migrationBothWaysKeepsEveryTokenSomewhere() async throws {
        try await DaemonKeyring.with { keyring in
            try await using(TestIssuer.start()) { issuer in
                let refreshToken = issuer.mintRefreshToken()
                let folder = try temporaryFolder()
                var daemon = try DaemonProcess(folder: folder, environment: ["DBUS_SESSION_BUS_ADDRESS": keyring.bus])
                #expect(await daemon.waitForLog("listening"))
                var env = ["TOKENVAULT_SOCKET": daemon.socketPath]
                let imported = try await runTool(
                    "vaultctl", ["import", "work", "--issuer", issuer.issuer, "--client-id", TestIssuer.clientID, "--scope", "openid"],
                    input: refreshToken + "\n", environment: env
                )
                #expect(imported.status == 0, "\(imported.stderr)")
                #expect(try await keyring.search("work").contains("tokenvault: work"))
                let vaultFile = folder + "/state/tokenvault/vault.sealed"
                let keyFile = folder + "/state/tokenvault/vault.key"

                let toFile = try await runTool("vaultctl", ["migrate", "--to", "file"], environment: env)
                #expect(toFile.stdout == "moved 1 account from keyring to file\n", "\(toFile.stdout)\(toFile.stderr)")
                #expect(!(try await keyring.search("work")).contains("tokenvault: work"), "gone from the keyring")
                let inFile = try await SealedFileStore(path: vaultFile, keySource: .keyFile(keyFile)).load("work")
                #expect(inFile?.refreshToken == (try SecretBytes(utf8: refreshToken)))
                #expect(try await self.status(env)["backend"] as? String == "file")
                #expect(try await runTool("vaultctl", ["token", "work"], environment: env).status == 0)

                let toKeyring = try await runTool("vaultctl", ["migrate", "--to", "keyring"], environment: env)
                #expect(toKeyring.stdout == "moved 1 account from file to keyring\n", "\(toKeyring.stdout)\(toKeyring.stderr)")
                #expect(try await keyring.search("work").contains("tokenvault: work"))
                #expect(try await SealedFileStore(path: vaultFile, keySource: .keyFile(keyFile)).load("work") == nil)

                // The next start finds the secrets where they were left.
                #expect(await daemon.terminate() == 0)
                daemon = try DaemonProcess(folder: folder, environment: ["DBUS_SESSION_BUS_ADDRESS": keyring.bus])
                try await using(daemon) { restarted in
                    #expect(await daemon.waitForLog("listening"))
                    env = ["TOKENVAULT_SOCKET": daemon.socketPath]
                    let status = try await self.status(env)
                    #expect(status["backend"] as? String == "keyring")
                    #expect((status["backend_reason"] as? String)?.contains("accounts.json") == true, "\(status)")
                    let token = try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: env)
                    #expect(token.status == 0, "\(token.stderr)")
                }
            }
        }
    }

    @Test func aLockedKeyringIsReportedAndAMissingOneIsAClearError() async throws {
        try await DaemonKeyring.with { keyring in
            try await keyring.script("lock")
            try await using(DaemonProcess(folder: try temporaryFolder(), environment: ["DBUS_SESSION_BUS_ADDRESS": keyring.bus])) { daemon in
                #expect(await daemon.waitForLog("listening"))
                let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
                let status = try await self.status(env)
                #expect(status["backend"] as? String == "keyring" && status["locked"] as? Bool == true, "\(status)")
                let add = try await runTool(
                    "vaultctl", ["import", "work", "--issuer", "https://id.example.org", "--client-id", "cli"],
                    input: "rt-123\n", environment: env
                )
                #expect(add.status == 77, "locked: \(add.stderr)")
            }
        }
        // A keyring chosen but not there: vaultd serves, locked, and says why.
        try await using(DaemonProcess(folder: try temporaryFolder(), arguments: ["--backend", "keyring"])) { missing in
            #expect(await missing.waitForLog("listening"), "\(missing.output)")
            #expect(missing.output.contains("the keyring cannot be reached"), "\(missing.output)")
            let status = try await self.status(["TOKENVAULT_SOCKET": missing.socketPath])
            #expect(status["locked"] as? Bool == true, "\(status)")
            #expect((status["backend_reason"] as? String)?.contains("the keyring cannot be reached") == true, "\(status)")
        }
    }

    /// An SSH login to the desktop machine: accounts.json says the secrets
    /// are in the keyring, and there is no session bus. vaultd serves what
    /// needs no secret, says why the rest waits, and gets the secrets once
    /// the keyring can be reached and `unlock` asks for them.
    @Test func aKeyringOutOfReachAtStartIsServedLockedUntilUnlock() async throws {
        try await DaemonKeyring.with { keyring in
            try await using(TestIssuer.start()) { issuer in
                let folder = try temporaryFolder()
                let first = try DaemonProcess(folder: folder, environment: ["DBUS_SESSION_BUS_ADDRESS": keyring.bus])
                #expect(await first.waitForLog("listening"))
                try await importAccount("work", from: issuer, environment: ["TOKENVAULT_SOCKET": first.socketPath])
                #expect(try await keyring.search("work").contains("tokenvault: work"))
                #expect(await first.terminate() == 0)

                // No DBUS_SESSION_BUS_ADDRESS, no $XDG_RUNTIME_DIR/bus, no $DISPLAY to autolaunch one.
                let runtime = try temporaryFolder()
                try await using(DaemonProcess(
                    folder: folder,
                    environment: ["XDG_RUNTIME_DIR": runtime],
                    launcher: ["/usr/bin/env", "-u", "DBUS_SESSION_BUS_ADDRESS", "-u", "DISPLAY", "-u", "WAYLAND_DISPLAY"]
                )) { daemon in
                    #expect(await daemon.waitForLog("listening"), "\(daemon.output)")
                    #expect(daemon.output.contains("the keyring cannot be reached"), "\(daemon.output)")
                    let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
                    let client = try LineClient(path: daemon.socketPath)
                    #expect(await client.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
                    let status = try await self.status(env)
                    #expect(status["backend"] as? String == "keyring" && status["locked"] as? Bool == true, "\(status)")
                    let reason = try #require(status["backend_reason"] as? String)
                    #expect(reason.contains("the keyring cannot be reached") && reason.contains("vaultctl unlock"), "\(reason)")
                    let token = try await runTool("vaultctl", ["token", "work"], environment: env)
                    #expect(token.status == 77, "locked: \(token.stderr)")
                    #expect(token.stderr.contains("the desktop keyring, which vaultd cannot reach"), "\(token.stderr)")
                    #expect(token.stderr.contains("then run: vaultctl unlock"), "\(token.stderr)")
                    let stillOut = try await runTool("vaultctl", ["unlock", "--no-passphrase"], environment: env)
                    // docs/protocol.md: `internal` while the keyring cannot be reached, so 70.
                    #expect(stillOut.status == 70 && stillOut.stderr.contains("could not be reached"), "\(stillOut.status): \(stillOut.stderr)")

                    // The desktop session's bus appears where GLib looks for it without an address.
                    let address = try #require(keyring.bus.split(separator: ",").first.map(String.init))
                    let busPath = try #require(address.hasPrefix("unix:path=") ? String(address.dropFirst("unix:path=".count)) : nil)
                    #expect(symlink(busPath, runtime + "/bus") == 0)
                    let unlocked = try await runTool("vaultctl", ["unlock", "--no-passphrase"], environment: env)
                    #expect(unlocked.status == 0, "\(unlocked.stderr)")
                    #expect(try await self.status(env)["locked"] as? Bool == false)
                    let served = try await runTool("vaultctl", ["token", "work"], environment: env)
                    #expect(served.status == 0, "\(served.stderr)")
                }
            }
        }
    }
}

/// A private keyring for one test; stopped whatever happens.
struct DaemonKeyring {
    let folder: String
    let env: [String: String]
    static let script = packageRoot + "/Tests/Support/keyring/session.sh"

    static func with(_ body: (DaemonKeyring) async throws -> Void) async throws {
        let folder = try temporaryFolder()
        let started = try await runTool(Self.script, ["start", folder])
        guard started.status == 0 else { throw ToolFailure(message: "keyring did not start: \(started.stderr)") }
        var env: [String: String] = [:]
        for line in try String(contentsOfFile: folder + "/env", encoding: .utf8).split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            env[String(line[..<equals])] = String(line[line.index(after: equals)...]).trimmingCharacters(in: CharacterSet(charactersIn: "'"))
        }
        let keyring = DaemonKeyring(folder: folder, env: env)
        do {
            try await body(keyring)
        } catch {
            _ = try? await runTool(Self.script, ["stop", folder])
            throw error
        }
        _ = try? await runTool(Self.script, ["stop", folder])
    }

    var bus: String { self.env["DBUS_SESSION_BUS_ADDRESS"] ?? "" }

    /// What secret-tool finds for tokenvault's items (labels, attributes, secrets).
    func search(_ account: String) async throws -> String {
        let result = try await runTool(
            "/usr/bin/secret-tool",
            ["search", "--all", "application", "tokenvault", "account", account],
            environment: ["DBUS_SESSION_BUS_ADDRESS": self.bus]
        )
        return result.stdout + result.stderr
    }

    func script(_ command: String) async throws {
        let result = try await runTool(Self.script, [command, self.folder])
        #expect(result.status == 0, "\(result.stderr)")
    }
}
