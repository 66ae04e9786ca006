import Glibc
package import VaultProtocol

/// Where the daemon keeps its files, after the XDG base-directory rules.
package struct DaemonPaths: Sendable, Hashable {
    /// `$XDG_STATE_HOME/tokenvault`: the sealed vault, its key file, the lock.
    package var stateDirectory: String
    /// `$XDG_CONFIG_HOME/tokenvault`: account configuration, readable, no secrets.
    package var configDirectory: String

    package init(stateDirectory: String, configDirectory: String) {
        self.stateDirectory = stateDirectory
        self.configDirectory = configDirectory
    }

    /// The paths from the environment; HOME is the fallback the XDG rules name.
    package static func fromEnvironment() throws(VaultError) -> DaemonPaths {
        func base(_ variable: String, _ fallback: String) throws(VaultError) -> String {
            if let value = TokenVault.environment(variable), value.hasPrefix("/") { return value }
            guard let home = TokenVault.environment("HOME") else {
                throw VaultError.noHome(variable)
            }
            return home + "/" + fallback
        }
        return DaemonPaths(
            stateDirectory: try base("XDG_STATE_HOME", ".local/state") + "/tokenvault",
            configDirectory: try base("XDG_CONFIG_HOME", ".config") + "/tokenvault"
        )
    }

    package var vaultFile: String { self.stateDirectory + "/vault.sealed" }
    package var defaultKeyFile: String { self.stateDirectory + "/vault.key" }
    package var lockFile: String { self.stateDirectory + "/vaultd.lock" }
    package var accountsFile: String { self.configDirectory + "/accounts.json" }
}
