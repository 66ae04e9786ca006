import Glibc
public import VaultProtocol

/// Where the daemon keeps its files, after the XDG base-directory rules.
public struct DaemonPaths: Sendable, Hashable {
    /// `$XDG_STATE_HOME/tokenvault`: the sealed vault, its key file, the lock.
    public var stateDirectory: String
    /// `$XDG_CONFIG_HOME/tokenvault`: account configuration, readable, no secrets.
    public var configDirectory: String

    public init(stateDirectory: String, configDirectory: String) {
        self.stateDirectory = stateDirectory
        self.configDirectory = configDirectory
    }

    /// The paths from the environment; HOME is the fallback the XDG rules name.
    public static func fromEnvironment() throws(VaultError) -> DaemonPaths {
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

    public var vaultFile: String { self.stateDirectory + "/vault.sealed" }
    public var defaultKeyFile: String { self.stateDirectory + "/vault.key" }
    public var lockFile: String { self.stateDirectory + "/vaultd.lock" }
    public var accountsFile: String { self.configDirectory + "/accounts.json" }
}
