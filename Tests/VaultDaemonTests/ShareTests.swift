import Foundation
import Glibc
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultTestIssuer
import VaultTestKit

/// `vaultctl share`: an extra socket that serves only named accounts'
/// tokens, used as a forwarded socket through a real OpenSSH and ended by
/// `unshare` or its ttl.
@Suite(.timeLimit(.minutes(1)))
struct ShareTests {
    typealias Setup = IssuerAndVault

    func setUp(clock: any WallClock = SystemClock()) async throws -> Setup {
        let issuer = try await TestIssuer.start()
        let vault = try await InProcessVault.start(clock: clock)
        for name in ["work", "home"] {
            _ = try await vault.broker.add(
                AccountAddition(
                    configuration: AccountConfiguration(name: name, issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid", "profile", "offline_access"]),
                    refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
                )
            )
        }
        let folder = try temporaryFolder()
        #expect(mkdir(folder + "/share", 0o700) == 0)
        return Setup(issuer: issuer, vault: vault, folder: folder)
    }

    @Test func aShareServesOnlyItsAccountsAndOps() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            let id = try await setup.share(["work", "--socket", path, "--scope", "openid", "--scope", "offline_access"])
            #expect(id.hasPrefix("s-"), "\(id)")
            #expect(try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int == 0o600)

            let client = try LineClient(path: path)
            #expect(await client.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
            let token = try #require(await client.call(#"{"id":2,"op":"token","account":"work"}"#))
            #expect(token["scope"] as? String == "openid offline_access", "\(token)")
            let wider = try #require(await client.call(#"{"id":3,"op":"token","account":"work","scope":"openid profile"}"#))
            #expect(wider.errorCode == "forbidden")
            // Another account and no account at all are refused alike: a share reveals no names.
            let home = try #require(await client.call(#"{"id":4,"op":"token","account":"home"}"#))
            let nobody = try #require(await client.call(#"{"id":5,"op":"token","account":"nobody"}"#))
            #expect(home.errorCode == "forbidden" && nobody.errorCode == "forbidden")
            #expect((home["error"] as? [String: Any])?["message"] as? String == ((nobody["error"] as? [String: Any])?["message"] as? String)?.replacingOccurrences(of: "nobody", with: "home"))
            let status = try #require(await client.call(#"{"id":6,"op":"status"}"#))
            #expect((status["accounts"] as? [[String: Any]])?.compactMap { $0["name"] as? String } == ["work"])
            for line in [
                #"{"id":7,"op":"signout","account":"work"}"#, #"{"id":8,"op":"refresh_token","account":"work"}"#,
                #"{"id":9,"op":"account.remove","name":"work"}"#, #"{"id":10,"op":"signin.start","account":"work","method":"device"}"#,
                #"{"id":11,"op":"share.open","accounts":["home"],"socket":"/tmp/x.sock"}"#, #"{"id":12,"op":"share.list"}"#,
                #"{"id":13,"op":"lock"}"#, #"{"id":14,"op":"migrate","to":"file"}"#, #"{"id":15,"op":"claims","account":"work"}"#,
            ] {
                #expect(await client.call(line)?.errorCode == "forbidden", "\(line)")
            }
            #expect(await setup.vault.broker.status().accounts.allSatisfy(\.signedIn), "nothing was signed out")

            let listed = try await runTool("vaultctl", ["share", "--list"], environment: setup.environment)
            #expect(listed.stdout.contains(id) && listed.stdout.contains(path), "\(listed.stdout)")
            let ended = try await runTool("vaultctl", ["unshare", id], environment: setup.environment)
            #expect(ended.status == 0, "\(ended.stderr)")
            #expect(await client.readLine() == nil, "the share's connections are closed")
            #expect(!FileManager.default.fileExists(atPath: path), "the share's socket is removed")
        }
    }

    /// vaultd stops as it does for the main socket: a request under way on
    /// a share's socket is answered before its connection closes.
    @Test func aShareRequestUnderWayIsAnsweredAtTheStop() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path])
            let client = try LineClient(path: path)
            setup.issuer.setTokenBehaviour(.gate)
            client.send(#"{"id":1,"op":"token","account":"work"}"# + "\n")
            try await eventually { setup.issuer.heldRequestCount == 1 }
            let stop = Task { await setup.vault.stop() }
            // The share stopped accepting (its socket is gone); its request waits at the issuer.
            try await eventually { !FileManager.default.fileExists(atPath: path) }
            setup.issuer.openGate()
            let answer = try #require(await client.readObject(), "the share's connection closed unanswered")
            #expect(answer["ok"] as? Bool == true, "\(answer)")
            await stop.value
        }
    }

    @Test func aShareEndsByItselfAtItsTTL() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/t.sock"
            _ = try await setup.share(["work", "--socket", path, "--ttl", "1"])
            // On a loaded machine the second may be over before this connects or is answered;
            // the socket goes and a connection made in time is closed, either way.
            let client = try? LineClient(path: path)
            client?.send(#"{"id":1,"op":"hello"}"# + "\n")
            try await eventually { !FileManager.default.fileExists(atPath: path) }
            if let client {
                var line = await client.readObject()
                if line != nil {
                    #expect(line?["ok"] as? Bool == true)
                    line = await client.readObject()
                }
                #expect(line == nil, "the share's connections are closed at its ttl")
            }
        }
    }

    @Test func aShareRefusesAFolderOthersCanWriteTo() async throws {
        try await using(self.setUp()) { setup in
            #expect(mkdir(setup.folder + "/open", 0o777) == 0 && chmod(setup.folder + "/open", 0o777) == 0)
            let refused = try await runTool(
                "vaultctl", ["share", "work", "--socket", setup.folder + "/open/s.sock"], environment: setup.environment
            )
            // share.open answers bad_request: 65.
            #expect(refused.status == 65, "\(refused.stderr)")
            #expect(refused.stderr.contains("/open is writable by its group or others"), "\(refused.stderr)")
        }
    }

    @Test func aRemoteHostGetsTokensThroughAForwardedShare() async throws {
        try await using(self.setUp()) { setup in
            let sshd = try await SSHServer.start(in: setup.folder)
            defer { sshd.stop() }
            let share = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", share])
            // The "remote" side: a private folder where ssh -R puts the forwarded socket.
            let remote = setup.folder + "/remote"
            #expect(mkdir(remote, 0o700) == 0)
            let vaultctl = productsDirectory + "/vaultctl"
            let script = """
                for i in $(seq 200); do [ -S \(remote)/vaultd.sock ] && break; sleep 0.05; done
                export TOKENVAULT_SOCKET=\(remote)/vaultd.sock
                \(vaultctl) token work; echo "token: $?"
                \(vaultctl) token home; echo "home: $?"
                \(vaultctl) signout work; echo "signout: $?"
                """
            let session = try await sshd.run(script, forwarding: "\(remote)/vaultd.sock:\(share)", environment: setup.environment)
            let expected = try await setup.vault.rooms.token(TokenRequest(account: "work"), for: testPeer).accessToken.unsafeString()
            let lines = session.stdout.split(separator: "\n").map(String.init)
            #expect(lines.first == expected, "\(session.stdout)\n\(session.stderr)")
            #expect(lines.contains("token: 0"))
            #expect(lines.contains("home: 77"), "forbidden: \(session.stdout)")
            #expect(lines.contains("signout: 77"), "forbidden: \(session.stdout)")
            #expect(await setup.vault.broker.status().accounts.allSatisfy(\.signedIn))
        }
    }
}

