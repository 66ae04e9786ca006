import Glibc
import Testing
import VaultProtocol

/// The rules that have one home in VaultProtocol, used by vaultd and vaultctl alike.
struct RuleTests {
    @Test func loopbackIsALiteralAddressNeverAName() {
        for host in ["127.0.0.1", "::1", "[::1]"] { #expect(Loopback.isAddress(host), "\(host)") }
        for host in ["localhost", "127.0.0.2", "0.0.0.0", "[::1]:80", "127.0.0.1.example"] { #expect(!Loopback.isAddress(host), "\(host)") }
        for host in ["127.0.0.1", "127.0.0.1:8080", "[::1]", "[::1]:443"] { #expect(Loopback.isAddress(withPort: host), "\(host)") }
        for host in ["localhost:80", "127.0.0.1:", "127.0.0.1:80x", "127.0.0.10", "[::1]x", "::1"] {
            #expect(!Loopback.isAddress(withPort: host), "\(host)")
        }
    }

    @Test func htmlEscapingCoversQuotesOfBothKinds() {
        #expect(#"<a href="x" onclick='y'>&</a>"#.escapingHTML == "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;")
    }

    @Test func minTTLHasOneRange() {
        #expect(TokenRequest.minTTLRange == 0...86_400)
        let refused = LineCodec.request(from: Array(#"{"id":1,"op":"token","account":"w","min_ttl":86401}"#.utf8))
        guard case .failure(let error) = refused.command else {
            Issue.record("min_ttl 86401 was accepted")
            return
        }
        #expect(error.message == TokenRequest.minTTLRule)
    }
}

/// A Unix socket's address is filled in one place, and never cut short.
struct UnixAddressTests {
    @Test func aPathThatDoesNotFitIsRefusedNotCut() {
        #expect(UnixAddress(String(repeating: "a", count: 107)) != nil)
        #expect(UnixAddress(String(repeating: "a", count: 108)) == nil, "108 bytes leave no room for the NUL")
        #expect(UnixAddress("") == nil)
    }

    @Test func lengthsCountTheNULOfAPathAndNotOfAnAbstractName() {
        let family = MemoryLayout<sa_family_t>.size
        #expect(UnixAddress("/run/x.sock")?.withSockaddr { $1 } == socklen_t(family + 12))
        #expect(UnixAddress("@notify", abstractAt: true)?.withSockaddr { $1 } == socklen_t(family + 7))
        // Without abstractAt, '@' is a file name's first character.
        #expect(UnixAddress("@notify")?.withSockaddr { $1 } == socklen_t(family + 8))
    }
}
