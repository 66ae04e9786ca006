import Foundation
import Testing
import VaultTestIssuer
import VaultTestKit

/// `vaultctl signin` as a person and a script use it, against a live vaultd.
@Suite(.timeLimit(.minutes(1)))
struct VaultctlSignInTests {
    static let email = "ada@example.org"

    func daemon(with issuer: TestIssuer) async throws -> DaemonProcess {
        issuer.addNativeUser(Self.email)
        let daemon = try DaemonProcess(folder: try temporaryFolder(), arguments: ["--log-level", "trace"])
        #expect(await daemon.waitForLog("listening"))
        let added = try await runTool(
            "vaultctl",
            ["account", "add", "work", "--issuer", issuer.issuer, "--client-id", TestIssuer.clientID, "--scope", "openid", "--scope", "offline_access"],
            environment: ["TOKENVAULT_SOCKET": daemon.socketPath]
        )
        #expect(added.status == 0, "\(added.stderr)")
        return daemon
    }

    /// A terminal of its own (a tmux server on a private socket), read and
    /// typed into as a person would.
    struct Terminal: Stoppable {
        let name = "tv-" + String(UUID().uuidString.prefix(8))

        func stop() async {
            _ = try? await self.tmux(["kill-server"])
        }

        func tmux(_ arguments: [String]) async throws -> ToolResult {
            try await runTool("/usr/bin/tmux", ["-L", self.name] + arguments)
        }

        func screen() async throws -> String {
            try await self.tmux(["capture-pane", "-p", "-t", "s"]).stdout
        }

        /// Polls the screen, with a deadline, until it shows `text`.
        func waitFor(_ text: String, seconds: Double = 20) async throws -> String {
            var shown = ""
            if try await within(seconds: seconds, { shown = try await self.screen(); return shown.contains(text) }) { return shown }
            Issue.record("the terminal never showed '\(text)'; it shows:\n\(shown)")
            return shown
        }

        func type(_ text: String) async throws {
            _ = try await self.tmux(["send-keys", "-t", "s", "-l", text])
            _ = try await self.tmux(["send-keys", "-t", "s", "Enter"])
        }
    }

    @Test func anInteractiveEmailSignInRecoversFromAWrongCode() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await using(self.daemon(with: issuer)) { daemon in
                try await using(Terminal()) { terminal in
                    let command = "TOKENVAULT_SOCKET=\(daemon.socketPath) \(productsDirectory)/vaultctl signin work --email \(Self.email); echo EXIT=$?; sleep 60"
                    let started = try await terminal.tmux(["new-session", "-d", "-s", "s", "-x", "120", "-y", "30", command])
                    #expect(started.status == 0, "\(started.stderr)")

                    let prompt = try await terminal.waitFor("Code (or r to send a new one):")
                    #expect(prompt.contains("An 8-digit code was sent by email to a**@example.org."), "\(prompt)")
                    let code = try #require(issuer.lastCode(for: Self.email))
                    let wrong = code == "00000000" ? "11111111" : "00000000"
                    try await terminal.type(wrong)
                    _ = try await terminal.waitFor("That code is not right; 4 attempts left.")
                    try await terminal.type(code)
                    let done = try await terminal.waitFor("EXIT=")
                    #expect(done.contains("Signed in to work as \(Self.email)."), "\(done)")
                    #expect(done.contains("EXIT=0"), "\(done)")
                    #expect(!done.contains(code) && !done.contains(wrong), "codes are read without echo")

                    let token = try await runTool("vaultctl", ["token", "work"], environment: ["TOKENVAULT_SOCKET": daemon.socketPath])
                    #expect(token.status == 0, "\(token.stderr)")
                    let log = daemon.output
                    #expect(log.contains("signed in"), "\(log)")
                    #expect(!log.contains(code) && !log.contains("ct-"), "no code or continuation token in the trace-level log")
                    #expect(!log.contains(token.stdout.trimmingCharacters(in: .newlines)), "no access token in the log")
                }
            }
        }
    }

    @Test func aScriptGivesCodesOnStdin() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await using(self.daemon(with: issuer)) { daemon in
                // The code is not known before the sign-in starts, so this script
                // has only wrong ones: each is refused, then stdin ends.
                let result = try await runTool(
                    "vaultctl",
                    ["signin", "work", "--email", Self.email],
                    input: "0000000\n00000000\n",
                    environment: ["TOKENVAULT_SOCKET": daemon.socketPath]
                )
                // Input ended before a right code: EX_NOINPUT.
                #expect(result.status == 66, "\(result.stderr)")
                #expect(result.stdout.isEmpty)
                #expect(result.stderr.contains("vaultctl: error: stdin ended"), "\(result.stderr)")
                #expect(result.stderr.contains("attempts left"), "\(result.stderr)")
                let status = try await runTool("vaultctl", ["status", "--json"], environment: ["TOKENVAULT_SOCKET": daemon.socketPath])
                #expect(status.stdout.contains(#""signed_in":false"#), "\(status.stdout)")
            }
        }
    }

    @Test func anUnknownUserIsOneClearError() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await using(self.daemon(with: issuer)) { daemon in
                let result = try await runTool(
                    "vaultctl",
                    ["signin", "work", "--email", "nobody@example.org", "--json"],
                    environment: ["TOKENVAULT_SOCKET": daemon.socketPath]
                )
                #expect(result.status == 67, "EX_NOUSER: \(result.stderr)")
                #expect(result.stderr.hasPrefix("vaultctl: error: "), "\(result.stderr)")
                #expect(result.stderr.split(separator: "\n").count == 1)
            }
        }
    }

    /// An issuer without RFC 8628: the message says so, with the issuer's
    /// reason and the other ways in; exit 69 (EX_UNAVAILABLE), not 70.
    @Test func aDeviceSignInAtAnIssuerWithoutOneSaysWhatToDoInstead() async throws {
        try await using(TestIssuer.start()) { issuer in
            issuer.setDeviceEndpointOffered(false)
            try await using(self.daemon(with: issuer)) { daemon in
                let result = try await runTool("vaultctl", ["signin", "work", "--device"], environment: ["TOKENVAULT_SOCKET": daemon.socketPath])
                #expect(result.status == 69, "\(result.status): \(result.stderr)")
                #expect(
                    result.stderr.contains("does not offer this (the issuer has no device authorization endpoint)")
                        && result.stderr.contains("vaultctl signin work with --browser, --device or --password"),
                    "\(result.stderr)"
                )
                #expect(result.stderr.split(separator: "\n").count == 1, "\(result.stderr)")
            }
        }
    }
}
