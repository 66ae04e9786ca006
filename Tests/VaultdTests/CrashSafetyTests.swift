import Foundation
import Glibc
import Testing
import VaultCrypto
import VaultStore
import VaultTestKit

/// vaultd killed with SIGKILL in the middle of its refresh cycle, against
/// Glewlwyd with a rotating client (every refresh spends the refresh token
/// and hands out its successor) and 2-second access tokens. After each kill
/// the vault must open, the record must be whole, and the session must
/// survive unless the kill fell between the issuer's answer and the durable
/// write of the rotated token; Glewlwyd's database tells which (the token
/// the vault held is spent and has exactly one successor, which the vault
/// never held). Tests/Soak/crash-safety.sh does the same hundreds of times.
@Suite(.timeLimit(.minutes(2)))
struct CrashSafetyTests {
    static let kills = 12

    /// What happened to the session across one kill.
    enum Outcome: Equatable {
        case survived
        case lostInTheWindow
    }

    @Test func killedMidRefreshTheVaultStaysWholeAndOnlyTheWindowLosesTheSession() async throws {
        try await Glewlwyd.with(accessTokenSeconds: 2) { provider in
            let client = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_ID"])
            let secret = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_SECRET"])
            let folder = try temporaryFolder()
            try await using(RunningDaemon(try DaemonProcess(folder: folder, arguments: ["--backend", "file"]))) { running in
                #expect(await running.daemon.waitForLog("listening"))
                let env = ["TOKENVAULT_SOCKET": running.daemon.socketPath]
                let added = try await runTool(
                    "vaultctl",
                    ["account", "add", "work", "--issuer", provider.issuer, "--client-id", client, "--client-secret",
                     "--scope", "openid", "--scope", "offline_access", "--scope", "email"],
                    input: secret + "\n",
                    environment: env
                )
                #expect(added.status == 0, "\(added.stderr)")
                try await self.signIn(env)

                var outcomes: [Outcome] = []
                var served = 0
                for round in 0..<Self.kills {
                    // Two companions ask with the default min_ttl (60 s, longer than
                    // the tokens live), so every answer is a fresh refresh. The kill
                    // comes either right after the Nth answer (the next refresh is
                    // then at whatever stage it has reached) or the moment Glewlwyd
                    // logs a rotation, which is nearly always before vaultd has it.
                    let daemon = running.daemon
                    let (answers, answered) = AsyncStream.makeStream(of: Void.self)
                    let companions = (0..<2).map { _ in Task { await Self.askUntilClosed(daemon.socketPath, answered) } }
                    let tokens = Task {
                        var results: [Companion] = []
                        for companion in companions { results.append(await companion.value) }
                        answered.finish()
                        return results
                    }
                    if round % 2 == 0 {
                        let wanted = Int.random(in: 1...6)
                        var iterator = answers.makeAsyncIterator()
                        var got = 0
                        while got < wanted, await iterator.next() != nil { got += 1 }
                        #expect(got == wanted, "round \(round): the companions stopped after \(got) tokens")
                        kill(daemon.pid, SIGKILL)
                    } else {
                        let watcher = try await runTool(
                            packageRoot + "/demo/glewlwyd/on-rotation.py",
                            [provider.folder, "--pid", String(daemon.pid), "--timeout", "20"]
                        )
                        #expect(watcher.status == 0, "round \(round): \(watcher.stdout) \(watcher.stderr)")
                        kill(daemon.pid, SIGKILL)
                    }
                    #expect(await daemon.waitForExit() == 128 + SIGKILL)
                    for companion in await tokens.value {
                        served += companion.served
                        #expect(companion.refused == nil, "round \(round): \(companion.refused ?? "")\n\(daemon.output.suffix(2000))")
                    }

                    // vaultd is dead: the sealed file opens and the record is whole.
                    let store = try SealedFileStore(
                        path: folder + "/state/tokenvault/vault.sealed",
                        keySource: .keyFile(folder + "/state/tokenvault/vault.key")
                    )
                    let secrets = try #require(try await store.load("work"), "round \(round): the record is gone")
                    let held = try #require(secrets.refreshToken, "round \(round): no refresh token in the record").unsafeString()
                    #expect(secrets.clientSecret != nil, "round \(round): the client secret is gone")

                    // Restart: the vault opens, the account is there and signed in.
                    running.daemon = try DaemonProcess(folder: folder, arguments: ["--backend", "file"])
                    try #require(await running.daemon.waitForLog("listening"), "round \(round): \(running.daemon.output)")
                    let checker = try LineClient(path: running.daemon.socketPath)
                    let status = try #require(await checker.call(#"{"id":"s","op":"status"}"#))
                    let account = try #require((status["accounts"] as? [[String: Any]])?.first, "\(status)")
                    #expect(account["name"] as? String == "work")
                    #expect(account["signed_in"] as? Bool == true, "round \(round): \(status)")
                    #expect(status["locked"] as? Bool == false)

                    // The session goes on with the token the vault held, unless the
                    // issuer had already spent it on an answer the vault never wrote.
                    let token = try #require(await checker.call(#"{"id":"c","op":"token","account":"work","min_ttl":1}"#))
                    if token["ok"] as? Bool == true {
                        outcomes.append(.survived)
                        continue
                    }
                    #expect(token.errorCode == "reauth_required", "round \(round): \(token)")
                    let chain = try await self.chain(of: held, at: provider)
                    #expect(chain["known"] as? Bool == true, "round \(round): \(chain)")
                    #expect(chain["enabled"] as? Bool == false, "round \(round): \(chain)")
                    #expect(chain["successors"] as? Int == 1, "round \(round): lost outside the window: \(chain)")
                    outcomes.append(.lostInTheWindow)
                    try await self.signIn(["TOKENVAULT_SOCKET": running.daemon.socketPath])
                }
                #expect(outcomes.count == Self.kills)
                let lostAfterAnswers = outcomes.enumerated().filter { $0.offset % 2 == 0 && $0.element == .lostInTheWindow }.count
                let lostAtRotation = outcomes.enumerated().filter { $0.offset % 2 == 1 && $0.element == .lostInTheWindow }.count
                print(
                    "crash safety: \(outcomes.count) kills, \(served) tokens served; sessions lost in the window: "
                        + "\(lostAfterAnswers) of \(outcomes.count / 2) killed after an answer, "
                        + "\(lostAtRotation) of \(outcomes.count - outcomes.count / 2) killed as the issuer rotated"
                )
            }
        }
    }

