import ArgumentParser
import FoundationEssentials
import Glibc
import VaultClient
import VaultProtocol

struct Share: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "share",
        abstract: "Serve some accounts' tokens on another socket: for a container, or a host you ssh into.",
        discussion: """
            The share's socket serves only hello, status, token and subscribe, for the named accounts \
            (within the named scopes), and DPoP proofs with --dpop; everything else is refused. It prints \
            the share's id.
              vaultctl share work --socket ~/.cache/tv-share.sock --ttl 3600
              ssh -R /run/user/1000/tokenvault/vaultd.sock:$HOME/.cache/tv-share.sock host
              docker run -v ~/.cache/tv-share.sock:/run/tokenvault.sock -e TOKENVAULT_SOCKET=/run/tokenvault.sock ...
            vaultd is found through $VAULTCTL_SOCKET, $TOKENVAULT_SOCKET or the XDG default.
            """
    )

    @Argument(help: "The accounts to share.")
    var accounts: [String] = []

    @Option(help: ArgumentHelp("Where the share's socket goes (its folder must be yours and private).", valueName: "path"))
    var socket: String?

    @Option(help: ArgumentHelp("End the share after this many seconds (default: when vaultd stops).", valueName: "seconds"))
    var ttl: Int?

    @Option(name: .customLong("scope"), help: "A scope tokens through the share may carry; repeat for more (default: the accounts').")
    var scopes: [String] = []

    @Flag(help: "Also make DPoP proofs for the shared accounts (dpop.proof, dpop.nonce).")
    var dpop = false

    @Flag(help: "List the shares instead.")
    var list = false

    @Flag(help: "Print the daemon's JSON reply instead of text.")
    var json = false

    func validate() throws {
        if self.list {
            guard self.accounts.isEmpty, self.socket == nil, self.ttl == nil, self.scopes.isEmpty, !self.dpop else {
                throw ValidationError("--list takes no accounts or other options")
            }
            return
        }
        guard !self.accounts.isEmpty else { throw ValidationError("name at least one account to share") }
        guard self.socket != nil else { throw ValidationError("--socket PATH: where the share's socket goes") }
        if let ttl = self.ttl, !(1...ShareOpen.maximumTTL).contains(ttl) {
            throw ValidationError("--ttl is 1 to \(ShareOpen.maximumTTL) seconds")
        }
    }

    func run() throws {
        try Connection.run(socket: nil) { (vault) throws(VaultError) in
            if self.list {
                let reply = try vault.send(.shareList)
                if self.json { return Output.verbatim(String(decoding: reply, as: UTF8.self)) }
                for share in try Output.field(ShareListResult.self, of: reply).shares {
                    let until = share.expiresAt.map { "until \(ExecCredential.rfc3339($0))" } ?? "until vaultd stops"
                    Output.line("\(share.share)  \(share.socket)  \(share.accounts.joined(separator: ","))  \(until)")
                }
                return
            }
            let open = ShareOpen(
                accounts: self.accounts,
                socket: Self.absolute(self.socket ?? ""),
                ttl: self.ttl,
                scopes: self.scopes.isEmpty ? nil : self.scopes,
                dpop: self.dpop
            )
            let reply = try vault.send(.shareOpen(open))
            if self.json { return Output.verbatim(String(decoding: reply, as: UTF8.self)) }
            Output.line(try Output.field(ShareResult.self, of: reply).share)
        }
    }

    /// vaultd runs elsewhere: a relative path is made absolute here.
    static func absolute(_ path: String) -> String {
        guard !path.hasPrefix("/") else { return path }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard getcwd(&buffer, buffer.count) != nil else { return path }
        let directory = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return directory == "/" ? "/" + path : directory + "/" + path
    }
}

struct Unshare: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unshare",
        abstract: "End a share: its socket is removed and its connections closed."
    )

    @OptionGroup var connection: Connection

    @Argument(help: "The share's id (from vaultctl share --list) or its socket path.")
    var share: String

    func run() throws {
        let target: ShareTarget = self.share.hasPrefix("s-") && !self.share.contains("/") ? .id(self.share) : .socket(Share.absolute(self.share))
        try self.connection.run { (vault) throws(VaultError) in
            let reply = try vault.send(.shareClose(target))
            if self.connection.json { return self.connection.printJSON(reply) }
            Output.note("share ended: \(self.share)")
        }
    }
}
