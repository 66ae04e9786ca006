import Foundation
import Glibc
import Testing
import VaultTestIssuer
import VaultTestKit

/// What vaultctl shows and starts: nothing secret on another program's
/// command line (every user reads /proc/PID/cmdline), nothing from an issuer
/// or the daemon reaching the terminal with its control characters, and the
/// sign-out address, which carries the ID token, printed only when asked for.
@Suite(.timeLimit(.minutes(1)))
struct VaultctlOutputTests {
    /// Stand-ins for xdg-open and qrencode, first on PATH, that record their
    /// argv, stdin and (xdg-open) the page they were given, in `records`.
    struct FakePrograms {
        let bin: String
        let records: String

        static func make() throws -> FakePrograms {
            let folder = try temporaryFolder()
            let fakes = FakePrograms(bin: folder + "/bin", records: folder + "/records")
            try FileManager.default.createDirectory(atPath: fakes.bin, withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: fakes.records, withIntermediateDirectories: true)
            try Self.install(fakes.bin + "/xdg-open", Self.xdgOpen)
            try Self.install(fakes.bin + "/qrencode", Self.qrencode)
            return fakes
        }

        private static func install(_ path: String, _ script: String) throws {
            try script.write(toFile: path, atomically: true, encoding: .utf8)
            chmod(path, 0o755)
        }

