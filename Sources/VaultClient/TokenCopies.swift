import Glibc
import Synchronization
public import VaultProtocol

/// The reference behaviour for a companion program: it keeps its own copy
/// of each access token, asks vaultd only when the copy would not live
/// `minTTL` more seconds, and drops the copy the moment vaultd says the
/// account signed out or needs signing in again.
///
/// ```swift
/// let tokens = try await TokenCopies.start(VaultClient.connect())
/// let token = try await tokens.token("work")
/// ```
public final class TokenCopies: Sendable {
    private let client: VaultClient
    private let copies = Mutex<[String: Copy]>([:])
    private let followerKey = Mutex<Int?>(nil)
    /// False once the events stopped (vaultd closed the connection, or
    /// ended it with `overloaded` because this companion fell behind): a
    /// sign-out could go unheard, so no copy is kept from then on.
    private let following = Atomic<Bool>(true)

    private struct Copy {
        var token: TokenResult?
        /// Bumped when the copy is dropped, so a fetch already under way
        /// does not put back a token of a signed-out account.
        var generation = 0
    }

    private init(client: VaultClient) {
        self.client = client
    }

    /// Subscribes `client` to vaultd's events and starts following them.
    public static func start(_ client: VaultClient, accounts: [String]? = nil) async throws(VaultError) -> TokenCopies {
        let copies = TokenCopies(client: client)
        // Followed on the client's reader, with no buffer between: a copy is
        // dropped before the next line is read, so no lag can hide a sign-out.
        let key = try await client.follow(
            accounts: accounts,
            VaultClient.Follower(
                event: { [weak copies] event in
                    if event.event == .signedOut || event.event == .reauthRequired || event.event == .signedIn {
                        copies?.drop(event.account)
                    }
                },
                ended: { [weak copies] in copies?.stopFollowing() }
            )
        )
        copies.followerKey.withLock { $0 = key }
        return copies
    }

    deinit {
        if let key = self.followerKey.withLock({ $0 }) { self.client.unfollow(key) }
    }

    /// An access token for `account` that lives at least `minTTL` more seconds.
    public func token(_ account: String, minTTL: Int = TokenRequest.defaultMinTTL) async throws(VaultError) -> TokenResult {
        let now = Int64(time(nil))
        let (cached, generation) = self.copies.withLock { copies -> (TokenResult?, Int) in
            let copy = copies[account] ?? Copy()
            return (copy.token, copy.generation)
        }
        if let cached, cached.expiresAt - now >= Int64(minTTL) { return cached }
        let fresh = try await self.client.token(account, minTTL: minTTL)
        self.copies.withLock { copies in
            guard self.following.load(ordering: .relaxed) else { return }
            if (copies[account]?.generation ?? 0) == generation { copies[account, default: Copy()].token = fresh }
        }
        return fresh
    }

    /// The accounts whose tokens this companion holds a copy of now.
    public var held: [String] {
        self.copies.withLock { copies in copies.filter { $0.value.token != nil }.map(\.key).sorted() }
    }

    private func stopFollowing() {
        self.copies.withLock { copies in
            self.following.store(false, ordering: .relaxed)
            for account in copies.keys {
                copies[account]?.token = nil
                copies[account]?.generation += 1
            }
        }
    }

    private func drop(_ account: String) {
        self.copies.withLock { copies in
            copies[account, default: Copy()].token = nil
            copies[account, default: Copy()].generation += 1
        }
    }
}
