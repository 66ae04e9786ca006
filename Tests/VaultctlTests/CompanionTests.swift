import Foundation
import Glibc
import Synchronization
import Testing
import VaultClient
import VaultCrypto
import VaultDaemon
import VaultProtocol
import VaultServer
import VaultTestIssuer
import VaultTestKit

/// What a companion program sees: events as an AsyncSequence, and a token
/// copy that goes away when the account signs out.
@Suite(.timeLimit(.minutes(1)))
struct CompanionTests {
    @Test func aCompanionDropsItsCopyOnSignOut() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await withVault { vault in
                let admin = try LineClient(path: vault.socketPath)
                let add = #"{"id":"add","op":"account.add","name":"work","issuer":"\#(issuer.issuer)","client_id":"\#(TestIssuer.clientID)","scopes":["openid","offline_access"],"refresh_token":"\#(issuer.mintRefreshToken())"}"#
                #expect(await admin.call(add)?["ok"] as? Bool == true)

                let companion = try await VaultClient.connect(path: vault.socketPath)
                let copies = try await TokenCopies.start(companion)
                let watcher = try await VaultClient.connect(path: vault.socketPath)
                var events = try await watcher.events(accounts: ["work"]).makeAsyncIterator()

                let first = try await copies.token("work")
                #expect(copies.held == ["work"])
                #expect(try await copies.token("work").accessToken == first.accessToken, "served from the companion's copy")
                let refreshed = await events.next()
                #expect(refreshed?.event == .tokenRefreshed && refreshed?.expiresAt == first.expiresAt)

                let signout = try #require(await admin.call(#"{"id":1,"op":"signout","account":"work"}"#))
                #expect(signout["notified"] as? Int == 2, "both subscribed connections were told: \(signout)")
                let signedOut = await events.next()
                #expect(signedOut?.event == .signedOut && signedOut?.account == "work")
                try await eventually { copies.held.isEmpty }
                await #expect(throws: VaultError.self) { try await copies.token("work") }
            }
        }
    }

    /// A companion that stops hearing events (vaultd closed its connection,
    /// as it does with `overloaded` for one that fell behind) could miss a
    /// sign-out: it drops its copies and keeps none after.
    @Test func aCompanionThatLosesItsEventsKeepsNoCopy() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await withVault { vault in
                _ = try await vault.broker.add(
                    AccountAddition(
                        configuration: AccountConfiguration(name: "work", issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"]),
                        refreshToken: try SecretBytes(utf8: issuer.mintRefreshToken())
                    )
                )
                let copies = try await TokenCopies.start(try await VaultClient.connect(path: vault.socketPath))
                _ = try await copies.token("work")
                #expect(copies.held == ["work"])
                vault.server.closeConnections()
                try await eventually { copies.held.isEmpty }
            }
        }
    }

    @Test func theRefreshTokenGoesOnlyToAnAllowedCompanionOfAnAccountThatReleasesIt() async throws {
        try await using(TestIssuer.start()) { issuer in
            try await withVault { vault in
                let companion = try #require(testPeer.executable)
                func add(_ name: String, release: Bool, allowed: [String]) async throws -> String {
                    let refreshToken = issuer.mintRefreshToken()
                    _ = try await vault.broker.add(
                        AccountAddition(
                            configuration: AccountConfiguration(
                                name: name, issuer: issuer.issuer, clientID: TestIssuer.clientID, scopes: ["openid"],
                                allowedClients: allowed, releaseRefreshToken: release
                            ),
                            refreshToken: try SecretBytes(utf8: refreshToken)
                        )
                    )
                    return refreshToken
                }
                let released = try await add("phone", release: true, allowed: [companion])
                _ = try await add("closed", release: false, allowed: [companion])
                _ = try await add("anyone", release: true, allowed: [])
                let answer = await vault.dispatcher.answer(.refreshToken(account: "phone"), from: testPeer)
                guard case .success(let payload) = answer.outcome, let result = payload as? RefreshTokenResult else {
                    Issue.record("no refresh token for an allowed companion: \(answer.outcome)")
                    return
                }
                #expect(result.refreshToken.unsafeString() == released)
                let stranger = Peer(pid: testPeer.pid, uid: testPeer.uid, gid: testPeer.gid, executable: "/usr/bin/stranger")
                for (name, peer) in [("phone", stranger), ("closed", testPeer), ("anyone", testPeer)] {
                    let code = await vault.dispatcher.refusal(.refreshToken(account: name), from: peer)?.code
                    #expect(code == .forbidden, "\(name) for \(peer.executable ?? "?")")
                }
                // allowed_clients gates token for everyone else too.
                #expect(await vault.dispatcher.refusal(.token(TokenRequest(account: "phone")), from: stranger)?.code == .forbidden)
            }
        }
    }
}

