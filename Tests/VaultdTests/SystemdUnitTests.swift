import Foundation
import Glibc
import Testing
import VaultTestKit

/// The user units in systemd/, checked offline with systemd's own tools: no
/// user manager runs here, so `systemd-analyze` loads the unit files as a
/// user manager would and reports what it would warn about.
@Suite(.timeLimit(.minutes(2)))
struct SystemdUnitTests {
    static let analyze = "/usr/bin/systemd-analyze"
    static let socketUnit = packageRoot + "/systemd/vaultd.socket"
    static let serviceUnit = packageRoot + "/systemd/vaultd.service"
    static let noUsernsDropIn = packageRoot + "/systemd/no-userns.conf"
    static let notifyUnit = packageRoot + "/systemd/vaultctl-notify.service"
    /// The most `systemd-analyze security` may score the service (gpg-agent's unit: 9.8).
    static let exposureLimit = 2.0

    @Test func theUnitsVerifyWithoutAWarning() async throws {
        let complaints = try await Self.verify(socket: Self.socketUnit, service: Self.serviceUnit, Self.notifyUnit)
        #expect(complaints.isEmpty, "systemd-analyze verify complained:\n\(complaints)")
    }

    /// The check above catches a typo in any of the project's unit files: a
    /// copy of each, with one of its directives misspelt (systemd ignores the
    /// line and verify still exits 0), is reported.
    @Test func theVerifyCheckCatchesAMisspeltDirectiveInEachUnit() async throws {
        let home = try UserManagerHome()
        defer { home.remove() }
        let units = home.folder + "/units"
        try FileManager.default.createDirectory(atPath: units + "/vaultd.service.d", withIntermediateDirectories: true)
        let socket = units + "/vaultd.socket"
        let service = units + "/vaultd.service"
        let dropIn = units + "/vaultd.service.d/no-userns.conf"
        let copies = [(Self.socketUnit, socket), (Self.serviceUnit, service), (Self.noUsernsDropIn, dropIn)]
        func restore() throws {
            for (original, copy) in copies {
                try String(contentsOfFile: original, encoding: .utf8).write(toFile: copy, atomically: true, encoding: .utf8)
            }
        }
        try restore()
        #expect(try await Self.verify(socket: socket, service: service).isEmpty, "the unchanged copies verify cleanly")
        for (original, copy) in copies {
            // Every directive of the file, in turn: a typo in a rarely read one counts as much.
            let keys = try Self.settings(original).keys.sorted()
            #expect(!keys.isEmpty, "\(original) has no directives")
            for key in keys {
                try restore()
                let misspelt = key + "x"
                let text = try String(contentsOfFile: original, encoding: .utf8)
                try text.replacingOccurrences(of: "\n" + key + "=", with: "\n" + misspelt + "=")
                    .write(toFile: copy, atomically: true, encoding: .utf8)
                let complaints = try await Self.verify(socket: socket, service: service)
                #expect(complaints.contains("Unknown key '\(misspelt)'") || complaints.contains("Unknown key name '\(misspelt)'"),
                    "\(misspelt)= in \(copy) went unreported:\n\(complaints)")
            }
        }
    }

    @Test func theServiceIsExposedAtMostTwo() async throws {
        let home = try UserManagerHome()
        defer { home.remove() }
        let result = try await runTool(
            Self.analyze, ["security", "--offline=true", "--user", "--no-pager", Self.serviceUnit],
            environment: home.environment
        )
        #expect(result.status == 0, "systemd-analyze security failed:\n\(result.stderr)")
        let score = try #require(
            Self.exposure(in: result.stdout),
            "no \"Overall exposure level\" in:\n\(result.stdout)\(result.stderr)"
        )
        #expect(score <= Self.exposureLimit, "exposure \(score) is over \(Self.exposureLimit):\n\(result.stdout)")
    }

    /// no-userns.conf (for allowed_clients, or hosts without unprivileged user
    /// namespaces) must load cleanly next to the unit and take effect.
    @Test func theNoUsernsDropInVerifiesAndLoosensTheSandbox() async throws {
        let home = try UserManagerHome()
        defer { home.remove() }
        let units = home.folder + "/units"
        try FileManager.default.createDirectory(atPath: units + "/vaultd.service.d", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: Self.socketUnit, toPath: units + "/vaultd.socket")
        try FileManager.default.copyItem(atPath: Self.serviceUnit, toPath: units + "/vaultd.service")
        try FileManager.default.copyItem(atPath: Self.noUsernsDropIn, toPath: units + "/vaultd.service.d/no-userns.conf")
        let complaints = try await Self.verify(socket: units + "/vaultd.socket", service: units + "/vaultd.service")
        #expect(complaints.isEmpty, "with no-userns.conf:\n\(complaints)")
        let security = try await runTool(
            Self.analyze, ["security", "--offline=true", "--user", "--no-pager", units + "/vaultd.service"],
            environment: home.environment
        )
        let loosened = try #require(Self.exposure(in: security.stdout), "\(security.stdout)\(security.stderr)")
        #expect(loosened > Self.exposureLimit, "the drop-in was not loaded: exposure \(loosened)")
    }

    /// Without PrivateUsers=, a user manager cannot shrink the capability
    /// bounding set and fails the start (218/CAPABILITIES) for every setting
    /// that does: the drop-in must turn each of them off.
    @Test func theNoUsernsDropInTurnsOffWhatNeedsAUserNamespace() throws {
        let service = try Self.settings(Self.serviceUnit)
        let dropIn = try Self.settings(Self.noUsernsDropIn)
        #expect(service["PrivateUsers"] == ["yes"])
        #expect(dropIn["PrivateUsers"] == ["no"])
        if service["CapabilityBoundingSet"] != nil {
            #expect(dropIn["CapabilityBoundingSet"] == ["~"], "\"~\" is the full set: nothing to drop")
        }
        for key in ["PrivateDevices", "ProtectClock", "ProtectKernelModules", "ProtectKernelLogs"] where service[key] != nil {
            #expect(dropIn[key] == ["no"], "no-userns.conf must set \(key)=no")
        }
    }

    /// What vaultd needs must survive the hardening, and the socket must be
    /// the one vaultctl looks for.
    @Test func theUnitsKeepWhatVaultdNeeds() throws {
        let socket = try Self.settings(Self.socketUnit)
        #expect(socket["ListenStream"] == ["%t/tokenvault/vaultd.sock"])
        #expect(socket["SocketMode"] == ["0600"])
        #expect(socket["DirectoryMode"] == ["0700"])
        #expect(socket["FileDescriptorName"] == ["vaultd"])
        #expect(socket["WantedBy"] == ["sockets.target"])

        let service = try Self.settings(Self.serviceUnit)
        #expect(service["Type"] == ["notify"])
        #expect(service["NotifyAccess"] == ["main"])
        #expect(service["ExecStart"] == ["%h/.local/bin/vaultd"])
        #expect(service["Requires"] == ["vaultd.socket"])
        #expect(service["After"] == ["vaultd.socket"])
        #expect(service["WatchdogSec"] == ["30"])
        // Outbound HTTPS and DNS, the browser sign-in listener, the socket,
        // the session bus and sd_notify.
        let families = Set((service["RestrictAddressFamilies"] ?? []).flatMap { $0.split(separator: " ").map(String.init) })
        #expect(families == ["AF_UNIX", "AF_INET", "AF_INET6"])
        #expect(service["PrivateNetwork"] == nil)
        #expect(service["IPAddressDeny"] == nil)
        // A user manager cannot raise the mlock limit; asking would fail the start.
        #expect(service["LimitMEMLOCK"] == nil)
        // The daemon's own files stay writable under ProtectSystem=strict and a read-only home.
        #expect(service["ProtectSystem"] == ["strict"])
        #expect(service["ProtectHome"] == ["read-only"])
        let writable = (service["ReadWritePaths"] ?? []).flatMap { $0.split(separator: " ").map(String.init) }
        #expect(writable.contains("%h/.local/state/tokenvault"))
        #expect(writable.contains("-%t/tokenvault"))
        #expect(service["ConfigurationDirectory"] == ["tokenvault"])
        #expect(service["Environment"] == ["XDG_STATE_HOME=%h/.local/state XDG_CONFIG_HOME=%E"])
        // StateDirectory= means ~/.config before systemd 254: not the daemon's state folder.
        #expect(service["StateDirectory"] == nil)
    }

    // MARK: - Helpers

    /// What `systemd-analyze verify` says about a socket and service unit (and
    /// the drop-ins in the service's `.d` folder): empty when it loads them
    /// without a warning. The output is the check, not only the exit status:
    /// verify exits 0 on a misspelt (hence ignored) directive.
    static func verify(socket: String, service: String, _ more: String...) async throws -> String {
        let home = try UserManagerHome()
        defer { home.remove() }
        let result = try await runTool(Self.analyze, ["verify", "--user", socket, service] + more, environment: home.environment)
        let output = result.stdout + result.stderr
        return result.status == 0 ? output : "exit status \(result.status)\n" + output
    }

    /// "Overall exposure level for vaultd.service: 1.5 OK" → 1.5
    static func exposure(in output: String) -> Double? {
        guard let line = output.split(separator: "\n").first(where: { $0.contains("Overall exposure level") }),
            let colon = line.lastIndex(of: ":")
        else { return nil }
        let number = line[line.index(after: colon)...].drop(while: { $0 == " " }).prefix(while: { $0.isNumber || $0 == "." })
        return Double(number)
    }

    /// Every uncommented `Key=value` of a unit file, by key, in order.
    static func settings(_ path: String) throws -> [String: [String]] {
        var settings: [String: [String]] = [:]
        for line in try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n") {
            let line = line.trimmingCharacters(in: .whitespaces)
            guard !line.hasPrefix("#"), !line.hasPrefix(";"), !line.hasPrefix("["),
                let equals = line.firstIndex(of: "=")
            else { continue }
            settings[String(line[..<equals]), default: []].append(String(line[line.index(after: equals)...]))
        }
        return settings
    }
}

