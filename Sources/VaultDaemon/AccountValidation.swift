import FoundationEssentials
import VaultCrypto
import VaultOIDC
import VaultProtocol

/// The checks an account's configuration passes before it is stored.
enum AccountValidation {
    /// A loaded account: the same rules, with a message that names the file.
    static func validate(_ c: AccountConfiguration, in file: String) throws(VaultError) {
        do throws(VaultError) {
            try Self.validate(c)
            if let identity = c.identity {
                guard identity.utf8.count <= 64, identity.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
                    throw VaultError.invalidIdentity
                }
            }
        } catch {
            throw VaultError.refusedLoadedAccount(file, error)
        }
    }

    /// A new account identity.
    static func newIdentity() -> String {
        randomID("a-", bytes: 12)
    }

    static func validate(_ c: AccountConfiguration) throws(VaultError) {
        guard Self.isValidName(c.name) else {
            throw VaultError.invalidAccountName
        }
        try Self.validateIssuer(c.issuer)
        guard !c.clientID.isEmpty, c.clientID.utf8.count <= 512 else {
            throw VaultError.invalidClientID
        }
        guard c.scopes.allSatisfy({ !$0.isEmpty && !$0.contains(" ") && $0.utf8.count <= 256 }) else {
            throw VaultError.invalidScopes
        }
        guard c.allowedClients.allSatisfy({ $0.hasPrefix("/") }) else {
            throw VaultError.invalidAllowedClients
        }
        guard (10...100).contains(c.refreshAhead) else {
            throw VaultError.invalidRefreshAhead
        }
        if let redirect = c.redirectURI {
            guard let url = URL(string: redirect), url.scheme == "http", let host = url.host, Loopback.isAddress(host),
                url.port != nil
            else {
                throw VaultError.invalidRedirectURI
            }
        }
    }

    static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard (1...64).contains(bytes.count), let first = bytes.first, Self.isAlphanumeric(first) else { return false }
        return bytes.allSatisfy { Self.isAlphanumeric($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-") }
    }

    /// Issuers are https, except loopback, as RFC 8252 allows.
    static func validateIssuer(_ issuer: String) throws(VaultError) {
        guard let url = URL(string: issuer), let scheme = url.scheme, let host = url.host, !host.isEmpty,
            url.query == nil, url.fragment == nil
        else {
            throw VaultError.invalidIssuerURL
        }
        guard scheme == "https" || (scheme == "http" && Loopback.isAddress(host)) else {
            throw VaultError.insecureIssuer
        }
    }

    private static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
            || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
    }
}