/// The client library against a vaultd that misbehaves: a fake server on a
/// Unix socket, run on a thread of its own, that answers a script of lines.
@Suite(.timeLimit(.minutes(1)))
struct HostileServerClientTests {
    /// Listens at `path`; for the one connection, reads request lines and
    /// answers each with `answer(line)`; after the subscribe reply it writes
    /// `after` once, and closes the connection then if `thenClose`.
    static func serve(_ path: String, answer: @escaping @Sendable (String) -> [UInt8], after: [UInt8] = [], thenClose: Bool = false) throws {
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let bound = bind(listener, unixPath: path)
        try #require(bound == 0 && listen(listener, 1) == 0)
        Thread.detachNewThread {
            let fd = accept(listener, nil, nil)
            close(listener)
            var line: [UInt8] = []
            var byte: UInt8 = 0
            while read(fd, &byte, 1) == 1 {
                guard byte == 0x0A else { line.append(byte); continue }
                let text = String(decoding: line, as: UTF8.self)
                line = []
                var reply = answer(text)
                if text.contains("\"subscribe\"") { reply += after }
                var offset = 0
                while offset < reply.count {
                    let n = reply[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    if n <= 0 { break }
                    offset += n
                }
                if thenClose && text.contains("\"subscribe\"") { break }
            }
            close(fd)
        }
    }

    static func id(of line: String) -> String {
        let match = line.firstRange(of: /"id":([0-9]+)/)
        return match.map { String(line[$0].dropFirst(5)) } ?? "null"
    }

    /// A reply line without end is cut at the client's bound, not buffered.
    @Test func aLineWithoutEndIsCutNotBuffered() async throws {
        let path = try temporaryFolder() + "/v.sock"
        try Self.serve(path) { _ in [UInt8](repeating: UInt8(ascii: "x"), count: VaultClient.maximumLineBytes + 65_536) }
        let client = try await VaultClient.connect(path: path)
        let failure = await #expect(throws: VaultError.self) { _ = try await client.token("work") }
        #expect(failure?.code == .internalError && failure?.message.contains("longer than") == true, "\(String(describing: failure))")
    }

    /// A consumer that fell behind sees its stream end, never a gap: the
    /// events it holds come in order, then the end, with none skipped.
    @Test func aLaggingEventStreamEndsInsteadOfSkipping() async throws {
        let path = try temporaryFolder() + "/v.sock"
        let count = VaultClient.maximumBufferedEvents + 100
        var events: [UInt8] = []
        for n in 0..<count { events += Array(#"{"event":"token_refreshed","account":"a\#(n)","expires_at":1}"#.utf8) + [0x0A] }
        events += Array(#"{"event":"signed_out","account":"work"}"#.utf8) + [0x0A]
        try Self.serve(path, answer: { Array(#"{"id":\#(Self.id(of: $0)),"ok":true,"accounts":null}"#.utf8) + [0x0A] }, after: events, thenClose: true)
        let client = try await VaultClient.connect(path: path)
        let stream = try await client.events()
        // The reader delivers every event before it sees the end: wait for that before reading a thing.
        try await eventually { client.isClosed }
        var seen: [String] = []
        for await event in stream { seen.append(event.account) }
        #expect(seen == (0..<VaultClient.maximumBufferedEvents).map { "a\($0)" }, "in order, then the end: \(seen.count)")
    }

    /// TokenCopies hears a sign-out however many events come before it.
    @Test func tokenCopiesHearASignOutBehindAFlood() async throws {
        let path = try temporaryFolder() + "/v.sock"
        let flood = Shared(false)
        try Self.serve(path, answer: { line in
            let id = Self.id(of: line)
            if line.contains("\"token\"") {
                var reply = Array(#"{"id":\#(id),"ok":true,"access_token":"at-1","token_type":"Bearer","expires_at":4102444800,"expires_in":3600,"scope":"openid"}"#.utf8) + [0x0A]
                if flood.value.withLock({ $0 }) {
                    // The sign-out, then more events than any buffer holds: a buffer that
                    // dropped the oldest would lose the sign-out.
                    reply += Array(#"{"event":"signed_out","account":"work"}"#.utf8) + [0x0A]
                    for n in 0..<5000 { reply += Array(#"{"event":"token_refreshed","account":"x\#(n)","expires_at":1}"#.utf8) + [0x0A] }
                }
                return reply
            }
            return Array(#"{"id":\#(id),"ok":true,"accounts":null}"#.utf8) + [0x0A]
        })
        let copies = try await TokenCopies.start(try await VaultClient.connect(path: path))
        flood.value.withLock { $0 = true }
        _ = try await copies.token("work")
        // The copy kept from this answer is dropped by the sign-out that follows it on the wire.
        try await eventually { copies.held.isEmpty }
    }
}
