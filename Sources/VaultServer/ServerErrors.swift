import VaultProtocol

// The wire errors of the socket layer: what a connection is told before it
// is closed. The vault's own are in VaultDaemon/WireErrors.swift, a
// malformed request's in VaultProtocol/RequestErrors.swift.

extension VaultError {
    static let tooManyConnections = VaultError(.overloaded, "vaultd has too many open connections; try again shortly")
    static let lineTooLong = VaultError(.lineTooLong, "a request line is at most \(TokenVault.maximumLineBytes) bytes")
    static let fellBehindEvents = VaultError(.overloaded, "this connection fell too far behind its events; reconnect and subscribe again")
}
