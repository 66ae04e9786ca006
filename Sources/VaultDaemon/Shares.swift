public import Logging
import NIOCore
import VaultCrypto
import VaultProtocol

/// What a share's socket lets through: `hello`, `token` for its accounts
/// (within its scopes), `status` of its accounts and `subscribe` to their
/// events. Everything else, and every other account, is `forbidden`.
public struct ShareGrant: Sendable {
    public let id: String
    public let accounts: Set<String>
    public let scopes: [String]?
}

/// The shares vaultd serves: extra sockets (for a container's bind mount or
/// `ssh -R`), each with its own listener and grant. They live in memory and
/// end at their ttl, on `share.close`, or when vaultd stops; an ending share
/// removes its socket and closes its connections.
public actor Shares {
    private struct Entry {
        let result: ShareResult
        let server: SocketServer
        let expiry: Task<Void, Never>?
    }

    /// Shares at once.
    static let maximumShares = 32
    /// Connections one share accepts at once.
    static let maximumConnections = 256

    private var entries: [String: Entry] = [:]
    let clock: any WallClock
    let logger: Logger

    public init(clock: any WallClock = SystemClock(), logger: Logger) {
        self.clock = clock
        self.logger = logger
    }

    public var isEmpty: Bool { self.entries.isEmpty }

    func open(_ request: ShareOpen, known: Set<String>, dispatcher: Dispatcher) async throws(VaultError) -> ShareResult {
        for name in request.accounts where !known.contains(name) { throw VaultError.unknownAccount(name) }
        guard !self.entries.values.contains(where: { $0.result.socket == request.socket }) else {
            throw VaultError(.badRequest, "a share already serves \(request.socket); close it with: vaultctl unshare \(request.socket)")
        }
        guard self.entries.count < Self.maximumShares else {
            throw VaultError(.overloaded, "vaultd serves \(Self.maximumShares) shares already; close one with: vaultctl unshare ID")
        }
        let id = "s-" + ((try? randomBytes(6)) ?? []).map { String(UInt16($0) | 0x100, radix: 16).dropFirst() }.joined()
        let accounts = Array(Set(request.accounts)).sorted()
        let grant = ShareGrant(id: id, accounts: Set(accounts), scopes: request.scopes)
        var configuration = SocketServer.Configuration(path: request.socket)
        configuration.maximumConnections = Self.maximumConnections
        let server: SocketServer
        do {
            server = try await SocketServer.start(configuration, dispatcher: dispatcher.restricted(to: grant), logger: self.logger)
        } catch {
            throw VaultError(.badRequest, "cannot open the share's socket: \(error)")
        }
        let expiresAt = request.ttl.map { Seconds.int64(self.clock.now()) + Int64($0) }
        let expiry = request.ttl.map { ttl in
            Task {
                try? await Task.sleep(for: .seconds(ttl))
                guard !Task.isCancelled else { return }
                await self.end(id, reason: "expired")
            }
        }
        let result = ShareResult(share: id, socket: request.socket, accounts: accounts, scopes: request.scopes, expiresAt: expiresAt)
        self.entries[id] = Entry(result: result, server: server, expiry: expiry)
        self.logger.notice(
            "share opened",
            metadata: ["share": "\(id)", "socket": "\(request.socket)", "accounts": "\(accounts)", "ttl": "\(request.ttl.map(String.init) ?? "none")"]
        )
        return result
    }

    func list() -> ShareListResult {
        ShareListResult(shares: self.entries.values.map(\.result).sorted { $0.share < $1.share })
    }

    func close(_ target: ShareTarget) async throws(VaultError) -> EmptyResult {
        let id: String?
        switch target {
        case .id(let wanted): id = self.entries[wanted] != nil ? wanted : nil
        case .socket(let path): id = self.entries.first { $0.value.result.socket == path }?.key
        }
        guard let id else {
            throw VaultError(.badRequest, "there is no such share; see: vaultctl share --list")
        }
        await self.end(id, reason: "closed")
        return EmptyResult()
    }

    /// Ends every share (vaultd is stopping).
    public func closeAll() async {
        for id in self.entries.keys.sorted() { await self.end(id, reason: "vaultd stopping") }
    }

    private func end(_ id: String, reason: String) async {
        guard let entry = self.entries.removeValue(forKey: id) else { return }
        entry.expiry?.cancel()
        await entry.server.close()
        entry.server.closeConnections()
        self.logger.notice("share ended", metadata: ["share": "\(id)", "reason": "\(reason)"])
    }
}
