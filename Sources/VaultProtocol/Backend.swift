/// Which backend holds the secrets: `status.backend`, `migrate`'s `to`,
/// `from` and `to`.
public enum Backend: String, Codable, Hashable, Sendable, CaseIterable {
    case file
    case keyring
}

/// A place a sign-out or removal wiped secrets from (`wiped`).
public enum SecretPlace: String, Codable, Hashable, Sendable, CaseIterable {
    case memory
    case file
    case keyring

    public init(_ backend: Backend) {
        switch backend {
        case .file: self = .file
        case .keyring: self = .keyring
        }
    }
}

/// What became of a refresh token at its issuer (`revoked`).
public enum Revocation: String, Codable, Hashable, Sendable {
    /// The issuer answered 200: the token is dead.
    case yes
    /// There was no refresh token to revoke.
    case no
    /// The issuer has no revocation endpoint.
    case unsupported
    /// The issuer could not be reached, or refused.
    case failed
}
