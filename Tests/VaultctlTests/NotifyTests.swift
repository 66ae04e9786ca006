import Foundation
import Testing
import VaultTestIssuer
import VaultTestKit

/// `vaultctl notify` against a real notification server: dunst on a private
/// session bus and display (Tests/Support/notify), driven as a person would.
@Suite(.timeLimit(.minutes(2)))
struct NotifyTests {
    /// A desktop of its own: a session bus, Xvfb and dunst.
    struct Desktop: Stoppable {
        let folder: String
        let env: [String: String]
        static let scripts = packageRoot + "/Tests/Support/notify"

        static func start() async throws -> Desktop {
            let folder = try temporaryFolder() + "/n"
            let started = try await runTool(Self.scripts + "/start.sh", [folder])
            guard started.status == 0 else { throw ToolFailure(message: "the notification server did not start: \(started.stderr)") }
            return Desktop(folder: folder, env: try environment(in: folder + "/env"))
        }

        func stop() async {
            _ = try? await runTool(Self.scripts + "/stop.sh", [self.folder])
        }

        /// How many notifications dunst has displayed so far (each id once).
        var displayedCount: Int {
            (try? FileManager.default.contentsOfDirectory(atPath: self.folder + "/shown"))?.count ?? 0
        }

        func ctl(_ arguments: [String]) async throws -> ToolResult {
            try await runTool(Self.scripts + "/ctl.sh", arguments, environment: self.env)
        }

        func showing() async throws -> [[String: Any]] {
            try await self.ctl(["showing", self.folder]).stdout.split(separator: "\n").compactMap {
                try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            }
        }
    }

    /// Ends `vaultctl notify` (and the sign-in it started) on `socket`: it never ends by itself.
    static func stop(_ socket: String) async {
        _ = try? await runTool("/usr/bin/pkill", ["-f", "--", "--socket " + socket])
    }

    /// `body`, and when it fails, notify ended first, so that the test's wait on it ends.
    static func ending(_ socket: String, _ body: () async throws -> Void) async throws {
        do {
            try await body()
        } catch {
            await Self.stop(socket)
            throw error
        }
    }

