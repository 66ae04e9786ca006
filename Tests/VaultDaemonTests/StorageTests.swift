import Foundation
import Glibc
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultStore
import VaultTestIssuer
import VaultTestKit

/// A vault whose disk is full or read-only: each failure is its own error
/// and exit code, `status` says the vault cannot be written until a write
/// succeeds, and the rotated refresh token, kept in memory, is written then.
/// On a real file system: a small tmpfs mounted for the test (the suite runs as root).
@Suite(.timeLimit(.minutes(1)), .serialized)
struct StorageTests {
    /// A tmpfs of `size` at `path` (mode 0700), unmounted by `unmount`.
    static func mount(_ path: String, size: String) async throws {
        #expect(mkdir(path, 0o700) == 0)
        let mounted = try await runTool("/bin/mount", ["-t", "tmpfs", "-o", "size=\(size),mode=0700", "tmpfs", path])
        try #require(mounted.status == 0, "\(mounted.stderr)")
    }

    static func unmount(_ path: String) async {
        _ = try? await runTool("/bin/umount", ["-l", path])
    }

    /// Fills the file system of `folder` with `folder/filler`.
    static func fill(_ folder: String) async throws {
        let filled = try await runTool("/bin/dd", ["if=/dev/zero", "of=\(folder)/filler", "bs=4k"])
        #expect(filled.stderr.contains("No space left"), "\(filled.stderr)")
    }

    @Test func aFullDiskIsSaidAndTheRotatedTokenIsWrittenOnceThereIsRoom() async throws {
        let issuer = try await TestIssuer.start(rotateRefreshTokens: true)
        let folder = try temporaryFolder()
        try await Self.mount(folder + "/state", size: "256k")
        var vault = try await InProcessVault.start(folder: folder)
        do {
            _ = try await vault.broker.add(
                AccountAddition(
                    configuration: AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid", "offline_access"]),
                    refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
                )
            )
            _ = try await vault.workToken()
            try await Self.fill(folder + "/state")

            let env = ["TOKENVAULT_SOCKET": vault.socketPath]
            let forced = try await runTool("vaultctl", ["token", "work", "--force-refresh"], environment: env)
            #expect(forced.status == 74, "EX_IOERR: \(forced.stderr)")
            #expect(forced.stderr.contains("\(folder)/state/vault.sealed") && forced.stderr.contains("No space left"), "\(forced.stderr)")
            #expect(forced.stderr.contains("df -h"), "the remedy: \(forced.stderr)")
            let full = await vault.broker.status()
            #expect(full.storageError?.contains("No space left") == true, "\(String(describing: full.storageError))")
            let shown = try await runTool("vaultctl", ["status"], environment: env)
            #expect(shown.stdout.contains("cannot write the vault"), "\(shown.stdout)")
            // The session survives: the rotated token is in memory and serves.
            let served = try await runTool("vaultctl", ["token", "work"], environment: env)
            #expect(served.status == 0, "\(served.stderr)")

            #expect(unlink(folder + "/state/filler") == 0)
            let roomy = await vault.broker.status()
            #expect(roomy.storageError == nil, "a write succeeded: \(String(describing: roomy.storageError))")
            await vault.stop()
            // What was written is the newest refresh token: the issuer still takes it after a restart.
            vault = try await InProcessVault.start(folder: folder)
            #expect(try await vault.workToken(force: true).accessToken.count > 0)
            #expect(issuer.reusedRefreshTokens == 0)
        } catch {
            Issue.record(error)
        }
        await vault.stop()
        await Self.unmount(folder + "/state")
        await issuer.stop()
    }

    /// A folder that cannot be written is its own kind, told from a full disk:
    /// the vault's write into a read-only tmpfs (root passes permission bits,
    /// and a file system with the vault's lock open cannot be remounted read-only).
    @Test func aReadOnlyFolderIsItsOwnError() async throws {
        let folder = try temporaryFolder()
        let readOnly = folder + "/ro"
        #expect(mkdir(readOnly, 0o700) == 0)
        let mounted = try await runTool("/bin/mount", ["-t", "tmpfs", "-o", "size=64k,mode=0700,ro", "tmpfs", readOnly])
        try #require(mounted.status == 0, "\(mounted.stderr)")
        defer { _ = umount2(readOnly, Int32(MNT_DETACH)) }
        let refused = #expect(throws: StoreError.self) { try FileSystem.writeAtomically([1, 2, 3], to: readOnly + "/vault.sealed") }
        #expect(refused?.kind == .denied, "\(String(describing: refused))")
    }
}
