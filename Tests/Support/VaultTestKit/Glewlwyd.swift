import Foundation

/// Glewlwyd, a third-party OpenID provider, started on 127.0.0.1 from
/// demo/glewlwyd with a fresh database for one test.
package struct Glewlwyd {
    package let folder: String
    package let env: [String: String]
    package var issuer: String { self.env["GLEWLWYD_ISSUER"] ?? "" }

    /// `dpop`: `off`, `on`, or `nonce:N` (demo/glewlwyd/start.sh's `GLEWLWYD_DPOP`);
    /// `registration`: `off`, `open` or `token` (`GLEWLWYD_REGISTRATION`);
    /// `par`: `off`, `on` or `required` (`GLEWLWYD_PAR`).
    package static func start(
        accessTokenSeconds: Int = 3,
        dpop: String = "off",
        registration: String = "off",
        par: String = "off"
    ) async throws -> Glewlwyd {
        let folder = try temporaryFolder()
        let started = try await runTool(
            packageRoot + "/demo/glewlwyd/start.sh",
            [folder],
            environment: [
                "GLEWLWYD_ACCESS_TOKEN_SECONDS": String(accessTokenSeconds), "GLEWLWYD_DPOP": dpop,
                "GLEWLWYD_REGISTRATION": registration, "GLEWLWYD_PAR": par,
            ]
        )
        guard started.status == 0 else { throw ToolFailure(message: "glewlwyd did not start: \(started.stderr)") }
        return Glewlwyd(folder: folder, env: try environment(in: folder + "/env"))
    }

    package func stop() async {
        _ = try? await runTool(packageRoot + "/demo/glewlwyd/stop.sh", [self.folder])
    }

    /// Runs `body` with a fresh provider and stops it afterwards, whatever happens.
    package static func with(
        accessTokenSeconds: Int = 3,
        dpop: String = "off",
        registration: String = "off",
        par: String = "off",
        _ body: (Glewlwyd) async throws -> Void
    ) async throws {
        let provider = try await Glewlwyd.start(accessTokenSeconds: accessTokenSeconds, dpop: dpop, registration: registration, par: par)
        do {
            try await body(provider)
        } catch {
            await provider.stop()
            throw error
        }
        await provider.stop()
    }

    /// Signs `ada` in headlessly and returns the token response.
    package func login(client: String, secret: String? = nil, grant: String = "code") async throws -> [String: Any] {
        var arguments = [
            "--issuer", self.issuer, "--client-id", client, "--grant", grant,
            "--username", "ada", "--password", "correct horse",
            "--scope", "openid offline_access profile email",
        ]
        if let secret { arguments += ["--client-secret", secret] }
        let result = try await runTool(packageRoot + "/demo/glewlwyd/login.py", arguments)
        guard result.status == 0,
            let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
        else { throw ToolFailure(message: "login failed: \(result.stderr)") }
        return object
    }

    /// Plays the user in a browser at `url` (demo/glewlwyd/browser.py):
    /// signs in, consents, and follows the redirect unless `--no-visit`.
    package func browse(_ url: String, _ extra: [String] = []) async throws -> [String: Any] {
        let result = try await runTool(packageRoot + "/demo/glewlwyd/browser.py", ["--issuer", self.issuer, "--url", url] + extra)
        guard result.status == 0, let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
        else { throw ToolFailure(message: "the browser did not get through: \(result.stderr)") }
        return object
    }

    /// The authorization code the provider redirects to for `url`, the
    /// redirect itself not visited.
    package func authorizationCode(for url: String) async throws -> String {
        let location = try await self.browse(url, ["--no-visit"])["location"] as? String ?? ""
        guard let code = URLComponents(string: location)?.queryItems?.first(where: { $0.name == "code" })?.value else {
            throw ToolFailure(message: "no code in the redirect: \(location)")
        }
        return code
    }

    /// A fresh initial access token for registration (`registration: token`).
    package func initialAccessToken() async throws -> String {
        let result = try await runTool(packageRoot + "/demo/glewlwyd/initial-token.py", [self.folder])
        guard result.status == 0 else { throw ToolFailure(message: "no initial access token: \(result.stderr)") }
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// The provider's clients, from its database: id and whether enabled.
    package func clients() async throws -> [String: Bool] {
        let result = try await runTool("/usr/bin/sqlite3", [self.folder + "/glewlwyd.db", "SELECT gc_client_id, gc_enabled FROM g_client;"])
        guard result.status == 0 else { throw ToolFailure(message: "sqlite3: \(result.stderr)") }
        var clients: [String: Bool] = [:]
        for line in result.stdout.split(separator: "\n") {
            let parts = line.split(separator: "|")
            if parts.count == 2 { clients[String(parts[0])] = parts[1] == "1" }
        }
        return clients
    }

    /// The hashes the provider keeps of the registration access tokens it
    /// gave (`{SHA512}` and base64 of SHA-512; RFC 7592).
    package func registrationTokenHashes() async throws -> [String] {
        let result = try await runTool(
            "/usr/bin/sqlite3", [self.folder + "/glewlwyd.db", "SELECT gpocr_management_at_hash FROM gpo_client_registration;"]
        )
        guard result.status == 0 else { throw ToolFailure(message: "sqlite3: \(result.stderr)") }
        return result.stdout.split(separator: "\n").map(String.init).filter { !$0.isEmpty }
    }

    /// Revokes a token at the provider (RFC 7009).
    package func revoke(_ token: String, client: String, secret: String) async throws {
        let result = try await runTool(
            packageRoot + "/demo/glewlwyd/introspect.py",
            ["--issuer", self.issuer, "--client-id", client, "--client-secret", secret, "--revoke"],
            input: token
        )
        guard result.status == 0 else { throw ToolFailure(message: "revoke failed: \(result.stderr)") }
    }
}

/// The `KEY='VALUE'` lines a test server's start script writes (demo/glewlwyd,
/// demo/mail, Tests/Support/notify), by key.
package func environment(in file: String) throws -> [String: String] {
    var env: [String: String] = [:]
    for line in try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n") {
        guard let equals = line.firstIndex(of: "=") else { continue }
        env[String(line[..<equals])] = String(line[line.index(after: equals)...]).trimmingCharacters(in: CharacterSet(charactersIn: "'"))
    }
    return env
}
