import ArgumentParser
import FoundationEssentials
import VaultClient
import VaultCrypto
import VaultJSON
import VaultProtocol

struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token",
        abstract: "Print an access token for an account, and nothing else.",
        discussion: "For scripts: curl -H \"Authorization: Bearer $(vaultctl token work)\" ..."
    )

    @OptionGroup var connection: Connection

    @OptionGroup var ask: TokenAsk

    @Flag(help: "Refresh even when the cached token would do.")
    var forceRefresh = false

    @Flag(help: "Print 'Authorization: Bearer TOKEN' instead of the bare token.")
    var header = false

    @Option(help: "Print the SASL initial response for MECHANISM (xoauth2 or oauthbearer), base64, as mail clients take it; with --user.")
    var sasl: SASLMechanism?

    @Option(help: "The mail address the SASL response names.")
    var user: String?

    func validate() throws {
        switch (self.sasl, self.user) {
        case (nil, nil): break
        case (nil, .some): throw ValidationError("--user names the address of a SASL response: add --sasl xoauth2 or --sasl oauthbearer")
        case (.some, nil): throw ValidationError("--sasl needs --user ADDRESS, the mail account the token is for")
        case (.some, .some(let user)):
            guard SASLMechanism.isWritable(user) else { throw ValidationError("--user must be a mail address without control characters") }
            guard !self.header, !self.connection.json else { throw ValidationError("--sasl prints the SASL response only: leave out --header and --json") }
        }
    }

    func run() throws {
        try TokenJob(
            socket: self.connection.socket,
            json: self.connection.json,
            account: self.ask.account,
            scopes: self.ask.scopes,
            minTTL: self.ask.minTTL,
            forceRefresh: self.forceRefresh,
            header: self.header,
            sasl: self.sasl.map { ($0, self.user ?? "") }
        ).run()
    }
}

/// What `vaultctl token` does once its arguments are parsed, by
/// ArgumentParser or by `QuickStart`.
struct TokenJob {
    var socket: String?
    var json = false
    var account: String
    var scopes: [String] = []
    var minTTL = TokenRequest.defaultMinTTL
    var forceRefresh = false
    var header = false
    /// Print this SASL mechanism's initial response for the address, not the token.
    var sasl: (mechanism: SASLMechanism, user: String)?

    func run() throws {
        let request = TokenRequest(
            account: self.account,
            scopes: self.scopes.isEmpty ? nil : self.scopes,
            minTTL: self.minTTL,
            forceRefresh: self.forceRefresh
        )
        try Connection.run(socket: self.socket) { (vault) throws(VaultError) in
            let reply = try vault.send(.token(request))
            if self.json { return Output.verbatim(String(decoding: reply, as: UTF8.self)) }
            if let sasl = self.sasl {
                let result = try Output.field(TokenResult.self, of: reply)
                guard result.tokenType == "Bearer", let response = sasl.mechanism.initialResponse(user: sasl.user, token: result.accessToken.unsafeString())
                else { throw VaultError(.badRequest, "a \(result.tokenType) token cannot go in a SASL bearer response") }
                return Output.verbatim(response)
            }
            if self.header {
                // A DPoP-bound token goes only with a proof for its one request.
                let result = try Output.field(TokenResult.self, of: reply).bearer(self.account)
                return Output.verbatim("Authorization: Bearer " + result.accessToken.unsafeString())
            }
            var token = LineCodec.plainAccessToken(of: reply)
            if token == nil { token = try Output.field(TokenResult.self, of: reply).accessToken.unsafeString() }
            Output.verbatim(token ?? "")
        }
    }
}

