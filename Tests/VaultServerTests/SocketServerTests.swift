import Foundation
import Glibc
import NIOCore
import Testing
import VaultProtocol
import VaultServer
import VaultTestKit

@Suite(.timeLimit(.minutes(1)))
struct SocketServerTests {
    @Test func answersHelloAndStatus() async throws {
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            let hello = try #require(await client.call(#"{"id":1,"op":"hello"}"#))
            #expect(hello["ok"] as? Bool == true)
            #expect(hello["protocol"] as? Int == 1)
            #expect(hello["server"] as? String == "vaultd")
            let status = try #require(await client.call(#"{"id":"s","op":"status"}"#))
            #expect(status["id"] as? String == "s")
            #expect(status["backend"] as? String == "file")
            #expect(status["locked"] as? Bool == false)
            #expect((status["accounts"] as? [Any])?.isEmpty == true)
            let noID = try #require(await client.call(#"{"op":"hello"}"#))
            #expect(noID["id"] is NSNull)
        }
    }

    @Test func socketIsPrivate() async throws {
        try await withVault { vault in
            let mode = try FileManager.default.attributesOfItem(atPath: vault.socketPath)[.posixPermissions] as? Int
            #expect(mode == 0o600)
            // A folder the daemon did not make is left as it was.
            let folderMode = try FileManager.default.attributesOfItem(atPath: vault.folder)[.posixPermissions] as? Int
            #expect(folderMode == 0o755)
        }
    }

    @Test func answersPipelinedRequestsByID() async throws {
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            let lines = (1...100).map { #"{"id":\#($0),"op":"\#($0 % 3 == 0 ? "status" : "hello")"}"# + "\n" }
            client.send(lines.joined())
            var ids: Set<Int> = []
            for _ in 1...100 {
                let reply = try #require(await client.readObject())
                #expect(reply["ok"] as? Bool == true)
                ids.insert(try #require(reply["id"] as? Int))
            }
            #expect(ids == Set(1...100))
        }
    }

    @Test func anOverlongLineIsRefusedAndTheServerKeepsServing() async throws {
        try await withVault { vault in
            let bystander = try LineClient(path: vault.socketPath)
            let client = try LineClient(path: vault.socketPath)
            client.send(#"{"id":1,"op":"hello","pad":""# + String(repeating: "x", count: 70_000) + "\"}\n")
            let reply = try #require(await client.readObject())
            #expect(reply.errorCode == "line_too_long")
            #expect(await client.readLine() == nil, "the connection is closed")
            #expect(await bystander.call(#"{"id":2,"op":"hello"}"#)?["ok"] as? Bool == true)
            #expect(try await LineClient(path: vault.socketPath).call(#"{"id":3,"op":"hello"}"#)?["ok"] as? Bool == true)
        }
    }

    @Test func aLineOfExactlyTheLimitIsServed() async throws {
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            let head = #"{"id":1,"op":"hello","pad":""#
            let line = head + String(repeating: "x", count: TokenVault.maximumLineBytes - head.utf8.count - 2) + "\"}"
            #expect(line.utf8.count == TokenVault.maximumLineBytes)
            #expect(await client.call(line)?["ok"] as? Bool == true)
        }
    }

    @Test func badInputGetsItsErrorAndTheConnectionStaysOpen() async throws {
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            let cases: [(String, String)] = [
                ("not json", "bad_request"),
                (#"{"id":1,"op":"self_destruct"}"#, "unknown_op"),
                (#"{"id":2,"op":"account.add","name":"w","issuer":5,"client_id":"c"}"#, "bad_request"),
                (#"{"id":3,"op":"account.remove"}"#, "bad_request"),
                (#"{"id":4,"op":"account.remove","name":"nobody"}"#, "unknown_account"),
                (#"{"id":5,"op":"account.add","name":"../x","issuer":"https://id.example","client_id":"c"}"#, "bad_request"),
                (#"{"id":6,"op":"account.add","name":"w","issuer":"http://id.example","client_id":"c"}"#, "bad_request"),
                ("[]", "bad_request"),
                ("", "bad_request"),
            ]
            for (line, code) in cases {
                let reply = try #require(await client.call(line))
                #expect(reply["ok"] as? Bool == false)
                #expect(reply.errorCode == code, "\(line)")
            }
            client.send([0x7B, 0xFF, 0xFE, 0x7D, 0x0A])
            #expect(await client.readObject()?.errorCode == "bad_request")
            #expect(await client.call(#"{"id":9,"op":"hello"}"#)?["ok"] as? Bool == true)
        }
    }

    @Test func addsListsAndRemovesAccounts() async throws {
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            let add = #"{"id":1,"op":"account.add","name":"work","issuer":"https://id.example.org","client_id":"cli","scopes":["openid"],"client_secret":"cs","refresh_token":"rt"}"#
            let added = try #require(await client.call(add))
            #expect(added["ok"] as? Bool == true)
            #expect(added["has_client_secret"] as? Bool == true)
            #expect(added["signed_in"] as? Bool == true)
            #expect(await client.call(add)?.errorCode == "bad_request", "a second add of one name is refused")
            let status = try #require(await client.call(#"{"id":2,"op":"status"}"#))
            let accounts = try #require(status["accounts"] as? [[String: Any]])
            #expect(accounts.count == 1)
            #expect(accounts.first?["name"] as? String == "work")
            #expect(accounts.first?["signed_in"] as? Bool == true)
            let config = try String(contentsOfFile: vault.folder + "/config/accounts.json", encoding: .utf8)
            #expect(config.contains("\"client_id\" : \"cli\""))
            #expect(!config.contains("\"cs\"") && !config.contains("\"rt\""), "no secret in the configuration")
            let removed = try #require(await client.call(#"{"id":3,"op":"account.remove","name":"work"}"#))
            #expect(removed["wiped"] as? [String] == ["memory", "file"])
            #expect((await client.call(#"{"id":4,"op":"status"}"#)?["accounts"] as? [Any])?.isEmpty == true)
        }
    }

    @Test func lockDropsSecretsAndUnlockRestoresThem() async throws {
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            _ = await client.call(#"{"id":1,"op":"account.add","name":"work","issuer":"https://id.example.org","client_id":"c","refresh_token":"rt"}"#)
            #expect(await client.call(#"{"id":2,"op":"lock"}"#)?["ok"] as? Bool == true)
            let locked = try #require(await client.call(#"{"id":3,"op":"status"}"#))
            #expect(locked["locked"] as? Bool == true)
            #expect((locked["accounts"] as? [[String: Any]])?.first?["signed_in"] as? Bool == false)
            let refused = await client.call(#"{"id":4,"op":"account.add","name":"home","issuer":"https://id.example.org","client_id":"c","client_secret":"s"}"#)
            #expect(refused?.errorCode == "locked")
            #expect(await client.call(#"{"id":5,"op":"unlock"}"#)?["ok"] as? Bool == true)
            let unlocked = try #require(await client.call(#"{"id":6,"op":"status"}"#))
            #expect(unlocked["locked"] as? Bool == false)
            #expect((unlocked["accounts"] as? [[String: Any]])?.first?["signed_in"] as? Bool == true)
        }
    }

    @Test func connectionsOverTheLimitAreToldOverloaded() async throws {
        try await withVault(maximumConnections: 2) { vault in
            let first = try LineClient(path: vault.socketPath)
            let second = try LineClient(path: vault.socketPath)
            #expect(await first.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
            #expect(await second.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
            let third = try LineClient(path: vault.socketPath)
            #expect(await third.readObject()?.errorCode == "overloaded")
            #expect(await third.readLine() == nil)
            #expect(await first.call(#"{"id":2,"op":"hello"}"#)?["ok"] as? Bool == true)
        }
    }

    @Test func idleConnectionsAreClosed() async throws {
        try await withVault(idleTimeout: .milliseconds(200)) { vault in
            let client = try LineClient(path: vault.socketPath)
            // On a loaded machine the idle timer may fire before the hello arrives:
            // the answer is then not sent, and the connection is closed either way.
            client.send(#"{"id":1,"op":"hello"}"# + "\n")
            var line = await client.readObject()
            if line != nil {
                #expect(line?["ok"] as? Bool == true)
                line = await client.readObject()
            }
            #expect(line == nil, "the server closes the idle connection")
        }
    }

    @Test(.enabled(if: getuid() == 0, "needs root to act as another user"))
    func peersOfAnotherUserAreRefusedBeforeAByteIsRead() async throws {
        try await withVault { vault in
            // Open the path to everyone so only SO_PEERCRED stands in the way.
            chmod(vault.folder, 0o755)
            chmod(vault.socketPath, 0o666)
            let script = """
                import socket, sys
                s = socket.socket(socket.AF_UNIX); s.settimeout(10)
                s.connect(sys.argv[1])
                try:
                    s.sendall(b'{"id":1,"op":"hello"}\\n'); data = s.recv(100)
                except OSError:
                    data = b''
                print('ANSWERED' if data else 'REFUSED')
                """
            let result = try await runTool(
                "/usr/bin/setpriv",
                ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script, vault.socketPath]
            )
            #expect(result.stdout.contains("REFUSED"), "\(result.stdout) \(result.stderr)")
            #expect(try await LineClient(path: vault.socketPath).call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
        }
    }
}
