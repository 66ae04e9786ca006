/// Where the vault sends its events (`signed_in`, `refreshed`,
/// `signed_out`, ...): the socket layer's subscribers, in vaultd.
public protocol EventSink: Sendable {
    /// Sends `event` to whoever listens for its account; returns how many were told.
    @discardableResult
    func emit(_ event: Event) -> Int
}