        /// Records, then (with FAKE_BROWSER_DENY) plays a browser whose user
        /// declines: the loopback redirect with error=access_denied and the
        /// page's state, which ends the flow.
        static let xdgOpen = #"""
            #!/usr/bin/env python3
            import html, json, os, re, sys, urllib.parse, urllib.request
            target = sys.argv[1]
            record = {"argv": sys.argv}
            if target.startswith("file://"):
                path = urllib.parse.unquote(urllib.parse.urlparse(target).path)
                page, folder = open(path).read(), os.stat(os.path.dirname(path))
                info = os.stat(path)
                record.update({"path": path, "page": page, "mode": info.st_mode & 0o7777, "uid": info.st_uid,
                               "folder_mode": folder.st_mode & 0o7777, "folder_uid": folder.st_uid})
                url = html.unescape(re.search(r'url=([^"]+)"', page).group(1))
            else:
                url = target
            out = os.path.join(os.environ["FAKE_RECORDS"], "xdg-open-%d.json" % os.getpid())
            with open(out + ".tmp", "w") as f:
                json.dump(record, f)
            os.rename(out + ".tmp", out)
            if os.environ.get("FAKE_BROWSER_DENY"):
                query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
                back = query["redirect_uri"][0] + "?error=access_denied&state=" + urllib.parse.quote(query["state"][0])
                try:
                    urllib.request.urlopen(back, timeout=10).read()
                except Exception:
                    pass
            """#

        static let qrencode = #"""
            #!/usr/bin/env python3
            import json, os, sys
            record = {"argv": sys.argv, "stdin": sys.stdin.read()}
            out = os.path.join(os.environ["FAKE_RECORDS"], "qrencode.json")
            with open(out + ".tmp", "w") as f:
                json.dump(record, f)
            os.rename(out + ".tmp", out)
            print("QR-PICTURE")
            """#

        /// The environment that puts the fakes first and a display in place.
        func environment(_ extra: [String: String] = [:]) -> [String: String] {
            var env = [
                "PATH": self.bin + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"),
                "FAKE_RECORDS": self.records,
                "DISPLAY": ":99",
            ]
            env.merge(extra) { _, new in new }
            return env
        }

        /// Every record a fake wrote, once `count` of them are there.
        func records(count: Int, seconds: Double = 20) async throws -> [[String: Any]] {
            func names() throws -> [String] {
                try FileManager.default.contentsOfDirectory(atPath: self.records).filter { $0.hasSuffix(".json") }
            }
            _ = try await within(seconds: seconds) { try names().count >= count }
            return try names().sorted().map { name in
                let data = try Data(contentsOf: URL(fileURLWithPath: self.records + "/" + name))
                return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
            }
        }
    }

    /// A private 0700 folder for $XDG_RUNTIME_DIR.
    func runtimeFolder() throws -> String {
        let folder = try temporaryFolder()
        chmod(folder, 0o700)
        return folder
    }

    @Test func theBrowserSignInPutsNothingSecretOnACommandLine() async throws {
        try await using(TestIssuer.start(), DaemonProcess(folder: try temporaryFolder())) { issuer, daemon in
            #expect(await daemon.waitForLog("listening"))
            let socket = ["TOKENVAULT_SOCKET": daemon.socketPath]
            let added = try await runTool(
                "vaultctl",
                ["account", "add", "work", "--issuer", issuer.issuer, "--client-id", TestIssuer.clientID, "--scope", "openid"],
                environment: socket
            )
            #expect(added.status == 0, "\(added.stderr)")

            let fakes = try FakePrograms.make()
            let runtime = try self.runtimeFolder()
            let result = try await runTool(
                "vaultctl",
                ["signin", "work", "--browser"],
                environment: fakes.environment(socket.merging(["XDG_RUNTIME_DIR": runtime, "FAKE_BROWSER_DENY": "1"]) { $1 })
            )
            // The fake browser declined, which ended the flow.
            #expect(result.status == 77, "EX_NOPERM: \(result.stderr)")
            #expect(result.stderr.contains("declined in the browser"), "\(result.stderr)")
            let url = try #require(result.stderr.split(separator: "\n").first { $0.hasPrefix(issuer.issuer + "/authorize?") })
            let query = try #require(URLComponents(string: String(url))?.queryItems)
            let secrets = ["state", "nonce", "code_challenge"].compactMap { name in query.first { $0.name == name }?.value }
            #expect(secrets.count == 3, "\(url)")

            let record = try #require(try await fakes.records(count: 1).first)
            let argv = try #require(record["argv"] as? [String])
            #expect(argv.count == 2 && argv[1].hasPrefix("file://" + runtime + "/"), "\(argv)")
            for value in secrets + ["state=", "nonce=", "code_challenge"] {
                #expect(!argv.joined(separator: " ").contains(value), "\(value) is on xdg-open's command line")
            }
            #expect(record["mode"] as? Int == 0o600, "\(record)")
            #expect(record["folder_mode"] as? Int == 0o700, "\(record)")
            #expect(record["uid"] as? Int == Int(getuid()) && record["folder_uid"] as? Int == Int(getuid()))
            let page = try #require(record["page"] as? String)
            let escapedURL = String(url).replacingOccurrences(of: "&", with: "&amp;")
            #expect(page.contains(#"<meta http-equiv="refresh" content="0; url=\#(escapedURL)">"#), "\(page)")
            // The page goes when the flow ends.
            let path = try #require(record["path"] as? String)
            #expect(!FileManager.default.fileExists(atPath: path))
            #expect(!FileManager.default.fileExists(atPath: (path as NSString).deletingLastPathComponent))
        }
    }

    @Test func theDeviceSignInGivesQrencodeTheAddressOnStdinAndShowsIssuerTextEscaped() async throws {
        let folder = try temporaryFolder()
        let code = "WDJB-MJHT"
        let complete = "https://id.example.org/device?user_code=\(code)"
        let daemon = try ScriptedDaemon(
            path: folder + "/s.sock",
            replies: [
                "signin.start": #""ok":true,"flow":"f1","state":"device_code","account":"work","method":"device","verification_uri":"https://id.example.org/device\u001b[2J\u001b[HFORGED","verification_uri_complete":"\#(complete)","user_code":"\#(code)","expires_in":600"#,
                "signin.wait": #""ok":true,"flow":"f1","state":"signed_in","account":"work","method":"device","username":"ada\u001b]0;owned\u0007\nvaultctl: error: forged""#,
            ]
        )
        defer { daemon.stop() }
        let fakes = try FakePrograms.make()
        try await using(VaultctlSignInTests.Terminal()) { terminal in
            let env = fakes.environment(["TOKENVAULT_SOCKET": daemon.path]).map { "\($0.key)='\($0.value)'" }.joined(separator: " ")
            let command = "env \(env) \(productsDirectory)/vaultctl signin work --device; echo EXIT=$?; sleep 60"
            let started = try await terminal.tmux(["new-session", "-d", "-s", "s", "-x", "200", "-y", "40", command])
            #expect(started.status == 0, "\(started.stderr)")

            let screen = try await terminal.waitFor("EXIT=")
            #expect(screen.contains("EXIT=0"), "\(screen)")
            #expect(screen.contains(#"https://id.example.org/device\u{1B}[2J\u{1B}[HFORGED"#), "\(screen)")
            #expect(screen.contains(#"Signed in to work as ada\u{1B}]0;owned\u{7}\nvaultctl: error: forged."#), "\(screen)")
            #expect(screen.contains("QR-PICTURE"), "\(screen)")
            let record = try #require(try await fakes.records(count: 1).first)
            let argv = try #require(record["argv"] as? [String])
            #expect(!argv.joined(separator: " ").contains(code), "the user code is on qrencode's command line: \(argv)")
            #expect(record["stdin"] as? String == complete)
        }
    }

    @Test func textFromTheDaemonReachesTheTerminalEscapedAndJSONAsItIs() async throws {
        let folder = try temporaryFolder()
        let statusReply = #""ok":true,"backend":"keyring","backend_reason":"why\u001b[31m\nforged: line","locked":false,"key_source":null,"accounts":[{"name":"work","issuer":"https://id.example.org\u009b2J","signed_in":true,"username":"ada\u001b]0;owned\u0007","access_token_expires_at":null,"needs_reauth":false}]"#
        let daemon = try ScriptedDaemon(
            path: folder + "/s.sock",
            replies: [
                "status": statusReply,
                "claims": #""ok":true,"claims":{"name":"Ada\u001b[8m","sub\r":"1"}"#,
                "token": #""ok":false,"error":{"code":"idp_error","message":"the issuer refused: \u001b[2Jgone\nvaultctl: error: forged","error":"x","error_description":"y"}"#,
            ]
        )
        defer { daemon.stop() }
        let env = ["TOKENVAULT_SOCKET": daemon.path]

        let status = try await runTool("vaultctl", ["status"], environment: env)
        #expect(status.status == 0, "\(status.stderr)")
        #expect(!status.stdout.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 || $0.value == 0x9B })
        #expect(
            status.stdout == """
                vault: unlocked (keyring backend)
                  why\\u{1B}[31m\\nforged: line
                work: signed in as ada\\u{1B}]0;owned\\u{7} at https://id.example.org\\u{9B}2J

