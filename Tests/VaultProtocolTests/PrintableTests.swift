import Testing
import VaultProtocol

@Suite struct PrintableTests {
    @Test func controlCharactersBecomeVisibleEscapes() {
        #expect("ada\u{1B}]0;owned\u{07}\nnext\r\tend\u{7F}\u{9B}2J\u{0}".escaped(for: .terminal)
            == #"ada\u{1B}]0;owned\u{7}\nnext\r\tend\u{7F}\u{9B}2J\u{0}"#)
    }

    /// U+202E would show what follows it right to left: `ada` then RLO
    /// `txt.exe` reads as `adaexe.txt`. Every embedding, override and isolate
    /// control is escaped, in both modes.
    @Test func bidiControlsBecomeVisibleEscapes() {
        for value in Array(UInt32(0x202A)...0x202E) + Array(UInt32(0x2066)...0x2069) {
            let text = "ada" + String(Unicode.Scalar(value)!) + "txt.exe"
            let hex = String(value, radix: 16)
            #expect(text.escaped(for: .terminal) == "ada\\u{\(hex.uppercased())}txt.exe")
            #expect(text.escaped(for: .log) == "ada\\u\(hex)txt.exe")
        }
        // Their neighbours are text, and stay as they are.
        for value: UInt32 in [0x2029, 0x202F, 0x2065, 0x206A] {
            let text = "a" + String(Unicode.Scalar(value)!) + "b"
            #expect(text.escaped(for: .terminal) == text)
        }
    }

    @Test func everythingElseStaysAsItIs() {
        let text = #"Ada Lovelace — ä 日本 🔑 C:\path "quoted" {json}"#
        #expect(text.escaped(for: .terminal) == text)
    }
}
