import Foundation
import Testing
import VaultTestKit

/// Real mail clients read and send mail with tokens from the vault, against
/// Dovecot (demo/mail) checking each token at Glewlwyd, as a user's mail
/// set-up would (README: Mail).
@Suite(.timeLimit(.minutes(2)))
struct MailTests {
    /// Dovecot's IMAP and submission services on 127.0.0.1, with a sink for what is sent.
    struct MailServer: Stoppable {
        let folder: String
        let env: [String: String]

        /// With IMAP over TLS too (a fresh self-signed certificate), for NeoMutt.
        static func start(issuer: String) async throws -> MailServer {
            let folder = try temporaryFolder() + "/m"
            let started = try await runTool(packageRoot + "/demo/mail/start.sh", [folder, issuer], environment: ["MAIL_TLS": "1"])
            guard started.status == 0 else { throw ToolFailure(message: "the mail server did not start: \(started.stderr)") }
            return MailServer(folder: folder, env: try environment(in: folder + "/env"))
        }

        func stop() async {
            _ = try? await runTool(packageRoot + "/demo/mail/stop.sh", [self.folder])
        }
    }

    /// Runs a bash line as a user's mail client would run it: vaultctl on the PATH.
    func shell(_ line: String, _ env: [String: String]) async throws -> ToolResult {
        let path = productsDirectory + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        return try await runTool("/bin/bash", ["-c", line], environment: env.merging(["PATH": path]) { $1 })
    }

