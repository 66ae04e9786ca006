public import ArgumentParser
import CVaultSystem
import Dispatch
import Glibc
public import Logging
import NIOCore
import Synchronization
public import VaultDaemon
import VaultProtocol
import VaultServer
import VaultStore

@main
struct VaultD: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vaultd",
        abstract: "The tokenvault daemon: keeps OAuth refresh tokens sealed and serves access tokens on a Unix socket.",
        version: TokenVault.version
    )

    @Option(help: "The socket path (default: $TOKENVAULT_SOCKET, else $XDG_RUNTIME_DIR/tokenvault/vaultd.sock).")
    var socket: String?

    @Option(help: "Where secrets rest: auto, file or keyring.")
    var backend: Daemon.BackendChoice = .auto

    @Option(help: "Where the file backend's key comes from: keyfile, passphrase or credential.")
    var keySource: Daemon.KeySourceChoice = .keyfile

    @Option(help: "The key file (default: $XDG_STATE_HOME/tokenvault/vault.key, made on first start).")
    var keyFile: String?

    @Option(help: "trace, debug, info, notice, warning or error.")
    var logLevel: Logger.Level = .info

    @Option(help: "When started by socket activation, exit after this many seconds with no connection (0: never).")
    var exitIdleAfter: Int = 0

    func run() throws {
        Self.sizeForOneUser()
        let level = self.logLevel
        LoggingSystem.bootstrap { JournalLogHandler(label: $0, level: level) }
        let logger = Logger(label: "vaultd")
        // No core dumps, no ptrace from other processes of the user (ssh-agent does the same).
        _ = vault_set_undumpable()
        Self.forbidCoreDumps()
        Self.raiseOpenFileLimit()
        do {
            let configuration = try Daemon.Configuration.fromEnvironment(
                socket: self.socket,
                backend: self.backend,
                keySource: self.keySource,
                keyFile: self.keyFile,
                exitIdleAfter: self.exitIdleAfter
            )
            try Self.waitingHere { try await Daemon(configuration, logger: logger).runService() }
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

    /// A per-user daemon serves one person's programs: one event loop and
    /// a small pool for blocking work (fsync, the keyring) whatever the
    /// machine's core count, and two malloc arenas, so its memory neither
    /// scales with the cores nor stays high after a burst. Before any of
    /// NIO's singletons exist.
    ///
    /// One loop, as ssh-agent has one thread: a second one on the same two
    /// cores as 64 busy clients was preempted about once per request, and
    /// one loop answers more of them, sooner, with fewer context switches.
    static func sizeForOneUser() {
        NIOSingletons.groupLoopCountSuggestion = 1
        NIOSingletons.blockingPoolThreadCountSuggestion = 4
        _ = vault_limit_malloc_arenas(2)
    }

    /// Runs `work` on Swift's executor and waits on this thread until it
    /// ends. An async `main` would give the main thread to dispatch_main(),
    /// which ends it with pthread_exit(): glibc unwinds the thread's stack,
    /// reading vaultd's unwind tables, 0.9 MB that then stayed resident for
    /// the daemon's whole life. At medium priority, as the tasks the event
    /// loops start are: Dispatch keeps a pool of worker threads for each
    /// priority in use, and the main thread's, user-initiated, added two.
    private static func waitingHere(_ work: @escaping @Sendable () async throws -> Void) throws {
        let ended = DispatchSemaphore(value: 0)
        let outcome = Mutex<Result<Void, any Error>>(.success(()))
        Task(priority: .medium) {
            do {
                try await work()
            } catch {
                outcome.withLock { $0 = .failure(error) }
            }
            ended.signal()
        }
        ended.wait()
        try outcome.withLock { $0 }.get()
    }

    /// No core file, soft or hard, whatever was inherited, as ssh-agent does:
    /// undumpable already says so, but a core_pattern pipe or a later
    /// prctl would not see a limit of 0 undone.
    static func forbidCoreDumps() {
        var none = rlimit(rlim_cur: 0, rlim_max: 0)
        _ = setrlimit(Int32(RLIMIT_CORE.rawValue), &none)
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
extension Daemon.BackendChoice: ExpressibleByArgument {}
extension Daemon.KeySourceChoice: ExpressibleByArgument {}
