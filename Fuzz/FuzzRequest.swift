// libFuzzer entry point for vaultd's request path: the bytes a client sends,
// through the line codec and the dispatcher, to the reply line.
//
// An input is what one connection sends: it is cut into lines at "\n" (a
// trailing "\r" is dropped, and the last line needs no newline), as vaultd's
// LineBasedFrameDecoder does; a line over the protocol's limit ends the input,
// as it ends the connection. For every line:
//
// - `LineCodec.request(from:)` turns any bytes into a request, never a crash;
// - a request that decodes re-encodes, and that line decodes to the same
//   request: encoding is a fixed point (the JSON is sorted, so equal requests
//   give equal bytes);
// - the `Dispatcher` answers it against a real broker, and `.pending` replies
//   run to completion, in order;
// - every reply encodes to one line of JSON carrying the request's `id`.
//
// The broker is the daemon's own `Broker` over a `SealedFileStore` and an
// `AccountDirectory` in a private temporary folder (on /dev/shm when it is
// there), so secrets are sealed, written and read back as in vaultd. Its
// `OIDCClient` has an `HTTPClient` that is shut down before the first input:
// every call to an issuer fails at once with `idp_unavailable`, without a
// socket, a DNS lookup or a timer. So no sign-in flow ever starts, and
// `signin.wait` never waits. The vault starts with three accounts: `work`
// (signed in, with a client secret), `ci` (signed in, releases its refresh
// token to this harness's peer) and `home` (not signed in). The clock is fixed.
//
// Each request that reaches the broker sees that vault as it was left by the
// requests before it in the same input, and each input starts from the seeded
// vault: once a request may have changed it (an operation that writes, unless
// it was refused before touching anything), the next request that needs the
// broker first gets the seeded files written back and a new broker.
//
// libFuzzer calls in on one thread; `.pending` replies, and the broker's
// start, run as tasks on the concurrency pool while that thread waits.
//
// The line cutting and the round trip are in RequestLines.swift, shared with
// the decoder-only harness (FuzzRequestDecode.swift).
//
// Built and run by dev/fuzz.sh; the corpus is Fuzz/corpus/request/.

