// libFuzzer entry point for the sealed vault file: the parser of its layout
// (`VaultFile.parse`) and the codec of a record's plaintext
// (`AccountSecrets(decoding:)`). Every input goes to both; each must throw
// or succeed, never crash.
//
// - A file that parses serializes again (with a fresh check box), to as many
//   bytes, and that parses to the same file; serializing is a fixed point but
//   for the check box, whose nonce is new each time. Every record opens under
//   its own name, and its plaintext goes through the record codec too.
// - A plaintext that decodes encodes, and that decodes to the same secrets;
//   encoding is a fixed point (fields of unknown tags are dropped, a repeated
//   tag keeps its last value, so the first encoding may differ from the input).
//
// Every key kind is answered with one fixed 32-byte key (no Argon2id: a
// passphrase header's parameters are checked, not used), so seeds sealed with
// that key open, and mutations of them reach the records. To write the seeds
// of Fuzz/corpus/vaultfile/ again:
//
//     TOKENVAULT_FUZZ_WRITE_SEEDS=Fuzz/corpus/vaultfile .build-fuzz/fuzz-vaultfile
//
// Built and run by scripts/fuzz.sh.

import Glibc
import VaultCrypto
@testable import VaultStore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzVaultFile(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    checkFile(bytes)
    if let plaintext = try? SecretBytes(copying: bytes) { checkRecord(plaintext) }
    return 0
}

@_cdecl("LLVMFuzzerInitialize")
public func fuzzVaultFileInitialize(_ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>) -> CInt {
    if let folder = getenv("TOKENVAULT_FUZZ_WRITE_SEEDS") {
        writeSeeds(to: String(cString: folder))
        exit(0)
    }
    return 0
}

/// Stops the process with a message libFuzzer reports as a crash.
func fail(_ message: String) -> Never {
    fatalError("fuzz property failed: \(message)")
}

let fixedKey: SecretBytes = {
    do {
        return try SecretBytes(copying: (0..<UInt8(AEAD.keyBytes)).map { $0 &* 7 &+ 1 })
    } catch {
        fail("no guarded memory for the key")
    }
}()

/// Where the check box sits: after the fixed-size header.
let checkRange = 47..<(47 + AEAD.overhead)

func parse(_ bytes: [UInt8]) throws(StoreError) -> VaultFile {
    try VaultFile.parse(bytes) { _, _ throws(StoreError) in fixedKey }.0
}

func serialize(_ file: VaultFile) -> [UInt8] {
    do {
        return try file.serialized(key: fixedKey)
    } catch {
        fail("a parsed file does not serialize: \(error)")
    }
}

func checkFile(_ bytes: [UInt8]) {
    let file: VaultFile
    do {
        file = try parse(bytes)
    } catch {
        return
    }
    let first = serialize(file)
    guard first.count == bytes.count else { fail("serializing changed the size from \(bytes.count) to \(first.count)") }
    let again: VaultFile
    do {
        again = try parse(first)
    } catch {
        fail("a serialized file does not parse: \(error)")
    }
    guard again == file else { fail("a serialized file parses to another file") }
    var second = serialize(again)
    var masked = first
    second.replaceSubrange(checkRange, with: repeatElement(0, count: checkRange.count))
    masked.replaceSubrange(checkRange, with: repeatElement(0, count: checkRange.count))
    guard second == masked else { fail("serializing is not a fixed point") }
    for (name, box) in file.records {
        guard let plaintext = try? AEAD.open(box, key: fixedKey, associatedData: Array(name.utf8)) else {
            fail("a record of a parsed file does not open")
        }
        checkRecord(plaintext)
    }
}

func checkRecord(_ plaintext: SecretBytes) {
    let secrets: AccountSecrets
    do {
        secrets = try AccountSecrets(decoding: plaintext)
    } catch {
        return
    }
    do {
        let first = try secrets.encoded()
        let again = try AccountSecrets(decoding: first)
        guard again == secrets else { fail("a re-encoded record decodes to other secrets") }
        guard try again.encoded() == first else { fail("encoding a record is not a fixed point") }
    } catch {
        fail("a decoded record does not round-trip: \(error)")
    }
}

// MARK: Seeds

func writeSeeds(to folder: String) {
    do {
        func secret(_ text: String) throws -> SecretBytes { try SecretBytes(utf8: text) }
        let work = AccountSecrets(
            refreshToken: try secret("seed-refresh-token"),
            clientSecret: try secret("seed-client-secret"),
            idToken: try secret("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZGEifQ.c2ln")
        )
        let ci = AccountSecrets(refreshToken: try secret("seed-refresh-token-ci"))
        let kept = AccountSecrets(clientSecret: try secret("kept-client-secret"))
        func seal(_ secrets: AccountSecrets, _ name: String) throws -> [UInt8] {
            try AEAD.seal(try secrets.encoded(), key: fixedKey, associatedData: Array(name.utf8))
        }
        let files: [(String, VaultFile)] = [
            ("empty-raw", VaultFile(keyKind: .raw, kdf: nil, records: [:])),
            ("one-record", VaultFile(keyKind: .raw, kdf: nil, records: ["work": try seal(work, "work")])),
            (
                "three-records",
                VaultFile(
                    keyKind: .raw, kdf: nil,
                    records: ["work": try seal(work, "work"), "ci": try seal(ci, "ci"), "home": try seal(kept, "home")]
                )
            ),
            (
                "passphrase",
                VaultFile(
                    keyKind: .passphrase,
                    kdf: PasswordKDF(salt: Array(repeating: 0x5A, count: PasswordKDF.saltBytes), opsLimit: 3, memLimit: 1 << 26),
                    records: ["ci": try seal(ci, "ci")]
                )
            ),
        ]
        for (name, file) in files {
            try write(try file.serialized(key: fixedKey), to: folder + "/" + name)
        }
        // Plaintexts for the record codec; the last holds a tag from a newer version.
        try write(try work.encoded().withUnsafeBytes { Array($0) }, to: folder + "/record-all-fields")
        try write(try ci.encoded().withUnsafeBytes { Array($0) }, to: folder + "/record-refresh-token")
        try write([1, 0, 0, 0, 2, 0x61, 0x62, 9, 0, 0, 0, 1, 0x7A], to: folder + "/record-unknown-tag")
    } catch {
        fail("could not write the seeds: \(error)")
    }
}

func write(_ bytes: [UInt8], to path: String) throws(StoreError) {
    try FileSystem.writeAtomically(bytes, to: path, mode: 0o644)
}
