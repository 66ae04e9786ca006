import Foundation
import Glibc
import Testing
import VaultTestKit

/// DPoP through the vault, against Glewlwyd with DPoP on: a sign-in binds
/// the grant to a key made and kept in the vault, companions get a proof
/// per request with `dpop.proof` (or `vaultctl dpop`), and a resource
/// server (Glewlwyd's userinfo) accepts each proof once.
@Suite(.timeLimit(.minutes(2)))
struct GlewlwydDPoPVaultTests {
    static let client = "confidential-rotating"
    static let secret = "s3cret-rotating"
    static let scopes = #"["openid","offline_access","profile","email"]"#

    /// Adds `name` for the rotating confidential client and signs it in with the password grant.
    func signIn(_ client: LineClient, _ provider: Glewlwyd, _ name: String, extra: String = "") async throws {
        let add = #"{"op":"account.add","name":"\#(name)","issuer":"\#(provider.issuer)","client_id":"\#(Self.client)","client_secret":"\#(Self.secret)","scopes":\#(Self.scopes)\#(extra)}"#
        let added = try #require(await client.call(add))
        #expect(added["ok"] as? Bool == true, "\(added)")
        let done = try #require(await client.call(#"{"op":"signin.start","account":"\#(name)","method":"password","username":"ada","password":"correct horse"}"#))
        #expect(done["state"] as? String == "signed_in", "\(done)")
    }

    /// Runs a bash line as a user would, vaultctl on the PATH and the vault's socket in the environment.
    func shell(_ line: String, _ socket: String, _ env: [String: String] = [:]) async throws -> ToolResult {
        let path = productsDirectory + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        return try await runTool("/bin/bash", ["-c", line], environment: env.merging(["TOKENVAULT_SOCKET": socket, "PATH": path]) { $1 })
    }

    /// The `cnf.jkt` of a JWT access token.
    func boundThumbprint(_ token: String) throws -> String? {
        try GlewlwydDPoPTests.boundThumbprint(token)
    }

