package import Logging
import ServiceLifecycle
import Synchronization
import UnixSignals
package import VaultOIDC
package import VaultProtocol
package import VaultServer
package import VaultStore

/// The daemon, from one configuration: the stores and the choice of
/// backend, the rooms (`Rooms`, wired to each other in one place), the
/// socket server (VaultServer), and systemd's readiness, watchdog and idle
/// exit.
///
/// `init` opens the vault and starts the broker; `run`, as a
/// swift-service-lifecycle `Service`, serves the socket until a graceful
/// shutdown and then drains. vaultd calls `runService()`, which adds the
/// watchdog and SIGTERM/SIGINT; the tests run the same `Daemon` in a
/// `ServiceGroup` of their own.
package final class Daemon: Service, Sendable {
    package enum BackendChoice: String, Sendable, CaseIterable {
        case auto, file, keyring
    }

    package enum KeySourceChoice: String, Sendable, CaseIterable {
        case keyfile, passphrase, credential
    }

    package struct Configuration: Sendable {
        package var paths: DaemonPaths
        package var socket: SocketServer.Configuration
        /// The socket's folder is the daemon's own (the default one): made and kept 0700.
        package var ownsSocketFolder = false
        package var backend: BackendChoice = .auto
        package var keySource: KeySource
        /// Whether the Secret Service is asked at all (a test keeps to the file).
        package var asksKeyring = true
        /// Exit once no connection has been open this long (socket activation).
        package var exitIdleAfter: Duration?
        /// Ping systemd's watchdog this often.
        package var watchdog: Duration?
        package var oidc = OIDCClient.Configuration()
        package var clock: any WallClock = SystemClock()
        package var events = EventHub()
        /// Wraps the store in use (a test slows or fails it).
        package var wrapStore: @Sendable (any SecretStore) -> any SecretStore = { $0 }

        package init(paths: DaemonPaths, socket: String, keySource: KeySource) {
            self.paths = paths
            self.socket = SocketServer.Configuration(path: socket)
            self.keySource = keySource
        }

        /// vaultd's: its flags, the environment (XDG, `$TOKENVAULT_SOCKET`,
        /// `$CREDENTIALS_DIRECTORY`) and what systemd passed (a socket, a watchdog).
        package static func fromEnvironment(
            socket: String?,
            backend: BackendChoice,
            keySource: KeySourceChoice,
            keyFile: String?,
            exitIdleAfter: Int
        ) throws -> Configuration {
            let paths = try DaemonPaths.fromEnvironment()
            var configuration = Configuration(
                paths: paths,
                socket: try TokenVault.socketPath(explicit: socket),
                keySource: try Self.resolve(keySource, keyFile: keyFile, paths: paths)
            )
            configuration.ownsSocketFolder = socket == nil && TokenVault.environment("TOKENVAULT_SOCKET") == nil
            configuration.backend = backend
            configuration.socket.inherited = Systemd.inheritedSocket(named: "vaultd")
            if configuration.socket.inherited != nil && exitIdleAfter > 0 {
                configuration.exitIdleAfter = .seconds(exitIdleAfter)
            }
            configuration.watchdog = Systemd.watchdogPing
            return configuration
        }

        private static func resolve(_ choice: KeySourceChoice, keyFile: String?, paths: DaemonPaths) throws -> KeySource {
            switch choice {
            case .keyfile:
                return .keyFile(keyFile ?? paths.defaultKeyFile)
            case .passphrase:
                return .passphrase
            case .credential:
                guard let directory = TokenVault.environment("CREDENTIALS_DIRECTORY") else {
                    throw ServerError(
                        "--key-source credential needs $CREDENTIALS_DIRECTORY; run under systemd with LoadCredential=vault.key"
                    )
                }
                return .credential(directory + "/vault.key")
            }
        }
    }

    package let configuration: Configuration
    package let rooms: Rooms
    let logger: Logger
    /// The backend in use at start, for systemd's status line.
    private let backend: Backend
    /// One daemon per vault: held from `init` to the end of `run`.
    private let lock: Mutex<LockFile?>
    private let server = Listening()
    static let drainLimit: Duration = .seconds(5)

    /// Takes the vault's lock, opens the stores, chooses the backend and
    /// starts the broker. Nothing listens yet.
    package init(_ configuration: Configuration, logger: Logger) async throws {
        let paths = configuration.paths
        // What is read from these folders says where refresh tokens go and
        // holds them sealed: no other user may be able to write any of it.
        try PrivateFolder.check(paths.stateDirectory, role: "the state folder")
        try PrivateFolder.check(paths.configDirectory, role: "the config folder")
        for file in [paths.accountsFile, paths.vaultFile] { try PrivateFolder.checkFile(file) }
        try FileSystem.ensurePrivateDirectory(paths.stateDirectory)
        let lock = try LockFile(path: paths.lockFile)
        if configuration.ownsSocketFolder {
            try FileSystem.ensurePrivateDirectory(FileSystem.directory(of: configuration.socket.path))
        }
        let directory = AccountDirectory(path: paths.accountsFile)
        let backends = try await Self.backends(configuration, directory: directory, logger: logger)
        logger.info(
            "vault opened",
            metadata: [
                "backend": "\(backends.store.backend.rawValue)", "reason": "\(backends.reason)",
                "key_source": "\(configuration.keySource.name)", "locked": "\(backends.store.isLocked)",
            ]
        )
        let rooms = try Rooms(
            store: configuration.wrapStore(backends.store),
            alsoWipe: backends.others,
            backendReason: backends.reason,
            directory: directory,
            keySource: configuration.keySource,
            oidc: OIDCClient(configuration: configuration.oidc, logger: logger),
            clock: configuration.clock,
            events: configuration.events,
            logger: logger
        )
        try await rooms.broker.start()
        self.configuration = configuration
        self.rooms = rooms
        self.logger = logger
        self.backend = backends.store.backend
        self.lock = Mutex(lock)
    }

    /// Serves the socket until a graceful shutdown (or, with `exitIdleAfter`,
    /// until no connection has been open that long); then stops accepting and
    /// gives the requests under way up to 5 s to be answered, on the main
    /// socket and on every share's alike. The chores run beside it, and end
    /// with it.
    package func run() async throws {
        let chores = self.rooms.chores
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await chores.run() }
            defer { chores.stop() }
            try await self.serve()
        }
    }

    private func serve() async throws {
        defer { self.lock.withLock { $0 = nil } }
        let server: SocketServer
        do {
            server = try await SocketServer.start(
                self.configuration.socket,
                handler: self.rooms.dispatcher,
                events: self.rooms.events,
                observer: self.rooms.heapTrim,
                logger: self.logger
            )
        } catch {
            self.server.fail(error)
            throw error
        }
        self.server.succeed(server)
        Systemd.notify("READY=1\nSTATUS=serving on \(self.configuration.socket.path) (\(self.backend.rawValue) backend)")
        if let idle = self.configuration.exitIdleAfter {
            await cancelWhenGracefulShutdown { await self.untilIdle(server, for: idle) }
        } else {
            try? await gracefulShutdown()
        }
        Systemd.notify("STOPPING=1\nSTATUS=stopping")
        let shares = await self.rooms.shares.closeAll()
        await server.close()
        let sockets: [any ShareSocket] = [server] + shares
        await withTaskGroup(of: Void.self) { race in
            race.addTask {
                await withTaskGroup(of: Void.self) { all in
                    for socket in sockets { all.addTask { await socket.untilNoRequest() } }
                }
            }
            race.addTask { try? await Task.sleep(for: Self.drainLimit) }
            await race.next()
            race.cancelAll()
        }
        let unanswered = sockets.reduce(0) { $0 + $1.requestsInFlight }
        if unanswered > 0 {
            self.logger.warning("stopping with requests unanswered", metadata: ["requests": "\(unanswered)"])
        }
        // As the process's exit would: what is still open ends with the daemon.
        for socket in sockets { socket.closeConnections() }
    }

    /// Returns once no connection has been open for `idle` and no share is
    /// open (or the task is cancelled): it wakes when the last connection
    /// closes and when the time is up, never to look in between.
    private func untilIdle(_ server: SocketServer, for idle: Duration) async {
        let clock = self.configuration.clock
        let seconds = Double(idle.components.seconds) + Double(idle.components.attoseconds) / 1e18
        while !Task.isCancelled {
            await server.untilNoConnection()
            let accepted = server.connectionsAccepted
            do {
                try await clock.sleep(until: clock.now() + seconds)
            } catch {
                return
            }
            if server.connectionsAccepted == accepted, server.openConnections == 0, await self.rooms.shares.isEmpty {
                self.logger.info("idle; exiting until the next connection")
                return
            }
        }
    }

    /// The socket server, once `run` listens.
    package func listening() async throws -> SocketServer {
        try await self.server.value()
    }

    /// Runs the daemon as vaultd does: with systemd's watchdog, until SIGTERM
    /// or SIGINT (or the idle exit). The socket opens inside the service
    /// group, so a signal is handled from before the first connection.
    package func runService() async throws {
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: self, successTerminationBehavior: .gracefullyShutdownGroup)
        ]
        if let ping = self.configuration.watchdog {
            services.append(.init(service: WatchdogService(interval: ping)))
        }
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: services,
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: self.logger
            )
        )
        try await group.run()
        self.logger.info("stopped")
    }

    /// The backend secrets rest in, why, and the other one when it is
    /// reachable (sign-out empties it too; `migrate` moves to it).
    private static func backends(
        _ configuration: Configuration,
        directory: AccountDirectory,
        logger: Logger
    ) async throws -> (store: any SecretStore, others: [any SecretStore], reason: String) {
        let probe: Result<Void, StoreError>? = configuration.asksKeyring ? await KeyringStore.probe(timeout: .seconds(1)) : nil
        let keyringAnswers: Bool
        switch probe {
        case .success: keyringAnswers = true
        case .failure(let error): keyringAnswers = error.kind == .locked
        case nil: keyringAnswers = false
        }
        let choice: Backend
        let reason: String
        switch configuration.backend {
        case .file:
            (choice, reason) = (.file, "chosen with --backend file")
        case .keyring:
            (choice, reason) = (.keyring, "chosen with --backend keyring")
        case .auto:
            if let recorded = try directory.recordedBackend() {
                (choice, reason) = (recorded, "auto: accounts.json says the secrets are in the \(recorded.rawValue)")
            } else if !(try directory.load()).isEmpty {
                (choice, reason) = (.file, "auto: accounts from an earlier version keep their secrets in the file")
            } else if keyringAnswers {
                (choice, reason) = (.keyring, "auto: a Secret Service answered")
            } else {
                (choice, reason) = (.file, "auto: no Secret Service answered (\(probe?.failureMessage ?? "?"))")
            }
        }
        // The file is always there to wipe and migrate to, but a passphrase
        // vault that is locked at start only when it is the one in use.
        let sealed = try SealedFileStore(path: configuration.paths.vaultFile, keySource: configuration.keySource)
        let file: (any SecretStore)? = choice == .file || !sealed.isLocked ? sealed : nil
        // A keyring out of reach (an SSH login to the desktop machine: no
        // session bus) does not stop the daemon, which would only be started
        // again: the store reports itself locked and why, `status` says so,
        // and `unlock` tries the keyring again.
        var keyring: KeyringStore?
        if configuration.asksKeyring && (choice == .keyring || keyringAnswers) {
            let store = KeyringStore()
            _ = try? await store.checkLocked()
            if let unreachable = store.unreachable {
                logger.warning(
                    "the keyring cannot be reached; its accounts wait for: vaultctl unlock",
                    metadata: ["reason": "\(unreachable)"]
                )
            }
            keyring = store
        }
        let primary: (any SecretStore)? = choice == .file ? file : keyring
        guard let primary else { throw ServerError("no \(choice.rawValue) backend could be opened") }
        let stores: [(any SecretStore)?] = [file, keyring]
        let others = stores.compactMap { $0 }.filter { $0.backend != primary.backend }
        return (primary, others, reason)
    }
}