    @Test func mailClientsReadAndSendWithTheVaultsTokensAndFailFastWhenSignedOut() async throws {
        // Glewlwyd's access tokens live 3 s: each fetch below gets a fresh one from the vault.
        try await Glewlwyd.with { provider in
            let secret = try #require(provider.env["GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET"])
            let mail = try await MailServer.start(issuer: provider.issuer)
            try await using(DaemonProcess(folder: try temporaryFolder())) { daemon in
                #expect(await daemon.waitForLog("listening"))
                var env = mail.env
                env["TOKENVAULT_SOCKET"] = daemon.socketPath
                let added = try await runTool(
                    "vaultctl",
                    ["account", "add", "mail", "--issuer", provider.issuer, "--client-id", "confidential-app", "--client-secret",
                     "--scope", "openid", "--scope", "offline_access", "--scope", "email"],
                    input: secret + "\n", environment: env
                )
                #expect(added.status == 0, "\(added.stderr)")
                let signedIn = try await runTool("vaultctl", ["signin", "mail", "--password", "--username", "ada"], input: "correct horse\n", environment: env)
                #expect(signedIn.status == 0, "\(signedIn.stderr)")

                // curl reads the mailbox (OAUTHBEARER), twice: the second fetch's token is another, fresh one.
                let fetch = #"curl -sS --url "imap://127.0.0.1:$MAIL_IMAP_PORT/INBOX;UID=1" --user "$MAIL_USER" --oauth2-bearer "$(vaultctl token mail)""#
                for round in 1...2 {
                    let fetched = try await self.shell(fetch, env)
                    #expect(fetched.status == 0 && fetched.stdout.contains("Subject: Hello from tokenvault"), "fetch \(round): \(fetched.stderr)")
                }

                // A client that takes the SASL response itself (Python's imaplib), with vaultctl's XOAUTH2 string.
                let sasl = #"""
                    python3 -c 'import base64, imaplib, os, subprocess
                    sasl = subprocess.run(["vaultctl", "token", "mail", "--sasl", "xoauth2", "--user", os.environ["MAIL_USER"]], check=True, capture_output=True).stdout
                    imap = imaplib.IMAP4("127.0.0.1", int(os.environ["MAIL_IMAP_PORT"]))
                    imap.authenticate("XOAUTH2", lambda _: base64.b64decode(sasl))
                    imap.select("INBOX")
                    print(imap.fetch("1", "(BODY[HEADER.FIELDS (SUBJECT)])")[1][0][1].decode().strip())'
                    """#
                let imaplib = try await self.shell(sasl, env)
                #expect(imaplib.status == 0 && imaplib.stdout == "Subject: Hello from tokenvault\n", "\(imaplib.stdout) \(imaplib.stderr)")

                // NeoMutt, in a terminal, lists the mailbox over IMAPS (XOAUTH2), the token from vaultctl.
                let muttrc = mail.folder + "/neomuttrc"
                try """
                    set imap_user = "\(try #require(mail.env["MAIL_USER"]))"
                    set imap_authenticators = "xoauth2"
                    set imap_oauth_refresh_command = "vaultctl token mail"
                    set folder = "imaps://127.0.0.1:\(try #require(mail.env["MAIL_IMAPS_PORT"]))/"
                    set spoolfile = "+INBOX"
                    set certificate_file = "\(try #require(mail.env["MAIL_TLS_CERT"]))"
                    set ssl_force_tls = yes
                    set header_cache = ""
                    set message_cachedir = ""
                    set mail_check_stats = no

                    """.write(toFile: muttrc, atomically: true, encoding: .utf8)
                try await using(VaultctlSignInTests.Terminal()) { terminal in
                    let path = productsDirectory + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
                    let command = "env TOKENVAULT_SOCKET=\(daemon.socketPath) PATH=\(path) HOME=\(mail.folder) neomutt -n -F \(muttrc)"
                    let started = try await terminal.tmux(["new-session", "-d", "-s", "s", "-x", "120", "-y", "30", command])
                    #expect(started.status == 0, "\(started.stderr)")
                    let screen = try await terminal.waitFor("Hello from tokenvault")
                    #expect(screen.contains("Hello from tokenvault"), "\(screen)")
                }

                // msmtp sends through submission (XOAUTH2), its password a vaultctl call.
                let rc = mail.folder + "/msmtprc"
                try """
                    account default
                    host 127.0.0.1
                    port \(try #require(mail.env["MAIL_SUBMISSION_PORT"]))
                    tls off
                    auth xoauth2
                    user \(try #require(mail.env["MAIL_USER"]))
                    from \(try #require(mail.env["MAIL_USER"]))
                    passwordeval "vaultctl token mail"

                    """.write(toFile: rc, atomically: true, encoding: .utf8)
                chmod(rc, 0o600)
                let send = #"printf 'Subject: from msmtp\n\nhello\n' | msmtp -C "$RC" "$MAIL_USER""#
                let sent = try await self.shell(send, env.merging(["RC": rc]) { $1 })
                #expect(sent.status == 0, "\(sent.stderr)")
                let sink = try #require(mail.env["MAIL_SINK"])
                let messages = try FileManager.default.contentsOfDirectory(atPath: sink).filter { $0.hasSuffix(".eml") }
                #expect(messages.count == 1, "\(messages)")
                if let message = messages.first {
                    #expect(try String(contentsOfFile: sink + "/" + message, encoding: .utf8).contains("Subject: from msmtp"))
                }

                // Signed out: every client fails at once with vaultctl's exit code, never a prompt or a hang.
                #expect(try await runTool("vaultctl", ["signout", "mail"], environment: env).status == 0)
                let token = try await runTool("vaultctl", ["token", "mail"], environment: env)
                #expect(token.status == 67 && token.stdout.isEmpty, "\(token.status) \(token.stderr)")
                let refused = try await self.shell(#"token=$(vaultctl token mail) || exit $?; curl -sS --url "imap://127.0.0.1:$MAIL_IMAP_PORT/INBOX" --user "$MAIL_USER" --oauth2-bearer "$token""#, env)
                #expect(refused.status == 67, "\(refused.status) \(refused.stderr)")
                let unsent = try await self.shell(send, env.merging(["RC": rc]) { $1 })
                #expect(unsent.status != 0, "msmtp sends nothing without a token")
                #expect(try FileManager.default.contentsOfDirectory(atPath: sink).filter { $0.hasSuffix(".eml") }.count == 1)
            }
            await mail.stop()
        }
    }
}
