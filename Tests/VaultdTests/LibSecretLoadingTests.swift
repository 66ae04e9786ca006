import Foundation
import Glibc
import Testing
import VaultTestKit

/// vaultd maps libsecret and GLib only once the keyring backend talks to a
/// Secret Service: a daemon on the sealed file carries none of them
/// (their pages, constructors and GLib's worker thread).
@Suite(.timeLimit(.minutes(2)))
struct LibSecretLoadingTests {
    /// The files a process has mapped, from /proc/PID/maps.
    static func mappedFiles(_ pid: pid_t) throws -> Set<String> {
        // Read to the end: the file's size is 0, which stops some readers early.
        let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: "/proc/\(pid)/maps"))
        defer { try? handle.close() }
        let maps = String(decoding: try handle.readToEnd() ?? Data(), as: UTF8.self)
        var files: Set<String> = []
        for line in maps.split(separator: "\n") {
            // address perms offset dev inode [path]
            let fields = line.split(separator: " ")
            if fields.count >= 6 { files.insert(fields[5...].joined(separator: " ")) }
        }
        return files
    }

    static func status(_ daemon: DaemonProcess) async throws -> [String: Any] {
        try #require(await LineClient(path: daemon.socketPath).call(#"{"id":1,"op":"status"}"#))
    }

    @Test func aDaemonOnTheSealedFileMapsNeitherLibsecretNorGLib() async throws {
        try await using(DaemonProcess(folder: try temporaryFolder())) { daemon in
            #expect(await daemon.waitForLog("listening"), "\(daemon.output)")
            let status = try await Self.status(daemon)
            #expect(status["backend"] as? String == "file", "\(status)")
            let files = try Self.mappedFiles(daemon.pid)
            #expect(files.contains { $0.contains("/libc.so") }, "the maps were read: \(files)")
            let glib = files.filter { $0.contains("libsecret") || $0.contains("libglib") || $0.contains("libgio") }
            #expect(glib.isEmpty, "\(glib)")
        }
    }

    @Test func theKeyringBackendLoadsLibsecret() async throws {
        try await DaemonKeyring.with { keyring in
            let environment = ["DBUS_SESSION_BUS_ADDRESS": keyring.bus]
            try await using(DaemonProcess(folder: try temporaryFolder(), environment: environment)) { daemon in
                #expect(await daemon.waitForLog("listening"), "\(daemon.output)")
                let status = try await Self.status(daemon)
                #expect(status["backend"] as? String == "keyring", "\(status)")
                let files = try Self.mappedFiles(daemon.pid)
                #expect(files.contains { $0.contains("/libsecret-1.so") }, "\(files)")
                #expect(files.contains { $0.contains("/libglib-2.0.so") }, "\(files)")
            }
        }
    }
}
