import ArgumentParser
import FoundationEssentials
import Glibc
import VaultClient
import VaultCrypto
import VaultProtocol

/// A Kubernetes client-go exec credential plugin: kubectl runs it and reads
/// one `ExecCredential` object from stdout.
struct ExecCredential: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exec-credential",
        abstract: "Print a Kubernetes ExecCredential with an access token, for kubectl.",
        discussion: """
            In a kubeconfig user:
              exec:
                apiVersion: client.authentication.k8s.io/v1
                command: vaultctl
                args: [exec-credential, work]
                interactiveMode: Never
            The apiVersion answered is the one in $KUBERNETES_EXEC_INFO, else \
            client.authentication.k8s.io/v1. Errors are one line on stderr and nothing on stdout.
            """
    )

    @OptionGroup var connection: Connection

    @OptionGroup var ask: TokenAsk

    static let defaultAPIVersion = "client.authentication.k8s.io/v1"

    /// The apiVersion kubectl asked for, when it is one of client-go's.
    static func apiVersion(fromExecInfo info: String?) -> String {
        struct Info: Decodable { var apiVersion: String? }
        guard let info, let decoded = try? JSONDecoder().decode(Info.self, from: Data(info.utf8)),
            let version = decoded.apiVersion, version.hasPrefix("client.authentication.k8s.io/"),
            version.utf8.count <= 64
        else { return Self.defaultAPIVersion }
        return version
    }

    /// RFC 3339 in UTC, whole seconds: 2026-11-24T05:12:19Z.
    static func rfc3339(_ seconds: Int64) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%SZ", &parts)
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    func run() throws {
        try ExecCredentialJob(socket: self.connection.socket, account: self.ask.account, scopes: self.ask.scopes, minTTL: self.ask.minTTL).run()
    }
}

/// What `vaultctl exec-credential` does once its arguments are parsed, by
/// ArgumentParser or by `QuickStart`. (`--json` changes nothing: the output is JSON.)
struct ExecCredentialJob {
    var socket: String?
    var account: String
    var scopes: [String] = []
    var minTTL = TokenRequest.defaultMinTTL

    func run() throws {
        let request = TokenRequest(account: self.account, scopes: self.scopes.isEmpty ? nil : self.scopes, minTTL: self.minTTL)
        let apiVersion = ExecCredential.apiVersion(fromExecInfo: getenv("KUBERNETES_EXEC_INFO").map { String(cString: $0) })
        try Connection.run(socket: self.socket) { (vault) throws(VaultError) in
            let token = try Output.field(TokenResult.self, of: try vault.send(.token(request))).bearer(self.account)
            struct Credential: Encodable {
                struct Status: Encodable {
                    var token: String
                    var expirationTimestamp: String
                }
                var apiVersion: String
                var kind = "ExecCredential"
                var status: Status
            }
            let credential = Credential(
                apiVersion: apiVersion,
                status: .init(token: token.accessToken.unsafeString(), expirationTimestamp: ExecCredential.rfc3339(token.expiresAt))
            )
            guard let bytes = try? LineCodec.json(credential) else {
                throw VaultError(.internalError, "could not encode the ExecCredential")
            }
            Output.line(String(decoding: bytes, as: UTF8.self))
        }
    }
}
