// libFuzzer entry point for the sealed vault file: the parser of its layout
// (`VaultFile.parse`) and the codec of a record's plaintext
// (`AccountSecrets(decoding:)`). Every input goes to both; each must throw
// or succeed, never crash.
//
// - A file that parses serializes again (with a fresh check box), to as many
//   bytes, and that parses to the same file; serializing is a fixed point but
//   for the check box, whose nonce is new each time. Every record opens under
//   its own name and binding, and its plaintext goes through the record codec
//   too. A version 1 file is first sealed again as version 2 (`next`), and
//   that must round-trip the same way, every record opening as before.
// - The file of the next write opens every record of the one before to the
//   same plaintext, and none of its records opens in the one before.
// - A plaintext that decodes encodes, and that decodes to the same secrets;
//   encoding is a fixed point (fields of unknown tags are kept, after the known
//   ones; a repeated tag keeps its last value, so the first encoding may
//   differ from the input).
//
// Every key kind is answered with one fixed 32-byte key (no Argon2id: a
// passphrase header's parameters are checked, not used), so seeds sealed with
// that key open, and mutations of them reach the records. To write the seeds
// of Fuzz/corpus/vaultfile/ again:
//
//     TOKENVAULT_FUZZ_WRITE_SEEDS=Fuzz/corpus/vaultfile .build-fuzz/fuzz-vaultfile
//
// Built and run by dev/fuzz.sh.

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
let checkRange = 71..<(71 + AEAD.overhead)

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
    let read: VaultFile
    do {
        read = try parse(bytes)
    } catch {
        return
    }
    let file: VaultFile
    do {
        file = try read.next(key: fixedKey)
    } catch {
        fail("a parsed file cannot be sealed again: \(error)")
    }
    for name in read.records.keys {
        guard let before = try? read.open(name, key: fixedKey), let after = try? file.open(name, key: fixedKey), before == after else {
            fail("sealing again changed or lost a record")
        }
        var stale = file
        stale.records[name] = read.records[name]
        guard (try? stale.open(name, key: fixedKey)) == nil else { fail("a record of an earlier write opens in the next") }
    }
    if !read.sealedByName {
        let same = serialize(read)
        guard same.count == bytes.count else { fail("serializing changed the size from \(bytes.count) to \(same.count)") }
    }
    let first = serialize(file)
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
    for name in file.records.keys {
        guard let plaintext = try? file.open(name, key: fixedKey) else {
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
        func file(_ kind: VaultFile.KeyKind, _ kdf: PasswordKDF?, _ records: [(String, AccountSecrets)]) throws -> VaultFile {
            var file = VaultFile(keyKind: kind, kdf: kdf, fileID: Array(repeating: 0x3C, count: VaultFile.fileIDBytes), counter: 6, records: [:])
            for (name, secrets) in records {
                let binding = Array("a-0123\u{0}https://id.example.org\u{0}cli".utf8)
                file = try file.next(key: fixedKey, setting: name, to: try secrets.encoded(), binding: name == "home" ? [] : binding)
            }
            return file
        }
        let files: [(String, VaultFile)] = [
            ("empty-raw", try file(.raw, nil, [])),
            ("one-record", try file(.raw, nil, [("work", work)])),
            ("three-records", try file(.raw, nil, [("work", work), ("ci", ci), ("home", kept)])),
            (
                "passphrase",
                try file(
                    .passphrase,
                    PasswordKDF(salt: Array(repeating: 0x5A, count: PasswordKDF.saltBytes), opsLimit: 3, memLimit: 1 << 26),
                    [("ci", ci)]
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
