import Foundation
import Testing
import VaultTestIssuer
import VaultTestKit

/// vaultctl's hot commands (`token`, `exec`, `git-credential`,
/// `exec-credential`) are parsed by hand before ArgumentParser starts. The
/// same command line must give the same stdout, stderr and exit status
/// either way, and everything the quick parser does not take plainly must
/// reach ArgumentParser. `VAULTCTL_PARSER=full` forces ArgumentParser;
/// `VAULTCTL_PARSER=quick` makes a declined command line exit 64.
@Suite(.timeLimit(.minutes(2)))
struct VaultctlQuickStartTests {
    private struct Case {
        var arguments: [String]
        var input = ""
    }

    private static func run(_ item: Case, _ env: [String: String], parser: String?) async throws -> ToolResult {
        var env = env
        if let parser { env["VAULTCTL_PARSER"] = parser }
        return try await runTool("vaultctl", item.arguments, input: item.input, environment: env)
    }

    static func withoutCountdown(_ text: String) -> String {
        text.replacingOccurrences(of: #""expires_in":[0-9]+"#, with: #""expires_in":_"#, options: .regularExpression)
    }

    @Test func theQuickParserAnswersAsArgumentParserDoes() async throws {
        let vault = try await IssuerAndDaemon.start()
        let (daemon, folder, env) = (vault.daemon, vault.folder, vault.env)
        let gitRequest = "protocol=https\nhost=git.example.org\n\n"
        let taken: [Case] = [
            Case(arguments: ["token", "work"]),
            Case(arguments: ["token", "work", "--header"]),
            Case(arguments: ["token", "--json", "work"]),
            Case(arguments: ["token", "work", "--min-ttl", "60", "--socket", daemon.socketPath]),
            Case(arguments: ["token", "--min-ttl=0", "--socket=\(daemon.socketPath)", "work"]),
            Case(arguments: ["token", "nobody"]),
            Case(arguments: ["token", "work", "--socket", folder + "/nothing.sock"]),
            Case(arguments: ["exec-credential", "work"]),
            Case(arguments: ["exec-credential", "work", "--json", "--min-ttl", "30"]),
            Case(arguments: ["exec-credential", "nobody"]),
            Case(arguments: ["git-credential", "work", "--host", "git.example.org", "get"], input: gitRequest),
            Case(arguments: ["git-credential", "--username", "x-access-token", "work", "--host=git.example.org", "get"], input: gitRequest),
            Case(arguments: ["git-credential", "--host", "a.example", "--host", "git.example.org", "work", "get"], input: gitRequest),
            Case(arguments: ["git-credential", "work", "--host", "other.example", "get"], input: gitRequest),
            Case(arguments: ["git-credential", "work", "--host", "git.example.org", "store"], input: gitRequest + "password=secret\n"),
            Case(arguments: ["git-credential", "nobody", "--host", "git.example.org", "get"], input: gitRequest),
            Case(arguments: ["exec", "work", "--", "/bin/sh", "-c", "echo \"$TOKENVAULT_TOKEN\" \"$@\"", "sh", "--help", ""]),
            Case(arguments: ["exec", "--env", "MY_TOKEN", "work", "--min-ttl=10", "--", "/bin/sh", "-c", "echo \"$MY_TOKEN\""]),
            Case(arguments: ["exec", "work", "--", folder + "/no-such-program"]),
            Case(arguments: ["exec", "nobody", "--", "/bin/true"]),
        ]
        for item in taken {
            let full = try await Self.run(item, env, parser: "full")
            let quick = try await Self.run(item, env, parser: "quick")
            let usual = try await Self.run(item, env, parser: nil)
            #expect(quick.status != 64, "\(item.arguments) was declined: \(quick.stderr)")
            for result in [quick, usual] {
                // Compared as Bools: stdout holds a token, which must not reach test output.
                // `expires_in` counts down between the runs; everything else must match.
                let sameOut = Self.withoutCountdown(result.stdout) == Self.withoutCountdown(full.stdout)
                let sameErr = result.stderr == full.stderr
                #expect(result.status == full.status, "\(item.arguments)")
                #expect(sameOut, "stdout differs for \(item.arguments)")
                #expect(sameErr, "stderr differs for \(item.arguments)")
            }
        }

        let declined: [Case] = [
            Case(arguments: []),
            Case(arguments: ["--version"]),
            Case(arguments: ["--help"]),
            Case(arguments: ["help", "token"]),
            Case(arguments: ["status", "--json"]),
            Case(arguments: ["token"]),
            Case(arguments: ["token", "--help"]),
            Case(arguments: ["token", "-h"]),
            Case(arguments: ["token", "help"]),
            Case(arguments: ["token", "work", "help"]),
            Case(arguments: ["token", "work", "extra"]),
            Case(arguments: ["token", "work", "--bogus"]),
            Case(arguments: ["token", "work", "-x"]),
            Case(arguments: ["token", "work", "--json=yes"]),
            Case(arguments: ["token", "work", "--header", "--header"]),
            Case(arguments: ["token", "work", "--min-ttl", "86401"]),
            Case(arguments: ["token", "work", "--min-ttl", "-5"]),
            Case(arguments: ["token", "work", "--min-ttl", "soon"]),
            Case(arguments: ["token", "work", "--min-ttl", "+5"]),
            Case(arguments: ["token", "work", "--socket"]),
            Case(arguments: ["token", "work", "--socket", ""]),
            Case(arguments: ["token", "work", "--socket", "a", "--socket", daemon.socketPath]),
            Case(arguments: ["token", "work", "--scope", "--json"]),
            Case(arguments: ["token", "--", "work"]),
            Case(arguments: ["token", ""]),
            Case(arguments: ["exec-credential"]),
            Case(arguments: ["exec-credential", "work", "--header"]),
            Case(arguments: ["git-credential", "work"]),
            Case(arguments: ["git-credential", "work", "get"], input: gitRequest),
            Case(arguments: ["git-credential", "work", "get", "--json"], input: gitRequest),
            Case(arguments: ["git-credential", "work", "get", "--username", "a\nb"], input: gitRequest),
            Case(arguments: ["exec", "work"]),
            Case(arguments: ["exec", "work", "--"]),
            Case(arguments: ["exec", "work", "--", ""]),
            Case(arguments: ["exec", "work", "--json", "--", "/bin/true"]),
            Case(arguments: ["exec", "work", "--env", "1TOKEN", "--", "/bin/true"]),
            Case(arguments: ["exec", "work", "--env", "LD_PRELOAD", "--", "/bin/true"]),
            Case(arguments: ["exec", "work", "/bin/true"]),
        ]
        for item in declined {
            let full = try await Self.run(item, env, parser: "full")
            let quick = try await Self.run(item, env, parser: "quick")
            let usual = try await Self.run(item, env, parser: nil)
            #expect(quick.status == 64, "\(item.arguments) was taken by the quick parser")
            #expect(quick.stdout.isEmpty, "\(item.arguments)")
            #expect(quick.stderr == "vaultctl: error: the quick parser declined these arguments\n")
            let sameOut = usual.stdout == full.stdout
            let sameErr = usual.stderr == full.stderr
            #expect(usual.status == full.status, "\(item.arguments)")
            #expect(sameOut, "stdout differs for \(item.arguments)")
            #expect(sameErr, "stderr differs for \(item.arguments)")
        }

        // The usual path still gives ArgumentParser's help, errors and exit codes.
        let help = try await runTool("vaultctl", ["token", "--help"], environment: env)
        #expect(help.status == 0)
        #expect(help.stdout.contains("USAGE: vaultctl token"), "\(help.stdout)")
        let unknown = try await runTool("vaultctl", ["token", "work", "--bogus"], environment: env)
        #expect(unknown.status == 64)
        #expect(unknown.stderr.hasPrefix("Error: Unknown option '--bogus'"), "\(unknown.stderr)")
        let range = try await runTool("vaultctl", ["token", "work", "--min-ttl", "86401"], environment: env)
        #expect(range.status == 64)
        #expect(range.stderr.contains("--min-ttl is 0 to 86400 seconds"), "\(range.stderr)")

        await vault.stop()
    }

    /// Every subcommand keeps the name it had when ArgumentParser derived it.
    @Test func everyCommandKeepsItsName() async throws {
        let help = try await runTool("vaultctl", ["--help"])
        #expect(help.status == 0)
        for name in [
            "status", "signin", "signout", "migrate", "token", "account", "import", "claims", "userinfo", "lock",
            "unlock", "exec", "git-credential", "exec-credential", "share", "unshare",
        ] {
            #expect(help.stdout.contains("\n  \(name) "), "\(name) is missing from: \(help.stdout)")
        }
        let account = try await runTool("vaultctl", ["account", "--help"])
        for name in ["add", "list", "remove"] {
            #expect(account.stdout.contains("\n  \(name) "), "\(name) is missing from: \(account.stdout)")
        }
    }
}
