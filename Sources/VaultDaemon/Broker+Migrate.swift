import Logging
package import VaultProtocol
import VaultStore

extension Broker {
    /// Moves every account's secrets to another backend, one account at a
    /// time: written to the target, read back and compared, and only then
    /// removed from the source, so no token is ever in neither. The daemon
    /// then uses the target, and accounts.json records it for the next start.
    package func migrate(to name: Backend) async throws(VaultError) -> MigrationResult {
        let source = self.store
        guard source.backend != name else {
            return MigrationResult(from: name, to: name, moved: [])
        }
        guard let index = self.alsoWipe.firstIndex(where: { $0.backend == name }) else {
            throw VaultError.backendUnavailable(name)
        }
        let target = self.alsoWipe[index]
        try self.requireUnlocked()
        if target.isLocked { throw VaultError.vaultLocked }
        // One turn of the store queue: no save or remove runs between the
        // copy and the switch, and those asked meanwhile go to the target.
        let moving = self.storeQueue.enqueue { () async -> Result<[String], VaultError> in
            await self.move(from: source, to: target, backendIndex: index)
        }
        let moved = try await moving.value.get()
        try await self.saveDirectory()
        self.logger.notice("secrets migrated", metadata: ["from": "\(source.backend.rawValue)", "to": "\(name.rawValue)", "accounts": "\(moved.count)"])
        return MigrationResult(from: source.backend, to: name, moved: moved)
    }

    private func move(from source: any SecretStore, to target: any SecretStore, backendIndex index: Int) async -> Result<[String], VaultError> {
        let name = target.backend.rawValue
        guard self.store.backend == source.backend else {
            return .failure(VaultError.migratedMeanwhile(to: self.store.backend))
        }
        var moved: [String] = []
        for account in self.accounts.keys.sorted() {
            let owner = self.owner(of: account)
            do throws(StoreError) {
                guard let secrets = try await source.load(owner) else { continue }
                try await target.save(secrets, for: owner)
                guard try await target.load(owner) == secrets else {
                    throw StoreError(.io, "the \(name) backend did not give back what was written for '\(account)'")
                }
                _ = try await source.remove(account)
            } catch {
                self.logger.error("migration stopped", metadata: ["account": "\(account)", "reason": "\(error.message)"])
                return .failure(VaultError.migrationStopped(at: account, error, to: target.backend, from: source.backend))
            }
            moved.append(account)
        }
        self.alsoWipe[index] = source
        self.store = target
        self.backendReason = "migrated from \(source.backend.rawValue)"
        return .success(moved)
    }
}