extension SocketServer: ShareSocket {}

/// Tells systemd's watchdog the daemon is alive, at half its interval.
struct WatchdogService: Service {
    let interval: Duration

    func run() async throws {
        // Cancelled at once on a graceful shutdown, not after its next sleep.
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                Systemd.notify("WATCHDOG=1")
                try? await Task.sleep(for: self.interval)
            }
        }
    }
}

/// The socket server of a running daemon, for whoever waits for it to listen.
private final class Listening: Sendable {
    private enum State {
        case waiting([CheckedContinuation<SocketServer, any Error>])
        case done(Result<SocketServer, any Error>)
    }

    private let state = Mutex<State>(.waiting([]))

    func value() async throws -> SocketServer {
        try await withCheckedThrowingContinuation { continuation in
            let done: Result<SocketServer, any Error>? = self.state.withLock { state in
                switch state {
                case .waiting(let waiters):
                    state = .waiting(waiters + [continuation])
                    return nil
                case .done(let result):
                    return result
                }
            }
            if let done { continuation.resume(with: done) }
        }
    }

    func succeed(_ server: SocketServer) { self.finish(.success(server)) }
    func fail(_ error: any Error) { self.finish(.failure(error)) }

    private func finish(_ result: Result<SocketServer, any Error>) {
        let waiters = self.state.withLock { state -> [CheckedContinuation<SocketServer, any Error>] in
            guard case .waiting(let waiters) = state else { return [] }
            state = .done(result)
            return waiters
        }
        for waiter in waiters { waiter.resume(with: result) }
    }
}

