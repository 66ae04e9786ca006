import Foundation
import Testing
@testable import VaultDaemon
import VaultOIDC
import VaultProtocol
import VaultStore
import VaultTestKit

/// The map from failures to wire errors (WireErrors.swift): every error a
/// person can meet says what happened and what to run next, and the lower
/// layers leave the advice to it.
@Suite struct WireErrorTests {
    @Test(arguments: [
        StoreError.Kind.locked, .wrongKey, .corrupt, .foreign, .io, .unavailable, .keySource,
    ])
    func everyStoreFailureSaysWhatToDo(kind: StoreError.Kind) {
        let error = VaultError(StoreError(kind, "what happened"))
        #expect(error.message.hasPrefix("what happened; "), "\(error.message)")
        #expect(error.message.contains(": "), "names a next step: \(error.message)")
        let code: ErrorCode =
            switch kind {
            case .locked: .locked
            case .wrongKey: .invalidCredentials
            default: .internalError
            }
        #expect(error.code == code)
    }

    @Test func aLockedStoreSaysHowToUnlock() {
        #expect(VaultError(StoreError(.locked, "the vault is locked")).message == VaultError.vaultLocked.message)
    }

    /// A refusal keeps the issuer's own reason: "refused: unsupported" alone
    /// tells nobody what to do.
    @Test func aRefusalCarriesTheIssuersReasonAndTheNextStep() {
        let error = VaultError(
            ProviderError.rejected(error: "invalid_scope", description: "scope 'admin' is not allowed"),
            account: "work"
        )
        #expect(error.code == .idpError)
        #expect(error.error == "invalid_scope")
        #expect(error.errorDescription == "scope 'admin' is not allowed")
        #expect(error.message.contains("refused: invalid_scope (scope 'admin' is not allowed)"), "\(error.message)")
        #expect(error.message.contains("vaultctl signin work"), "\(error.message)")
    }

    /// A missing issuer feature says so and names the other ways in.
    @Test func aMissingFeatureNamesTheOtherWaysToSignIn() {
        let error = VaultError(
            ProviderError.rejected(error: "unsupported", description: "the issuer has no device authorization endpoint"),
            account: "dev2"
        )
        #expect(error.code == .idpError && error.error == "unsupported")
        #expect(error.message.contains("does not offer this (the issuer has no device authorization endpoint)"), "\(error.message)")
        #expect(error.message.contains("vaultctl signin dev2 with --browser, --device or --password"), "\(error.message)")
    }

    @Test func theRecurringErrorsNameTheirCommand() {
        #expect(VaultError(ProviderError.invalidGrant, account: "work") == .reauthRequired("work"))
        #expect(VaultError.reauthRequired("work").message.hasSuffix("vaultctl signin work"))
        #expect(VaultError.notSignedIn("work").message.hasSuffix("vaultctl signin work"))
        #expect(VaultError.signedOutMeanwhile("work").code == .notSignedIn)
        #expect(VaultError.unknownAccount("work").message.hasSuffix("vaultctl account list"))
        #expect(VaultError.keyringUnreachable("no session bus").message.hasSuffix("vaultctl unlock --no-passphrase"))
        let unavailable = VaultError(ProviderError.unavailable(reason: "connection refused", retryAfterSeconds: 3), account: "work")
        #expect(unavailable.code == .idpUnavailable && unavailable.retryAfterMs == 3_000)
        #expect(unavailable.message.hasSuffix("try again in 3 s"))
    }

    /// The store says what happened and nothing about vaultctl: the command
    /// line's advice is the daemon's wire layer's to add.
    @Test func storeMessagesCarryNoCommandLineAdvice() throws {
        let folder = URL(fileURLWithPath: packageRoot + "/Sources/VaultStore")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".swift") }
        #expect(!files.isEmpty)
        for file in files {
            let text = try String(contentsOf: folder.appendingPathComponent(file), encoding: .utf8)
            for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated()
            where line.contains("\"") && line.contains("vaultctl") {
                Issue.record("\(file):\(number + 1) puts command-line advice in a store error: \(line)")
            }
        }
    }

    /// Wire values that are enums in the code are enums on the wire types,
    /// and their strings are the documented ones.
    @Test func receiptsAndStatusUseTheDocumentedStrings() throws {
        let receipt = SignOutReceipt(name: "w", revoked: .unsupported, wiped: [.memory, .keyring])
        let line = String(decoding: try JSONEncoder().encode(receipt), as: UTF8.self)
        #expect(line.contains(#""revoked":"unsupported""#) && line.contains(#""wiped":["memory","keyring"]"#), "\(line)")
        let removal = try JSONDecoder().decode(
            RemovalResult.self, from: Data(#"{"account":"w","wiped":["memory","file"],"revoked":"failed"}"#.utf8))
        #expect(removal.wiped == [.memory, .file] && removal.revoked == .failed)
        #expect(Revocation(rawValue: "maybe") == nil)
        #expect(Backend.allCases.map(\.rawValue) == ["file", "keyring"])
        #expect(SecretPlace(.keyring) == .keyring)
    }
}

/// One home for each error: what vaultd answers is built in WireErrors.swift
/// (the vault), RequestErrors.swift (a request that breaks the protocol) or
/// ServerErrors.swift (the socket layer), and what a client library reports
/// in ClientErrors.swift. A `VaultError(.code, ...)` anywhere else fails here.
struct ErrorHomeTests {
    static let homes: Set<String> = [
        "Sources/VaultDaemon/WireErrors.swift", "Sources/VaultProtocol/RequestErrors.swift",
        "Sources/VaultProtocol/ErrorCode.swift", "Sources/VaultServer/ServerErrors.swift",
        "Sources/VaultClient/ClientErrors.swift",
    ]

    @Test func everyErrorIsBuiltInItsHome() throws {
        var strays: [String] = []
        for module in ["VaultDaemon", "VaultProtocol", "VaultServer", "VaultClient", "VaultStore", "VaultOIDC"] {
            let root = packageRoot + "/Sources/" + module
            let files = try #require(FileManager.default.enumerator(atPath: root)).compactMap { $0 as? String }
            for file in files where file.hasSuffix(".swift") {
                let path = "Sources/\(module)/\(file)"
                guard !Self.homes.contains(path) else { continue }
                let text = try String(contentsOfFile: packageRoot + "/" + path, encoding: .utf8)
                // A literal: `VaultError(` then, after any spaces or newlines, `.code`.
                var rest = Substring(text)
                while let found = rest.range(of: "VaultError(") {
                    let after = rest[found.upperBound...].drop { $0 == " " || $0 == "\n" }
                    if after.first == "." { strays.append(path) }
                    rest = rest[found.upperBound...]
                }
            }
        }
        #expect(strays.isEmpty, "VaultError literals outside their homes: \(Set(strays).sorted())")
    }
}
