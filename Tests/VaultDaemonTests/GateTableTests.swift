import Foundation
import Testing
import VaultDaemon
import VaultProtocol
import VaultServer

/// The gate's whole table, asked directly: every operation, through each
/// door (the main socket, a share, a share opened with `--dpop`), from a
/// program on the account's `allowed_clients` and from one that is not.
/// docs/protocol.md (Gate) is this table in words.
@Suite struct GateTableTests {
    /// One request line per operation; `subscribe` twice (to every account, to one).
    static let lines: [String: String] = [
        "hello": #"{"op":"hello"}"#,
        "status": #"{"op":"status"}"#,
        "account.add": #"{"op":"account.add","name":"new","issuer":"https://issuer.example","client_id":"c","scopes":["openid"]}"#,
        "account.remove": #"{"op":"account.remove","name":"work"}"#,
        "lock": #"{"op":"lock"}"#,
        "unlock": #"{"op":"unlock"}"#,
        "token": #"{"op":"token","account":"work"}"#,
        "dpop.proof": #"{"op":"dpop.proof","account":"work","htm":"GET","htu":"https://rs.example/a"}"#,
        "dpop.nonce": #"{"op":"dpop.nonce","account":"work","origin":"https://rs.example","nonce":"n-1"}"#,
        "claims": #"{"op":"claims","account":"work"}"#,
        "userinfo": #"{"op":"userinfo","account":"work"}"#,
        "signin.start": #"{"op":"signin.start","account":"work","method":"browser"}"#,
        "signin.submit_code": #"{"op":"signin.submit_code","flow":"f","code":"123456"}"#,
        "signin.resend_code": #"{"op":"signin.resend_code","flow":"f"}"#,
        "signin.submit_password": #"{"op":"signin.submit_password","flow":"f","password":"p"}"#,
        "signin.wait": #"{"op":"signin.wait","flow":"f"}"#,
        "signin.cancel": #"{"op":"signin.cancel","flow":"f"}"#,
        "subscribe": #"{"op":"subscribe","accounts":["work"]}"#,
        "subscribe (every account)": #"{"op":"subscribe"}"#,
        "signout": #"{"op":"signout","account":"work"}"#,
        "refresh_token": #"{"op":"refresh_token","account":"work"}"#,
        "migrate": #"{"op":"migrate","to":"file"}"#,
        "share.open": #"{"op":"share.open","socket":"/tmp/s.sock","accounts":["work"]}"#,
        "share.list": #"{"op":"share.list"}"#,
        "share.close": #"{"op":"share.close","share":"s-1"}"#,
    ]

    enum Door: String, CaseIterable {
        case main, share, dpopShare = "share --dpop"
    }

    /// What the gate says: "ok", or "forbidden" (every refusal of the gate
    /// is `forbidden`). Columns: main, share, share --dpop; each as
    /// "allowed program / other program".
    static let expected: [String: [Door: String]] = {
        let everywhereOnMain = ["ok/ok", "forbidden/forbidden", "forbidden/forbidden"]
        let accountOnMain = ["ok/forbidden", "forbidden/forbidden", "forbidden/forbidden"]
        var table: [String: [String]] = [:]
        for op in [
            "account.add", "account.remove", "lock", "unlock", "signin.start", "signin.submit_code", "signin.resend_code",
            "signin.submit_password", "signin.wait", "signin.cancel", "signout", "migrate", "share.open", "share.list",
            "share.close",
        ] {
            table[op] = everywhereOnMain
        }
        for op in ["claims", "userinfo", "refresh_token"] { table[op] = accountOnMain }
        table["hello"] = ["ok/ok", "ok/ok", "ok/ok"]
        table["status"] = ["ok/ok", "ok/ok", "ok/ok"]
        table["token"] = ["ok/forbidden", "ok/forbidden", "ok/forbidden"]
        table["subscribe"] = ["ok/forbidden", "ok/forbidden", "ok/forbidden"]
        // To every account: the main socket narrows it to the caller's accounts.
        table["subscribe (every account)"] = ["ok/ok", "ok/forbidden", "ok/forbidden"]
        table["dpop.proof"] = ["ok/forbidden", "forbidden/forbidden", "ok/forbidden"]
        table["dpop.nonce"] = ["ok/forbidden", "forbidden/forbidden", "ok/forbidden"]
        return table.mapValues { Dictionary(uniqueKeysWithValues: zip(Door.allCases, $0)) }
    }()