    @Test func aSignInIsBoundToTheVaultsKeyAndCompanionsProveEachRequest() async throws {
        try await Glewlwyd.with(dpop: "on") { provider in
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                try await self.signIn(client, provider, "work")
                let status = try #require(await client.call(#"{"op":"status"}"#))
                let row = try #require((status["accounts"] as? [[String: Any]])?.first)
                let jkt = try #require(row["dpop_jkt"] as? String, "\(row)")
                #expect(jkt.count == 43)

                let token = try #require(await client.call(#"{"op":"token","account":"work"}"#))
                #expect(token["token_type"] as? String == "DPoP", "\(token)")
                #expect(try self.boundThumbprint(try #require(token["access_token"] as? String)) == jkt, "the issuer bound the token to the vault's key")

                // What a user types: curl with vaultctl dpop's two header lines, once per request.
                let userinfo = provider.issuer + "/userinfo"
                let curl = #"curl -sS -o /dev/null -w '%{http_code}' -H @<(vaultctl dpop work GET "$URL") "$URL""#
                for round in 1...2 {
                    let ok = try await self.shell(curl, vault.socketPath, ["URL": userinfo])
                    #expect(ok.stdout == "200", "request \(round): \(ok.stdout) \(ok.stderr)")
                }
                // A proof is good once: the same headers again are refused.
                let replay = try await self.shell(
                    #"vaultctl dpop work GET "$URL" > "$F" && curl -sS -o /dev/null -w '%{http_code} ' -H @"$F" "$URL" "$URL""#,
                    vault.socketPath, ["URL": userinfo, "F": vault.folder + "/headers"]
                )
                #expect(replay.stdout == "200 401 ", "\(replay.stdout) \(replay.stderr)")
                // The bearer form of the same token is refused too.
                let access = try #require(token["access_token"] as? String)
                let bearer = try await self.shell(#"curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $T" "$URL""#, vault.socketPath, ["URL": userinfo, "T": access])
                #expect(bearer.stdout != "200", "\(bearer.stdout)")

                // Refreshes across rotation keep the binding; the vault's own userinfo proves too.
                for round in 1...2 {
                    let refreshed = try #require(await client.call(#"{"op":"token","account":"work","force_refresh":true}"#))
                    #expect(refreshed["token_type"] as? String == "DPoP", "refresh \(round): \(refreshed)")
                    #expect(try self.boundThumbprint(try #require(refreshed["access_token"] as? String)) == jkt)
                }
                let info = try #require(await client.call(#"{"op":"userinfo","account":"work"}"#))
                #expect(info["ok"] as? Bool == true, "\(info)")
                let after = try await self.shell(curl, vault.socketPath, ["URL": userinfo])
                #expect(after.stdout == "200", "\(after.stdout) \(after.stderr)")

                // Bad requests for a proof say why, and lose nothing.
                for bad in [
                    #"{"op":"dpop.proof","account":"work","htm":"GE T","htu":"https://rs.example/"}"#,
                    #"{"op":"dpop.proof","account":"work","htm":"GET","htu":"ftp://rs.example/"}"#,
                    #"{"op":"dpop.proof","account":"work","htm":"GET","htu":"https://user@rs.example/"}"#,
                    #"{"op":"dpop.nonce","account":"work","origin":"https://rs.example/path","nonce":"n"}"#,
                    #"{"op":"dpop.nonce","account":"work","origin":"https://rs.example","nonce":"a\"b"}"#,
                ] {
                    #expect(await client.call(bad)?.errorCode == "bad_request", "\(bad)")
                }

                // A share makes proofs only when opened with dpop.
                #expect(mkdir(vault.folder + "/share", 0o700) == 0)
                for (socket, dpop, expected) in [("plain.sock", "", "forbidden"), ("dpop.sock", #","dpop":true"#, nil)] {
                    let path = vault.folder + "/share/" + socket
                    let opened = try #require(await client.call(#"{"op":"share.open","accounts":["work"],"socket":"\#(path)"\#(dpop)}"#))
                    #expect(opened["ok"] as? Bool == true, "\(opened)")
                    let shared = try LineClient(path: path)
                    let proof = try #require(await shared.call(#"{"op":"dpop.proof","account":"work","htm":"GET","htu":"\#(userinfo)"}"#))
                    #expect(proof.errorCode == expected, "\(socket): \(proof)")
                    if expected == nil {
                        #expect((proof["authorization"] as? String)?.hasPrefix("DPoP ") == true && proof["dpop"] is String, "\(proof)")
                        // A nonce recorded through the share is the share's: the user's own proofs never carry it.
                        let recorded = try #require(await shared.call(#"{"op":"dpop.nonce","account":"work","origin":"https://rs.example","nonce":"share-nonce"}"#))
                        #expect(recorded["ok"] as? Bool == true, "\(recorded)")
                        let ask = #"{"op":"dpop.proof","account":"work","htm":"GET","htu":"https://rs.example/items"}"#
                        let theirs = try #require(await shared.call(ask)?["dpop"] as? String)
                        #expect(try GlewlwydDPoPTests.claims(of: theirs)["nonce"] as? String == "share-nonce")
                        let own = try #require(await client.call(ask)?["dpop"] as? String)
                        #expect(try GlewlwydDPoPTests.claims(of: own)["nonce"] == nil, "the share's nonce reached the user's proof")
                    }
                }

                // Sign-out reaches the issuer's copies: a request made ready before it, sent after, is refused.
                let late = vault.folder + "/late-headers"
                let ready = try await self.shell(#"vaultctl dpop work GET "$URL" > "$F""#, vault.socketPath, ["URL": userinfo, "F": late])
                #expect(ready.status == 0, "\(ready.stderr)")
                let out = try #require(await client.call(#"{"op":"signout","account":"work"}"#))
                let receipt = try #require((out["accounts"] as? [[String: Any]])?.first)
                #expect(receipt["revoked"] as? String == "yes", "\(out)")
                #expect((receipt["access_tokens_revoked"] as? Int ?? 0) >= 1, "\(out)")
                let afterSignOut = try await self.shell(#"curl -sS -o /dev/null -w '%{http_code}' -H @"$F" "$URL""#, vault.socketPath, ["URL": userinfo, "F": late])
                #expect(afterSignOut.stdout == "401", "the access token handed out still opens userinfo: \(afterSignOut.stdout)")
                let signedOut = try #require(await client.call(#"{"op":"status"}"#))
                #expect((signedOut["accounts"] as? [[String: Any]])?.first?["dpop_jkt"] is NSNull, "\(signedOut)")
                let none = try #require(await client.call(#"{"op":"dpop.proof","account":"work","htm":"GET","htu":"\#(userinfo)"}"#))
                #expect(none.errorCode == "not_signed_in", "\(none)")
            }
        }
    }

    /// Nonces mandatory at the token endpoint and at userinfo: the vault
    /// meets the issuer's itself; a companion records the resource
    /// server's with `dpop.nonce`. A refresh token taken out of the vault
    /// is useless without the key, and the vault's session survives it.
    @Test func noncesAreMetAndALeakedRefreshTokenIsUselessWithoutTheKey() async throws {
        try await Glewlwyd.with(dpop: "nonce:2") { provider in
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                let me = try #require(try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
                try await self.signIn(client, provider, "work")
                try await self.signIn(client, provider, "leaky", extra: #","release_refresh_token":true,"allowed_clients":["\#(me)"]"#)
                for round in 1...4 {
                    let refreshed = try #require(await client.call(#"{"op":"token","account":"work","force_refresh":true}"#))
                    #expect(refreshed["token_type"] as? String == "DPoP", "refresh \(round): \(refreshed)")
                }
                #expect(await client.call(#"{"op":"userinfo","account":"work"}"#)?["ok"] as? Bool == true)

                // A resource server that wants a nonce: 401 with DPoP-Nonce, recorded, then accepted.
                let userinfo = provider.issuer + "/userinfo"
                let origin = try #require(URLComponents(string: provider.issuer).map { "\($0.scheme ?? "")://\($0.host ?? ""):\($0.port ?? 0)" })
                var accepted = false
                for _ in 1...3 where !accepted {
                    let proof = try #require(await client.call(#"{"op":"dpop.proof","account":"work","htm":"GET","htu":"\#(userinfo)"}"#))
                    let call = try await self.shell(
                        #"curl -sS -D - -o /dev/null -H "Authorization: $A" -H "DPoP: $P" "$URL""#, vault.socketPath,
                        ["URL": userinfo, "A": try #require(proof["authorization"] as? String), "P": try #require(proof["dpop"] as? String)]
                    )
                    let lines = call.stdout.split(separator: "\r\n")
                    if lines.first?.contains(" 200") == true { accepted = true; break }
                    #expect(lines.first?.contains(" 401") == true, "\(call.stdout)")
                    let nonce = try #require(lines.first { $0.lowercased().hasPrefix("dpop-nonce:") }).dropFirst("dpop-nonce:".count).trimmingCharacters(in: .whitespaces)
                    let recorded = try #require(await client.call(#"{"op":"dpop.nonce","account":"work","origin":"\#(origin)","nonce":"\#(nonce)"}"#))
                    #expect(recorded["ok"] as? Bool == true, "\(recorded)")
                }
                #expect(accepted, "a proof with the recorded nonce is accepted")

                // The refresh token, taken out of the vault, refreshes nothing without a proof.
                let released = try #require(await client.call(#"{"op":"refresh_token","account":"leaky"}"#))
                let refreshToken = try #require(released["refresh_token"] as? String, "\(released)")
                let stolen = try await self.shell(
                    #"curl -sS -o /dev/null -w '%{http_code}' -u "$C:$S" -d grant_type=refresh_token --data-urlencode "refresh_token=$R" "$URL""#,
                    vault.socketPath, ["URL": provider.issuer + "/token", "C": Self.client, "S": Self.secret, "R": refreshToken]
                )
                #expect(stolen.stdout.hasPrefix("4"), "\(stolen.stdout)")
                let still = try #require(await client.call(#"{"op":"token","account":"leaky","force_refresh":true}"#))
                #expect(still["token_type"] as? String == "DPoP", "the vault's session survives: \(still)")
            }
        }
    }

    /// `dpop: required` with an issuer that does not bind (Glewlwyd with
    /// DPoP off lists no algorithms): the sign-in fails and keeps nothing;
    /// `off` keeps bearer tokens even where the issuer binds.
    @Test func requiredRefusesABearerIssuerAndOffStaysBearer() async throws {
        try await Glewlwyd.with(dpop: "off") { provider in
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                let add = #"{"op":"account.add","name":"strict","issuer":"\#(provider.issuer)","client_id":"\#(Self.client)","client_secret":"\#(Self.secret)","scopes":\#(Self.scopes),"dpop":"required"}"#
                #expect(await client.call(add)?["ok"] as? Bool == true)
                let refused = try #require(await client.call(#"{"op":"signin.start","account":"strict","method":"password","username":"ada","password":"correct horse"}"#))
                #expect(refused.errorCode == "idp_error", "\(refused)")
                #expect((refused["error"] as? [String: Any])?["error"] as? String == "dpop_unsupported", "\(refused)")
                let status = try #require(await client.call(#"{"op":"status"}"#))
                #expect((status["accounts"] as? [[String: Any]])?.first?["signed_in"] as? Bool == false)
                let bad = try #require(await client.call(#"{"op":"account.add","name":"x","issuer":"\#(provider.issuer)","client_id":"c","dpop":"sometimes"}"#))
                #expect(bad.errorCode == "bad_request", "\(bad)")
            }
        }
        try await Glewlwyd.with(dpop: "on") { provider in
            try await withVault { vault in
                let client = try LineClient(path: vault.socketPath)
                try await self.signIn(client, provider, "plain", extra: #","dpop":"off""#)
                let token = try #require(await client.call(#"{"op":"token","account":"plain","force_refresh":true}"#))
                #expect(token["token_type"] as? String == "Bearer", "\(token)")
                let proof = try #require(await client.call(#"{"op":"dpop.proof","account":"plain","htm":"GET","htu":"https://rs.example/"}"#))
                #expect(proof.errorCode == "bad_request", "\(proof)")
            }
        }
    }
}
