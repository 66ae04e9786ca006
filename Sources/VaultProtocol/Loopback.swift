/// The one loopback rule (RFC 8252 §8.3): a loopback issuer or redirect URI
/// names the address itself, `127.0.0.1` or `[::1]`, never `localhost`. A
/// name is resolved, and the HTTP client tries `::1` first: another local
/// user listening there would get what was meant for the issuer.
public enum Loopback {
    /// `host` as a URL parser gives it: `127.0.0.1`, `::1` or `[::1]`.
    public static func isAddress(_ host: String) -> Bool {
        host == "127.0.0.1" || host == "::1" || host == "[::1]"
    }

    /// `host[:port]` as git and HTTP's Host header give it: a loopback
    /// address, with or without a port.
    public static func isAddress(withPort host: String) -> Bool {
        for address in ["127.0.0.1", "[::1]"] where host == address || host.hasPrefix(address + ":") {
            let port = host.dropFirst(address.count).dropFirst()
            return host == address || (!port.isEmpty && port.allSatisfy(\.isNumber))
        }
        return false
    }

    /// Whether `host` is the IPv6 loopback address.
    public static func isIPv6(_ host: String) -> Bool {
        host == "::1" || host == "[::1]"
    }
}
