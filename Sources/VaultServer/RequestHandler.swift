public import VaultProtocol

/// The seam between the socket layer and the vault: the server reads lines,
/// decodes requests and writes replies; what a request means is the
/// handler's business. The server never sees the broker.
public protocol RequestHandler: Sendable {
    /// Called on the connection's event loop for each decoded request. A
    /// reply that needs no waiting is `.ready`; everything else is
    /// `.pending` and runs as its own task, so one slow request never holds
    /// up the others on its connection.
    func handle(_ request: Request, from peer: Peer) -> Reply
}

public enum Reply: Sendable {
    case ready(Response)
    case pending(@Sendable () async -> Response)
    /// Answer, then send the events for `accounts` (nil: all) on this connection.
    case subscribe(Response, accounts: [String]?)
}

/// Told when connections read and close (the daemon gives freed heap pages
/// back once connections stop closing).
public protocol ConnectionObserver: Sendable {
    /// A connection read bytes: activity, so not the moment for heavy work.
    func reading()
    /// A connection closed.
    func closed()
}
