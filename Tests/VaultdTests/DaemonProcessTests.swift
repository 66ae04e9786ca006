import Foundation
import Glibc
import Testing
import VaultTestKit

/// vaultd and vaultctl as a user runs them: real executables, real files.
@Suite(.timeLimit(.minutes(2)))
struct DaemonProcessTests {
    @Test func aSecondDaemonOnTheSameSocketRefusesToStart() async throws {
        let folder = try temporaryFolder()
        let socket = folder + "/one.sock"
        let first = try DaemonProcess(folder: folder + "/a", socketPath: socket)
        #expect(await first.waitForLog("listening"))
        let second = try DaemonProcess(folder: folder + "/b", socketPath: socket)
        #expect(await second.waitForExit() == 70)
        #expect(second.output.contains("another vaultd is already listening on \(socket)"))
        let sameVault = try DaemonProcess(folder: folder + "/a", socketPath: folder + "/two.sock")
        #expect(await sameVault.waitForExit() == 70)
        #expect(sameVault.output.contains("another vaultd"))
        #expect(try await LineClient(path: socket).call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
        #expect(await first.terminate() == 0)
        #expect(!FileManager.default.fileExists(atPath: socket), "SIGTERM removes the socket")
    }

    @Test func aStaleSocketIsReplaced() async throws {
        let folder = try temporaryFolder()
        let socket = folder + "/stale.sock"
        // A socket file nobody listens on, as a killed daemon leaves behind.
        let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        _ = bind(fd, unixPath: socket)
        close(fd)
        #expect(FileManager.default.fileExists(atPath: socket))
        let daemon = try DaemonProcess(folder: folder, socketPath: socket)
        #expect(await daemon.waitForLog("listening"))
        #expect(try await LineClient(path: socket).call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
        #expect(await daemon.terminate() == 0)
    }

