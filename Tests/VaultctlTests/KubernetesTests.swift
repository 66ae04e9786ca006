import Foundation
import Glibc
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultTestIssuer
import VaultTestKit

/// `vaultctl exec-credential` as kubectl's exec credential plugin: the real
/// kubectl against an HTTPS stand-in for an API server that accepts only
/// the vault's current access token.
@Suite(.timeLimit(.minutes(1)))
struct KubernetesTests {
    typealias Setup = IssuerAndVault

    func setUp() async throws -> Setup {
        let issuer = try await TestIssuer.start()
        let vault = try await InProcessVault.start()
        _ = try await vault.broker.add(
            AccountAddition(
                configuration: AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid", "offline_access"]),
                refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
            )
        )
        return Setup(issuer: issuer, vault: vault, folder: try temporaryFolder())
    }

    @Test func kubectlGetsTheVaultsTokenThroughTheExecPlugin() async throws {
        try await using(self.setUp()) { setup in
            let folder = setup.folder
            let cert = try await runTool(
                "/usr/bin/openssl",
                [
                    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", folder + "/key.pem", "-out", folder + "/cert.pem",
                ]
            )
            try #require(cert.status == 0, "\(cert.stderr)")
            let current = try await setup.vault.rooms.token(TokenRequest(account: "work"), for: testPeer)
            try current.accessToken.unsafeString().write(toFile: folder + "/token", atomically: true, encoding: .utf8)
            let stub = try await runTool(
                "/bin/sh",
                [
                    "-c",
                    "python3 \"$0\" --cert \"$1/cert.pem\" --key \"$1/key.pem\" --token-file \"$1/token\" --port-file \"$1/port\" </dev/null >\"$1/stub.log\" 2>&1 & echo $!",
                    packageRoot + "/Tests/Support/kube/apiserver-stub.py", folder,
                ]
            )
            let stubPID = try #require(pid_t(stub.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
            defer { kill(stubPID, SIGTERM) }
            try await eventually { FileManager.default.fileExists(atPath: folder + "/port") }
            let port = try String(contentsOfFile: folder + "/port", encoding: .utf8)
            let kubeconfig = """
                apiVersion: v1
                kind: Config
                clusters:
                - name: stub
                  cluster:
                    server: https://127.0.0.1:\(port)
                    certificate-authority: \(folder)/cert.pem
                users:
                - name: vault
                  user:
                    exec:
                      apiVersion: client.authentication.k8s.io/v1beta1
                      command: \(productsDirectory)/vaultctl
                      args: [exec-credential, work]
                      interactiveMode: Never
                      provideClusterInfo: true
                contexts:
                - name: stub
                  context: {cluster: stub, user: vault}
                current-context: stub
                """
            try kubeconfig.write(toFile: folder + "/kubeconfig", atomically: true, encoding: .utf8)
            let kubectl = try await runTool(
                "/usr/bin/kubectl",
                ["--kubeconfig", folder + "/kubeconfig", "get", "--raw", "/api/tokenvault-check"],
                environment: setup.environment
            )
            #expect(kubectl.status == 0, "\(kubectl.stderr)")
            #expect(kubectl.stdout.contains(#""accepted": true"#), "\(kubectl.stdout)")

            // Another token is refused by the stand-in, so the one kubectl sent was the vault's.
            try "not-the-token".write(toFile: folder + "/token", atomically: true, encoding: .utf8)
            let refused = try await runTool(
                "/usr/bin/kubectl",
                ["--kubeconfig", folder + "/kubeconfig", "get", "--raw", "/api/tokenvault-check"],
                environment: setup.environment
            )
            #expect(refused.status != 0)
        }
    }

    @Test func theCredentialNamesTheVersionAskedForAndExpiresWithTheToken() async throws {
        try await using(self.setUp()) { setup in
            let plain = try await runTool("vaultctl", ["exec-credential", "work"], environment: setup.environment)
            #expect(plain.status == 0, "\(plain.stderr)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(plain.stdout.utf8)) as? [String: Any])
            #expect(object["apiVersion"] as? String == "client.authentication.k8s.io/v1")
            #expect(object["kind"] as? String == "ExecCredential")
            let status = try #require(object["status"] as? [String: Any])
            let token = try await setup.vault.rooms.token(TokenRequest(account: "work"), for: testPeer)
            #expect(status["token"] as? String == token.accessToken.unsafeString())
            let formatter = ISO8601DateFormatter()
            let expiry = try #require((status["expirationTimestamp"] as? String).flatMap(formatter.date(from:)))
            #expect(Int64(expiry.timeIntervalSince1970) == token.expiresAt)

            var asked = setup.environment
            asked["KUBERNETES_EXEC_INFO"] = #"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{"interactive":false}}"#
            let beta = try await runTool("vaultctl", ["exec-credential", "work"], environment: asked)
            #expect(beta.stdout.contains(#""apiVersion":"client.authentication.k8s.io/v1beta1""#), "\(beta.stdout)")
        }
    }

    @Test func anErrorIsOneLineOnStderrAndNothingOnStdout() async throws {
        try await using(self.setUp()) { setup in
            let failed = try await runTool("vaultctl", ["exec-credential", "nobody"], environment: setup.environment)
            #expect(failed.status == 67, "unknown account: \(failed.stderr)")
            #expect(failed.stdout.isEmpty)
            #expect(failed.stderr.split(separator: "\n").count == 1, "\(failed.stderr)")
            #expect(failed.stderr.contains("nobody"))
        }
    }
}
