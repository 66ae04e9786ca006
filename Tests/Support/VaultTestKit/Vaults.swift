import Foundation
import Glibc
import Logging
package import NIOCore
import ServiceLifecycle
import Synchronization
import Testing
package import VaultDaemon
import VaultOIDC
package import VaultProtocol
package import VaultServer
package import VaultStore
package import VaultTestIssuer

/// `using(InProcessVault.start(...))`, for the commonest case.
package func withVault<T>(
    folder: String? = nil,
    clock: any WallClock = SystemClock(),
    maximumConnections: Int = 4096,
    idleTimeout: TimeAmount = .minutes(10),
    issuerTimeout: TimeAmount = .seconds(15),
    events: EventHub = EventHub(),
    wrapStore: @escaping @Sendable (any SecretStore) -> any SecretStore = { $0 },
    _ body: (InProcessVault) async throws -> T
) async throws -> T {
    try await using(
        InProcessVault.start(
            folder: folder,
            clock: clock,
            maximumConnections: maximumConnections,
            idleTimeout: idleTimeout,
            issuerTimeout: issuerTimeout,
            events: events,
            wrapStore: wrapStore
        ),
        body
    )
}

extension TestIssuer: Stoppable {}

extension SocketServer: Stoppable {
    package func stop() async { await self.close() }
}

/// A vault served in this process, as vaultd serves it (the same `Daemon`,
/// run in a service group), on the file backend with a key file.
package struct InProcessVault: Stoppable {
    package let folder: String
    package let socketPath: String
    package let daemon: Daemon
    package let server: SocketServer
    private let group: ServiceGroup
    private let running: Task<Void, any Error>

    package var rooms: Rooms { self.daemon.rooms }
    package var broker: Broker { self.daemon.rooms.broker }
    package var dispatcher: Dispatcher { self.daemon.rooms.dispatcher }
    package var cache: TokenCache { self.daemon.rooms.cache }
    package var signIns: SignIns { self.daemon.rooms.signIns }

    package static func start(
        folder: String? = nil,
        clock: any WallClock = SystemClock(),
        maximumConnections: Int = 4096,
        idleTimeout: TimeAmount = .minutes(10),
        issuerTimeout: TimeAmount = .seconds(15),
        revocationTimeout: TimeAmount? = nil,
        events: EventHub = EventHub(),
        wrapStore: @escaping @Sendable (any SecretStore) -> any SecretStore = { $0 }
    ) async throws -> InProcessVault {
        let folder = try folder ?? temporaryFolder()
        let paths = DaemonPaths(stateDirectory: folder + "/state", configDirectory: folder + "/config")
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        var configuration = Daemon.Configuration(
            paths: paths,
            socket: folder + "/s.sock",
            keySource: .keyFile(paths.defaultKeyFile)
        )
        configuration.backend = .file
        configuration.asksKeyring = false
        configuration.socket.maximumConnections = maximumConnections
        configuration.socket.idleTimeout = idleTimeout
        configuration.oidc.timeout = issuerTimeout
        if let revocationTimeout { configuration.oidc.revocationTimeout = revocationTimeout }
        configuration.clock = clock
        configuration.events = events
        configuration.wrapStore = wrapStore
        let daemon = try await Self.open(configuration, logger: logger)
        let group = ServiceGroup(services: [daemon], logger: logger)
        let running = Task { try await group.run() }
        do {
            let server = try await daemon.listening()
            return InProcessVault(
                folder: folder,
                socketPath: configuration.socket.path,
                daemon: daemon,
                server: server,
                group: group,
                running: running
            )
        } catch {
            _ = await running.result
            throw error
        }
    }

    /// The daemon on `configuration`. A restart on the same folder may find
    /// the vault's lock still held for a moment after the stop: every process
    /// this test process is starting holds a copy of each descriptor from its
    /// fork to its exec, the lock's too (close-on-exec closes it only at exec).
    /// So "another vaultd holds" is tried again until a deadline.
    private static func open(_ configuration: Daemon.Configuration, logger: Logger) async throws -> Daemon {
        var daemon: Daemon?
        var held: StoreError?
        _ = try await within(seconds: 5) {
            do {
                daemon = try await Daemon(configuration, logger: logger)
                return true
            } catch let error as StoreError where error.message.hasPrefix("another vaultd holds") {
                held = error
                return false
            }
        }
        guard let daemon else { throw held ?? ToolFailure(message: "the vault did not open") }
        return daemon
    }

    /// Stops serving, as vaultd does on SIGTERM, and waits until it has; the
    /// files stay, so a new vault on the same folder is a restart. Stopping
    /// twice is stopping once.
    package func stop() async {
        await self.group.triggerGracefulShutdown()
        _ = await self.running.result
    }

    package var vaultFile: String { self.folder + "/state/vault.sealed" }
    package var keyFile: String { self.folder + "/state/vault.key" }
}

extension InProcessVault {
    /// `work`'s access token for this test process, asked of the broker directly.
    package func workToken(force: Bool = false) async throws -> TokenResult {
        try await self.rooms.token(TokenRequest(account: "work", forceRefresh: force), for: testPeer)
    }

