public import ArgumentParser
import VaultClient
import VaultProtocol

struct SignOut: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "signout",
        abstract: "Sign out: revoke the refresh token and wipe every copy of the tokens.",
        discussion: """
            Revokes the refresh token at the issuer where it offers revocation, removes the \
            account's tokens from memory, the vault file and the keyring, and tells every \
            subscribed program to drop its copies. The account stays, ready to sign in again; \
            a revocation that fails still wipes every local copy, and says so.

            Where the issuer has a sign-out page (end_session_endpoint), vaultctl opens it in \
            the browser when there is a display, to end the issuer's browser session too. Its \
            address carries the account's ID token, so it is printed only with \
            --print-end-session-url (and is in the --json receipt).
            """
    )

    @OptionGroup var connection: Connection

    @Argument(help: "The account to sign out.")
    var account: String?

    @Flag(help: "Sign out of every account.")
    var all = false

    @Flag(help: "Do not open the issuer's sign-out page in the browser.")
    var noOpen = false

    @Flag(name: .customLong("print-end-session-url"), help: "Print the issuer's sign-out address, which carries the ID token.")
    var printEndSessionURL = false

    func validate() throws {
        guard (self.account != nil) != self.all else {
            throw ValidationError("name one account, or give --all")
        }
    }

    func run() throws {
        let target: SignOutTarget = self.account.map { .account($0) } ?? .all
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.signout(target))
            if self.connection.json { return self.connection.printJSON(reply) }
            let result = try Output.field(SignOutResult.self, of: reply)
            if result.accounts.isEmpty { Output.line("no accounts to sign out of") }
            for receipt in result.accounts {
                Output.line("signed out of \(receipt.name): \(Self.revocation(receipt)); wiped from \(receipt.wiped.map(\.rawValue).joined(separator: ", "))")
                switch receipt.accessTokensRevoked {
                case 0: break
                case 1: Output.line("  the access token handed out was revoked too")
                case let count: Output.line("  the \(count) access tokens handed out were revoked too")
                }
                if let url = receipt.endSessionURL { self.endSession(url) }
            }
            let programs = result.notified == 1 ? "1 subscribed program was" : "\(result.notified) subscribed programs were"
            Output.line("\(programs) told")
        }
    }

    /// The issuer's sign-out page: printed when asked for, else opened in
    /// the browser when there is one; never printed unasked, as it carries
    /// the ID token.
    private func endSession(_ url: String) {
        if self.printEndSessionURL {
            Output.line("  to end the issuer's browser session too, open: \(url)")
        } else if !self.noOpen, BrowserPage.open(url, removedAfter: 60) != nil {
            Output.line("  opened the issuer's sign-out page in the browser, to end its browser session too")
        } else {
            Output.line("  the issuer's browser session may still be open; to end it, sign out at the issuer (or next time use --print-end-session-url)")
        }
    }

    private static func revocation(_ receipt: SignOutReceipt) -> String {
        switch receipt.revoked {
        case .yes: "refresh token revoked at the issuer"
        case .no: "was not signed in"
        case .unsupported: "the issuer offers no revocation; the refresh token lives until it expires"
        case .failed: "revocation failed (\(receipt.reason ?? "no reason given")); the refresh token may live until it expires"
        }
    }
}

struct Migrate: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Move every account's secrets to another backend.",
        discussion: """
            Each account's secrets are written to the target, read back, and only then removed \
            from the source, so no token is ever in neither. vaultd uses the target from then on.
            """
    )

    @OptionGroup var connection: Connection

    @Option(help: "Where the secrets go: file or keyring.")
    var to: Backend

    func run() throws {
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.migrate(to: self.to))
            if self.connection.json { return self.connection.printJSON(reply) }
            let result = try Output.field(MigrationResult.self, of: reply)
            if result.from == result.to {
                Output.line("the secrets are already in the \(result.to.rawValue) backend")
            } else {
                let count = result.moved.count == 1 ? "1 account" : "\(result.moved.count) accounts"
                Output.line("moved \(count) from \(result.from.rawValue) to \(result.to.rawValue)")
            }
        }
    }
}
/// `vaultctl migrate --to file|keyring`.
extension Backend: ExpressibleByArgument {}
