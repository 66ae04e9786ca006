import Foundation
import Glibc
import Testing
@testable import VaultDaemon
import VaultProtocol
@testable import VaultServer
import VaultTestIssuer
import VaultTestKit

/// What vaultd learns of a peer at accept, and how it writes it down.
@Suite(.timeLimit(.minutes(1)))
struct PeerIdentityTests {
    @Test func peerValuesAreEscapedToOneField() {
        #expect(("/usr/bin/curl").escaped(for: .log) == "/usr/bin/curl")
        #expect(("a\nvaultd: error: x").escaped(for: .log) == #"a\nvaultd:\x20error:\x20x"#)
        #expect(("\u{1B}[2J\r\t\\\u{7F}\u{85}\u{2028}é").escaped(for: .log) == #"\x1b[2J\r\t\\\x7f\x85\u2028é"#)
    }

    @Test func theUnitIsTheDeepestServiceOrScopeOfTheSystemdHierarchy() {
        let user = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-4242.scope\n"
        #expect(Peer.unit(inCgroup: user) == "app-gnome-firefox-4242.scope")
        #expect(Peer.unit(inCgroup: "0::/system.slice/backup.service/worker\n") == "backup.service")
        let hybrid = "4:memory:/x\n1:name=systemd:/system.slice/cron.service\n0::/\n"
        #expect(Peer.unit(inCgroup: hybrid) == "cron.service")
        #expect(Peer.unit(inCgroup: "0::/\n") == nil)
        #expect(Peer.unit(inCgroup: "") == nil)
    }

    /// A program whose path holds a newline and a forged log line connects
    /// and is handed a token: every line naming it shows the path escaped,
    /// and the forged line never starts a line of its own.
    @Test func anExecutablePathWithANewlineCannotForgeALogLine() async throws {
        try await using(TestIssuer.start()) { issuer in
            let folder = try temporaryFolder()
            try await using(DaemonProcess(folder: folder, arguments: ["--log-level", "debug"])) { daemon in
                #expect(await daemon.waitForLog("listening"))
                try await importAccount(from: issuer, environment: ["TOKENVAULT_SOCKET": daemon.socketPath])
                let hostile = folder + "/evil\nvaultd: error: forged"
                // A copy, not a link: /proc/PID/exe names the file that runs.
                let python = URL(fileURLWithPath: "/usr/bin/python3").resolvingSymlinksInPath().path
                try FileManager.default.copyItem(atPath: python, toPath: hostile)
                let script = """
                    import socket, sys
                    s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
                    s.sendall(b'{"id":1,"op":"token","account":"work"}\\n')
                    print(s.makefile("rb").readline().decode(), end="")
                    """
                let result = try await runTool(hostile, ["-B", "-c", script, daemon.socketPath])
                #expect(result.stdout.contains(#""ok":true"#), "\(result.stdout) \(result.stderr)")
                #expect(await daemon.waitForLog("token released"))
                let escaped = "exe=\(folder)/evil\\nvaultd:\\x20error:\\x20forged"
                let lines = daemon.output.split(separator: "\n")
                #expect(!lines.contains { $0.hasPrefix("vaultd: error: forged") }, "\(daemon.output)")
                let opened = lines.filter { $0.contains("connection opened") && $0.contains(escaped) }
                let released = lines.filter { $0.contains("token released") && $0.contains(escaped) }
                #expect(opened.count == 1 && released.count == 1, "\(daemon.output)")
                #expect(released.first?.contains("account=work") == true)
                #expect(released.first?.contains("uid=\(getuid())") == true)
            }
        }
    }

    /// A peer started inside a cgroup named like a unit is logged with that unit.
    @Test(.enabled(if: getuid() == 0, "needs root to make a cgroup"))
    func aPeersUnitIsReadFromItsCgroup() async throws {
        let hierarchy = FileManager.default.fileExists(atPath: "/sys/fs/cgroup/systemd/cgroup.procs")
            ? "/sys/fs/cgroup/systemd" : "/sys/fs/cgroup"
        let unit = "tv-\(UUID().uuidString.prefix(8).lowercased()).service"
        let group = hierarchy + "/" + unit
        guard mkdir(group, 0o755) == 0 else {
            Issue.record("cannot make a cgroup at \(group): \(String(cString: strerror(errno)))")
            return
        }
        defer { rmdir(group) }
        try await using(DaemonProcess(folder: try temporaryFolder(), arguments: ["--log-level", "debug"])) { daemon in
            #expect(await daemon.waitForLog("listening"))
            let script = """
                import socket, sys
                s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
                s.sendall(b'{"id":1,"op":"hello"}\\n'); print(s.makefile("rb").readline().decode(), end="")
                """
            let result = try await runTool(
                "/bin/sh",
                ["-c", "echo $$ > \"$0/cgroup.procs\" && exec python3 -B -c \"$1\" \"$2\"", group, script, daemon.socketPath]
            )
            #expect(result.stdout.contains(#""ok":true"#), "\(result.stdout) \(result.stderr)")
            #expect(await daemon.waitForLog("unit=\(unit)"), "\(daemon.output)")
        }
    }
}
