import Foundation
import Testing
import VaultTestKit

/// scripts/demo.sh as a newcomer runs it, with the binaries this suite built:
/// it starts a provider and vaultd and signs `demo` in; a token can be had;
/// `stop` leaves nothing running.
@Suite(.timeLimit(.minutes(2)))
struct DemoTests {
    @Test func theDemoStartsSignsInServesATokenAndStopsEverything() async throws {
        let folder = try temporaryFolder() + "/demo"
        let environment = ["DEMO_BIN": productsDirectory, "DEMO_DIR": folder]
        try await using(Demo(environment: environment)) { demo in
            let started = try await runTool(packageRoot + "/scripts/demo.sh", [], environment: environment)
            let vaultdPID = (try? String(contentsOfFile: folder + "/vaultd.pid", encoding: .utf8)) ?? ""
            let providerPID = (try? String(contentsOfFile: folder + "/provider/glewlwyd.pid", encoding: .utf8)) ?? ""
            #expect(started.status == 0, "\(started.stderr)")
            #expect(started.stdout.contains("vaultctl token demo"), "\(started.stdout)")

            let token = try await runTool("vaultctl", ["token", "demo"], environment: ["TOKENVAULT_SOCKET": folder + "/run/tokenvault/vaultd.sock"])
            #expect(token.status == 0, "\(token.stderr)")
            #expect(token.stdout.split(separator: "\n").count == 1 && token.stdout.count > 20)

            let stopped = try await runTool(packageRoot + "/scripts/demo.sh", ["stop"], environment: environment)
            #expect(stopped.status == 0, "\(stopped.stderr)")
            for pid in [vaultdPID, providerPID].map({ $0.trimmingCharacters(in: .whitespacesAndNewlines) }) {
                #expect(!pid.isEmpty)
                // Gone, or a zombie its new parent has not reaped yet.
                let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
                let state = stat.split(separator: ")").last?.split(separator: " ").first
                #expect(stat.isEmpty || state == "Z", "process \(pid) still runs: \(stat)")
            }
        }
    }
}

/// What `scripts/demo.sh` started, stopped by `scripts/demo.sh stop`.
private struct Demo: Stoppable {
    let environment: [String: String]

    func stop() async {
        _ = try? await runTool(packageRoot + "/scripts/demo.sh", ["stop"], environment: self.environment)
    }
}
