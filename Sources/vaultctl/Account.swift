import ArgumentParser
import FoundationEssentials
import VaultClient
import VaultCrypto
import VaultProtocol

struct Account: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "account",
        abstract: "Add, list and remove accounts.",
        subcommands: [Add.self, List.self, Remove.self]
    )

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "add",
            abstract: "Add an account: an issuer and the client that signs in to it.",
            discussion: """
                Without --client-id, vaultd registers a client for the account at the issuer (RFC 7591), \
                when its discovery offers registration, and deletes it again with the account. \
                Secrets never go on the command line: --client-secret and --registration-token read \
                theirs from the terminal or stdin.
                """
        )

        @OptionGroup var connection: Connection

        @OptionGroup var account: AccountOptions

        @Flag(help: "Without --client-id: read the initial access token the issuer asks before it registers a client, from the terminal (no echo) or stdin.")
        var registrationToken = false

        func validate() throws {
            if self.registrationToken, self.account.clientID != nil {
                throw ValidationError("--registration-token is for registering a client; with --client-id nothing is registered")
            }
        }

        func run() throws {
            let secret = self.account.clientSecret ? try Prompt.secret("client secret: ") : nil
            let token = self.registrationToken ? try Prompt.secret("initial access token: ") : nil
            try self.connection.run { (vault) throws(VaultError) in
                let addition = AccountAddition(configuration: self.account.configuration, clientSecret: secret, registrationToken: token)
                let reply = try vault.send(.accountAdd(addition))
                if self.connection.json { return self.connection.printJSON(reply) }
                let added = try Output.field(AccountResult.self, of: reply)
                if added.account.registration == .dynamic {
                    Output.line("added \(added.account.name) (\(added.account.issuer)) with client \(added.account.clientID), registered at the issuer; sign in with: vaultctl signin \(added.account.name)")
                } else {
                    Output.line("added \(added.account.name) (\(added.account.issuer))")
                }
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "list", abstract: "List the accounts, one per line.")

        @OptionGroup var connection: Connection

        func run() throws {
            try self.connection.run { (vault) throws(VaultError) in
                let reply = try vault.send(.status)
                let status = try Output.field(StatusResult.self, of: reply)
                if self.connection.json {
                    let names = (try? LineCodec.json(status.accounts.map(\.name))) ?? Data("[]".utf8)
                    return Output.verbatim(String(decoding: names, as: UTF8.self))
                }
                for account in status.accounts { Output.line(account.name) }
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "remove", abstract: "Sign an account out and forget it.")

        @OptionGroup var connection: Connection

        @Argument(help: "The account to remove.")
        var name: String

        func run() throws {
            try self.connection.run { (vault) throws(VaultError) in
                let reply = try vault.send(.accountRemove(name: self.name))
                if self.connection.json { return self.connection.printJSON(reply) }
                let removal = try Output.field(RemovalResult.self, of: reply)
                let revoked = removal.revoked == .yes ? "; refresh token revoked at the issuer" : ""
                let registration = removal.registrationDeleted == true ? "; its client's registration deleted at the issuer" : ""
                Output.line("removed \(removal.account); secrets wiped from: \(removal.wiped.map(\.rawValue).joined(separator: ", "))\(revoked)\(registration)")
                if let left = removal.registrationLeft { Output.note("but \(left)") }
            }
        }
    }
}

/// The options that describe an account, shared by `account add` and `import`.
struct AccountOptions: ParsableArguments {
    @Argument(help: "A short name for the account, like 'work'.")
    var name: String

    @Option(help: "The issuer URL (https, or http on loopback).")
    var issuer: String

    @Option(help: "The OAuth client id (account add without it: a client registered at the issuer).")
    var clientID: String?

    @Option(name: .customLong("scope"), help: "A scope to ask for; repeat for more.")
    var scopes: [String] = ["openid", "offline_access"]

    @Flag(help: "Also read a client secret from the terminal (no echo) or stdin.")
    var clientSecret = false

    @Option(name: .customLong("allowed-client"), help: "An executable that may use this account; repeat for more.")
    var allowedClients: [String] = []

    @Flag(help: "Let allowed clients fetch the refresh token itself.")
    var releaseRefreshToken = false

    @Option(help: "A fixed loopback redirect URI, for issuers that match the port exactly.")
    var redirectURI: String?

    @Option(help: ArgumentHelp("Refresh a token in use after this share of its lifetime (10-100).", valueName: "percent"))
    var refreshAhead = AccountConfiguration.defaultRefreshAhead

    @Option(help: ArgumentHelp("Bind tokens to a key of the vault (DPoP): auto, required or off.", valueName: "mode"))
    var dpop = DPoPMode.auto.rawValue

    func validate() throws {
        guard DPoPMode(rawValue: self.dpop) != nil else { throw ValidationError("--dpop is auto, required or off") }
    }

    var configuration: AccountConfiguration {
        AccountConfiguration(
            name: self.name,
            issuer: self.issuer,
            clientID: self.clientID ?? "",
            scopes: self.scopes,
            allowedClients: self.allowedClients,
            releaseRefreshToken: self.releaseRefreshToken,
            redirectURI: self.redirectURI,
            refreshAhead: self.refreshAhead,
            dpop: DPoPMode(rawValue: self.dpop) ?? .auto
        )
    }
}

