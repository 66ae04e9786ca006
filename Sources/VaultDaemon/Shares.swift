import Logging
import NIOCore
import VaultCrypto
import VaultProtocol

/// The shares vaultd serves: extra sockets (for a container's bind mount or
/// `ssh -R`), each with its own listener and grant. They live in memory and
/// end at their ttl, on `share.close`, or when vaultd stops; an ending share
/// removes its socket and closes its connections.
package actor Shares {
    /// Opens a share's socket at `path`, served by `door`, with at most
    /// `maximumConnections` open: the composition root wires it to the
    /// socket server.
    package typealias Listen = @Sendable (_ path: String, _ door: ShareDoor, _ maximumConnections: Int) async throws -> any ShareSocket
    /// The door for a share's grant; `expire` ends the share.
    package typealias Door = @Sendable (_ grant: ShareGrant, _ expire: @escaping @Sendable () async -> Void) -> ShareDoor

    private struct Entry {
        let result: ShareResult
        let grant: ShareGrant
        let socket: any ShareSocket
        let expiry: Chores.Ticket?
    }

    /// Shares at once.
    static let maximumShares = 32
    /// Connections one share accepts at once.
    static let maximumConnections = 256

    private var entries: [String: Entry] = [:]
    let listen: Listen
    let door: Door
    let chores: Chores
    let logger: Logger

    init(listen: @escaping Listen, door: @escaping Door, chores: Chores, logger: Logger) {
        self.listen = listen
        self.door = door
        self.chores = chores
        self.logger = logger
    }

    package var isEmpty: Bool { self.entries.isEmpty }

    func open(_ request: ShareOpen, accounts configurations: [AccountConfiguration]) async throws(VaultError) -> ShareResult {
        let socket = try SocketPath.normalized(request.socket)
        guard !self.entries.values.contains(where: { $0.result.socket == socket }) else {
            throw VaultError.shareExists(socket)
        }
        guard self.entries.count < Self.maximumShares else {
            throw VaultError.tooManyShares(Self.maximumShares)
        }
        let id = randomID("s-", bytes: 6)
        var granted: [String: ShareGrant.Account] = [:]
        for configuration in configurations {
            guard let identity = configuration.identity else { throw VaultError.unknownAccount(configuration.name) }
            granted[configuration.name] = ShareGrant.Account(identity: identity, scopes: request.scopes ?? configuration.scopes)
        }
        let accounts = granted.keys.sorted()
        // The deadline the gate checks on every request is on the clock
        // nobody can set; `expires_at` is the same moment on the wall clock.
        let clock = self.chores.clock
        let now = clock.now()
        let deadline = request.ttl.map { clock.uptime() + Double($0) }
        let expiresAt = request.ttl.map { Seconds.int64(now) + Int64($0) }
        let grant = ShareGrant(id: id, accounts: granted, scopes: request.scopes, dpop: request.dpop, deadline: deadline)
        let server: any ShareSocket
        do {
            // The door holds the share weakly: an open share does not keep the shares alive.
            let door = self.door(grant) { [weak self] in await self?.expire(id) }
            server = try await self.listen(socket, door, Self.maximumConnections)
        } catch {
            throw VaultError.shareNotOpened(error)
        }
        let expiry = request.ttl.map { ttl in
            self.chores.at(now + Double(ttl)) { await self.end(id, reason: "expired") }
        }
        let result = ShareResult(
            share: id,
            socket: socket,
            accounts: accounts,
            scopes: request.scopes,
            expiresAt: expiresAt,
            dpop: request.dpop
        )
        self.entries[id] = Entry(result: result, grant: grant, socket: server, expiry: expiry)
        self.logger.notice(
            "share opened",
            metadata: ["share": "\(id)", "socket": "\(socket)", "accounts": "\(accounts)", "ttl": "\(request.ttl.map(String.init) ?? "none")"]
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
        case .socket(let path):
            let path = try SocketPath.normalized(path)
            id = self.entries.first { $0.value.result.socket == path }?.key
        }
        guard let id else {
            throw VaultError.noSuchShare
        }
        await self.end(id, reason: "closed")
        return EmptyResult()
    }

    /// Ends every share that holds the account `identity` (it was removed).
    func end(holding identity: String) async {
        let holding = self.entries.filter { $0.value.grant.accounts.values.contains { $0.identity == identity } }
        for id in holding.keys.sorted() { await self.end(id, reason: "an account it shares was removed") }
    }

    /// Ends the share `id`, which the gate found past its deadline.
    func expire(_ id: String) async {
        await self.end(id, reason: "expired")
    }

    /// Ends every share (vaultd is stopping): each stops accepting and is
    /// forgotten; returned are their sockets, whose requests under way the
    /// daemon drains with the main socket's before it closes their connections.
    package func closeAll() async -> [any ShareSocket] {
        var sockets: [any ShareSocket] = []
        for id in self.entries.keys.sorted() {
            guard let entry = self.entries.removeValue(forKey: id) else { continue }
            self.chores.cancel(entry.expiry)
            await entry.socket.close()
            sockets.append(entry.socket)
            self.logger.notice("share ended", metadata: ["share": "\(id)", "reason": "vaultd stopping"])
        }
        return sockets
    }

    private func end(_ id: String, reason: String) async {
        guard let entry = self.entries.removeValue(forKey: id) else { return }
        self.chores.cancel(entry.expiry)
        await entry.socket.close()
        entry.socket.closeConnections()
        self.logger.notice("share ended", metadata: ["share": "\(id)", "reason": "\(reason)"])
    }
}

/// A share's open socket, as `Shares` ends it.
package protocol ShareSocket: Sendable {
    /// Stops accepting and removes the socket file.
    func close() async
    /// Closes every connection it accepted.
    func closeConnections()
    /// Returns once no request it accepted is under way.
    func untilNoRequest() async
    /// Requests under way.
    var requestsInFlight: Int { get }
}

/// A share's socket path as vaultd keeps and compares it: absolute, with no
/// `.` or `..` and no doubled or trailing `/`, so one socket has one name.
enum SocketPath {
    static func normalized(_ path: String) throws(VaultError) -> String {
        // The message names no path vaultd made up: its working directory is not the client's business.
        guard path.hasPrefix("/") else {
            throw VaultError.relativeSharePath
        }
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        guard !parts.isEmpty, !parts.contains(where: { $0 == "." || $0 == ".." }) else {
            throw VaultError.dottedSharePath
        }
        return "/" + parts.joined(separator: "/")
    }
}
