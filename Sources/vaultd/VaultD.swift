public import ArgumentParser
import CVaultSystem
import Glibc
public import Logging
import NIOCore
import ServiceLifecycle
import UnixSignals
import VaultDaemon
import VaultOIDC
import VaultProtocol
import VaultStore

@main
struct VaultD: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vaultd",
        abstract: "The tokenvault daemon: keeps OAuth refresh tokens sealed and serves access tokens on a Unix socket.",
        version: TokenVault.version
    )

    enum BackendChoice: String, ExpressibleByArgument, CaseIterable {
        case auto, file, keyring
    }

    enum KeySourceChoice: String, ExpressibleByArgument, CaseIterable {
        case keyfile, passphrase, credential
    }

    @Option(help: "The socket path (default: $TOKENVAULT_SOCKET, else $XDG_RUNTIME_DIR/tokenvault/vaultd.sock).")
    var socket: String?

    @Option(help: "Where secrets rest: auto, file or keyring.")
    var backend: BackendChoice = .auto

    @Option(help: "Where the file backend's key comes from: keyfile, passphrase or credential.")
    var keySource: KeySourceChoice = .keyfile

    @Option(help: "The key file (default: $XDG_STATE_HOME/tokenvault/vault.key, made on first start).")
    var keyFile: String?

    @Option(help: "trace, debug, info, notice, warning or error.")
    var logLevel: Logger.Level = .info

    @Option(help: "When started by socket activation, exit after this many seconds with no connection (0: never).")
    var exitIdleAfter: Int = 0

    func run() async throws {
        Self.sizeForOneUser()
        let level = self.logLevel
        LoggingSystem.bootstrap { JournalLogHandler(label: $0, level: level) }
        let logger = Logger(label: "vaultd")
        do {
            try await self.serve(logger: logger)
        } catch let error as VaultError {
            logger.error("\(error.message)")
            throw ExitCode(70)
        } catch let error as StoreError {
            logger.error("\(error.message)")
            throw ExitCode(70)
        } catch let error as ServerError {
            logger.error("\(error.description)")
            throw ExitCode(70)
        }
    }

    /// A per-user daemon serves one person's programs: two event loops and
    /// a small pool for blocking work (fsync, the keyring) whatever the
    /// machine's core count, and two malloc arenas, so its memory neither
    /// scales with the cores nor stays high after a burst. Before any of
    /// NIO's singletons exist.
    static func sizeForOneUser() {
        NIOSingletons.groupLoopCountSuggestion = min(System.coreCount, 2)
        NIOSingletons.blockingPoolThreadCountSuggestion = 4
        _ = vault_limit_malloc_arenas(2)
    }

    private func serve(logger: Logger) async throws {
        // No core dumps, no ptrace from other processes of the user (ssh-agent does the same).
        _ = vault_set_undumpable()
        Self.raiseOpenFileLimit()

        let paths = try DaemonPaths.fromEnvironment()
        try FileSystem.ensurePrivateDirectory(paths.stateDirectory)
        let lock = try LockFile(path: paths.lockFile)
        let socketPath = try TokenVault.socketPath(explicit: self.socket)
        if self.socket == nil && TokenVault.environment("TOKENVAULT_SOCKET") == nil {
            // The default folder, $XDG_RUNTIME_DIR/tokenvault, is ours: keep it 0700.
            try FileSystem.ensurePrivateDirectory(FileSystem.directory(of: socketPath))
        }

        let keySource = try self.resolvedKeySource(paths)
        let directory = AccountDirectory(path: paths.accountsFile)
        let backends = try await self.backends(paths: paths, keySource: keySource, directory: directory, logger: logger)
        let store = backends.store
        logger.info(
            "vault opened",
            metadata: [
                "backend": "\(store.backend.rawValue)", "reason": "\(backends.reason)", "key_source": "\(keySource.name)",
                "locked": "\(store.isLocked)",
            ]
        )

        let broker = try Broker(
            store: store,
            alsoWipe: backends.others,
            backendReason: backends.reason,
            directory: directory,
            keySource: keySource,
            oidc: OIDCClient(logger: logger),
            logger: logger
        )
        try await broker.start()
        var configuration = SocketServer.Configuration(path: socketPath)
        configuration.inherited = Systemd.inheritedSocket(named: "vaultd")
        // The socket opens inside the service group, so SIGTERM is handled
        // from before the first connection is accepted.
        let socketService = SocketService(
            configuration: configuration,
            dispatcher: Dispatcher(broker: broker, logger: logger),
            status: "serving on \(socketPath) (\(store.backend.rawValue) backend)",
            exitIdleAfter: configuration.inherited != nil && self.exitIdleAfter > 0 ? .seconds(self.exitIdleAfter) : nil,
            logger: logger
        )
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: socketService, successTerminationBehavior: .gracefullyShutdownGroup)
        ]
        if let ping = Systemd.watchdogPing {
            services.append(.init(service: WatchdogService(interval: ping)))
        }
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: services,
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger
            )
        )
        try await group.run()
        withExtendedLifetime(lock) {}
        logger.info("stopped")
    }

    /// The backend secrets rest in, why, and the other one when it is
    /// reachable (sign-out empties it too; `migrate` moves to it).
    private func backends(
        paths: DaemonPaths,
        keySource: KeySource,
        directory: AccountDirectory,
        logger: Logger
    ) async throws -> (store: any SecretStore, others: [any SecretStore], reason: String) {
        let probe = await KeyringStore.probe(timeout: .seconds(1))
        let keyringAnswers: Bool
        switch probe {
        case .success: keyringAnswers = true
        case .failure(let error): keyringAnswers = error.kind == .locked
        }
        let choice: Backend
        let reason: String
        switch self.backend {
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
                (choice, reason) = (.file, "auto: no Secret Service answered (\(probe.failureMessage ?? "?"))")
            }
        }
        // The file is always there to wipe and migrate to, but a passphrase
        // vault that is locked at start only when it is the one in use.
        let sealed = try SealedFileStore(path: paths.vaultFile, keySource: keySource)
        let file: (any SecretStore)? = choice == .file || !sealed.isLocked ? sealed : nil
        // A keyring out of reach (an SSH login to the desktop machine: no
        // session bus) does not stop the daemon, which would only be started
        // again: the store reports itself locked and why, `status` says so,
        // and `unlock` tries the keyring again.
        var keyring: KeyringStore?
        if choice == .keyring || keyringAnswers {
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

    private func resolvedKeySource(_ paths: DaemonPaths) throws -> KeySource {
        switch self.keySource {
        case .keyfile:
            return .keyFile(self.keyFile ?? paths.defaultKeyFile)
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

    /// One descriptor per connection: lift the soft limit to the hard one.
    private static func raiseOpenFileLimit() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// Serves the socket until a graceful shutdown (or, when socket-activated
/// with an idle limit, until no connection has been open that long); then
/// stops accepting and gives the requests under way up to 5 s to be answered.
struct SocketService: Service {
    let configuration: SocketServer.Configuration
    let dispatcher: Dispatcher
    let status: String
    let exitIdleAfter: Duration?
    let logger: Logger
    static let drainLimit: Duration = .seconds(5)

    func run() async throws {
        let server = try await SocketServer.start(self.configuration, dispatcher: self.dispatcher, logger: self.logger)
        Systemd.notify("READY=1\nSTATUS=\(self.status)")
        if let idle = self.exitIdleAfter {
            while !Task.isShuttingDownGracefully {
                try? await Task.sleep(for: .seconds(1))
                if let since = server.idleSince, ContinuousClock.now - since >= idle, await self.dispatcher.shares.isEmpty {
                    self.logger.info("idle; exiting until the next connection")
                    break
                }
            }
        } else {
            try? await gracefulShutdown()
        }
        Systemd.notify("STOPPING=1\nSTATUS=stopping")
        await self.dispatcher.shares.closeAll()
        await server.close()
        let clock = ContinuousClock()
        let deadline = clock.now + Self.drainLimit
        while server.requestsInFlight > 0 && clock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
        if server.requestsInFlight > 0 {
            self.logger.warning("stopping with requests unanswered", metadata: ["requests": "\(server.requestsInFlight)"])
        }
    }
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

extension Result where Failure == StoreError {
    var failureMessage: String? {
        if case .failure(let error) = self { return error.message }
        return nil
    }
}
