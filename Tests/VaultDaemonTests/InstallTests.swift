import Foundation
import Testing

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
            ".local/bin/vaultd", ".local/bin/vaultctl", ".config/systemd/user/vaultd.socket",
            ".config/systemd/user/vaultd.service", ".local/share/bash-completion/completions/vaultctl",
            ".local/share/zsh/site-functions/_vaultctl", ".local/share/fish/vendor_completions.d/vaultctl.fish",
        ] {
            #expect(FileManager.default.fileExists(atPath: home + "/" + path), "\(path)")
        }
        let bash = try String(contentsOfFile: home + "/.local/share/bash-completion/completions/vaultctl", encoding: .utf8)
        #expect(bash.contains("signin") && bash.contains("signout"), "the completions know the commands")
        #expect(result.stdout.contains("systemctl --user") , "\(result.stdout)")
        let version = try await runTool(home + "/.local/bin/vaultctl", ["--version"])
        #expect(version.status == 0)
        for binary in ["vaultd", "vaultctl"] {
            let sections = try await runTool("/usr/bin/readelf", ["-S", home + "/.local/bin/" + binary])
            #expect(sections.status == 0 && !sections.stdout.contains(".debug_info") && !sections.stdout.contains(".symtab"), "\(binary) is installed stripped")
        }
    }
}