import AsyncHTTPClient
import Dispatch
import Glibc
import Logging
import Synchronization
import VaultCrypto
import VaultDaemon
import VaultOIDC
import VaultProtocol
import VaultServer
import VaultStore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRequest(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    Harness.shared.run(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

/// Makes the vault and runs requests that start the threads and singletons
/// the daemon keeps for life (the I/O thread pool, the concurrency pool), so
/// the leak check does not count them against the first inputs.
@_cdecl("LLVMFuzzerInitialize")
public func fuzzRequestInitialize(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>
) -> CInt {
    Harness.shared.run(Array(#"{"op":"status"}"#.utf8 + [0x0A] + #"{"op":"token","account":"work"}"#.utf8))
    Harness.shared.run(Array(#"{"op":"hello"}"#.utf8))
    return 0
}

/// Runs `body` on the concurrency pool and waits for it on this thread.
func blocking<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
    let box = Box<T>()
    let done = DispatchSemaphore(value: 0)
    Task {
        box.value = await body()
        done.signal()
    }
    done.wait()
    guard let value = box.value else { fail("a task ended without a value") }
    return value
}

/// A task's result, read after the semaphore says it was written.
final class Box<T>: @unchecked Sendable {
    var value: T?
}

/// The vault the requests run against, and how to make it again. Used from
/// libFuzzer's thread only; async work runs while that thread waits.
final class Harness: @unchecked Sendable {
    static let shared = Harness()

    /// The peer every request comes from: this process, with an executable
    /// that `ci` lists in its `allowed_clients`.
    static let peer = Peer(pid: getpid(), uid: getuid(), gid: getgid(), executable: "/usr/libexec/tokenvault-fuzz")

    private let folder: String
    private let logger = Logger(label: "fuzz", factory: { _ in RenderingLogHandler() })
    private let oidc: OIDCClient
    /// The files of the starting vault, by name, once made.
    private var template: [(String, [UInt8])] = []
    private var dispatcher: Dispatcher?
    /// Whether a request may have changed the vault since it was made.
    private var changed = false

    private static let files = ["vault.key", "vault.sealed", "accounts.json"]

    private init() {
        var pattern = Array((access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp").utf8CString)
        pattern.removeLast()
        pattern += Array("/tokenvault-fuzz-XXXXXX".utf8CString)
        guard let made = mkdtemp(&pattern) else { fail("no temporary folder: errno \(errno)") }
        self.folder = String(cString: made)
        let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        do {
            try http.syncShutdown()
        } catch {
            fail("the HTTP client did not shut down: \(error)")
        }
        self.oidc = OIDCClient(http: http, logger: self.logger)
        Harness.removeAtExit(self.folder)
    }

    func run(_ input: [UInt8]) {
        var changed = false
        defer { self.changed = self.changed || changed }
        for line in RequestLines.lines(of: input) {
            let request = LineCodec.request(from: line)
            RequestLines.checkRoundTrip(request)
            // Share operations are decoded, never run: they would bind sockets at fuzzed paths.
            if case .success(.shareOpen) = request.command { continue }
            if case .success(.shareClose) = request.command { continue }
            // A request refused by the codec, or `hello`, never reaches the broker.
            var needsVault = false
            if case .success(let command) = request.command {
                if case .hello = command {} else { needsVault = true }
            }
            let dispatcher = needsVault ? self.vault() : (self.dispatcher ?? self.vault())
            let response: Response
            switch dispatcher.handle(request, from: Self.peer) {
            case .ready(let ready): response = ready
            case .pending(let body): response = blocking(body)
            case .subscribe(let ready, _): response = ready
            }
            Self.check(response, answering: request)
            if Self.mayChange(request, response) { changed = true }
        }
    }

    // MARK: The vault

    /// The vault for this input: the one in use, unless an earlier input may have changed it.
    private func vault() -> Dispatcher {
        if let dispatcher = self.dispatcher, !self.changed { return dispatcher }
        if self.template.isEmpty {
            let broker = self.rooms().broker
            blocking { await Self.seed(broker) }
            for name in Self.files {
                guard let bytes = try? FileSystem.read(self.path(name), limit: 1 << 20) else { fail("no \(name) to keep") }
                self.template.append((name, bytes))
            }
        } else {
            for (name, bytes) in self.template where (try? FileSystem.read(self.path(name), limit: 1 << 20)) != bytes {
                do {
                    try FileSystem.writeAtomically(bytes, to: self.path(name))
                } catch {
                    fail("could not restore \(name): \(error)")
                }
            }
        }
        let dispatcher = self.rooms().dispatcher
        self.dispatcher = dispatcher
        self.changed = false
        return dispatcher
    }

    /// The vault's rooms, wired as vaultd wires them, their broker started.
    private func rooms() -> Rooms {
        let rooms: Rooms
        do {
            let store = try SealedFileStore(path: self.path("vault.sealed"), keySource: .keyFile(self.path("vault.key")))
            rooms = try Rooms(
                store: store,
                directory: AccountDirectory(path: self.path("accounts.json")),
                keySource: .keyFile(self.path("vault.key")),
                oidc: self.oidc,
                clock: FixedClock(),
                events: EventHub(),
                logger: self.logger
            )
        } catch {
            fail("the vault did not open: \(error)")
        }
        let broker = rooms.broker
        let started: String? = blocking {
            do throws(VaultError) {
                try await broker.start()
                return nil
            } catch {
                return "\(error)"
            }
        }
        if let started { fail("the vault did not start: \(started)") }
        return rooms
    }

    private static func seed(_ broker: Broker) async {
        do {
            let accounts = [
                AccountAddition(
                    configuration: AccountConfiguration(
                        name: "work", issuer: "https://id.example.org", clientID: "cli",
                        scopes: ["openid", "offline_access"]
                    ),
                    clientSecret: try SecretBytes(utf8: "fuzz-client-secret"),
                    refreshToken: try SecretBytes(utf8: "fuzz-refresh-token-work")
                ),
                AccountAddition(
                    configuration: AccountConfiguration(
                        name: "ci", issuer: "http://127.0.0.1:9", clientID: "bot", scopes: ["api"],
                        allowedClients: [Self.peer.executable ?? ""], releaseRefreshToken: true
                    ),
                    refreshToken: try SecretBytes(utf8: "fuzz-refresh-token-ci")
                ),
                AccountAddition(
                    configuration: AccountConfiguration(
                        name: "home", issuer: "https://login.example.net/tenant/v2.0", clientID: "app",
                        scopes: ["openid"], redirectURI: "http://127.0.0.1:53682/callback"
                    )
                ),
            ]
            for account in accounts { _ = try await broker.add(account) }
        } catch {
            fail("could not seed the vault: \(error)")
        }
    }

    private func path(_ name: String) -> String { self.folder + "/" + name }

    private static func removeAtExit(_ folder: String) {
        folderToRemove = folder
        atexit {
            guard let folder = folderToRemove else { return }
            for name in Harness.files + Harness.files.map({ $0 + ".tmp" }) { unlink(folder + "/" + name) }
            rmdir(folder)
        }
    }

    // MARK: Properties

    /// Every reply is one line of JSON, answering the request's id.
    static func check(_ response: Response, answering request: Request) {
        let line = LineCodec.line(for: response)
        guard !line.contains(UInt8(ascii: "\n")) else { fail("a reply spans two lines") }
        let head: ResponseHead
        do {
            head = try LineCodec.head(of: line)
        } catch {
            fail("a reply does not decode: \(String(decoding: line, as: UTF8.self))")
        }
        guard head.id == request.id, head.ok != nil, head.event == nil else {
            fail("a reply does not answer its request: \(String(decoding: line, as: UTF8.self))")
        }
        if let error = head.error, error.code == .internalError, error.message == "vaultd could not encode its reply" {
            fail("a reply could not be encoded")
        }
        guard (head.ok == true) == (head.error == nil) else { fail("ok and error disagree") }
    }

    /// Whether the request may have changed the vault, so the next input needs a fresh one.
    static func mayChange(_ request: Request, _ response: Response) -> Bool {
        guard case .success(let command) = request.command else { return false }
        switch command {
        case .hello, .status, .claims, .refreshToken, .subscribe, .migrate, .shareOpen, .shareList, .shareClose,
            .signinSubmitCode, .signinResendCode, .signinSubmitPassword, .signinWait, .signinCancel, .dpopNonce:
            // Read only here: no flow can start, and `migrate` has nowhere to go.
            return false
        case .accountAdd, .accountRemove, .lock, .unlock, .token, .dpopProof, .userinfo, .signinStart, .signout:
            guard case .failure(let error) = response.outcome else { return true }
            // These are refused before anything is touched.
            let untouched: Set<ErrorCode> = [.badRequest, .unknownAccount, .forbidden, .notSignedIn, .locked]
            return !untouched.contains(error.code)
        }
    }
}

/// The folder `atexit` removes; a C callback cannot capture it.
nonisolated(unsafe) private var folderToRemove: String?

/// Always the same second, so replies do not depend on when they ran.
struct FixedClock: WallClock {
    func now() -> Double { 1_800_000_000 }

    /// Time stands still: a sleep ends only when it is cancelled.
    func sleep(until deadline: Double) async throws {
        guard deadline > self.now() else { return }
        while true { try await Task.sleep(for: .seconds(3600)) }
    }
}

/// What the log handler rendered, so the rendering is not optimized away.
let renderedLogBytes = Atomic<Int>(0)

/// Renders every message and its metadata, at every level, and drops the
/// text: the log lines are part of what each request runs.
struct RenderingLogHandler: LogHandler {
    var logLevel: Logger.Level = .trace
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var merged = self.metadata
        if let extra = event.metadata { merged.merge(extra) { _, new in new } }
        let line = "\(event.level) \(event.message)" + merged.map { " \($0.key)=\($0.value)" }.joined()
        renderedLogBytes.add(line.utf8.count, ordering: .relaxed)
    }
}
