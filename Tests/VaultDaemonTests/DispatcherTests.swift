import Foundation
import Logging
import Synchronization
import Testing
import VaultCrypto
import VaultDaemon
import VaultOIDC
import VaultProtocol
import VaultServer
import VaultStore
import VaultTestIssuer
import VaultTestKit

/// The rooms alone, without a socket: a vault in a folder, and a share
/// listener that opens nothing and records what it was asked.
@Suite(.timeLimit(.minutes(1)))
struct DispatcherTests {
    /// A share "socket" that is only a record of its grant and of being closed.
    final class FakeShareSocket: ShareSocket {
        let path: String
        let grant: ShareGrant
        let closed = Atomic<Bool>(false)

        init(path: String, grant: ShareGrant) {
            self.path = path
            self.grant = grant
        }

        func close() async { self.closed.store(true, ordering: .relaxed) }
        func closeConnections() {}
        func untilNoRequest() async {}
        var requestsInFlight: Int { 0 }
    }

    final class Opened: Sendable {
        let sockets = Mutex<[FakeShareSocket]>([])
    }

    struct Setup: Stoppable {
        let issuer: TestIssuer
        let rooms: Rooms
        let dispatcher: Dispatcher
        let opened: Opened

        func stop() async { await self.issuer.stop() }
        func sockets() -> [FakeShareSocket] { self.opened.sockets.withLock { $0 } }
    }

    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    /// The rooms of a vault on a new folder (the file backend with a key
    /// file), whose shares open no socket: `listen` hands them to `opened`.
    static func rooms(listen: Shares.Listen? = nil) throws -> Rooms {
        let folder = try temporaryFolder()
        return try Rooms(
            store: try SealedFileStore(path: folder + "/vault.sealed", keySource: .keyFile(folder + "/vault.key")),
            directory: AccountDirectory(path: folder + "/accounts.json"),
            keySource: .keyFile(folder + "/vault.key"),
            oidc: OIDCClient(logger: Self.logger),
            clock: SystemClock(),
            events: EventHub(),
            logger: Self.logger,
            listen: listen
        )
    }

    func setUp() async throws -> Setup {
        let issuer = try await TestIssuer.start()
        let opened = Opened()
        let rooms = try Self.rooms { path, door, _ in
            let socket = FakeShareSocket(path: path, grant: door.grant)
            opened.sockets.withLock { $0.append(socket) }
            return socket
        }
        let broker = rooms.broker
        try await broker.start()
        _ = try await broker.add(
            AccountAddition(
                configuration: AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"]),
                refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
            )
        )
        return Setup(issuer: issuer, rooms: rooms, dispatcher: rooms.dispatcher, opened: opened)
    }

    func reply(_ setup: Setup, _ command: Command) -> Reply {
        setup.dispatcher.handle(Request(id: .number(1), command: command), from: testPeer)
    }

    /// A token the cache holds is answered at once, on the caller's thread; a miss is work for later.
    @Test func aCachedTokenIsReadyAndAMissIsPending() async throws {
        try await using(self.setUp()) { setup in
            let token = Command.token(TokenRequest(account: "work"))
            guard case .pending = self.reply(setup, token) else {
                Issue.record("a miss was answered at once")
                return
            }
            _ = await setup.dispatcher.answer(token, from: testPeer)
            guard case .ready(let response) = self.reply(setup, token), case .success = response.outcome else {
                Issue.record("a cached token was not answered at once")
                return
            }
            guard case .subscribe(_, let accounts) = self.reply(setup, .subscribe(accounts: ["work"])) else {
                Issue.record("subscribe is not a subscription")
                return
            }
            #expect(accounts == ["work"])
        }
    }

    /// A share is a grant handed to a listener: the dispatcher never opens a socket itself.
    @Test func aShareIsAGrantHandedToTheListenerAndEndsWithItsAccount() async throws {
        try await using(self.setUp()) { setup in
            let open = ShareOpen(accounts: ["work"], socket: "/run/share//x.sock", ttl: nil, scopes: nil)
            let opened = await setup.dispatcher.answer(.shareOpen(open), from: testPeer)
            guard case .success = opened.outcome else {
                Issue.record("\(opened)")
                return
            }
            let socket = try #require(setup.sockets().first)
            #expect(socket.path == "/run/share/x.sock")
            let identity = setup.rooms.cache.identity(of: "work")
            #expect(identity != nil)
            #expect(socket.grant.accounts["work"]?.identity == identity)
            #expect(socket.grant.accounts["work"]?.scopes == ["openid"])
            _ = await setup.dispatcher.answer(.accountRemove(name: "work"), from: testPeer)
            let closed = socket.closed.load(ordering: .relaxed)
            #expect(closed, "removing the account ends its share")
        }
    }

    /// The rooms hold their shares, and a share's door holds the share
    /// weakly: nothing of that keeps the shares (and through them the broker
    /// and its secrets) alive once the rooms are dropped.
    @Test func theRoomsDoNotKeepThemselvesAlive() async throws {
        weak var shares: Shares?
        weak var broker: Broker?
        do {
            let rooms = try Self.rooms()
            shares = rooms.shares
            broker = rooms.broker
            #expect(shares != nil)
        }
        #expect(shares == nil, "the shares outlived their rooms")
        #expect(broker == nil, "the broker outlived its rooms")
    }
}
