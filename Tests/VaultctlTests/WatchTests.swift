import Foundation
import Testing
import VaultProtocol
import VaultServer
import VaultTestIssuer
import VaultTestKit

/// `vaultctl watch`: vaultd's events for people, for scripts (--json), and
/// a command per event (--exec), in order, never with a token.
@Suite(.timeLimit(.minutes(1)))
struct WatchTests {
    @Test func eventsReachTheTextTheJSONAndTheCommandInOrder() async throws {
        let vault = try await IssuerAndDaemon.start(arguments: ["--log-level", "debug"])
        let (daemon, folder, env) = (vault.daemon, vault.folder, vault.env)
        let record = folder + "/exec.log"
        let script = #"printf '%s %s %s %s\n' "$TOKENVAULT_EVENT" "$TOKENVAULT_ACCOUNT" "${TOKENVAULT_EXPIRES_AT:+expiry}" "$(env | grep -c '^TOKENVAULT_TOKEN')" >> "$0""#
        async let text = runTool("vaultctl", ["watch", "work"], environment: env)
        async let json = runTool("vaultctl", ["watch", "--json"], environment: env)
        async let exec = runTool("vaultctl", ["watch", "--exec", script.replacingOccurrences(of: "\"$0\"", with: "'\(record)'")], environment: env)
        try await eventually { daemon.output.components(separatedBy: "subscribed").count - 1 >= 3 }

        let forced = try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: env)
        #expect(forced.status == 0, "\(forced.stderr)")
        let token = forced.stdout.trimmingCharacters(in: .newlines)
        let out = try await runTool("vaultctl", ["signout", "work"], environment: env)
        #expect(out.status == 0, "\(out.stderr)")
        // The stream ends when vaultd stops: each watcher exits 69 for its supervisor.
        try await eventually { (try? String(contentsOfFile: record, encoding: .utf8))?.contains("signed_out") == true }
        #expect(await daemon.terminate() == 0)

        let (textResult, jsonResult, execResult) = try await (text, json, exec)
        for result in [textResult, jsonResult, execResult] {
            #expect(result.status == 69, "\(result.status) \(result.stderr)")
            #expect(!result.stdout.contains(token) && !result.stderr.contains(token), "no token in any output")
        }
        let lines = textResult.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 2, "\(lines)")
        #expect(lines.first?.hasPrefix("token_refreshed work expires_at=") == true, "\(lines)")
        #expect(lines.last == "signed_out work", "\(lines)")
        let objects = jsonResult.stdout.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        #expect(objects.map { $0["event"] as? String } == ["token_refreshed", "signed_out"], "\(jsonResult.stdout)")
        let ran = try String(contentsOfFile: record, encoding: .utf8)
        #expect(ran == "token_refreshed work expiry 0\nsigned_out work  0\n", "one run per event, in order: \(ran)")
        await vault.stop()
    }

    @Test func aCommandThatRunsTooLongIsKilledAndTheNextEventStillRuns() async throws {
        let vault = try await IssuerAndDaemon.start(arguments: ["--log-level", "debug"])
        let (daemon, folder, env) = (vault.daemon, vault.folder, vault.env)
        let record = folder + "/exec.log"
        // The first event's command waits on a fifo no one writes: only the timeout ends it.
        let fifo = folder + "/never"
        #expect(mkfifo(fifo, 0o600) == 0)
        let script = "echo \"$TOKENVAULT_EVENT\" >> '\(record)'; [ \"$TOKENVAULT_EVENT\" = token_refreshed ] && read x < '\(fifo)'; true"
        async let exec = runTool("vaultctl", ["watch", "--exec", script, "--exec-timeout", "1"], environment: env)
        try await eventually { daemon.output.contains("subscribed") }
        #expect(try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: env).status == 0)
        #expect(try await runTool("vaultctl", ["signout", "work"], environment: env).status == 0)
        try await eventually { (try? String(contentsOfFile: record, encoding: .utf8))?.contains("signed_out") == true }
        #expect(await daemon.terminate() == 0)
        let result = try await exec
        #expect(result.stderr.contains("ran past 1 s and was killed"), "\(result.stderr)")
        #expect(try String(contentsOfFile: record, encoding: .utf8) == "token_refreshed\nsigned_out\n")
        await vault.stop()
    }

    /// A watcher that stops reading falls behind: vaultd drops it with
    /// `overloaded`, and once it reads again it exits 75, for its supervisor
    /// to start it anew (it never skips events silently).
    @Test func aWatcherThatFellBehindExits75() async throws {
        let hub = EventHub(maximumBacklog: 16)
        try await withVault(events: hub) { vault in
            let go = vault.folder + "/go"
            #expect(mkfifo(go, 0o600) == 0)
            let env = ["TOKENVAULT_SOCKET": vault.socketPath, "VAULTCTL": productsDirectory + "/vaultctl", "GO": go]
            // Its reader reads nothing until told to: the pipe, then the socket, fill.
            async let watch = runTool(
                "/bin/bash", ["-c", #""$VAULTCTL" watch | { read -r _ < "$GO"; cat > /dev/null; }; echo "exit=${PIPESTATUS[0]}""#],
                environment: env
            )
            try await eventually { hub.emit(Event(.tokenRefreshed, account: "work")) == 1 }
            var emitted = 1
            while emitted < 1_000_000, hub.emit(Event(.tokenRefreshed, account: "work")) == 1 { emitted += 1 }
            #expect(emitted < 1_000_000, "vaultd dropped the watcher")
            let writer = open(go, O_WRONLY)
            #expect(writer >= 0)
            _ = write(writer, "go\n", 3)
            close(writer)
            let result = try await watch
            #expect(result.stdout == "exit=75\n", "\(result.stdout) \(result.stderr)")
            #expect(result.stderr.contains("vaultctl: error:"), "\(result.stderr)")
        }
    }
}