extension Result where Failure == StoreError {
    var failureMessage: String? {
        if case .failure(let error) = self { return error.message }
        return nil
    }
}

/// The rooms of a vault, made and wired to each other in this one place:
/// the chores on the vault's clock, the heap trim, the token cache, the
/// event hub, the broker (accounts and secrets), the sign-in flows, the
/// shares and the two doors, the main socket's `Dispatcher` and a share's
/// `ShareDoor`. Each room is handed what it needs here and constructs no
/// other; a new room plugs in here, not into the broker.
package struct Rooms: Sendable {
    package let clock: any WallClock
    package let chores: Chores
    package let heapTrim: HeapTrim
    package let cache: TokenCache
    package let events: EventHub
    package let broker: Broker
    package let signIns: SignIns
    package let shares: Shares
    package let dispatcher: Dispatcher

    /// `listen`: how a share's socket is opened (a socket server, unless a
    /// test watches the shares without sockets).
    package init(
        store: any SecretStore,
        alsoWipe: [any SecretStore] = [],
        backendReason: String? = nil,
        directory: AccountDirectory,
        keySource: KeySource?,
        oidc: OIDCClient,
        clock: any WallClock,
        events: EventHub,
        logger: Logger,
        listen: Shares.Listen? = nil
    ) throws(VaultError) {
        let chores = Chores(clock: clock)
        let heapTrim = HeapTrim(chores: chores)
        let cache = TokenCache()
        let broker = try Broker(
            store: store,
            alsoWipe: alsoWipe,
            backendReason: backendReason,
            directory: directory,
            keySource: keySource,
            oidc: oidc,
            clock: clock,
            cache: cache,
            chores: chores,
            heapTrim: heapTrim,
            events: events,
            logger: logger
        )
        let signIns = SignIns(broker: broker, oidc: oidc, events: events, chores: chores, logger: logger)
        let shares = Shares(
            listen: listen ?? { path, door, maximumConnections in
                var configuration = SocketServer.Configuration(path: path)
                configuration.maximumConnections = maximumConnections
                return try await SocketServer.start(configuration, handler: door, events: events, observer: heapTrim, logger: logger)
            },
            door: { grant, expire in
                ShareDoor(grant: grant, broker: broker, cache: cache, chores: chores, clock: clock, logger: logger, expire: expire)
            },
            chores: chores,
            logger: logger
        )
        self.clock = clock
        self.chores = chores
        self.heapTrim = heapTrim
        self.cache = cache
        self.events = events
        self.broker = broker
        self.signIns = signIns
        self.shares = shares
        self.dispatcher = Dispatcher(
            broker: broker, cache: cache, chores: chores, signIns: signIns, shares: shares, clock: clock, logger: logger
        )
    }
}
