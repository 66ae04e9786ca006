import Testing
import VaultCrypto

@Suite struct SecretBytesTests {
    let canary = "rt-CANARY-0123456789"

    @Test func neverShowsItsBytes() throws {
        let secret = try SecretBytes(utf8: canary)
        var dumped = ""
        dump(secret, to: &dumped)
        for shown in ["\(secret)", String(reflecting: secret), dumped, "\([secret])", "\(Optional(secret) as Any)"] {
            #expect(!shown.contains(canary))
            #expect(!shown.contains("CANARY"))
        }
        #expect("\(secret)" == "SecretBytes(20 bytes, redacted)")
    }

    @Test func comparesByContent() throws {
        let a = try SecretBytes(utf8: canary)
        let b = try SecretBytes(copying: Array(canary.utf8))
        let c = try SecretBytes(utf8: canary + "x")
        let d = try SecretBytes(utf8: "rt-CANARY-0123456780")
        #expect(a == b)
        #expect(a != c)
        #expect(a != d)
        #expect(try SecretBytes(copying: []) == SecretBytes(copying: []))
    }

    @Test func randomBytesDiffer() throws {
        let a = try SecretBytes(randomCount: 32)
        let b = try SecretBytes(randomCount: 32)
        #expect(a.count == 32)
        #expect(a != b)
    }

    @Test func roundTripsUTF8() throws {
        #expect(try SecretBytes(utf8: "héllo ✓").unsafeString() == "héllo ✓")
    }
}

@Suite struct AEADTests {
    @Test func sealsAndOpens() throws {
        let key = try SecretBytes(randomCount: AEAD.keyBytes)
        let plaintext = try SecretBytes(utf8: "refresh-token")
        let box = try AEAD.seal(plaintext, key: key, associatedData: Array("work".utf8))
        #expect(box.count == plaintext.count + AEAD.overhead)
        #expect(try AEAD.open(box, key: key, associatedData: Array("work".utf8)) == plaintext)
        let again = try AEAD.seal(plaintext, key: key, associatedData: Array("work".utf8))
        #expect(again != box, "each seal draws a fresh nonce")
    }

    @Test func refusesWrongKeyContextOrBytes() throws {
        let key = try SecretBytes(randomCount: AEAD.keyBytes)
        let box = try AEAD.seal(try SecretBytes(utf8: "x"), key: key, associatedData: Array("work".utf8))
        #expect(throws: AEAD.Failure.authenticationFailed) {
            try AEAD.open(box, key: try SecretBytes(randomCount: AEAD.keyBytes), associatedData: Array("work".utf8))
        }
        #expect(throws: AEAD.Failure.authenticationFailed) {
            try AEAD.open(box, key: key, associatedData: Array("home".utf8))
        }
        for index in box.indices {
            var flipped = box
            flipped[index] ^= 0x01
            #expect(throws: AEAD.Failure.authenticationFailed) {
                try AEAD.open(flipped, key: key, associatedData: Array("work".utf8))
            }
        }
        #expect(throws: AEAD.Failure.authenticationFailed) {
            try AEAD.open(box.prefix(10), key: key, associatedData: Array("work".utf8))
        }
    }

    @Test func derivesTheSameKeyFromTheSamePassphrase() throws {
        let kdf = PasswordKDF(salt: Array(repeating: 7, count: PasswordKDF.saltBytes), opsLimit: 2, memLimit: 8 << 20)
        let a = try kdf.deriveKey(from: try SecretBytes(utf8: "correct horse"))
        let b = try kdf.deriveKey(from: try SecretBytes(utf8: "correct horse"))
        let c = try kdf.deriveKey(from: try SecretBytes(utf8: "correct horsf"))
        #expect(a.count == AEAD.keyBytes)
        #expect(a == b)
        #expect(a != c)
        #expect(!PasswordKDF(salt: [1], opsLimit: 2, memLimit: 8 << 20).isValid)
        #expect(!PasswordKDF(salt: kdf.salt, opsLimit: 2, memLimit: UInt64.max).isValid)
    }
}