/// A private sshd on 127.0.0.1 for one test: its own host key, one user key
/// for the user running the tests, and stream-local forwarding allowed.
struct SSHServer {
    let folder: String
    let port: Int
    let pid: pid_t

    static func start(in parent: String) async throws -> SSHServer {
        let folder = parent + "/sshd"
        #expect(mkdir(folder, 0o700) == 0)
        for key in ["host", "user"] {
            let made = try await runTool("/usr/bin/ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", folder + "/" + key])
            try #require(made.status == 0, "\(made.stderr)")
        }
        try FileManager.default.copyItem(atPath: folder + "/user.pub", toPath: folder + "/authorized_keys")
        _ = mkdir("/run/sshd", 0o755)
        let port = try freePort()
        let config = """
            Port \(port)
            ListenAddress 127.0.0.1
            HostKey \(folder)/host
            AuthorizedKeysFile \(folder)/authorized_keys
            PidFile \(folder)/sshd.pid
            UsePAM no
            StrictModes no
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            PermitRootLogin prohibit-password
            AllowStreamLocalForwarding yes
            StreamLocalBindUnlink yes
            StreamLocalBindMask 0177
            """
        try config.write(toFile: folder + "/sshd_config", atomically: true, encoding: .utf8)
        let started = try await runTool(
            "/bin/sh",
            ["-c", "/usr/sbin/sshd -D -f \"$0/sshd_config\" -E \"$0/sshd.log\" </dev/null >/dev/null 2>&1 & echo $!", folder]
        )
        let pid = try #require(pid_t(started.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
        try await eventually { isListening(port: port) || kill(pid, 0) != 0 }
        try #require(kill(pid, 0) == 0, "sshd did not start: \((try? String(contentsOfFile: folder + "/sshd.log", encoding: .utf8)) ?? "")")
        return SSHServer(folder: folder, port: port, pid: pid)
    }

    func stop() {
        kill(self.pid, SIGTERM)
    }

    /// Runs `script` on "the remote host" through ssh, with `-R forwarding`.
    func run(_ script: String, forwarding: String, environment: [String: String]) async throws -> ToolResult {
        try await runTool(
            "/usr/bin/ssh",
            [
                "-F", "/dev/null", "-i", self.folder + "/user", "-p", String(self.port),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                "-o", "ExitOnForwardFailure=yes", "-o", "LogLevel=ERROR",
                "-R", forwarding, "\(String(cString: getpwuid(getuid()).pointee.pw_name))@127.0.0.1", script,
            ],
            environment: environment
        )
    }
}

/// A TCP port on 127.0.0.1 nobody listens on now.
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
        }
    }
    guard bound else { throw ToolFailure(message: "no free port") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
func isListening(port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = UInt16(port).bigEndian
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}

extension IssuerAndVault {
    /// `vaultctl share ...`; returns the share's id.
    func share(_ arguments: [String]) async throws -> String {
        let shared = try await runTool("vaultctl", ["share"] + arguments, environment: self.environment)
        try #require(shared.status == 0, "\(shared.stderr)")
        return shared.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