    /// Why asking for `work`'s token fails, or nil when it does not.
    package func workTokenFailure(force: Bool = false) async -> VaultError? {
        do {
            _ = try await self.workToken(force: force)
            return nil
        } catch let error as VaultError {
            return error
        } catch {
            return VaultError(.internalError, "\(type(of: error))")
        }
    }
}

/// A test issuer and a vault served in this process, with a folder of the
/// test's own as `HOME`; stopped together.
package struct IssuerAndVault: Stoppable {
    package let issuer: TestIssuer
    package let vault: InProcessVault
    package let folder: String
    package var environment: [String: String] { ["TOKENVAULT_SOCKET": self.vault.socketPath, "HOME": self.folder] }

    package init(issuer: TestIssuer, vault: InProcessVault, folder: String) {
        self.issuer = issuer
        self.vault = vault
        self.folder = folder
    }

    package func stop() async {
        await self.vault.stop()
        await self.issuer.stop()
    }
}

/// This test process as a peer, for calling the broker directly.
package let testPeer = Peer(pid: getpid(), uid: getuid(), gid: getgid(), executable: "/usr/bin/test-companion")

/// A clock the test moves by hand.
package final class ManualClock: WallClock, Sendable {
    private struct State {
        var seconds: Double
        /// The clock nobody sets: moved by `advance`, never by `step`.
        var uptime: Double = 1000
        var next = 0
        var sleepers: [Int: (deadline: Double, continuation: CheckedContinuation<Void, any Error>)] = [:]
    }

    private let state: Mutex<State>

    /// Starts at the real time, so tokens signed by a test issuer are current.
    package init(_ seconds: Double = Date().timeIntervalSince1970) {
        self.state = Mutex(State(seconds: seconds))
    }

    package func now() -> Double {
        self.state.withLock { $0.seconds }
    }

    package func uptime() -> Double {
        self.state.withLock { $0.uptime }
    }

    /// Sets the wall clock `delta` seconds on or back, as an administrator
    /// or NTP would, while no time passes.
    package func step(by delta: Double) {
        self.state.withLock { $0.seconds += delta }
    }

    /// Moves time on, and wakes every sleep whose deadline it reached.
    package func advance(by delta: Double) {
        let woken = self.state.withLock { state in
            state.seconds += delta
            state.uptime += delta
            let due = state.sleepers.filter { $0.value.deadline <= state.seconds }
            for key in due.keys { state.sleepers[key] = nil }
            return due.values.map(\.continuation)
        }
        for continuation in woken { continuation.resume() }
    }

    /// Sleeps now waiting for the clock to move.
    package var sleepers: Int { self.state.withLock { $0.sleepers.count } }

    package func sleep(until deadline: Double) async throws {
        let ticket = self.state.withLock { state -> Int in
            state.next += 1
            return state.next
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let now = self.state.withLock { state -> Result<Void, any Error>? in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if deadline <= state.seconds { return .success(()) }
                    state.sleepers[ticket] = (deadline, continuation)
                    return nil
                }
                if let now { continuation.resume(with: now) }
            }
        } onCancel: {
            self.state.withLock { $0.sleepers.removeValue(forKey: ticket) }?.continuation.resume(throwing: CancellationError())
        }
    }
}

/// Chores on the real clock, run as long as the test process: for parts
/// tested without a daemon around them.
package let runningChores: Chores = {
    let chores = Chores(clock: SystemClock())
    Task.detached { await chores.run() }
    return chores
}()

extension Dispatcher {
    /// `command` from `peer`, answered as a socket answers it: through the gate.
    package func answer(_ command: Command, from peer: Peer) async -> Response {
        switch self.handle(Request(id: .number(1), command: command), from: peer) {
        case .ready(let response): return response
        case .pending(let body): return await body()
        case .subscribe(let response, _): return response
        }
    }

    /// The error `command` from `peer` is answered with, or nil when it succeeds.
    package func refusal(_ command: Command, from peer: Peer) async -> VaultError? {
        guard case .failure(let error) = await self.answer(command, from: peer).outcome else { return nil }
        return error
    }
}

extension Rooms {
    /// `token` as the main socket serves it to `peer`: the gate first.
    package func token(_ request: TokenRequest, for peer: Peer) async throws(VaultError) -> TokenResult {
        try await self.broker.token(request, for: peer, admitted: self.admitted(.token(request), peer))
    }

    /// `claims` as the main socket serves it to `peer`: the gate first.
    package func claims(account: String, for peer: Peer) async throws(VaultError) -> ClaimsResult {
        try await self.broker.claims(account: account, for: peer, admitted: self.admitted(.claims(account: account), peer))
    }

    /// What the main socket's gate admits `command` of `peer` to.
    package func admitted(_ command: Command, _ peer: Peer) throws(VaultError) -> Admitted {
        guard let admitted = try Gate.admit(command, from: peer, cache: self.cache).get().account else {
            throw VaultError(.internalError, "\(command) names no account")
        }
        return admitted
    }
}
