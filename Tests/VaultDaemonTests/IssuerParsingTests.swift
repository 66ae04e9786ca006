import Testing
import VaultJSON
import VaultProtocol
@testable import VaultOIDC

/// The readers of what issuers send, alone.
struct IssuerParsingTests {
    @Test func numbersAreBoundedWhereTheyAreRead() {
        let lifetimes = IssuerNumber.lifetimes
        let cases: [(JSONValue?, Int?)] = [
            (.number(Double(Int.max)), 315_360_000), (.string("9223372036854775807"), 315_360_000),
            (.number(1e300), 315_360_000), (.string(" 1e300 "), 315_360_000), (.number(-5), 0),
            (.number(-1e300), 0), (.number(3599.9), 3599), (.string("3600"), 3600), (.string("NaN"), nil),
            (.string("-inf"), nil), (.string("soon"), nil), (.null, nil), (.bool(true), nil), (nil, nil),
        ]
        for (value, expected) in cases {
            #expect(IssuerNumber.bounded(value, lifetimes) == expected, "\(String(describing: value))")
        }
        #expect(IssuerNumber.bounded(.number(0), IssuerNumber.intervals) == 1)
        #expect(IssuerNumber.bounded(.number(1e300), IssuerNumber.intervals) == 60)
    }

    @Test func retryAfterAndMaxAge() {
        #expect(IssuerNumber.retryAfter("120") == 120)
        #expect(IssuerNumber.retryAfter("9223372036854775807") == 3600)
        #expect(IssuerNumber.retryAfter("99999999999999999999999") == 3600)
        #expect(IssuerNumber.retryAfter("-1") == nil)
        #expect(IssuerNumber.retryAfter("Wed, 21 Oct 2015 07:28:00 GMT") == nil)
        #expect(IssuerNumber.maxAge(["public", " max-age=600"]) == 600)
        #expect(IssuerNumber.maxAge(["max-age=\"99999999999\""]) == 86400)
        #expect(IssuerNumber.maxAge(["max-age=60", "no-cache"]) == 0)
        #expect(IssuerNumber.maxAge(["max-age=-1"]) == nil)
        #expect(IssuerNumber.maxAge([]) == nil)
    }

    @Test func oauthMetadataIsLookedForBeforeAndAfterTheIssuerPath() {
        #expect(
            AuthorizationServerMetadata.urls(for: "https://id.example.org/tenant/v2.0") == [
                "https://id.example.org/.well-known/oauth-authorization-server/tenant/v2.0",
                "https://id.example.org/tenant/v2.0/.well-known/oauth-authorization-server",
            ]
        )
        #expect(
            AuthorizationServerMetadata.urls(for: "https://id.example.org/")
                == ["https://id.example.org/.well-known/oauth-authorization-server"]
        )
        #expect(
            AuthorizationServerMetadata.urls(for: "http://127.0.0.1:8080")
                == ["http://127.0.0.1:8080/.well-known/oauth-authorization-server"]
        )
    }
}