struct Import: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Add an account with a refresh token you already have.",
        discussion: """
            The refresh token is read from the terminal (no echo) or the first line of stdin, never \
            from the command line; with --client-secret the secret follows on the next line.
            """
    )

    @OptionGroup var connection: Connection
    @OptionGroup var account: AccountOptions

    func validate() throws {
        guard self.account.clientID != nil else { throw ValidationError("import needs --client-id: the refresh token belongs to that client") }
    }

    func run() throws {
        let refreshToken = try Prompt.secret("refresh token: ")
        let secret = self.account.clientSecret ? try Prompt.secret("client secret: ") : nil
        try self.connection.run { (vault) throws(VaultError) in
            let addition = AccountAddition(
                configuration: self.account.configuration,
                clientSecret: secret,
                refreshToken: refreshToken
            )
            let reply = try vault.send(.accountAdd(addition))
            if self.connection.json { return self.connection.printJSON(reply) }
            Output.line("imported \(self.account.name) (\(self.account.issuer)); try: vaultctl token \(self.account.name)")
        }
    }
}

struct Claims: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "claims", abstract: "Show the claims of the account's validated ID token.")

    @OptionGroup var connection: Connection

    @Argument(help: "The account.")
    var account: String

    func run() throws {
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.claims(account: self.account))
            if self.connection.json { return self.connection.printJSON(reply) }
            Output.json(try Output.field(ClaimsResult.self, of: reply).claims)
        }
    }
}

struct Userinfo: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "userinfo", abstract: "Fetch the issuer's userinfo for the account.")

    @OptionGroup var connection: Connection

    @Argument(help: "The account.")
    var account: String

    func run() throws {
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.userinfo(account: self.account))
            if self.connection.json { return self.connection.printJSON(reply) }
            Output.json(try Output.field(UserinfoResult.self, of: reply).userinfo)
        }
    }
}

extension Output {
    static func field<P: ResultPayload>(_ type: P.Type, of reply: Data) throws(VaultError) -> P {
        do {
            return try LineCodec.payload(P.self, of: reply)
        } catch {
            throw VaultError.unreadableReply
        }
    }

    /// One `key: value` line per top-level field, for people.
    static func json(_ value: JSONValue) {
        guard case .object(let object) = value else { return }
        for key in object.keys.sorted() {
            guard let field = object[key] else { continue }
            let text: String
            if case .string(let string) = field {
                text = string
            } else {
                text = (try? LineCodec.json(field)).map { String(decoding: $0, as: UTF8.self) } ?? ""
            }
            Output.line("\(key): \(text)")
        }
    }
}

struct DPoP: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dpop",
        abstract: "Print the Authorization and DPoP headers for one request to a resource server.",
        discussion: """
            For an account whose tokens are bound to the vault's key (DPoP). The proof names METHOD and \
            URL (without its query) and holds for this one request:
              curl -H @<(vaultctl dpop work GET "$url") "$url"
            """
    )

    @OptionGroup var connection: Connection

    @OptionGroup var ask: TokenAsk

    @Argument(help: "The request's HTTP method, like GET or POST.")
    var method: String

    @Argument(help: "The request's absolute URL.")
    var url: String

    func validate() throws {
        guard DPoPTarget(method: self.method, url: self.url) != nil else {
            throw ValidationError("METHOD is an HTTP method like GET, and URL an absolute http or https URL")
        }
    }

    func run() throws {
        guard let target = DPoPTarget(method: self.method, url: self.url) else { return }
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.dpopProof(DPoPProofRequest(token: self.ask.request, target: target)))
            if self.connection.json { return self.connection.printJSON(reply) }
            let result = try Output.field(DPoPProofResult.self, of: reply)
            Output.verbatim("Authorization: \(result.authorization)\nDPoP: \(result.proof)")
        }
    }
}

/// The account and what its token must be, as `token`, `dpop` and `exec-credential` take them.
struct TokenAsk: ParsableArguments {
    @Argument(help: "The account.")
    var account: String

    @Option(name: .customLong("scope"), help: "A scope to ask for (default: the account's); repeat for more.")
    var scopes: [String] = []

    @Option(help: "Refresh unless the token lives at least this many more seconds.")
    var minTTL: Int = TokenRequest.defaultMinTTL

    func validate() throws {
        guard TokenRequest.minTTLRange.contains(self.minTTL) else { throw ValidationError("--min-ttl is 0 to 86400 seconds") }
    }

    var request: TokenRequest {
        TokenRequest(account: self.account, scopes: self.scopes.isEmpty ? nil : self.scopes, minTTL: self.minTTL)
    }
}
