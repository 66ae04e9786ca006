import Foundation
import Testing
import VaultTestKit

/// A short run of Tests/Soak/soak.sh: vaultd with three accounts on Glewlwyd's
/// rotating client, clients asking them for mixed scope sets with a small
/// min_ttl, sign-outs and sign-ins along the way, and SIGKILLs of vaultd.
/// No refresh token may be presented twice, no token served or stored after
/// a sign-out, no session lost but in a kill window, and vaultd may not exit
/// by itself. People run the same script for ten minutes and 200 clients.
@Suite(.timeLimit(.minutes(2)))
struct SoakTests {
    static let seconds = 25
    static let clients = 20
    /// About how often vaultd is killed: two or three times in the run.
    static let killSeconds = 8

    /// The figures that must stay 0.
    static let goals = [
        "refresh tokens presented twice",
        "tokens served after a sign-out",
        "tokens stored after a sign-out",
        "sessions lost outside the kill window",
        "crashes",
    ]

    @Test func mixedScopesSignOutsAndKillsSpendEachRefreshTokenOnce() async throws {
        let result = try await runTool(
            packageRoot + "/Tests/Soak/soak.sh",
            [String(Self.seconds)],
            environment: [
                "SOAK_BIN": productsDirectory,
                "SOAK_CLIENTS": String(Self.clients),
                "SOAK_KILL_SECONDS": String(Self.killSeconds),
            ]
        )
        let figures = Self.figures(result.stdout)
        print("soak (\(Self.seconds) s, \(Self.clients) clients):\n\(result.stdout)")
        for goal in Self.goals {
            #expect(figures[goal] == "0", "\(goal): \(figures[goal] ?? "missing")\n\(result.stderr)")
        }
        #expect((Int(figures["requests served"] ?? "") ?? 0) > 0, "\(result.stdout)\n\(result.stderr)")
        #expect(figures["kills"]?.hasPrefix("0 ") == false, "no kill in the run: \(result.stdout)")
        #expect(result.status == 0, "\(result.stdout)\n\(result.stderr)")
    }

    /// The `name: value` lines the soak prints.
    static func figures(_ output: String) -> [String: String] {
        var figures: [String: String] = [:]
        for line in output.split(separator: "\n") {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            figures[String(line[..<colon])] = value
        }
        return figures
    }
}
