import Foundation
import Glibc
import Testing
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultTestIssuer
import VaultTestKit

/// The one gate (Gate.swift): what each door of the vault lets out. Each
/// test is a way a share served more than it granted before the gate.
@Suite(.timeLimit(.minutes(1)))
struct GateTests {
    typealias Setup = IssuerAndVault

    /// Two accounts, `work` and `home`, and a private folder for share sockets: ShareTests' set-up.
    func setUp(clock: any WallClock = SystemClock()) async throws -> Setup {
        try await ShareTests().setUp(clock: clock)
    }

    /// A share's ttl is a deadline on the clock nobody sets: a wall clock
    /// set back an hour does not keep it serving.
    @Test func aShareEndsAtItsTTLWhenTheWallClockIsSetBack() async throws {
        let clock = ManualClock()
        try await using(self.setUp(clock: clock)) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path, "--ttl", "60"])
            let client = try LineClient(path: path)
            #expect(await client.call(#"{"id":1,"op":"token","account":"work"}"#)?["ok"] as? Bool == true)
            clock.step(by: -3600)
            clock.advance(by: 61)
            let late = try #require(await client.call(#"{"id":2,"op":"token","account":"work"}"#))
            #expect(late.errorCode == "forbidden", "\(late)")
            #expect(await client.readLine() == nil, "the share ended, and its connections with it")
            #expect(!FileManager.default.fileExists(atPath: path))
        }
    }

    /// Each scope set is its own refresh: a share may cause refreshes for
    /// a few of them, not for every subset of its scopes.
    @Test func aShareRefreshesForABoundedNumberOfScopeSets() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path])
            let client = try LineClient(path: path)
            let subsets = ["openid", "profile", "offline_access", "openid profile", "openid offline_access", "profile offline_access"]
            var refused: [String] = []
            for (id, scope) in subsets.enumerated() {
                let reply = try #require(await client.call(#"{"id":\#(id),"op":"token","account":"work","scope":"\#(scope)"}"#))
                if reply.errorCode != nil { refused.append(scope) }
            }
            #expect(refused == ["openid offline_access", "profile offline_access"], "\(refused)")
            #expect(setup.issuer.refreshCount == 4)
            // Those it asked before are still served; the user's own socket is not bounded.
            #expect(await client.call(#"{"id":9,"op":"token","account":"work","scope":"openid"}"#)?["ok"] as? Bool == true)
            _ = try await setup.vault.rooms.token(TokenRequest(account: "work", scopes: ["profile", "offline_access"]), for: testPeer)
        }
    }

    /// An issuer that leaves `scope` out may have ignored the narrowed ask:
    /// a share of fewer scopes than the account's cannot tell, and serves nothing.
    @Test func aShareWithholdsATokenWhoseScopeTheIssuerDidNotSay() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path, "--scope", "openid"])
            setup.issuer.setAnsweredScopeJSON("")
            let client = try LineClient(path: path)
            let unsaid = try #require(await client.call(#"{"id":1,"op":"token","account":"work"}"#))
            #expect(unsaid.errorCode == "forbidden", "\(unsaid)")
            // A share of the whole grant can tell.
            let whole = setup.folder + "/share/w.sock"
            _ = try await setup.share(["work", "--socket", whole])
            #expect(try await LineClient(path: whole).call(#"{"id":2,"op":"token","account":"work"}"#)?["ok"] as? Bool == true)
        }
    }

    /// A share's `status` tells a share client what it needs: its accounts
    /// and whether the vault is locked, nothing of where the secrets rest.
    @Test func aSharesStatusSaysNothingOfTheBackend() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path])
            let status = try #require(await LineClient(path: path).call(#"{"id":1,"op":"status"}"#))
            #expect(status["ok"] as? Bool == true && status["locked"] as? Bool == false, "\(status)")
            for field in ["backend", "backend_reason", "key_source", "storage_error"] {
                #expect(status[field] == nil, "\(field): \(status)")
            }
            #expect((status["accounts"] as? [[String: Any]])?.map { $0["name"] as? String } == ["work"])
        }
    }

    func readd(_ setup: Setup) async throws {
        _ = try await setup.vault.broker.add(
            AccountAddition(
                configuration: AccountConfiguration(name: "work", issuer: setup.issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"]),
                refreshToken: try SecretBytes(utf8: setup.issuer.mintRefreshToken())
            )
        )
    }

    /// An issuer may answer a refresh with more than was asked (RFC 6749 §6
    /// lets it ignore `scope`); a share withholds such a token.
    @Test func aShareWithholdsATokenWiderThanItGrants() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path, "--scope", "openid"])
            setup.issuer.setAnsweredScope("openid admin:all")
            let client = try LineClient(path: path)
            let wide = try #require(await client.call(#"{"id":1,"op":"token","account":"work"}"#))
            #expect(wide.errorCode == "forbidden", "\(wide)")
            #expect(wide["access_token"] == nil)
            let message = try #require((wide["error"] as? [String: Any])?["message"] as? String)
            #expect(message.contains("wider than this share grants") && !message.contains("admin:all"), "\(message)")
            // Cached now for the main socket, where the user asked: still withheld from the share.
            let owner = try await setup.vault.rooms.token(TokenRequest(account: "work", scopes: ["openid"]), for: testPeer)
            #expect(owner.scope == "openid admin:all")
            #expect(await client.call(#"{"id":2,"op":"token","account":"work"}"#)?.errorCode == "forbidden")
            // An issuer that keeps to what was asked is served.
            setup.issuer.setAnsweredScope(nil)
            let narrow = try #require(await client.call(#"{"id":3,"op":"token","account":"work","scope":"openid","min_ttl":0}"#))
            #expect(narrow.errorCode == "forbidden", "the cached wide token is still withheld: \(narrow)")
        }
    }

    /// A share opened without `--scope` grants the account's configured scopes, not any string.
    @Test func aShareWithoutScopesGrantsTheAccountsScopesOnly() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path])
            let client = try LineClient(path: path)
            let other = try #require(await client.call(#"{"id":1,"op":"token","account":"work","scope":"openid admin:all"}"#))
            #expect(other.errorCode == "forbidden", "\(other)")
            #expect(setup.issuer.refreshCount == 0, "nothing was asked of the issuer")
            let own = try #require(await client.call(#"{"id":2,"op":"token","account":"work","scope":"openid"}"#))
            #expect(own["scope"] as? String == "openid", "\(own)")
            let all = try #require(await client.call(#"{"id":3,"op":"token","account":"work"}"#))
            #expect(all["scope"] as? String == "openid profile offline_access", "\(all)")
        }
    }

    /// A share client cannot make the vault spend the refresh token at will.
    @Test func aShareCannotForceRefreshes() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path])
            let client = try LineClient(path: path)
            #expect(await client.call(#"{"id":1,"op":"token","account":"work"}"#)?["ok"] as? Bool == true)
            let before = setup.issuer.refreshCount
            let forced = try #require(await client.call(#"{"id":2,"op":"token","account":"work","force_refresh":true}"#))
            #expect(forced.errorCode == "forbidden", "\(forced)")
            for id in 3..<23 {
                let long = try #require(await client.call(#"{"id":\#(id),"op":"token","account":"work","min_ttl":86400}"#))
                #expect(long["ok"] as? Bool == true, "min_ttl is held to the default: \(long)")
            }
            #expect(setup.issuer.refreshCount == before, "no refresh was spent")
        }
    }

    /// A share holds the account it shared, not a name: removing the
    /// account ends the share, and a new account of that name is not served.
    @Test func aShareEndsWithItsAccount() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            let kept = setup.folder + "/share/k.sock"
            _ = try await setup.share(["work", "--socket", path])
            _ = try await setup.share(["home", "--socket", kept])
            let client = try LineClient(path: path)
            #expect(await client.call(#"{"id":1,"op":"token","account":"work"}"#)?["ok"] as? Bool == true)
            // Removed and added again behind the socket's back (the broker itself, so
            // the share is not ended): the gate still tells the new account from the old.
            _ = try await setup.vault.broker.remove("work")
            try await self.readd(setup)
            let replaced = try #require(await client.call(#"{"id":2,"op":"token","account":"work"}"#))
            #expect(replaced.errorCode == "forbidden", "\(replaced)")
            let status = try #require(await client.call(#"{"id":3,"op":"status"}"#))
            #expect((status["accounts"] as? [[String: Any]])?.isEmpty == true, "\(status)")

            // Removing the new account ends no share of the old one's, nor another account's.
            let removed = try await runTool("vaultctl", ["account", "remove", "work"], environment: setup.environment)
            #expect(removed.status == 0, "\(removed.stderr)")
            let listed = try await runTool("vaultctl", ["share", "--list"], environment: setup.environment)
            #expect(listed.stdout.contains(kept), "\(listed.stdout)")
            // Re-add and share again, then remove through the socket: this share ends.
            try await self.readd(setup)
            let again = setup.folder + "/share/a.sock"
            _ = try await setup.share(["work", "--socket", again])
            let second = try LineClient(path: again)
            #expect(await second.call(#"{"id":1,"op":"token","account":"work"}"#)?["ok"] as? Bool == true)
            let gone = try await runTool("vaultctl", ["account", "remove", "work"], environment: setup.environment)
            #expect(gone.status == 0, "\(gone.stderr)")
            #expect(await second.readLine() == nil, "the share's connections are closed")
            #expect(!FileManager.default.fileExists(atPath: again), "its socket is removed")
            #expect(FileManager.default.fileExists(atPath: kept), "a share of another account stays")
        }
    }

    /// Every await is a place where the account can change: a share's request
    /// held at the issuer while its account is removed and a new one added
    /// under the name gets no token, neither the old account's nor the new one's.
    @Test func aShareRequestInFlightWhenItsAccountIsReplacedGetsNothing() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path])
            let client = try LineClient(path: path)
            setup.issuer.setTokenBehaviour(.gate)
            client.send(#"{"id":1,"op":"token","account":"work"}"# + "\n")
            try await eventually { setup.issuer.heldRequestCount == 1 }
            let replace = Task {
                _ = try await setup.vault.broker.remove("work")
                try await self.readd(setup)
            }
            // The secrets are dropped at once; the removal then waits for the exchange in flight.
            try await eventually { await setup.vault.broker.status().accounts.first { $0.name == "work" }?.signedIn != true }
            setup.issuer.openGate()
            try await replace.value
            let line = try #require(await client.readLine())
            let answer = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            #expect(answer["access_token"] == nil, "\(answer)")
            #expect(answer["ok"] as? Bool == false, "\(answer)")
            let after = try #require(await client.call(#"{"id":2,"op":"token","account":"work"}"#))
            #expect(after.errorCode == "forbidden", "the new account is not the shared one: \(after)")
        }
    }

    /// Signed out, a shared account serves nothing; `subscribe` outside the grant is refused.
    @Test func aShareServesNothingSignedOutAndSubscribesOnlyItsAccounts() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/s.sock"
            _ = try await setup.share(["work", "--socket", path])
            let client = try LineClient(path: path)
            #expect(await client.call(#"{"id":1,"op":"token","account":"work"}"#)?["ok"] as? Bool == true)
            let outside = try #require(await client.call(#"{"id":2,"op":"subscribe","accounts":["work","home"]}"#))
            #expect(outside.errorCode == "forbidden", "\(outside)")
            let nobody = try #require(await client.call(#"{"id":3,"op":"subscribe","accounts":["nobody"]}"#))
            #expect(nobody.errorCode == "forbidden", "\(nobody)")
            _ = try await setup.vault.broker.signOut(.account("work"))
            let after = try #require(await client.call(#"{"id":4,"op":"token","account":"work","min_ttl":0}"#))
            #expect(after.errorCode == "not_signed_in", "\(after)")
        }
    }

    /// One socket, one share: paths are compared normalized; a relative
    /// path is refused without vaultd's working directory; ending a share
    /// removes only the socket it made.
    @Test func shareSocketPathsAreNormalizedAndOnlyTheirOwnSocketIsRemoved() async throws {
        try await using(self.setUp()) { setup in
            let path = setup.folder + "/share/x.sock"
            let id = try await setup.share(["work", "--socket", path])
            let doubled = try await runTool(
                "vaultctl", ["share", "home", "--socket", setup.folder + "//share//x.sock"], environment: setup.environment
            )
            #expect(doubled.status == 65, "the same socket: \(doubled.stderr)")

            let client = try LineClient(path: setup.vault.socketPath)
            let relative = try #require(await client.call(#"{"id":1,"op":"share.open","accounts":["work"],"socket":"rel/x.sock"}"#))
            #expect(relative.errorCode == "bad_request")
            let message = (relative["error"] as? [String: Any])?["message"] as? String ?? ""
            #expect(!message.contains(FileManager.default.currentDirectoryPath), "\(message)")
            let dotted = try #require(await client.call(#"{"id":2,"op":"share.open","accounts":["work"],"socket":"\#(setup.folder)/share/../share/y.sock"}"#))
            #expect(dotted.errorCode == "bad_request")

            // Another file put where the socket was: ending the share leaves it.
            #expect(unlink(path) == 0)
            try "mine".write(toFile: path, atomically: false, encoding: .utf8)
            let ended = try await runTool("vaultctl", ["unshare", id], environment: setup.environment)
            #expect(ended.status == 0, "\(ended.stderr)")
            #expect(try String(contentsOfFile: path, encoding: .utf8) == "mine")
        }
    }

    /// A request admitted for one account is not served by another that
    /// took its name while the request waited: the broker and the cache
    /// serve only the identity the gate admitted.
    @Test func aRequestAdmittedForAnAccountIsNotServedForItsSuccessor() async throws {
        try await using(self.setUp()) { setup in
            let broker = setup.vault.broker
            let rooms = setup.vault.rooms
            _ = try await rooms.token(TokenRequest(account: "work"), for: testPeer)
            let admitted = try rooms.admitted(.token(TokenRequest(account: "work")), testPeer)
            let identity = try #require(admitted.identity)
            _ = try await broker.remove("work")
            try await self.readd(setup)
            _ = try await rooms.token(TokenRequest(account: "work"), for: testPeer)
            let refused = await #expect(throws: VaultError.self) {
                _ = try await broker.token(TokenRequest(account: "work"), for: testPeer, admitted: admitted)
            }
            #expect(refused?.code == .unknownAccount)
            guard case .miss = rooms.cache.lookup(account: "work", identity: identity, scopes: nil, minTTL: 0, now: Date().timeIntervalSince1970) else {
                Issue.record("the cache served the successor's token for the admitted identity")
                return
            }
        }
    }

    /// Admitted while no account had the name, a request is not served by
    /// an account added under it meanwhile, whose `allowed_clients` the gate
    /// never asked.
    @Test func aRequestAdmittedForNoAccountIsNotServedForOneAddedSince() async throws {
        try await using(self.setUp()) { setup in
            let broker = setup.vault.broker
            let rooms = setup.vault.rooms
            let admitted = try rooms.admitted(.token(TokenRequest(account: "work")), testPeer)
            _ = try await broker.remove("work")
            let none = try rooms.admitted(.claims(account: "work"), testPeer)
            #expect(none.identity == nil)
            try await self.readd(setup)
            _ = try await rooms.token(TokenRequest(account: "work"), for: testPeer)
            for stale in [admitted, none] {
                let refused = await #expect(throws: VaultError.self) {
                    _ = try await broker.token(TokenRequest(account: "work"), for: testPeer, admitted: stale)
                }
                #expect(refused?.code == .unknownAccount)
            }
            let claims = await #expect(throws: VaultError.self) {
                _ = try await broker.claims(account: "work", for: testPeer, admitted: none)
            }
            #expect(claims?.code == .unknownAccount)
        }
    }
}