    static let allowed = Peer(pid: 10, uid: getuid(), gid: getgid(), executable: "/usr/bin/allowed")
    static let other = Peer(pid: 11, uid: getuid(), gid: getgid(), executable: "/usr/bin/other")
    static let work = AccountPolicy(
        {
            var configuration = AccountConfiguration(
                name: "work", issuer: "https://issuer.example", clientID: "c", scopes: ["openid", "offline_access"],
                allowedClients: ["/usr/bin/allowed"], releaseRefreshToken: true
            )
            configuration.identity = "id-work"
            return configuration
        }()
    )

    static func grant(_ door: Door) -> ShareGrant? {
        guard door != .main else { return nil }
        let account = ShareGrant.Account(identity: "id-work", scopes: ["openid", "offline_access"])
        return ShareGrant(id: "s-1", accounts: ["work": account], scopes: nil, dpop: door == .dpopShare, deadline: nil)
    }

    static func outcome(_ line: String, _ door: Door, _ peer: Peer) -> String {
        guard case .success(let command) = LineCodec.request(from: Array(line.utf8)).command else { return "undecodable" }
        let admitted = Gate.admit(command, from: peer, through: Self.grant(door), uptime: 0, accounts: ["work"]) {
            $0 == "work" ? Self.work : nil
        }
        switch admitted {
        case .success(let admission):
            // Whatever names an account is admitted to it, as it is now.
            if let account = admission.account, account.account != "work" || account.identity != "id-work" { return "wrong admission" }
            return "ok"
        case .failure(let error):
            return error.code == .forbidden ? "forbidden" : "\(error.code)"
        }
    }

    /// The same doors for an account without `allowed_clients` (every
    /// program of the user) that does not release its refresh token: the
    /// caller no longer matters, the door still does.
    static let expectedOpen: [String: [Door: String]] = {
        var table = Self.expected.mapValues { row in row.mapValues { verdict in verdict.replacingOccurrences(of: "ok/forbidden", with: "ok/ok") } }
        table["refresh_token"] = [.main: "forbidden/forbidden", .share: "forbidden/forbidden", .dpopShare: "forbidden/forbidden"]
        return table
    }()

    static let open = AccountPolicy(
        {
            var configuration = AccountConfiguration(name: "work", issuer: "https://issuer.example", clientID: "c", scopes: ["openid", "offline_access"])
            configuration.identity = "id-work"
            return configuration
        }()
    )

    static func outcome(_ line: String, _ door: Door, _ peer: Peer, policy: AccountPolicy) -> String {
        guard case .success(let command) = LineCodec.request(from: Array(line.utf8)).command else { return "undecodable" }
        switch Gate.admit(command, from: peer, through: Self.grant(door), uptime: 0, accounts: ["work"], policy: { $0 == "work" ? policy : nil }) {
        case .success: return "ok"
        case .failure(let error): return error.code == .forbidden ? "forbidden" : "\(error.code)"
        }
    }

    @Test(arguments: Self.lines.keys.sorted(), Door.allCases)
    func theGateAnswersAsItsTableSaysForAnAccountOfEveryProgram(_ op: String, _ door: Door) throws {
        let line = try #require(Self.lines[op])
        let said = Self.outcome(line, door, Self.allowed, policy: Self.open) + "/" + Self.outcome(line, door, Self.other, policy: Self.open)
        #expect(said == Self.expectedOpen[op]?[door], "\(op) through \(door.rawValue)")
    }

    @Test func everyOperationIsInTheTable() {
        let ops = Set(Op.allCases.map(\.rawValue))
        #expect(ops.isSubset(of: Set(Self.lines.keys)))
        #expect(Set(Self.lines.keys) == Set(Self.expected.keys))
    }

    @Test(arguments: Self.lines.keys.sorted(), Door.allCases)
    func theGateAnswersAsItsTableSays(_ op: String, _ door: Door) throws {
        let line = try #require(Self.lines[op])
        let said = Self.outcome(line, door, Self.allowed) + "/" + Self.outcome(line, door, Self.other)
        #expect(said == Self.expected[op]?[door], "\(op) through \(door.rawValue)")
    }

    /// A share past its ttl admits nothing, not even `hello`.
    @Test func anExpiredShareAdmitsNothing() throws {
        let account = ShareGrant.Account(identity: "id-work", scopes: ["openid"])
        let grant = ShareGrant(id: "s-1", accounts: ["work": account], scopes: nil, dpop: true, deadline: 100)
        for line in Self.lines.values {
            guard case .success(let command) = LineCodec.request(from: Array(line.utf8)).command else { continue }
            let admitted = Gate.admit(command, from: Self.allowed, through: grant, uptime: 100, accounts: ["work"]) { _ in Self.work }
            guard case .failure(let error) = admitted else {
                Issue.record("an expired share admitted \(line)")
                continue
            }
            #expect(error.code == .forbidden && error.message.contains("expired"), "\(error.message)")
        }
    }
}
