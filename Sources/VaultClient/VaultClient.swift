public import FoundationEssentials
import Dispatch
import Glibc
import Synchronization
public import VaultProtocol

/// An async client for companion programs: many requests in flight on one
/// connection, each answered by id, errors as `VaultError` values.
///
/// ```swift
/// let vault = try await VaultClient.connect()
/// let token = try await vault.token("work")
/// request.headers.add(name: "Authorization", value: "Bearer " + token.accessToken.unsafeString())
/// ```
///
/// One background reader per connection routes replies to their callers.
public final class VaultClient: Sendable {
    private let fd: Int32
    private let state = Mutex(State())

    private struct State {
        var nextID: Int64 = 1
        var waiting: [Int64: CheckedContinuation<Data, any Error>] = [:]
        var followers: [Int: Follower] = [:]
        var nextFollower = 0
        var closed: VaultError?
    }

    /// Told of each event on the reader's thread, in order, and once of the
    /// end of the connection; it must not block.
    struct Follower: Sendable {
        let event: @Sendable (Event) -> Void
        let ended: @Sendable () -> Void
    }

    /// A reply line longer than this ends the connection rather than being buffered.
    public static let maximumLineBytes = 4 << 20

    /// Events an `events()` stream holds for a consumer that has not read
    /// them; one more ends the stream, as an ended connection does.
    public static let maximumBufferedEvents = 1024

    /// Connects to `path`, else `TOKENVAULT_SOCKET`, else the XDG default;
    /// fails with `forbidden`, having sent nothing, when the socket's server
    /// runs as another user.
    public static func connect(path: String? = nil) async throws(VaultError) -> VaultClient {
        let connection = try VaultConnection(path: try TokenVault.socketPath(explicit: path))
        return VaultClient(fd: connection.detach())
    }

    private init(fd: Int32) {
        self.fd = fd
        DispatchQueue(label: "tokenvault.client.reader").async { [self] in self.readLoop() }
    }

    deinit {
        Glibc.close(self.fd)
    }

    /// Whether the connection has ended (every event before the end was delivered).
    public var isClosed: Bool { self.state.withLock { $0.closed != nil } }

    /// Ends the connection; requests in flight fail with `unavailable`.
    public func close() {
        shutdown(self.fd, Int32(SHUT_RDWR))
    }

    /// Sends `command`; returns the reply line once vaultd answers it.
    public func send(_ command: Command) async throws(VaultError) -> Data {
        let id = self.state.withLock { state -> Int64 in
            defer { state.nextID += 1 }
            return state.nextID
        }
        var line: Data
        do {
            line = try LineCodec.framed(Request(id: .number(id), command: command))
        } catch {
            throw VaultError.requestNotEncoded
        }
        defer { line.resetBytes(in: 0..<line.count) }
        do {
            return try await withCheckedThrowingContinuation { continuation in
                let refused = self.state.withLock { state -> VaultError? in
                    if let closed = state.closed { return closed }
                    state.waiting[id] = continuation
                    return nil
                }
                if let refused {
                    continuation.resume(throwing: refused)
                } else if !self.write(line) {
                    self.fail(id, .connectionLost(nil))
                }
            }
        } catch let error as VaultError {
            throw error
        } catch {
            throw VaultError.unexpected(error)
        }
    }

    /// Sends `command` and decodes its result.
    public func call<P: ResultPayload>(_ command: Command, as type: P.Type) async throws(VaultError) -> P {
        let reply = try await self.send(command)
        do {
            return try LineCodec.payload(P.self, of: reply)
        } catch {
            throw VaultError.unreadableReply
        }
    }

    /// An access token for `account`.
    public func token(
        _ account: String,
        scopes: [String]? = nil,
        minTTL: Int = TokenRequest.defaultMinTTL
    ) async throws(VaultError) -> TokenResult {
        try await self.call(.token(TokenRequest(account: account, scopes: scopes, minTTL: minTTL)), as: TokenResult.self)
    }

    /// A DPoP proof for one request to a resource server, with the access
    /// token it pairs with: send `result.authorization` as `Authorization`
    /// and `result.proof` as `DPoP`. For an account whose tokens are
    /// DPoP-bound; else `bad_request`.
    public func dpopProof(
        _ account: String,
        method: String,
        url: String,
        scopes: [String]? = nil,
        minTTL: Int = TokenRequest.defaultMinTTL
    ) async throws(VaultError) -> DPoPProofResult {
        guard let target = DPoPTarget(method: method, url: url) else {
            throw VaultError.notADPoPTarget
        }
        let token = TokenRequest(account: account, scopes: scopes, minTTL: minTTL)
        return try await self.call(.dpopProof(DPoPProofRequest(token: token, target: target)), as: DPoPProofResult.self)
    }

