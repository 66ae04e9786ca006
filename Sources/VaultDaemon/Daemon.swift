package import Logging
import ServiceLifecycle
import Synchronization
import UnixSignals
package import VaultOIDC
import VaultProtocol
package import VaultServer
package import VaultStore

/// The daemon, assembled in one place from one configuration: the stores and
/// the choice of backend, the broker, the sign-in flows, the shares and the
/// dispatcher, the socket server (VaultServer) and the event hub it and the
/// broker share, and systemd's readiness, watchdog and idle exit. This is
/// the one place the rooms are wired to each other.
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
    package let broker: Broker
    package let dispatcher: Dispatcher
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
        let broker = try Broker(
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
        try await broker.start()
        self.configuration = configuration
        self.broker = broker
        self.dispatcher = Self.dispatcher(broker: broker, events: configuration.events, clock: configuration.clock, logger: logger)
        self.logger = logger
        self.backend = backends.store.backend
        self.lock = Mutex(lock)
    }

    /// Serves the socket until a graceful shutdown (or, with `exitIdleAfter`,
    /// until no connection has been open that long); then stops accepting and
    /// gives the requests under way up to 5 s to be answered. The broker's
    /// chores run beside it, and end with it.
    package func run() async throws {
        let chores = self.broker.chores
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
                handler: self.dispatcher,
                events: self.configuration.events,
                observer: self.broker.heapTrim,
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
        await self.dispatcher.shares.closeAll()
        await server.close()
        await withTaskGroup(of: Void.self) { race in
            race.addTask { await server.untilNoRequest() }
            race.addTask { try? await Task.sleep(for: Self.drainLimit) }
            await race.next()
            race.cancelAll()
        }
        if server.requestsInFlight > 0 {
            self.logger.warning("stopping with requests unanswered", metadata: ["requests": "\(server.requestsInFlight)"])
        }
        // As the process's exit would: what is still open ends with the daemon.
        server.closeConnections()
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
            if server.connectionsAccepted == accepted, server.openConnections == 0, await self.dispatcher.shares.isEmpty {
                self.logger.info("idle; exiting until the next connection")
                return
            }
        }
    }

    /// The dispatcher for `broker`, with the sign-in flows and the shares it
    /// runs; a share's socket is a socket server that answers through the
    /// same dispatcher, restricted to the share's grant.
    package static func dispatcher(broker: Broker, events: EventHub, clock: any WallClock, logger: Logger) -> Dispatcher {
        let signIns = SignIns(broker: broker, oidc: broker.oidc, events: events, logger: logger)
        // A share's dispatcher needs the shares, whose listener makes it: the
        // listener holds them weakly, so they and the broker are not kept
        // alive by their own listener once the daemon lets go of them.
        let made = SharesOnce()
        let shares = Shares(
            listen: { path, grant, maximumConnections in
                guard let shares = made.shares else { throw ServerError("vaultd is stopping") }
                var configuration = SocketServer.Configuration(path: path)
                configuration.maximumConnections = maximumConnections
                return try await SocketServer.start(
                    configuration,
                    handler: Dispatcher(broker: broker, signIns: signIns, shares: shares, clock: clock, logger: logger).restricted(to: grant),
                    events: events,
                    observer: broker.heapTrim,
                    logger: logger
                )
            },
            chores: broker.chores,
            logger: logger
        )
        made.shares = shares
        return Dispatcher(broker: broker, signIns: signIns, shares: shares, clock: clock, logger: logger)
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

/// The shares, for their own listener: held weakly, and set once, before
/// any share can open, so reading it needs no lock.
private final class SharesOnce: @unchecked Sendable {
    weak var shares: Shares?
}

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
