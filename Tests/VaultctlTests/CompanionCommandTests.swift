import Foundation
import Testing
import VaultTestIssuer
import VaultTestKit

/// `vaultctl exec` and `vaultctl git-credential` against a live vaultd, the
/// latter driven by the real git.
@Suite(.timeLimit(.minutes(1)))
struct CompanionCommandTests {
    @Test func execPutsTheTokenInTheEnvironmentOnly() async throws {
        let vault = try await IssuerAndDaemon.start()
        let printed = try await runTool(
            "vaultctl",
            ["exec", "work", "--", "/bin/sh", "-c", #"printf %s "$TOKENVAULT_TOKEN""#],
            environment: vault.env
        )
        #expect(printed.status == 0, "\(printed.stderr)")
        #expect(printed.stdout == vault.token)
        #expect(printed.stderr.isEmpty)

        // Another name; every other variable as it was; PATH is searched.
        let renamed = try await runTool(
            "vaultctl",
            ["exec", "work", "--env", "GIT_TOKEN", "--min-ttl", "120", "--", "sh", "-c",
             #"printf '%s|%s|%s|%s' "$GIT_TOKEN" "${TOKENVAULT_TOKEN-unset}" "$KEEP_ME" "$TOKENVAULT_SOCKET""#],
            environment: vault.env.merging(["KEEP_ME": "kept"]) { $1 }
        )
        #expect(renamed.status == 0, "\(renamed.stderr)")
        #expect(renamed.stdout == "\(vault.token)|unset|kept|\(vault.daemon.socketPath)")

        // vaultctl became the command: same pid, and the token is on no argv.
        let argv = try await runTool(
            "vaultctl",
            ["exec", "work", "--", "/bin/sh", "-c", #"tr '\0' ' ' < /proc/$$/cmdline; grep SigIgn /proc/$$/status; exit 3"#],
            environment: vault.env
        )
        #expect(argv.status == 3, "the command's exit status is vaultctl's")
        #expect(argv.stdout.hasPrefix("/bin/sh -c "), "\(argv.stdout)")
        #expect(!argv.stdout.contains(vault.token))
        // No signal vaultctl ignores leaks into the command: it starts as it would without vaultctl.
        let direct = try await runTool("/bin/sh", ["-c", "grep SigIgn /proc/$$/status"])
        #expect(direct.stdout.hasPrefix("SigIgn:"))
        #expect(argv.stdout.hasSuffix(direct.stdout), "\(argv.stdout) \(direct.stdout)")
        await vault.stop()
    }

    @Test func execFailsLikeAShell() async throws {
        let vault = try await IssuerAndDaemon.start()
        let marker = vault.folder + "/ran"

        let missing = try await runTool("vaultctl", ["exec", "work", "--", "/nonexistent/tool", "x"], environment: vault.env)
        #expect(missing.status == 127)
        #expect(missing.stdout.isEmpty)
        #expect(missing.stderr == "vaultctl: error: cannot run /nonexistent/tool: No such file or directory\n")
        let notInPath = try await runTool("vaultctl", ["exec", "work", "--", "no-such-tool-tv"], environment: vault.env)
        #expect(notInPath.status == 127)
        #expect(notInPath.stderr.split(separator: "\n").count == 1, "\(notInPath.stderr)")

        let script = vault.folder + "/not-executable"
        try "#!/bin/sh\ntouch \(marker)\n".write(toFile: script, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: script)
        let denied = try await runTool("vaultctl", ["exec", "work", "--", script], environment: vault.env)
        #expect(denied.status == 126)
        #expect(denied.stderr == "vaultctl: error: cannot run \(script): Permission denied\n")

        let unknown = try await runTool("vaultctl", ["exec", "nobody", "--", "/bin/sh", "-c", "touch \(marker)"], environment: vault.env)
        #expect(unknown.status == 67)
        #expect(unknown.stdout.isEmpty)
        #expect(unknown.stderr.hasPrefix("vaultctl: error: "))
        #expect(unknown.stderr.split(separator: "\n").count == 1, "\(unknown.stderr)")
        #expect(!FileManager.default.fileExists(atPath: marker), "the command ran without a token")

        let json = try await runTool("vaultctl", ["exec", "work", "--json", "--", "/bin/true"], environment: vault.env)
        #expect(json.status == 64)
        let noCommand = try await runTool("vaultctl", ["exec", "work"], environment: vault.env)
        #expect(noCommand.status == 64)
        let badName = try await runTool("vaultctl", ["exec", "work", "--env", "A=B", "--", "/bin/true"], environment: vault.env)
        #expect(badName.status == 64)
        // Names the loader or a shell reads: the token would be loaded, run or printed (ld.so quotes what it cannot load).
        for name in ["LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "PATH", "PYTHONSTARTUP"] {
            let interpreted = try await runTool("vaultctl", ["exec", "work", "--env", name, "--", "/bin/true"], environment: vault.env)
            #expect(interpreted.status == 64, "\(name)")
            #expect(interpreted.stderr.contains("--env \(name)") && !interpreted.stderr.contains(vault.token), "\(interpreted.stderr)")
        }
        await vault.stop()

        let stopped = try await runTool("vaultctl", ["exec", "work", "--", "/bin/sh", "-c", "touch \(marker)"], environment: vault.env)
        #expect(stopped.status == 69)
        #expect(!FileManager.default.fileExists(atPath: marker))
    }

    @Test func gitCredentialFillGetsTheToken() async throws {
        let vault = try await IssuerAndDaemon.start()
        let home = vault.folder + "/home"
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        let gitconfig = home + "/gitconfig"
        let helper = "!\(productsDirectory)/vaultctl git-credential work --host git.example.org --host 127.0.0.1:8443"
        try "[credential]\n\thelper = \"\(helper)\"\n".write(toFile: gitconfig, atomically: true, encoding: .utf8)
        let gitEnv = vault.env.merging([
            "GIT_CONFIG_GLOBAL": gitconfig, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "HOME": home,
            "GIT_ASKPASS": "", "SSH_ASKPASS": "",
        ]) { $1 }
        let request = "protocol=https\nhost=git.example.org\n\n"

        let fill = try await runTool("/usr/bin/git", ["credential", "fill"], input: request, environment: gitEnv)
        #expect(fill.status == 0, "\(fill.stderr)")
        let lines = fill.stdout.split(separator: "\n").map(String.init)
        #expect(lines.contains("username=oauth2"), "\(fill.stdout)")
        #expect(lines.contains("password=\(vault.token)"))
        #expect(lines.contains("host=git.example.org"))

        let approved = "protocol=https\nhost=git.example.org\nusername=oauth2\npassword=\(vault.token)\n\n"
        let approve = try await runTool("/usr/bin/git", ["credential", "approve"], input: approved, environment: gitEnv)
        #expect(approve.status == 0, "\(approve.stderr)")
        #expect(approve.stdout.isEmpty)
        let reject = try await runTool("/usr/bin/git", ["credential", "reject"], input: approved, environment: gitEnv)
        #expect(reject.status == 0, "\(reject.stderr)")
        #expect(reject.stdout.isEmpty)

        // The helper is set for every URL: any other host, and plain http off
        // loopback, get nothing, and git has no other helper to ask.
        for other in [
            "protocol=https\nhost=attacker.example\n\n", "protocol=http\nhost=git.example.org\n\n",
            "protocol=https\nhost=git.example.org.attacker.example\n\n", "protocol=https\nhost=git.example.org:8443\n\n",
        ] {
            let refused = try await runTool("/usr/bin/git", ["credential", "fill"], input: other, environment: gitEnv)
            #expect(refused.status != 0, "\(other): \(refused.stdout)")
            #expect(!refused.stdout.contains(vault.token) && !refused.stderr.contains(vault.token), "\(other)")
        }
        let loopback = try await runTool(
            "/usr/bin/git", ["credential", "fill"], input: "protocol=http\nhost=127.0.0.1:8443\n\n", environment: gitEnv
        )
        #expect(loopback.stdout.contains("password=\(vault.token)"), "plain http on loopback: \(loopback.stderr)")
        await vault.stop()
    }

    @Test func gitCredentialSpeaksTheHelperProtocol() async throws {
        let vault = try await IssuerAndDaemon.start()
        let sent = "protocol=https\nhost=git.example.org\nusername=ada\n\n"

        let get = try await runTool("vaultctl", ["git-credential", "work", "--host", "git.example.org", "get"], input: sent, environment: vault.env)
        #expect(get.status == 0, "\(get.stderr)")
        #expect(get.stderr.isEmpty)
        let lines = get.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        #expect(lines.count == 4 && lines.last == "", "\(get.stdout)")
        #expect(Array(lines.prefix(2)) == ["username=ada", "password=\(vault.token)"], "git's username comes back, nothing else")
        let expiry = lines.count > 2 ? Int(lines[2].dropFirst("password_expiry_utc=".count)) ?? 0 : 0
        #expect(lines.count > 2 && lines[2].hasPrefix("password_expiry_utc="))
        #expect(expiry > Int(Date().timeIntervalSince1970), "the expiry is in the future")

        let github = try await runTool(
            "vaultctl", ["git-credential", "work", "--host", "git.example.org", "--username", "x-access-token", "get"], input: sent, environment: vault.env
        )
        #expect(github.stdout.hasPrefix("username=x-access-token\npassword=\(vault.token)\n"), "\(github.stdout)")
        // No host sent, or no --host given: no answer.
        let noInput = try await runTool("vaultctl", ["git-credential", "work", "--host", "git.example.org", "get"], environment: vault.env)
        #expect(noInput.status == 0 && noInput.stdout.isEmpty, "\(noInput.stdout)")
        let noHost = try await runTool("vaultctl", ["git-credential", "work", "get"], input: sent, environment: vault.env)
        #expect(noHost.status == 64 && noHost.stdout.isEmpty, "\(noHost.stderr)")
        #expect(noHost.stderr.contains("--host"), "\(noHost.stderr)")

        // store, erase and operations git may add later: input read, nothing echoed.
        for operation in ["store", "erase", "future-op"] {
            let stored = try await runTool(
                "vaultctl", ["git-credential", "work", "--host", "git.example.org", operation],
                input: "protocol=https\nhost=git.example.org\nusername=ada\npassword=hunter2\n\n", environment: vault.env
            )
            #expect(stored.status == 0, "\(operation): \(stored.stderr)")
            #expect(stored.stdout.isEmpty && stored.stderr.isEmpty, "\(operation)")
        }

        let unknown = try await runTool("vaultctl", ["git-credential", "nobody", "--host", "git.example.org", "get"], input: sent, environment: vault.env)
        #expect(unknown.status == 67)
        #expect(unknown.stdout.isEmpty, "git must see no answer")
        #expect(unknown.stderr.hasPrefix("vaultctl: error: "))
        #expect(unknown.stderr.split(separator: "\n").count == 1)
        let json = try await runTool("vaultctl", ["git-credential", "work", "--host", "git.example.org", "--json", "get"], input: sent, environment: vault.env)
        #expect(json.status == 64)
        #expect(json.stdout.isEmpty)
        await vault.stop()

        let stopped = try await runTool("vaultctl", ["git-credential", "work", "--host", "git.example.org", "get"], input: sent, environment: vault.env)
        #expect(stopped.status == 69)
        #expect(stopped.stdout.isEmpty)
    }
}