    /// Signs ada in with her password through vaultctl, and checks a token comes.
    func signIn(_ env: [String: String]) async throws {
        let signedIn = try await runTool("vaultctl", ["signin", "work", "--password", "--username", "ada"], input: "correct horse\n", environment: env)
        try #require(signedIn.status == 0, "\(signedIn.stderr)")
        let token = try await runTool("vaultctl", ["token", "work", "--min-ttl", "1"], environment: env)
        try #require(token.status == 0, "\(token.stderr)")
    }

    /// Where `refreshToken` stands in its rotation chain at the provider.
    func chain(of refreshToken: String, at provider: Glewlwyd) async throws -> [String: Any] {
        let result = try await runTool(
            packageRoot + "/demo/glewlwyd/refresh-chain.py",
            [provider.folder],
            input: refreshToken + "\n"
        )
        try #require(result.status == 0, "\(result.stderr)")
        return try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
    }

    /// A companion: asks for tokens, one after another, until the daemon
    /// closes the connection (it was killed); tells `answered` of each token
    /// and returns how many it got.
    static func askUntilClosed(_ socketPath: String, _ answered: AsyncStream<Void>.Continuation) async -> Companion {
        let client: LineClient
        do {
            client = try LineClient(path: socketPath)
        } catch {
            return Companion(served: 0, refused: "connect: \(error)")
        }
        var served = 0
        while let reply = await client.call(#"{"id":"o","op":"token","account":"work"}"#) {
            guard reply["ok"] as? Bool == true else { return Companion(served: served, refused: "\(reply)") }
            served += 1
            answered.yield()
        }
        return Companion(served: served, refused: nil)
    }

    /// What a companion got before the connection closed, and the answer
    /// that stopped it early, if one did.
    struct Companion {
        var served: Int
        var refused: String?
    }
}

/// The daemon of the moment, replaced at each restart; the suite's cleanup
/// stops whichever is current.
private final class RunningDaemon: Stoppable, @unchecked Sendable {
    private let lock = NSLock()
    private var current: DaemonProcess

    init(_ daemon: DaemonProcess) { self.current = daemon }

    /// Ends whichever vaultd runs now.
    func stop() async { _ = await self.daemon.terminate() }

    var daemon: DaemonProcess {
        get { self.lock.withLock { self.current } }
        set { self.lock.withLock { self.current = newValue } }
    }
}
