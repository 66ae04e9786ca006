import Foundation
import Testing
import VaultTestIssuer
import VaultTestKit

/// clients/tokenvault.py, the stdlib-only Python client companions copy,
/// against a live vaultd.
@Suite(.timeLimit(.minutes(1)))
struct PythonClientTests {
    static let clients = packageRoot + "/clients"

    /// python3 from PATH, with -B so no __pycache__ lands in the tree.
    func python(_ arguments: [String], environment: [String: String]) async throws -> ToolResult {
        try await runTool("/usr/bin/env", ["python3", "-B"] + arguments, environment: environment)
    }

    @Test func thePythonClientServesTheTokenVaultctlServes() async throws {
        let hadBytecode = FileManager.default.fileExists(atPath: Self.clients + "/__pycache__")
        try await using(TestIssuer.start()) { issuer in
            let folder = try temporaryFolder()
            // The socket where the client looks by default: $XDG_RUNTIME_DIR/tokenvault/vaultd.sock.
            try FileManager.default.createDirectory(
                atPath: folder + "/tokenvault",
                withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700]
            )
            try await using(DaemonProcess(folder: folder, socketPath: folder + "/tokenvault/vaultd.sock")) { daemon in
                #expect(await daemon.waitForLog("listening"))
                let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
                try await importAccount(from: issuer, environment: env)
                let vaultctl = try await runTool("vaultctl", ["token", "work"], environment: env)
                #expect(vaultctl.status == 0, "\(vaultctl.stderr)")
                let accessToken = vaultctl.stdout.trimmingCharacters(in: .newlines)
                #expect(accessToken.hasPrefix("at-"))

                // The command line: the bare token, the same one.
                let printed = try await self.python([Self.clients + "/tokenvault.py", "work"], environment: env)
                #expect(printed.status == 0, "\(printed.stderr)")
                #expect(printed.stdout == accessToken + "\n")
                #expect(printed.stderr.isEmpty)
                // Found through XDG_RUNTIME_DIR when TOKENVAULT_SOCKET is empty, as vaultctl does.
                let byDefault = try await self.python(
                    [Self.clients + "/tokenvault.py", "work"],
                    environment: ["TOKENVAULT_SOCKET": "", "XDG_RUNTIME_DIR": folder]
                )
                #expect(byDefault.status == 0, "\(byDefault.stderr)")
                #expect(byDefault.stdout == accessToken + "\n")

                let unknown = try await self.python([Self.clients + "/tokenvault.py", "nobody"], environment: env)
                #expect(unknown.status == 1)
                #expect(unknown.stdout.isEmpty)
                #expect(unknown.stderr.hasPrefix("tokenvault.py: error: "), "\(unknown.stderr)")
                #expect(unknown.stderr.contains("unknown_account"), "\(unknown.stderr)")
                #expect(unknown.stderr.split(separator: "\n").count == 1, "one line: \(unknown.stderr)")

                // The module, imported by a companion.
                let script = """
                    import sys
                    sys.dont_write_bytecode = True
                    sys.path.insert(0, sys.argv[1])
                    import tokenvault
                    print(tokenvault.token("work"))
                    print(tokenvault.token("work", min_ttl=120, scope="openid", path=sys.argv[2]))
                    print(tokenvault.call("hello", path=sys.argv[2])["protocol"])
                    try:
                        tokenvault.token("nobody", path=sys.argv[2])
                        print("no error")
                    except tokenvault.VaultError as error:
                        print(error.code, bool(error.message))
                    """
                let module = try await self.python(
                    ["-c", script, Self.clients, daemon.socketPath],
                    environment: ["TOKENVAULT_SOCKET": daemon.socketPath]
                )
                #expect(module.status == 0, "\(module.stderr)")
                #expect(module.stdout == "\(accessToken)\n\(accessToken)\n1\nunknown_account True\n", "\(module.stderr)")
                // An explicit path wins over TOKENVAULT_SOCKET.
                let explicit = try await self.python(
                    [
                        "-c", "import sys; sys.path.insert(0, sys.argv[1]); import tokenvault; print(tokenvault.token('work', path=sys.argv[2]))",
                        Self.clients, daemon.socketPath,
                    ],
                    environment: ["TOKENVAULT_SOCKET": folder + "/nowhere.sock"]
                )
                #expect(explicit.status == 0, "\(explicit.stderr)")
                #expect(explicit.stdout == accessToken + "\n")

                #expect(issuer.refreshCount == 1, "every client was served the one cached token")
                if !hadBytecode {
                    #expect(!FileManager.default.fileExists(atPath: Self.clients + "/__pycache__"))
                }
            }
        }
    }

    /// `dpop_proof` of an account that holds bearer tokens (an imported
    /// refresh token is a bearer grant) is a `bad_request`, and so is one
    /// whose method is not an HTTP method, which names the field.
    @Test func thePythonClientsProofOfABearerAccountIsABadRequest() async throws {
        try await using(IssuerAndDaemon.start()) { vault in
            let script = """
                import sys
                sys.dont_write_bytecode = True
                sys.path.insert(0, sys.argv[1])
                import tokenvault
                for method in ["GET", "GE T"]:
                    try:
                        tokenvault.dpop_proof("work", method, "https://rs.example/path?q=1", path=sys.argv[2])
                        print("no error")
                    except tokenvault.VaultError as error:
                        print(error.code, "'htm'" in error.message)
                """
            let proof = try await self.python(["-c", script, Self.clients, vault.daemon.socketPath], environment: vault.env)
            #expect(proof.status == 0, "\(proof.stderr)")
            #expect(proof.stdout == "bad_request False\nbad_request True\n", "\(proof.stderr)")
            #expect(!proof.stdout.contains(vault.token) && !proof.stderr.contains(vault.token))
        }
    }
}
