import Testing
import VaultProtocol

@Suite struct PrintableTests {
    @Test func controlCharactersBecomeVisibleEscapes() {
        #expect("ada\u{1B}]0;owned\u{07}\nnext\r\tend\u{7F}\u{9B}2J\u{0}".escaped(for: .terminal)
            == #"ada\u{1B}]0;owned\u{7}\nnext\r\tend\u{7F}\u{9B}2J\u{0}"#)
    }

    @Test func everythingElseStaysAsItIs() {
        let text = #"Ada Lovelace — ä 日本 🔑 C:\path "quoted" {json}"#
        #expect(text.escaped(for: .terminal) == text)
    }
}