    @Test func aRejectedSignInShowsOneNotificationWhoseActionStartsTheSignIn() async throws {
        let vault = try await IssuerAndDaemon.start(arguments: ["--log-level", "debug"])
        let desktop = try await Desktop.start()
        let fakes = try VaultctlOutputTests.FakePrograms.make()
        let socket = vault.daemon.socketPath
        var env = vault.env.merging(desktop.env) { $1 }
        env["PATH"] = fakes.bin + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        env["FAKE_RECORDS"] = fakes.records
        let screenshot = vault.folder + "/notification.png"
        async let notify = runTool("vaultctl", ["notify", "--socket", socket, "--every", "10"], environment: env)
        try await Self.ending(socket) {
            try await eventually { vault.daemon.output.contains("subscribed") }

            // The issuer rejects the refresh token: the account needs a sign-in, and the desktop says so, once.
            vault.issuer.setTokenBehaviour(.invalidGrant)
            let rejected = try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: vault.env)
            #expect(rejected.status == 77, "\(rejected.stderr)")
            try await eventually { desktop.displayedCount >= 1 }
            let shown = try await desktop.showing()
            #expect(shown.count == 1, "\(shown)")
            let notification = try #require(shown.first)
            #expect(notification["summary"] as? String == "Sign in to work", "\(notification)")
            #expect((notification["body"] as? String)?.contains("'work'") == true, "\(notification)")
            #expect(notification["timeout_ms"] as? Int == 0, "it stays until the account is signed in")
            let id = try #require(notification["id"] as? Int)
            #expect(try await desktop.ctl(["screenshot", desktop.folder, screenshot]).status == 0)

            // The same rejection again: still the one notification.
            #expect(try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: vault.env).status == 77)
            #expect(try await desktop.showing().count == 1)

            // "Sign in", from the notification's menu: vaultctl signin work runs (the browser flow opens the browser).
            #expect(try await desktop.ctl(["invoke", desktop.folder, "\(id)", "signin"]).status == 0)
            try await eventually {
                ((try? FileManager.default.contentsOfDirectory(atPath: fakes.records)) ?? []).contains { $0.hasPrefix("xdg-open") }
            }
            try await eventually { try await desktop.showing().isEmpty }
        }
        await Self.stop(socket)
        let ended = try await notify
        #expect(!ended.stdout.contains(vault.token) && !ended.stderr.contains(vault.token), "no token in any output")
        // TOKENVAULT_NOTIFY_SCREENSHOT=FILE keeps the screen with the notification on it.
        if let keep = ProcessInfo.processInfo.environment["TOKENVAULT_NOTIFY_SCREENSHOT"] {
            try? FileManager.default.copyItem(atPath: screenshot, toPath: keep)
        }
        await desktop.stop()
        await vault.stop()
    }

    /// Any program on the session bus can send what dunst sends when "Sign in"
    /// is picked. From another connection than the service that answered
    /// `Notify`, broadcast or addressed to notify alone, it starts nothing and
    /// the notification stays, said once on stderr; dunst's own still works.
    @Test func anActionSentByAnotherPeerOnTheBusStartsNothing() async throws {
        let vault = try await IssuerAndDaemon.start(arguments: ["--log-level", "debug"])
        let desktop = try await Desktop.start()
        let fakes = try VaultctlOutputTests.FakePrograms.make()
        let socket = vault.daemon.socketPath
        var env = vault.env.merging(desktop.env) { $1 }
        env["PATH"] = fakes.bin + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        env["FAKE_RECORDS"] = fakes.records
        let errors = vault.folder + "/notify.err"
        env["ERR"] = errors
        env["VAULTCTL"] = productsDirectory + "/vaultctl"
        env["SOCKET"] = socket
        let started = {
            ((try? FileManager.default.contentsOfDirectory(atPath: fakes.records)) ?? []).contains { $0.hasPrefix("xdg-open") }
        }
        async let notify = runTool("/bin/bash", ["-c", #"exec "$VAULTCTL" notify --socket "$SOCKET" --every 10 2> "$ERR""#], environment: env)
        try await Self.ending(socket) {
            try await eventually { vault.daemon.output.contains("subscribed") }
            vault.issuer.setTokenBehaviour(.invalidGrant)
            #expect(try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: vault.env).status == 77)
            try await eventually { desktop.displayedCount >= 1 }
            let id = try #require(try await desktop.showing().first?["id"] as? Int)

            // The notification's own id, from dbus-send: ignored, once said.
            for key in ["signin", "default"] {
                let forged = try await desktop.ctl(["forge", desktop.folder, "\(id)", key])
                #expect(forged.status == 0, "\(forged.stderr)")
            }
            let ignored = { ((try? String(contentsOfFile: errors, encoding: .utf8)) ?? "").contains("ignoring signals from :1.") }
            try await eventually { ignored() || started() }
            #expect(try await within(seconds: 2, started) == false, "a forged action started vaultctl signin")
            #expect(try await desktop.showing().map { $0["id"] as? Int } == [id])
            let said = try String(contentsOfFile: errors, encoding: .utf8)
            #expect(said.components(separatedBy: "ignoring").count == 2, "said once: \(said)")

            // The same action from dunst starts the sign-in.
            #expect(try await desktop.ctl(["invoke", desktop.folder, "\(id)", "signin"]).status == 0)
            try await eventually(started)
        }
        await Self.stop(socket)
        _ = try await notify
        await desktop.stop()
        await vault.stop()
    }

    /// A peer that keeps sending neither fills notify's memory nor holds it
    /// up: what it sent while notify was busy (here: stopped) is dropped as
    /// it is read, also while a call waits for its reply, and the next
    /// account that needs a sign-in is shown at once.
    @Test func whatAPeerKeepsSendingIsDroppedNotKept() async throws {
        let vault = try await IssuerAndDaemon.start(arguments: ["--log-level", "debug"])
        try await importAccount("home", from: vault.issuer, environment: vault.env)
        let desktop = try await Desktop.start()
        let socket = vault.daemon.socketPath
        var env = vault.env.merging(desktop.env) { $1 }
        let errors = vault.folder + "/notify.err"
        let pidFile = vault.folder + "/notify.pid"
        env["ERR"] = errors
        env["PID"] = pidFile
        env["VAULTCTL"] = productsDirectory + "/vaultctl"
        env["SOCKET"] = socket
        let script = #"echo $$ > "$PID"; exec "$VAULTCTL" notify --socket "$SOCKET" 2> "$ERR""#
        async let notify = runTool("/bin/bash", ["-c", script], environment: env)
        try await Self.ending(socket) {
            try await eventually { vault.daemon.output.contains("subscribed") }
            vault.issuer.setTokenBehaviour(.invalidGrant)
            #expect(try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: vault.env).status == 77)
            try await eventually { desktop.displayedCount >= 1 }
            let pid = try String(contentsOfFile: pidFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)

            // While notify is stopped: work's sign-out, whose event makes it
            // close the notification when it runs again, before it reads the
            // bus (a call, whose reply comes after all the bus queued); then
            // the flood, which the bus queues for it.
            #expect(try await runTool("/bin/kill", ["-STOP", pid]).status == 0)
            #expect(try await runTool("vaultctl", ["signout", "work"], environment: vault.env).status == 0)
            let flood = try await desktop.ctl(["flood", desktop.folder, "4"])
            #expect(flood.status == 0, "\(flood.stderr)")
            #expect(Int(flood.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 > 50_000, "sent: \(flood.stdout)")
            #expect(try await runTool("/bin/kill", ["-CONT", pid]).status == 0)

            // Then home needs a sign-in: shown once the flood is read, not held up by it.
            #expect(try await runTool("vaultctl", ["token", "home", "--force-refresh"], environment: vault.env).status == 77)
            try await eventually { try await desktop.showing().map { $0["summary"] as? String } == ["Sign in to home"] }
            let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
            let peak = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }.flatMap { Int($0.split(separator: " ")[1]) }
            #expect(try #require(peak) < 40 * 1024, "notify's peak memory: \(peak ?? 0) kB")
            let said = try String(contentsOfFile: errors, encoding: .utf8)
            #expect(said.components(separatedBy: "ignoring signals from :1.").count == 2, "said once: \(said)")
        }
        await Self.stop(socket)
        _ = try await notify
        await desktop.stop()
        await vault.stop()
    }

    /// notify waits for no answer of the notification service. Stopped
    /// (SIGSTOP), dunst answers `Notify` late: the notification of an account
    /// signed out meanwhile is closed when its id comes. Never answered, the
    /// reminder is printed after five seconds, and vaultd's events are served
    /// meanwhile.
    @Test func aSlowOrSilentNotificationServiceHoldsNothingUp() async throws {
        let vault = try await IssuerAndDaemon.start(arguments: ["--log-level", "debug"])
        try await importAccount("home", from: vault.issuer, environment: vault.env)
        let desktop = try await Desktop.start()
        let socket = vault.daemon.socketPath
        var env = vault.env.merging(desktop.env) { $1 }
        let out = vault.folder + "/notify.out"
        let errors = vault.folder + "/notify.err"
        env["OUT"] = out
        env["ERR"] = errors
        env["VAULTCTL"] = productsDirectory + "/vaultctl"
        env["SOCKET"] = socket
        let dunst = try #require(desktop.env["NOTIFY_DUNST_PID"])
        let printed = { (try? String(contentsOfFile: out, encoding: .utf8)) ?? "" }
        // Every Notify call on the bus, as dbus-monitor sees it (the bus lets it eavesdrop).
        let calls = vault.folder + "/notify.calls"
        let monitorPID = vault.folder + "/monitor.pid"
        env["CALLS"] = calls
        env["MONITOR_PID"] = monitorPID
        let monitorScript = #"echo $$ > "$MONITOR_PID"; exec dbus-monitor --session "type='method_call',member='Notify'" > "$CALLS""#
        async let monitor = runTool("/bin/bash", ["-c", monitorScript], environment: env)
        let notifyCalls = { ((try? String(contentsOfFile: calls, encoding: .utf8)) ?? "").components(separatedBy: "member=Notify").count - 1 }
        // It loses its unique name as it becomes a monitor: from then on it sees every call.
        try await eventually { ((try? String(contentsOfFile: calls, encoding: .utf8)) ?? "").contains("member=NameLost") }
        let script = #"exec "$VAULTCTL" notify --socket "$SOCKET" > "$OUT" 2> "$ERR""#
        async let notify = runTool("/bin/bash", ["-c", script], environment: env)
        do {
            try await Self.ending(socket) {
                try await eventually { vault.daemon.output.contains("subscribed") }
                vault.issuer.setTokenBehaviour(.invalidGrant)

                // work's Notify waits for dunst; work is signed out meanwhile.
                #expect(try await runTool("/bin/kill", ["-STOP", dunst]).status == 0)
                #expect(try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: vault.env).status == 77)
                try await eventually { notifyCalls() >= 1 }
                #expect(try await runTool("vaultctl", ["signout", "work"], environment: vault.env).status == 0)
                #expect(try await runTool("/bin/kill", ["-CONT", dunst]).status == 0)
                try await eventually { desktop.displayedCount >= 1 }
                try await eventually { try await desktop.showing().isEmpty }
                #expect(printed().isEmpty)

                // home's is never answered.
                #expect(try await runTool("/bin/kill", ["-STOP", dunst]).status == 0)
                #expect(try await runTool("vaultctl", ["token", "home", "--force-refresh"], environment: vault.env).status == 77)
                try await eventually { printed().hasSuffix("Run: vaultctl signin home\n") }
                #expect(printed().hasPrefix("Sign in to home: ") && printed().split(separator: "\n").count == 1, "\(printed())")
                let said = try String(contentsOfFile: errors, encoding: .utf8)
                #expect(said.contains("the notification service refused (") && said.contains("; printing instead"), "\(said)")
            }
        } catch {
            _ = try? await runTool("/bin/kill", ["-CONT", dunst])
            throw error
        }
        _ = try? await runTool("/bin/kill", ["-CONT", dunst])
        if let pid = try? String(contentsOfFile: monitorPID, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines) {
            _ = try? await runTool("/bin/kill", [pid])
        }
        _ = try? await monitor
        await Self.stop(socket)
        _ = try await notify
        await desktop.stop()
        await vault.stop()
    }

    /// Without a session bus: what would have been shown goes to stdout.
    @Test func withoutASessionBusItPrintsWhatItWouldShow() async throws {
        let vault = try await IssuerAndDaemon.start(arguments: ["--log-level", "debug"])
        let socket = vault.daemon.socketPath
        var env = vault.env
        env["DBUS_SESSION_BUS_ADDRESS"] = ""
        env["XDG_RUNTIME_DIR"] = vault.folder
        let out = vault.folder + "/notify.out"
        env["OUT"] = out
        env["VAULTCTL"] = productsDirectory + "/vaultctl"
        env["SOCKET"] = socket
        let expected = "Sign in to work: tokenvault: the issuer asks you to sign in to 'work' as ada again. Run: vaultctl signin work\n"
        async let notify = runTool("/bin/bash", ["-c", #"exec "$VAULTCTL" notify --socket "$SOCKET" > "$OUT""#], environment: env)
        try await Self.ending(socket) {
            try await eventually { vault.daemon.output.contains("subscribed") }
            vault.issuer.setTokenBehaviour(.invalidGrant)
            #expect(try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: vault.env).status == 77)
            try await eventually { (try? String(contentsOfFile: out, encoding: .utf8)) == expected }
            // Signing out on purpose is quiet: nothing more is printed for it.
            #expect(try await runTool("vaultctl", ["signout", "work"], environment: vault.env).status == 0)
            try await eventually { vault.daemon.output.contains("signed out") }
        }
        await Self.stop(socket)
        let ended = try await notify
        #expect(try String(contentsOfFile: out, encoding: .utf8) == expected)
        #expect(ended.stderr.contains("no session bus"), "\(ended.stderr)")
        await vault.stop()
    }

    /// The username is the issuer's text: printed without a notification
    /// server, it is escaped as every line vaultctl prints, so an issuer
    /// cannot set the terminal's title, forge a line or reorder one.
    @Test func withoutASessionBusTheIssuersUsernameIsPrintedEscaped() async throws {
        let issuer = try await TestIssuer.start()
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder, arguments: ["--log-level", "debug"])
        #expect(await daemon.waitForLog("listening"))
        let vaultEnv = ["TOKENVAULT_SOCKET": daemon.socketPath]
        let refreshToken = issuer.mintRefreshToken(subject: "ada\u{1B}]0;owned\u{7}\nRun: evil\u{202E}olleh")
        let imported = try await runTool(
            "vaultctl",
            ["import", "work", "--issuer", issuer.issuer, "--client-id", TestIssuer.clientID, "--scope", "openid"],
            input: refreshToken + "\n",
            environment: vaultEnv
        )
        #expect(imported.status == 0, "\(imported.stderr)")
        #expect(try await runTool("vaultctl", ["token", "work"], environment: vaultEnv).status == 0)
        let out = folder + "/notify.out"
        let env = vaultEnv.merging([
            "DBUS_SESSION_BUS_ADDRESS": "", "XDG_RUNTIME_DIR": folder, "OUT": out,
            "VAULTCTL": productsDirectory + "/vaultctl", "SOCKET": daemon.socketPath,
        ]) { $1 }
        let expected = "Sign in to work: tokenvault: the issuer asks you to sign in to 'work' as "
            + #"ada\u{1B}]0;owned\u{7}\nRun: evil\u{202E}olleh again. Run: vaultctl signin work"# + "\n"
        async let notify = runTool("/bin/bash", ["-c", #"exec "$VAULTCTL" notify --socket "$SOCKET" > "$OUT""#], environment: env)
        try await Self.ending(daemon.socketPath) {
            try await eventually { daemon.output.contains("subscribed") }
            issuer.setTokenBehaviour(.invalidGrant)
            #expect(try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: vaultEnv).status == 77)
            try await eventually { (try? String(contentsOfFile: out, encoding: .utf8))?.isEmpty == false }
        }
        await Self.stop(daemon.socketPath)
        _ = try await notify
        #expect(try String(contentsOfFile: out, encoding: .utf8) == expected)
        #expect(await daemon.terminate() == 0)
        await issuer.stop()
    }
}
