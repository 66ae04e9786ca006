import NIOCore
import Synchronization
public import VaultProtocol

/// The connections that asked to hear events (`subscribe`), and the one way
/// to tell them. An event is encoded once and written to every subscriber of
/// its account; a subscriber that does not read is skipped, not buffered for.
public final class EventHub: Sendable {
    private struct Subscriber {
        let channel: any Channel
        /// Nil: every account.
        let accounts: Set<String>?
    }

    private let subscribers = Mutex<[ObjectIdentifier: Subscriber]>([:])

    public init() {}

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
        let channels = self.subscribers.withLock { subscribers in
            subscribers.values.filter { $0.accounts?.contains(event.account) ?? true }.map(\.channel)
        }
        guard !channels.isEmpty else { return 0 }
        var line = Array(LineCodec.line(for: event))
        line.append(UInt8(ascii: "\n"))
        var told = 0
        for channel in channels where channel.isActive && channel.isWritable {
            channel.writeAndFlush(channel.allocator.buffer(bytes: line), promise: nil)
            told += 1
        }
        return told
    }
}