/// What `systemd-analyze --user` needs to load the units as a user manager
/// would, without one running: $XDG_RUNTIME_DIR (for %t; without it the tool
/// stops with "Failed to lookup RuntimeDirectory path"), and a $HOME whose
/// ~/.local/bin/vaultd exists and is executable (verify checks ExecStart=).
/// The binary is the one just built, linked in; the real home is untouched.
struct UserManagerHome {
    let folder: String

    init() throws {
        self.folder = try temporaryFolder()
        let manager = FileManager.default
        try manager.createDirectory(atPath: self.folder + "/run", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try manager.createDirectory(atPath: self.folder + "/home/.local/bin", withIntermediateDirectories: true)
        let vaultd = productsDirectory + "/vaultd"
        guard manager.isExecutableFile(atPath: vaultd) else {
            throw ToolFailure(message: "\(vaultd) is not built; the units' ExecStart= points at a copy of it")
        }
        try manager.createSymbolicLink(atPath: self.folder + "/home/.local/bin/vaultd", withDestinationPath: vaultd)
        try manager.createSymbolicLink(atPath: self.folder + "/home/.local/bin/vaultctl", withDestinationPath: productsDirectory + "/vaultctl")
    }

    var environment: [String: String] {
        [
            "HOME": self.folder + "/home",
            "XDG_RUNTIME_DIR": self.folder + "/run",
            "XDG_CONFIG_HOME": self.folder + "/home/.config",
            "SYSTEMD_COLORS": "0",
            "SYSTEMD_PAGER": "",
            "SYSTEMD_LOG_LEVEL": "info",
        ]
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: self.folder)
    }
}
