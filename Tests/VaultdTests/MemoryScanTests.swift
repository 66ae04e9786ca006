import Foundation
import Glibc
import Testing
import VaultTestIssuer
import VaultTestKit

/// What is left of a refresh token in vaultd's memory once the account is
/// signed out: every readable mapping of the process, scanned for the token's
/// bytes (the suite runs as root, which may read an undumpable process).
///
/// The token comes in on a request line (`vaultctl import`), goes out in the
/// body of five refreshes and of the revocation. Before the wipes, six
/// copies were left after sign-out: the line's read buffer, the decoder's
/// copy of the line, the form body's growing array, AsyncHTTPClient's body
/// buffer (each freed unwiped, and copied on by every realloc of memory that
/// held them), and the account's own guarded copy, still referenced after
/// a refresh by something not yet found, and now wiped in place at sign-out.
@Suite(.timeLimit(.minutes(1)))
struct MemoryScanTests {
    static let scanner = """
        import re, sys
        pid, needle = sys.argv[1], sys.argv[2].encode()
        found = {}
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
            for line in maps:
                fields = line.split()
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if "r" not in fields[1] or end - start > 1 << 30:
                    continue
                name = fields[5] if len(fields) > 5 else "[anonymous]"
                try:
                    mem.seek(start)
                    chunk = mem.read(end - start)
                except (OSError, ValueError, OverflowError):
                    continue
                count = chunk.count(needle)
                if count:
                    found[name] = found.get(name, 0) + count
        print(sum(found.values()), " ".join(f"{k}={v}" for k, v in sorted(found.items())))
        """

    /// Copies of `needle` in the memory of `pid`, and where they are.
    static func copies(of needle: String, in pid: pid_t) async throws -> (count: Int, where: String) {
        let scanned = try await runTool("/usr/bin/python3", ["-c", Self.scanner, String(pid), needle])
        let words = scanned.stdout.split(separator: " ", maxSplits: 1)
        return (Int(words.first.map(String.init)?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? -1, words.count > 1 ? String(words[1]) : "")
    }

    @Test(.enabled(if: getuid() == 0, "needs root to read another process's memory"))
    func signOutLeavesNoCopyOfTheRefreshTokenInMemory() async throws {
        let issuer = try await TestIssuer.start()
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder)
        #expect(await daemon.waitForLog("listening"))
        let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
        let refreshToken = try await importAccount(from: issuer, environment: env)
        for _ in 0..<5 {
            let forced = try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: env)
            #expect(forced.status == 0, "\(forced.stderr)")
        }
        let before = try await Self.copies(of: refreshToken, in: daemon.pid)
        let out = try await runTool("vaultctl", ["signout", "work"], environment: env)
        #expect(out.status == 0, "\(out.stderr)")
        let after = try await Self.copies(of: refreshToken, in: daemon.pid)
        #expect(before.count >= 1, "the scan finds the token while signed in")
        #expect(after.count == 0, "copies left after sign-out: \(after.where)")
        #expect(await daemon.terminate() == 0)
        await issuer.stop()
    }

    /// A request may write the name `refresh_token` with escapes, however
    /// long: JSONDecoder reads it, so SecretFields must take its value too, or
    /// the token goes through the decoder's Strings (three copies after the
    /// import, one left after sign-out, when names over 66 bytes were skipped).
    @Test(.enabled(if: getuid() == 0, "needs root to read another process's memory"))
    func signOutLeavesNoCopyOfARefreshTokenSentUnderAnEscapedName() async throws {
        let issuer = try await TestIssuer.start()
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder)
        #expect(await daemon.waitForLog("listening"))
        let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
        let refreshToken = issuer.mintRefreshToken()
        // `refresh_token` as thirteen \u00XX escapes: 78 bytes.
        let name = "refresh_token".unicodeScalars.map { "\\u00" + String($0.value, radix: 16) }.joined()
        #expect(name.utf8.count == 78)
        do {  // The client hangs up before the scans.
            let client = try LineClient(path: daemon.socketPath)
            let added = await client.call(
                #"{"id":1,"op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","#
                    + #""scopes":["openid"],"\#(name)":"\#(refreshToken)"}"#
            )
            #expect(added?["signed_in"] as? Bool == true, "\(added ?? [:])")
        }
        let token = try await runTool("vaultctl", ["token", "work"], environment: env)
        #expect(token.status == 0, "\(token.stderr)")
        let before = try await Self.copies(of: refreshToken, in: daemon.pid)
        let out = try await runTool("vaultctl", ["signout", "work"], environment: env)
        #expect(out.status == 0, "\(out.stderr)")
        let after = try await Self.copies(of: refreshToken, in: daemon.pid)
        #expect(before.count >= 1, "the scan finds the token while signed in")
        #expect(after.count == 0, "copies left after sign-out: \(after.where)")
        #expect(await daemon.terminate() == 0)
        await issuer.stop()
    }

    /// Rotated refresh tokens arrive in the issuer's JSON answers, which are
    /// read into guarded memory without a String of any token (SecretFields):
    /// after sign-out, no token of the whole chain is left anywhere.
    @Test(.enabled(if: getuid() == 0, "needs root to read another process's memory"))
    func signOutLeavesNoCopyOfAnyRotatedRefreshToken() async throws {
        let issuer = try await TestIssuer.start(rotateRefreshTokens: true)
        let folder = try temporaryFolder()
        let daemon = try DaemonProcess(folder: folder)
        #expect(await daemon.waitForLog("listening"))
        let env = ["TOKENVAULT_SOCKET": daemon.socketPath]
        _ = try await importAccount(from: issuer, environment: env)
        for _ in 0..<5 {
            let forced = try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: env)
            #expect(forced.status == 0, "\(forced.stderr)")
        }
        let chain = issuer.issuedRefreshTokens
        #expect(chain.count == 6)
        let out = try await runTool("vaultctl", ["signout", "work"], environment: env)
        #expect(out.status == 0, "\(out.stderr)")
        for token in chain {
            let after = try await Self.copies(of: token, in: daemon.pid)
            #expect(after.count == 0, "copies left after sign-out of a token \(issuer.isRefreshTokenActive(token) ? "still active" : "rotated away"): \(after.where)")
        }
        #expect(await daemon.terminate() == 0)
        await issuer.stop()
    }
}
