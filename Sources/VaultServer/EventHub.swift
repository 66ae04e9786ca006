import NIOCore
import Synchronization
public import VaultProtocol

/// The connections that asked to hear events (`subscribe`), and the one way
/// to tell them. An event is encoded once and written to every subscriber of
/// its account, in order. A subscriber that falls `maximumBacklog` events
/// behind gets one final `overloaded` error line and is closed: it is never
/// skipped silently, so a companion that misses an event knows it did and
/// drops its copies.
public final class EventHub: EventSink {
    private final class Subscriber: Sendable {
        let channel: any Channel
        /// Nil: every account.
        let accounts: Set<String>?
        /// Events handed to the channel and not yet written to the socket.
        let backlog = Atomic<Int>(0)

        init(channel: any Channel, accounts: Set<String>?) {
            self.channel = channel
            self.accounts = accounts
        }
    }

    /// Events one subscriber may have waiting in memory.
    let maximumBacklog: Int
    private let subscribers = Mutex<[ObjectIdentifier: Subscriber]>([:])

    public init(maximumBacklog: Int = 1024) {
        self.maximumBacklog = maximumBacklog
    }

    func subscribe(_ channel: any Channel, accounts: [String]?) {
        let subscriber = Subscriber(channel: channel, accounts: accounts.map(Set.init))
        self.subscribers.withLock { $0[ObjectIdentifier(channel)] = subscriber }
    }

    func unsubscribe(_ channel: any Channel) {
        _ = self.subscribers.withLock { $0.removeValue(forKey: ObjectIdentifier(channel)) }
    }

    /// Writes `event` to its subscribers; returns how many were told.
    @discardableResult
    public func emit(_ event: Event) -> Int {
        let matching = self.subscribers.withLock { subscribers in
            subscribers.values.filter { $0.accounts?.contains(event.account) ?? true }
        }
        guard !matching.isEmpty else { return 0 }
        // Encoded once; each channel writes the same bytes.
        let line = ByteBufferAllocator().line(for: event)
        var told = 0
        for subscriber in matching {
            let channel = subscriber.channel
            guard channel.isActive else { continue }
            guard subscriber.backlog.add(1, ordering: .relaxed).newValue <= self.maximumBacklog else {
                self.overloaded(subscriber)
                continue
            }
            channel.writeAndFlush(line).whenComplete { _ in
                subscriber.backlog.subtract(1, ordering: .relaxed)
            }
            told += 1
        }
        return told
    }

    /// Ends a subscriber that fell too far behind: no more events, one last
    /// line that says why, then the connection closes (once that line is
    /// out, or after a grace period if the peer never reads again).
    private func overloaded(_ subscriber: Subscriber) {
        let removed = self.subscribers.withLock { $0.removeValue(forKey: ObjectIdentifier(subscriber.channel)) }
        guard removed != nil else { return }
        let channel = subscriber.channel
        let close = channel.eventLoop.scheduleTask(in: Self.closeGrace) { channel.close(promise: nil) }
        channel.writeAndFlush(channel.allocator.line(for: Response(id: nil, error: .fellBehindEvents))).whenComplete { _ in
            close.cancel()
            channel.close(promise: nil)
        }
    }

    static let closeGrace = TimeAmount.seconds(60)
}
