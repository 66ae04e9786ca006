import FoundationEssentials
package import NIOPosix
package import VaultProtocol
import VaultStore

/// The account configurations, kept in one JSON file a person can read and
/// edit (`accounts.json`). Secrets never go here.
package struct AccountDirectory: Sendable {
    package let path: String
    private let threadPool: NIOThreadPool

    package init(path: String, threadPool: NIOThreadPool = .singleton) {
        self.path = path
        self.threadPool = threadPool
    }

    private struct File: Codable {
        var version = 1
        /// Where the accounts' secrets rest (`file` or `keyring`), so the
        /// `auto` backend finds them where they were left.
        var backend: String?
        var accounts: [AccountConfiguration]
    }

    /// Reads the file at start-up; a missing file is an empty directory.
    package func load() throws(VaultError) -> [AccountConfiguration] {
        try self.read()?.accounts ?? []
    }

    /// The backend the file says holds the secrets, if it says.
    package func recordedBackend() throws(VaultError) -> Backend? {
        try self.read()?.backend.flatMap(Backend.init(rawValue:))
    }

    private func read() throws(VaultError) -> File? {
        let bytes: [UInt8]?
        do {
            bytes = try FileSystem.read(self.path, limit: 4 << 20)
        } catch {
            throw VaultError(error)
        }
        guard let bytes else { return nil }
        do {
            let file = try JSONDecoder().decode(File.self, from: Data(bytes))
            guard file.version == 1 else {
                throw VaultError.accountsFileVersion(self.path, file.version)
            }
            return file
        } catch let error as VaultError {
            throw error
        } catch {
            throw VaultError.accountsFileInvalid(self.path)
        }
    }

    package func save(_ accounts: [AccountConfiguration], backend: Backend) async throws(VaultError) {
        let bytes: [UInt8]
        do {
            bytes = Array(try LineCodec.json(File(backend: backend.rawValue, accounts: accounts.sorted { $0.name < $1.name }), pretty: true))
        } catch {
            throw VaultError.accountsNotEncoded
        }
        let path = self.path
        let failure: StoreError?
        do {
            failure = try await self.threadPool.runIfActive { () -> StoreError? in
                do throws(StoreError) {
                    try FileSystem.ensurePrivateDirectory(FileSystem.directory(of: path))
                    try FileSystem.writeAtomically(bytes + [0x0A], to: path)
                    return nil
                } catch {
                    return error
                }
            }
        } catch {
            throw VaultError.ioStopped
        }
        if let failure { throw VaultError(failure) }
    }
}