    @Test func secretsNeverReachTheLog() async throws {
        let folder = try temporaryFolder()
        let canaries = ["CANARY-PASS-1", "CANARY-CS-2", "CANARY-RT-3", "CANARY-WRONG-4"]
        let daemon = try DaemonProcess(folder: folder, arguments: ["--log-level", "trace", "--key-source", "passphrase"])
        #expect(await daemon.waitForLog("listening"))
        let client = try LineClient(path: daemon.socketPath)
        let locked = try #require(await client.call(#"{"id":1,"op":"status"}"#))
        #expect(locked["locked"] as? Bool == true)
        #expect(await client.call(#"{"id":2,"op":"unlock","passphrase":"\#(canaries[0])"}"#)?["ok"] as? Bool == true)
        let add = #"{"id":3,"op":"account.add","name":"work","issuer":"https://id.example.org","client_id":"c","client_secret":"\#(canaries[1])","refresh_token":"\#(canaries[2])"}"#
        #expect(await client.call(add)?["ok"] as? Bool == true)
        #expect(await client.call(#"{"id":4,"op":"lock"}"#)?["ok"] as? Bool == true)
        let wrong = try #require(await client.call(#"{"id":5,"op":"unlock","passphrase":"\#(canaries[3])"}"#))
        #expect(wrong.errorCode == "invalid_credentials")
        _ = await client.call(#"{"id":6,"op":"account.add","name":"x","issuer":"\#(canaries[1])","client_id":"c"}"#)
        _ = await client.call(#"{"id":"\#(canaries[2])","op":"\#(canaries[2])"}"#)
        #expect(await client.call(#"{"id":7,"op":"unlock","passphrase":"\#(canaries[0])"}"#)?["ok"] as? Bool == true)
        let status = try #require(await client.call(#"{"id":8,"op":"status"}"#))
        #expect((status["accounts"] as? [[String: Any]])?.first?["signed_in"] as? Bool == true)
        #expect(await daemon.terminate() == 0)
        let log = daemon.output
        #expect(log.contains("vault unlocked"), "the log was captured")
        for canary in canaries {
            #expect(!log.contains(canary), "\(canary) appeared in the log")
        }
        let files = try FileManager.default.subpathsOfDirectory(atPath: folder)
        for file in files where !file.hasSuffix(".sock") {
            guard let data = FileManager.default.contents(atPath: folder + "/" + file) else { continue }
            let text = String(decoding: data, as: UTF8.self)
            for canary in canaries { #expect(!text.contains(canary), "\(canary) appeared in \(file)") }
        }
    }

    @Test func vaultctlDrivesTheDaemon() async throws {
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder)
        #expect(await daemon.waitForLog("listening"))
        let env = ["TOKENVAULT_SOCKET": daemon.socketPath, "VAULTCTL_SOCKET": ""]
        let empty = try await runTool("vaultctl", ["status"], environment: env)
        #expect(empty.status == 0)
        #expect(empty.stdout.contains("vault: unlocked (file backend, key from keyfile)"))
        let added = try await runTool(
            "vaultctl",
            ["account", "add", "work", "--issuer", "https://id.example.org", "--client-id", "cli", "--client-secret"],
            input: "CANARY-SECRET\n",
            environment: env
        )
        #expect(added.status == 0, "\(added.stderr)")
        #expect(!added.stdout.contains("CANARY") && !added.stderr.contains("CANARY"))
        let list = try await runTool("vaultctl", ["account", "list"], environment: env)
        #expect(list.stdout == "work\n")
        let json = try await runTool("vaultctl", ["status", "--json"], environment: env)
        let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        #expect(object?["backend"] as? String == "file")
        let unknown = try await runTool("vaultctl", ["account", "remove", "nope"], environment: env)
        #expect(unknown.status == 67)
        #expect(unknown.stderr.hasPrefix("vaultctl: error: there is no account named 'nope'"))
        let removed = try await runTool("vaultctl", ["account", "remove", "work"], environment: env)
        #expect(removed.stdout.contains("secrets wiped from: memory, file"))
        #expect(await daemon.terminate() == 0)
        let down = try await runTool("vaultctl", ["status"], environment: env)
        #expect(down.status == 69)
        #expect(down.stderr.contains("vaultd is not running"))
    }

    @Test func aDamagedVaultStopsTheDaemonAndIsKept() async throws {
        let folder = try temporaryFolder()
        let first = try DaemonProcess(folder: folder)
        #expect(await first.waitForLog("listening"))
        #expect(await first.terminate() == 0)
        let vault = folder + "/state/tokenvault/vault.sealed"
        var bytes = try #require(FileManager.default.contents(atPath: vault))
        bytes[bytes.count - 1] ^= 1
        try bytes.write(to: URL(fileURLWithPath: vault))
        let second = try DaemonProcess(folder: folder)
        #expect(await second.waitForExit() == 70)
        #expect(second.output.contains("the key does not open the vault file"))
        #expect(FileManager.default.contents(atPath: vault) == bytes)
    }

    /// Sized for one user, not for the machine: one event loop and four
    /// threads for blocking work, however many cores there are.
    @Test func oneEventLoopWhateverTheCores() async throws {
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder)
        #expect(await daemon.waitForLog("listening"))
        #expect(try await LineClient(path: daemon.socketPath).call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
        let tasks = "/proc/\(daemon.pid)/task"
        let names = try FileManager.default.contentsOfDirectory(atPath: tasks).map {
            try String(contentsOfFile: "\(tasks)/\($0)/comm", encoding: .utf8).trimmingCharacters(in: .newlines)
        }
        // NIO names its threads "NIO-SGLTN-<group>-#<n>" and "NIO-SGLTN-TP-#<n>",
        // cut to the kernel's 15 characters.
        let pool = names.filter { $0.contains("TP-#") }
        let loops = names.filter { $0.contains("SGLTN-") && !$0.contains("TP-#") }
        #expect(loops.count == 1, "event loops: \(loops)")
        #expect(pool.count == 4, "blocking pool: \(pool)")
        #expect(await daemon.terminate() == 0)
    }

    /// No core file, whatever limit vaultd inherits: soft and hard 0, as ssh-agent sets.
    @Test func vaultdWritesNoCoreFile() async throws {
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder, launcher: ["/usr/bin/prlimit", "--core=unlimited:unlimited"])
        #expect(await daemon.waitForLog("listening"))
        let limits = try String(contentsOfFile: "/proc/\(daemon.pid)/limits", encoding: .utf8)
        let core = limits.split(separator: "\n").first { $0.hasPrefix("Max core file size") }.map(String.init) ?? ""
        let fields = core.split(separator: " ", omittingEmptySubsequences: true)
        #expect(fields.count >= 6 && fields[4] == "0" && fields[5] == "0", "\(core)")
        #expect(await daemon.terminate() == 0)
    }
}
