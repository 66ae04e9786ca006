import Foundation
import Testing
import VaultTestKit

/// scripts/install.sh puts everything where the units and the shells look.
@Suite(.timeLimit(.minutes(1)))
struct InstallTests {
    @Test func theInstallScriptPlacesBinariesUnitsAndCompletions() async throws {
        let home = try temporaryFolder()
        let result = try await runTool(
            packageRoot + "/scripts/install.sh",
            ["--from", productsDirectory],
            environment: ["HOME": home, "XDG_CONFIG_HOME": home + "/.config", "XDG_DATA_HOME": home + "/.local/share"]
        )
        #expect(result.status == 0, "\(result.stderr)")
        for path in [
            ".local/bin/vaultd", ".local/bin/vaultctl", ".local/bin/vaultctl-notify", ".config/systemd/user/vaultd.socket",
            ".config/systemd/user/vaultd.service", ".config/systemd/user/vaultctl-notify.service",
            ".local/share/bash-completion/completions/vaultctl",
            ".local/share/zsh/site-functions/_vaultctl", ".local/share/fish/vendor_completions.d/vaultctl.fish",
        ] {
            #expect(FileManager.default.fileExists(atPath: home + "/" + path), "\(path)")
        }
        let bash = try String(contentsOfFile: home + "/.local/share/bash-completion/completions/vaultctl", encoding: .utf8)
        #expect(bash.contains("signin") && bash.contains("signout"), "the completions know the commands")
        #expect(result.stdout.contains("systemctl --user") , "\(result.stdout)")
        let version = try await runTool(home + "/.local/bin/vaultctl", ["--version"])
        #expect(version.status == 0)
        for binary in ["vaultd", "vaultctl", "vaultctl-notify"] {
            let sections = try await runTool("/usr/bin/readelf", ["-S", home + "/.local/bin/" + binary])
            #expect(sections.status == 0 && !sections.stdout.contains(".debug_info") && !sections.stdout.contains(".symtab"), "\(binary) is installed stripped")
        }
    }

    /// What a user's install puts on the machine is what vaultd and vaultctl
    /// need: none of the servers and tools the test suite runs against.
    @Test func aUsersInstallInstallsNoTestPackage() async throws {
        let user = try await runTool(packageRoot + "/scripts/install-deps.sh", ["--list"])
        let tests = try await runTool(packageRoot + "/dev/install-test-deps.sh", ["--list"])
        #expect(user.status == 0 && tests.status == 0, "\(user.stderr)\(tests.stderr)")
        let userPackages = Set(user.stdout.split(separator: "\n").map(String.init))
        let testPackages = Set(tests.stdout.split(separator: "\n").map(String.init))
        #expect(userPackages.isSuperset(of: ["libsodium-dev", "libsecret-1-dev", "qrencode"]), "\(userPackages)")
        for package in ["glewlwyd", "openssh-server", "gnome-keyring", "tmux", "sqlite3"] {
            #expect(!userPackages.contains(package), "\(package) is for the tests")
            #expect(testPackages.contains(package), "\(package) is installed for the tests")
        }
        #expect(userPackages.isDisjoint(with: testPackages))
        // The scripts users run name only the user's list.
        for script in ["install.sh", "run.sh"] {
            let text = try String(contentsOfFile: packageRoot + "/scripts/" + script, encoding: .utf8)
            #expect(!text.contains("install-test-deps") && !text.contains("--also"), "\(script)")
        }
    }
}
