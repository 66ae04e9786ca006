import Foundation
import Glibc
import Testing
import VaultClient
import VaultProtocol
import VaultTestKit

/// Who owns the socket: clients send nothing to a server of another user,
/// and vaultd serves only from a folder no other user can change.
@Suite(.timeLimit(.minutes(1)))
struct SocketOwnerTests {
    /// A listener run as `nobody` at the path the clients are given, which
    /// writes `received N` to its log for each connection: the bytes it got
    /// before the client hung up or sent a whole line.
    static let impostor = """
        import socket, sys
        path = sys.argv[-1]
        s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(8)
        print("listening", file=sys.stderr, flush=True)
        while True:
            c, _ = s.accept(); c.settimeout(20); got = b""
            try:
                while not got.endswith(b"\\n"):
                    chunk = c.recv(65536)
                    if not chunk: break
                    got += chunk
            except OSError:
                pass
            print(f"received {len(got)}", file=sys.stderr, flush=True)
            c.close()
        """

    @Test(.enabled(if: getuid() == 0, "needs root to run a listener as another user"))
    func clientsSendNothingToASocketServedByAnotherUser() async throws {
        let folder = try temporaryFolder()
        let shared = folder + "/impostor"
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: false)
        chown(shared, 65534, 65534)
        // DaemonProcess runs the launcher with vaultd's arguments after it;
        // the script takes the last one, the socket path.
        try await using(DaemonProcess(
            folder: folder,
            socketPath: shared + "/vaultd.sock",
            launcher: ["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", Self.impostor]
        )) { impostor in
            #expect(await impostor.waitForLog("listening"))
            let path = impostor.socketPath

            let vaultctl = try await runTool(
                "vaultctl",
                ["import", "work", "--issuer", "https://id.example.org", "--client-id", "c"],
                input: "CANARY-RT-1\n",
                environment: ["TOKENVAULT_SOCKET": path]
            )
            // forbidden: 77, "not permitted" (sysexits, as the README lists them).
            #expect(vaultctl.status == 77, "\(vaultctl.stderr)")
            #expect(vaultctl.stderr.contains("\(path) is served by uid 65534"), "\(vaultctl.stderr)")

            do throws(VaultError) {
                let client = try await VaultClient.connect(path: path)
                _ = try? await client.token("work")
                Issue.record("VaultClient connected to a socket of uid 65534")
            } catch {
                #expect(error.code == .forbidden)
                #expect(error.message.contains("\(path) is served by uid 65534"), "\(error.message)")
            }

            let python = try await runTool(
                "/usr/bin/env",
                ["python3", "-B", packageRoot + "/clients/tokenvault.py", "work"],
                environment: ["TOKENVAULT_SOCKET": path]
            )
            #expect(python.status == 1)
            #expect(python.stderr.contains("\(path) is served by uid 65534"), "\(python.stderr)")

            // Each of the three connected, and hung up without sending a byte.
            try await eventually { impostor.output.components(separatedBy: "received ").count >= 4 }
            let received = impostor.output.split(separator: "\n").filter { $0.hasPrefix("received ") }
            #expect(received == ["received 0", "received 0", "received 0"], "\(impostor.output)")
        }
    }

    @Test(.enabled(if: getuid() == 0, "needs root to give a folder to another user"))
    func vaultdRefusesASocketFolderOfAnotherUser() async throws {
        let folder = try temporaryFolder()
        try FileManager.default.createDirectory(atPath: folder + "/theirs", withIntermediateDirectories: false)
        chown(folder + "/theirs", 65534, 65534)
        let daemon = try DaemonProcess(folder: folder, socketPath: folder + "/theirs/vaultd.sock")
        #expect(await daemon.waitForExit() == 70)
        #expect(daemon.output.contains("the socket's folder \(folder)/theirs belongs to uid 65534"), "\(daemon.output)")
        #expect(!FileManager.default.fileExists(atPath: folder + "/theirs/vaultd.sock"))
    }

    @Test func vaultdRefusesASymlinkedSocketFolder() async throws {
        let folder = try temporaryFolder()
        try FileManager.default.createDirectory(atPath: folder + "/real", withIntermediateDirectories: false)
        symlink(folder + "/real", folder + "/link")
        let daemon = try DaemonProcess(folder: folder, socketPath: folder + "/link/vaultd.sock")
        #expect(await daemon.waitForExit() == 70)
        #expect(daemon.output.contains("\(folder)/link is a symbolic link"), "\(daemon.output)")
        #expect(!FileManager.default.fileExists(atPath: folder + "/real/vaultd.sock"))
    }

    @Test func vaultdRefusesAGroupWritableFolderAboveTheSocket() async throws {
        let folder = try temporaryFolder()
        try FileManager.default.createDirectory(atPath: folder + "/shared/mine", withIntermediateDirectories: true)
        chmod(folder + "/shared", 0o775)
        let daemon = try DaemonProcess(folder: folder, socketPath: folder + "/shared/mine/vaultd.sock")
        #expect(await daemon.waitForExit() == 70)
        #expect(daemon.output.contains("\(folder)/shared is writable by its group or others (mode 775)"), "\(daemon.output)")
        // A missing socket folder under folders that pass is made, mode 0700.
        chmod(folder + "/shared", 0o755)
        let served = try DaemonProcess(folder: folder, socketPath: folder + "/shared/new/vaultd.sock")
        #expect(await served.waitForLog("listening"))
        let mode = try FileManager.default.attributesOfItem(atPath: folder + "/shared/new")[.posixPermissions] as? Int
        #expect(mode == 0o700)
        #expect(await served.terminate() == 0)
    }
}