                """,
            "\(status.stdout)"
        )
        let claims = try await runTool("vaultctl", ["claims", "work"], environment: env)
        #expect(claims.stdout == "name: Ada\\u{1B}[8m\nsub\\r: 1\n", "\(claims.stdout)")

        let token = try await runTool("vaultctl", ["token", "work"], environment: env)
        #expect(token.status == 69)  // idp_error: EX_UNAVAILABLE (docs/protocol.md)
        #expect(token.stderr == "vaultctl: error: the issuer refused: \\u{1B}[2Jgone\\nvaultctl: error: forged\n", "\(token.stderr)")

        // --json is the reply as it came, JSON-escaped already.
        let json = try await runTool("vaultctl", ["status", "--json"], environment: env)
        #expect(json.stdout == #"{"id":1,"# + statusReply + "}\n", "\(json.stdout)")
    }

    /// docs/protocol.md, Error codes: the exit code follows the error, and
    /// for `idp_error` the issuer's own `error`.
    @Test(arguments: [
        ("idp_error", "access_denied", 77),
        ("idp_error", "unsupported", 69),
        ("idp_error", "untrusted_response", 76),
        ("locked", nil, 77),
        ("not_signed_in", nil, 67),
        ("idp_unavailable", nil, 75),
        ("internal", nil, 70),
        ("storage_full", nil, 74),
        ("storage_denied", nil, 73),
    ] as [(String, String?, Int32)])
    func theExitCodeFollowsTheError(code: String, issuerError: String?, exit: Int32) async throws {
        let folder = try temporaryFolder()
        let detail = issuerError.map { #","error":"\#($0)","error_description":"the reason""# } ?? ""
        let daemon = try ScriptedDaemon(
            path: folder + "/s.sock",
            replies: ["token": #""ok":false,"error":{"code":"\#(code)","message":"what happened; what to do"\#(detail)}"#]
        )
        defer { daemon.stop() }
        let token = try await runTool("vaultctl", ["token", "work"], environment: ["TOKENVAULT_SOCKET": daemon.path])
        #expect(token.status == exit, "\(code) \(issuerError ?? ""): \(token.status) \(token.stderr)")
        #expect(token.stderr == "vaultctl: error: what happened; what to do\n", "\(token.stderr)")
        #expect(token.stdout.isEmpty)
    }

    @Test func signOutOpensTheSignOutPageAndPrintsItsAddressOnlyWhenAsked() async throws {
        try await using(TestIssuer.start(), DaemonProcess(folder: try temporaryFolder())) { issuer, daemon in
            #expect(await daemon.waitForLog("listening"))
            let socket = ["TOKENVAULT_SOCKET": daemon.socketPath]
            for name in ["work", "home", "lab"] {
                try await importAccount(name, from: issuer, environment: socket)
                // A refresh brings the ID token that the sign-out address carries.
                #expect(try await runTool("vaultctl", ["token", name], environment: socket).status == 0)
            }
            let fakes = try FakePrograms.make()
            let runtime = try self.runtimeFolder()
            let env = fakes.environment(socket.merging(["XDG_RUNTIME_DIR": runtime]) { $1 })

            let out = try await runTool("vaultctl", ["signout", "work"], environment: env)
            #expect(out.status == 0, "\(out.stderr)")
            #expect(!(out.stdout + out.stderr).contains("id_token_hint") && !(out.stdout + out.stderr).contains("eyJ"), "\(out.stdout)")
            #expect(out.stdout.contains("opened the issuer's sign-out page in the browser"), "\(out.stdout)")
            let record = try #require(try await fakes.records(count: 1).first)
            let argv = try #require(record["argv"] as? [String]).joined(separator: " ")
            #expect(!argv.contains("id_token_hint") && !argv.contains("eyJ"), "\(argv)")
            #expect(record["mode"] as? Int == 0o600 && record["folder_mode"] as? Int == 0o700, "\(record)")
            #expect((record["page"] as? String)?.contains(issuer.issuer + "/logout?client_id=") == true)
            #expect((record["page"] as? String)?.contains("id_token_hint=eyJ") == true)

            // Without a display it says what to do, and prints nothing secret either.
            let headless = socket.merging(["DISPLAY": "", "WAYLAND_DISPLAY": ""]) { $1 }
            let unopened = try await runTool("vaultctl", ["signout", "home"], environment: headless)
            #expect(unopened.status == 0, "\(unopened.stderr)")
            #expect(unopened.stdout.contains("--print-end-session-url") && !unopened.stdout.contains("eyJ"), "\(unopened.stdout)")

            let asked = try await runTool("vaultctl", ["signout", "lab", "--print-end-session-url"], environment: headless)
            #expect(asked.stdout.contains("open: \(issuer.issuer)/logout?client_id="), "\(asked.stdout)")
            #expect(asked.stdout.contains("id_token_hint=eyJ"), "\(asked.stdout)")
        }
    }
}

/// A stand-in for vaultd that answers each op with a canned reply (the
/// fields after `"id":N,`), to show vaultctl what a hostile issuer's text
/// looks like once it has passed through the daemon.
final class ScriptedDaemon: @unchecked Sendable {
    let path: String
    private let fd: Int32
    private let replies: [String: String]

    init(path: String, replies: [String: String]) throws {
        self.path = path
        self.replies = replies
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        let bound = bind(fd, unixPath: path)
        guard bound == 0, listen(fd, 16) == 0 else {
            close(fd)
            throw ToolFailure(message: "cannot listen on \(path)")
        }
        self.fd = fd
        Thread { self.acceptLoop() }.start()
    }

    func stop() {
        shutdown(self.fd, Int32(SHUT_RDWR))
    }

    private func acceptLoop() {
        while true {
            let client = Glibc.accept(self.fd, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                close(self.fd)
                return
            }
            Thread { self.serve(client) }.start()
        }
    }

    private func serve(_ client: Int32) {
        defer { close(client) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(client, &chunk, chunk.count)
            if n <= 0 { return }
            buffer.append(contentsOf: chunk[0..<n])
            while let newline = buffer.firstIndex(of: 0x0A) {
                let line = Data(buffer[..<newline])
                buffer.removeSubrange(...newline)
                let request = (try? JSONSerialization.jsonObject(with: line)) as? [String: Any] ?? [:]
                let id = (request["id"] as? Int).map(String.init) ?? "null"
                let op = request["op"] as? String ?? ""
                let fields = self.replies[op] ?? #""ok":false,"error":{"code":"unknown_op","message":"not scripted"}"#
                let reply = Array(#"{"id":\#(id),\#(fields)}"#.utf8) + [0x0A]
                _ = reply.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
        }
    }
}
