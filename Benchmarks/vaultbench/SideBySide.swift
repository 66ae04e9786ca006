// vaultd and oidc-agent side by side: the same Glewlwyd, the same C load
// client, each through its own protocol, and the C echo floor of the run.
import Foundation
import Glibc

func usv(_ micro: Double) -> String { String(format: "%.1f µs", micro) }
func rate(_ perSecond: Double) -> String { String(format: "%.0f/s", perSecond) }
func times(_ a: Double, _ b: Double) -> String { b > 0 ? String(format: "%.2f×", a / b) : "–" }

func sideBySide(bin: String, folder: String, load: Load) async throws -> [[String]] {
    guard Glewlwyd.installed else {
        return [["(glewlwyd is not installed: no side-by-side run)", "–", "–", "–", "–"]]
    }
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    // One issuer for cached tokens (an hour), one whose tokens expire in 5 s
    // for the burst, each client rotating its refresh tokens there. The
    // first binds tokens to a DPoP key when a proof comes with the request.
    let issuer = try Glewlwyd.start(folder: folder + "/glewlwyd", accessTokenSeconds: 3600, dpop: "on")
    defer { issuer.stop() }
    let shortIssuer = try Glewlwyd.start(folder: folder + "/glewlwyd-short", accessTokenSeconds: 5)
    defer { shortIssuer.stop() }

    let socket = folder + "/vaultd.sock"
    let daemon = try startVaultd(bin: bin, socket: socket, folder: folder)
    defer { stop(daemon.processIdentifier) }
    let vaultd = daemon.processIdentifier
    let client = try Client.connect(socket, deadline: 10)
    func signIn(_ name: String, _ issuer: Glewlwyd, _ clientID: String, _ secret: String, dpop: String = "off") throws {
        let add = #"{"id":1,"op":"account.add","name":"\#(name)","issuer":"\#(issuer.issuer)","client_id":"\#(clientID)","client_secret":"\#(secret)","scopes":["openid","offline_access"],"dpop":"\#(dpop)"}"#
        guard try client.call(add).contains(#""ok":true"#) else { throw BenchError("vaultd: account.add \(name) failed") }
        let start = #"{"id":2,"op":"signin.start","account":"\#(name)","method":"password","username":"ada","password":"correct horse"}"#
        let state = try client.call(start)
        guard state.contains(#""signed_in""#) else { throw BenchError("vaultd: password sign-in of \(name) failed: \(state.prefix(200))") }
    }
    try signIn("bench", issuer, "confidential-app", "s3cret-confidential")
    try signIn("burst", shortIssuer, "confidential-rotating", "s3cret-rotating")

    var agent: OidcAgent?
    if OidcAgent.installed {
        let peer = try OidcAgent.start(folder: folder)
        agent = peer
        try peer.add("bench", issuer: issuer.issuer, clientID: "confidential-app", clientSecret: "s3cret-confidential")
        try peer.add("burst", issuer: shortIssuer.issuer, clientID: "confidential-rotating", clientSecret: "s3cret-rotating")
    }
    defer { agent?.stop() }
    // Both burst accounts got their 5-second tokens by now.
    let expired = Clock.now() + 5.5

    let vRequest = #"{"id":1,"op":"token","account":"bench"}"#
    let oRequest = OidcAgent.request("bench")
    let reply = try client.call(vRequest)
    guard reply.contains(#""ok":true"#) else { throw BenchError("vaultd: no cached token") }
    var rows: [[String]] = []
    func row(_ figure: String, _ v: String, _ o: String, _ ratio: String, _ goal: String) { rows.append([figure, v, o, ratio, goal]) }
    let none = "–"

    // Idle after set-up.
    let vIdle = try memory(of: vaultd)
    let oIdle = try agent?.memory()

    // CPU a server spent per answered request while `work` ran.
    func measured(_ pids: [pid_t], _ work: () throws -> Load.Result) rethrows -> (Load.Result, Double) {
        let before = cpuSeconds(of: pids)
        let result = try work()
        let cpu = cpuSeconds(of: pids) - before
        // The warm-up's requests are not counted, its CPU is: at most 0.3/2.3 too much.
        return (result, result.ok > 0 ? cpu * 1e6 / (Double(result.ok) * (2.3 / 2.0)) : 0)
    }
    // The floor: a C echo server answering each line with as many bytes as vaultd's reply.
    let echoSocket = folder + "/echo.sock"
    let echo = try load.echoServer(echoSocket, replyBytes: reply.utf8.count)
    let (floorKept, floorCPU) = try measured([echo]) { try load.run("line", echoSocket, clients: 1, seconds: 2, request: vRequest) }
    let floorConn = try load.run("conn", echoSocket, clients: 1, seconds: 2, request: vRequest)
    let floorKept64 = try load.run("line", echoSocket, clients: 64, seconds: 2, request: vRequest)
    let floorConn64 = try load.run("conn", echoSocket, clients: 64, seconds: 2, request: vRequest)
    stop(echo)

    let (v1, v1cpu) = try measured([vaultd]) { try load.run("line", socket, clients: 1, seconds: 2, request: vRequest) }
    let vConn1 = try load.run("conn", socket, clients: 1, seconds: 2, request: vRequest)
    let (v8, _) = try measured([vaultd]) { try load.run("line", socket, clients: 8, seconds: 2, request: vRequest) }
    let (v64, v64cpu) = try measured([vaultd]) { try load.run("line", socket, clients: 64, seconds: 2, request: vRequest) }
    // A DPoP proof per request: a signature and a small JSON encode on top of
    // the cached token. Signed in only now, so that the idle figures above
    // are of the same set-up as before.
    try signIn("proof", issuer, "confidential-rotating", "s3cret-rotating", dpop: "required")
    let pRequest = #"{"id":1,"op":"dpop.proof","account":"proof","htm":"GET","htu":"https://rs.example/api/items?page=2"}"#
    guard try client.call(pRequest).contains(#""ok":true"#) else { throw BenchError("vaultd: no DPoP proof") }
    let p1 = try load.run("line", socket, clients: 1, seconds: 2, request: pRequest)
    let p64 = try load.run("line", socket, clients: 64, seconds: 2, request: pRequest)
    var o1: Load.Result?, o8: Load.Result?, o64: Load.Result?
    var o1cpu = 0.0, o64cpu = 0.0
    if let agent {
        let agentPids = agent.pids
        let one = try measured(agentPids) { try load.run("oidc", agent.socket, clients: 1, seconds: 2, request: oRequest) }
        o8 = try load.run("oidc", agent.socket, clients: 8, seconds: 2, request: oRequest)
        let many = try measured(agentPids) { try load.run("oidc", agent.socket, clients: 64, seconds: 2, request: oRequest) }
        o1 = one.0
        o1cpu = one.1
        o64 = many.0
        o64cpu = many.1
    }

    row(
        "C echo floor, same client, 1 client, median: a kept connection (vaultd's kind) / a connection per request (oidc-agent's kind)",
        usv(floorKept.p50), usv(floorConn.p50), none, "–"
    )
    row(
        "C echo floor, 64 clients: requests/s / p99",
        "\(rate(floorKept64.rate)) / \(usv(floorKept64.p99))", "\(rate(floorConn64.rate)) / \(usv(floorConn64.p99))", none, "–"
    )
    let floorGoal = 2.5 * floorKept.p50
    row(
        "cached token, 1 client, median (p99)",
        "\(usv(v1.p50)) (\(usv(v1.p99)))", o1.map { "\(usv($0.p50)) (\(usv($0.p99)))" } ?? none,
        o1.map { times(v1.p50, $0.p50) } ?? none,
        String(format: "≤ 2.5× floor (%.1f µs): %.2f× floor, ", floorGoal, v1.p50 / floorKept.p50) + (v1.p50 <= floorGoal ? "met" : "not met")
    )
    row(
        "cached token, 1 client, a connection per request, median",
        usv(vConn1.p50), o1.map { usv($0.p50) } ?? none, o1.map { times(vConn1.p50, $0.p50) } ?? none,
        String(format: "%.2f× its floor (%.1f µs)", vConn1.p50 / floorConn.p50, floorConn.p50)
    )
    row(
        "cached token, 8 clients, requests/s",
        rate(v8.rate), o8.map { rate($0.rate) } ?? none, o8.map { times(v8.rate, $0.rate) } ?? none,
        o8.map { "≥ 5×: " + (v8.rate >= 5 * $0.rate ? "met" : "not met") } ?? "≥ 5×"
    )
    row(
        "cached token, 64 clients, requests/s / p99",
        "\(rate(v64.rate)) / \(usv(v64.p99))", o64.map { "\(rate($0.rate)) / \(usv($0.p99))" } ?? none,
        o64.map { "\(times(v64.rate, $0.rate)) / \(times(v64.p99, $0.p99))" } ?? none,
        "≥ 5× / ≤ 2 ms: " + (o64.map { v64.rate >= 5 * $0.rate ? "met" : "not met" } ?? "–") + " / " + (v64.p99 <= 2000 ? "met" : "not met")
    )
    row(
        "DPoP proof (dpop.proof), 1 client, median (p99)",
        "\(usv(p1.p50)) (\(usv(p1.p99)))", none, none,
        String(format: "≤ 2× cached token (%.1f µs): %.2f×, ", 2 * v1.p50, p1.p50 / v1.p50) + (p1.p50 <= 2 * v1.p50 ? "met" : "not met")
    )
    row(
        "DPoP proof, 64 clients, requests/s / p99 (oidc-agent: its bearer token)",
        "\(rate(p64.rate)) / \(usv(p64.p99))", o64.map { "\(rate($0.rate)) / \(usv($0.p99))" } ?? none,
        o64.map { times(p64.rate, $0.rate) } ?? none,
        "≥ 5× oidc-agent's bearer: " + (o64.map { p64.rate >= 5 * $0.rate ? "met" : "not met" } ?? "–")
    )
    row(
        "daemon CPU per request (user + system), 1 client / 64 clients",
        "\(usv(v1cpu)) / \(usv(v64cpu))", agent == nil ? none : "\(usv(o1cpu)) / \(usv(o64cpu))",
        agent == nil ? none : "\(times(v1cpu, o1cpu)) / \(times(v64cpu, o64cpu))", "C echo server, 1 client: \(usv(floorCPU))"
    )
    let runs: [(String, Load.Result?)] = [
        ("vaultd, 1 client", v1), ("vaultd, a connection per request", vConn1), ("vaultd, 8 clients", v8), ("vaultd, 64 clients", v64),
        ("vaultd dpop.proof, 1 client", p1), ("vaultd dpop.proof, 64 clients", p64),
        ("oidc-agent, 1 client", o1), ("oidc-agent, 8 clients", o8), ("oidc-agent, 64 clients", o64),
    ]
    for (name, result) in runs where (result?.errors ?? 0) > 0 {
        row("errors: \(name)", "\(result?.errors ?? 0)", none, none, "0")
    }

    // Whole process: vaultctl token against oidc-token, and /bin/true, taking turns.
    var commands = [
        Command(path: bin + "/vaultctl", arguments: ["token", "bench", "--socket", socket]),
        Command(path: "/bin/true", arguments: []),
    ]
    if let agent { commands.append(Command(path: "/usr/bin/oidc-token", arguments: ["bench"], environment: agent.environment)) }
    let taken = try wholeProcess(commands, rounds: 200)
    let (cli, floor) = (taken[0], taken[1])
    let peerCLI = agent == nil ? nil : taken[2]
    row(
        "`vaultctl token` / `oidc-token`, whole process, median (p99)",
        "\(ms(percentile(cli, 0.5))) (\(ms(percentile(cli, 0.99))))",
        peerCLI.map { "\(ms(percentile($0, 0.5))) (\(ms(percentile($0, 0.99))))" } ?? none,
        peerCLI.map { times(percentile(cli, 0.5), percentile($0, 0.5)) } ?? none,
        "≤ 1.0× (`/bin/true`: \(ms(percentile(floor, 0.5)))): " + (peerCLI.map { percentile(cli, 0.5) <= percentile($0, 0.5) ? "met" : "not met" } ?? "–")
    )

    // Memory: idle, then after load (vaultd: 1,000 connections held and
    // 100,000 requests over them; oidc-agent: 100,000 requests, each on its
    // own connection, as its protocol has it).
    row(
        "idle RSS after set-up (2 accounts signed in, tokens cached); threads (oidc-agent: its 2 processes added up)",
        "\(mb(vIdle.rssKB)); \(vIdle.threads)", oIdle.map { "\(mb($0.rssKB)); \($0.threads)" } ?? none,
        oIdle.map { times(Double(vIdle.rssKB), Double($0.rssKB)) } ?? none,
        "≤ 12 MB: " + (Double(vIdle.rssKB) * 1024 <= 12e6 ? "met" : "not met")
    )
    // The long-lived companions, idle on the same vaultd: resident memory, and
    // CPU over 5 s with no event (no polling: 0 ticks). notify has no session
    // bus here, so it would print; vaultd's events never come.
    let companions = try ["watch", "notify"].map { command in
        try spawn(bin + "/vaultctl", [command, "--socket", socket], environment: ["DBUS_SESSION_BUS_ADDRESS": "", "XDG_RUNTIME_DIR": folder])
    }
    usleep(1_000_000)
    let companionCPU = companions.map { cpuSeconds(of: [$0]) }
    usleep(5_000_000)
    let companionIdle = try zip(companions, companionCPU).map { pid, before in (try memory(of: pid), cpuSeconds(of: [pid]) - before) }
    companions.forEach(stop)
    row(
        "`vaultctl watch` / `vaultctl notify` idle: RSS; threads; CPU over 5 s",
        companionIdle.map { "\(mb($0.0.rssKB)); \($0.0.threads); \(String(format: "%.2f s", $0.1))" }.joined(separator: " / "), none, none,
        "≤ 6 MB, no CPU: " + (companionIdle.allSatisfy { Double($0.0.rssKB) * 1024 <= 6e6 && $0.1 == 0 } ? "met" : "not met")
    )
    let vLoad = try heldConnections(socket: socket, connections: 1_000, requests: 100_000, line: vRequest, workers: 50) {}
    _ = try client.call(#"{"id":1,"op":"status"}"#)
    var oLoad: Load.Result?
    if let agent { oLoad = try load.many("oidc", agent.socket, clients: 8, total: 100_000, request: oRequest) }
    usleep(1_000_000)
    let vAfter = try memory(of: vaultd)
    let oAfter = try agent?.memory()
    row(
        "RSS after 1,000 connections + 100,000 requests (× idle)",
        mb(vAfter.rssKB) + String(format: " (%.2f×)", Double(vAfter.rssKB) / Double(vIdle.rssKB)),
        oAfter.flatMap { after in oIdle.map { mb(after.rssKB) + String(format: " (%.2f×)", Double(after.rssKB) / Double($0.rssKB)) } } ?? none,
        oAfter.map { times(Double(vAfter.rssKB), Double($0.rssKB)) } ?? none,
        "≤ 1.2× idle: " + (Double(vAfter.rssKB) <= 1.2 * Double(vIdle.rssKB) ? "met" : "not met")
    )
    row(
        "that load: requests/s, errors",
        "\(rate(vLoad.rate)), \(vLoad.errors) (Swift client, 50 threads)",
        oLoad.map { "\(rate($0.rate)), \($0.errors) (C client, 8 threads)" } ?? none, none, "–"
    )

    // One rotating refresh: 50 requests at one instant once the token has expired.
    while Clock.now() < expired { usleep(50_000) }
    let rotatingClient = "confidential-rotating"
    var issued = shortIssuer.tokensIssued(to: rotatingClient)
    let vBurst = try load.burst("line", socket, clients: 50, request: #"{"id":1,"op":"token","account":"burst","min_ttl":0}"#)
    let vRefreshes = shortIssuer.tokensIssued(to: rotatingClient) - issued
    issued = shortIssuer.tokensIssued(to: rotatingClient)
    let oBurst = try agent.map { try load.burst("oidc", $0.socket, clients: 50, request: OidcAgent.request("burst", minValid: 0)) }
    let oRefreshes = shortIssuer.tokensIssued(to: rotatingClient) - issued
    row(
        "one rotating refresh: 50 requests at once after expiry: wait median / max, refreshes, errors",
        "\(ms(vBurst.p50 / 1e6)) / \(ms(vBurst.max / 1e6)), \(vRefreshes), \(vBurst.errors)",
        oBurst.map { "\(ms($0.p50 / 1e6)) / \(ms($0.max / 1e6)), \(oRefreshes), \($0.errors)" } ?? none,
        oBurst.map { times(vBurst.max, $0.max) + " (max)" } ?? none,
        "1 refresh: " + (vRefreshes == 1 && vBurst.errors == 0 ? "met" : "not met")
    )
    if agent == nil { row("(oidc-agent-cli is not installed: no peer column)", none, none, none, none) }
    return rows
}