    /// Subscribes this connection to vaultd's events for `accounts` (nil:
    /// every account) and returns them as they come: sign-in steps,
    /// `signed_in`, `token_refreshed`, `reauth_required`, `signed_out`. The
    /// stream ends when the connection does.
    /// A consumer that falls `maximumBufferedEvents` behind sees the stream
    /// end there, as if the connection had ended: an event is never skipped
    /// silently, so a `signed_out` cannot be missed unawares.
    public func events(accounts: [String]? = nil) async throws(VaultError) -> AsyncStream<Event> {
        let (stream, continuation) = AsyncStream<Event>.makeStream(bufferingPolicy: .bufferingOldest(Self.maximumBufferedEvents))
        let key = try await self.follow(
            accounts: accounts,
            Follower(
                event: { event in
                    if case .dropped = continuation.yield(event) { continuation.finish() }
                },
                ended: { continuation.finish() }
            )
        )
        continuation.onTermination = { [weak self] _ in self?.unfollow(key) }
        return stream
    }

    /// Subscribes this connection and calls `follower` for each event, on
    /// the reader's thread, with nothing buffered between; returns its key.
    func follow(accounts: [String]?, _ follower: Follower) async throws(VaultError) -> Int {
        let key = self.state.withLock { state -> Int? in
            guard state.closed == nil else { return nil }
            defer { state.nextFollower += 1 }
            state.followers[state.nextFollower] = follower
            return state.nextFollower
        }
        guard let key else {
            follower.ended()
            throw VaultError.closedByVaultd
        }
        do {
            _ = try await self.send(.subscribe(accounts: accounts))
        } catch {
            self.unfollow(key)
            follower.ended()
            throw error
        }
        return key
    }

    func unfollow(_ key: Int) {
        _ = self.state.withLock { $0.followers.removeValue(forKey: key) }
    }

    private func write(_ data: Data) -> Bool {
        // One writer at a time, so lines never interleave.
        self.state.withLock { _ in
            data.withUnsafeBytes { raw in
                var offset = 0
                while offset < raw.count {
                    let n = Glibc.send(self.fd, raw.baseAddress?.advanced(by: offset), raw.count - offset, Int32(MSG_NOSIGNAL))
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { return false }
                    offset += n
                }
                return true
            }
        }
    }

    private func fail(_ id: Int64, _ error: VaultError) {
        let continuation = self.state.withLock { $0.waiting.removeValue(forKey: id) }
        continuation?.resume(throwing: error)
    }

    private func readLoop() {
        var closed = VaultError.closedByVaultd
        var pending: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = recv(self.fd, &chunk, chunk.count, 0)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            pending.append(contentsOf: chunk[0..<n])
            while let newline = pending.firstIndex(of: 0x0A) {
                self.deliver(Data(pending[..<newline]))
                pending.removeSubrange(...newline)
            }
            if pending.count > Self.maximumLineBytes {
                closed = VaultError.lineTooLongFromVaultd(Self.maximumLineBytes)
                shutdown(self.fd, Int32(SHUT_RDWR))
                break
            }
        }
        let (waiting, followers) = self.state.withLock { state in
            state.closed = closed
            defer {
                state.waiting = [:]
                state.followers = [:]
            }
            return (Array(state.waiting.values), Array(state.followers.values))
        }
        for continuation in waiting { continuation.resume(throwing: closed) }
        for follower in followers { follower.ended() }
    }

    private func deliver(_ line: Data) {
        guard let head = try? LineCodec.head(of: line) else { return }
        if head.event != nil {
            guard let event = try? LineCodec.event(from: line) else { return }
            for follower in self.state.withLock({ Array($0.followers.values) }) { follower.event(event) }
            return
        }
        guard case .number(let id) = head.id else { return }
        guard let continuation = self.state.withLock({ $0.waiting.removeValue(forKey: id) }) else { return }
        if let error = head.error {
            continuation.resume(throwing: error)
        } else {
            continuation.resume(returning: line)
        }
    }
}
