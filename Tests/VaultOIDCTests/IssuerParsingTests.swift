import Testing
import VaultCrypto
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

/// Token answers are read without a String of any token.
struct TokenAnswerTests {
    @Test func aTokenAnswerIsReadIntoGuardedMemoryAndItsBodyHoldsNoToken() throws {
        let json = #"{"access_token":"AT-1","token_type":"bearer","expires_in":"300","refresh_token":"RT-\u0031","id_token":"ID-1","scope":"openid"}"#
        var body = Array(json.utf8)
        let response = try TokenResponseParser.parse(status: 200, body: &body, retryAfter: nil)
        #expect(response.accessToken.unsafeString() == "AT-1")
        #expect(response.refreshToken?.unsafeString() == "RT-1")
        #expect(response.idToken?.unsafeString() == "ID-1")
        #expect(response.expiresIn == 300)
        #expect(response.scope == "openid")
        let left = String(decoding: body, as: UTF8.self)
        for token in ["AT-1", "RT-", "ID-1"] { #expect(!left.contains(token)) }
    }

    @Test func anAnswerThatNamesATokenTwiceIsNotTrusted() {
        var body = Array(#"{"access_token":"a","refresh_token":"r1","refresh_token":"r2"}"#.utf8)
        #expect(throws: ProviderError.self) { try TokenResponseParser.parse(status: 200, body: &body, retryAfter: nil) }
        var empty = Array(#"{"access_token":"","token_type":"Bearer"}"#.utf8)
        #expect(throws: ProviderError.self) { try TokenResponseParser.parse(status: 200, body: &empty, retryAfter: nil) }
        var dpop = Array(#"{"access_token":"a","token_type":"DPoP"}"#.utf8)
        #expect(throws: ProviderError.self) { try TokenResponseParser.parse(status: 200, body: &dpop, retryAfter: nil) }
    }

    /// A DPoP token answers a request that carried a proof, and only such a
    /// request: an issuer that binds a token nobody asked it to bind is not
    /// trusted, and one that answers a proof with a bearer token is taken
    /// at its word.
    @Test func aDPoPTokenIsTakenOnlyForARequestWithAProof() throws {
        var dpop = Array(#"{"access_token":"a","token_type":"dpop"}"#.utf8)
        #expect(try TokenResponseParser.parse(status: 200, body: &dpop, retryAfter: nil, proved: true).tokenType == "DPoP")
        var bearer = Array(#"{"access_token":"a","token_type":"Bearer"}"#.utf8)
        #expect(try TokenResponseParser.parse(status: 200, body: &bearer, retryAfter: nil, proved: true).tokenType == "Bearer")
        var other = Array(#"{"access_token":"a","token_type":"mac"}"#.utf8)
        #expect(throws: ProviderError.self) { try TokenResponseParser.parse(status: 200, body: &other, retryAfter: nil, proved: true) }
    }

    /// A `DPoP-Nonce` is sent back only as RFC 9449 §8.1 writes one.
    @Test func onlyAWellFormedNonceIsKept() {
        #expect(DPoPNonce.valid("eyJ7S_zG.eyJH0-Z.HX4w-7v") == "eyJ7S_zG.eyJH0-Z.HX4w-7v")
        for bad in [nil, "", "a b", "a\"b", "a\\b", "tab\t", "\u{e9}", String(repeating: "n", count: 513)] {
            #expect(DPoPNonce.valid(bad) == nil, "\(bad.debugDescription)")
        }
    }

    @Test func aNativeAuthAnswerKeepsItsContinuationTokenGuardedAndTrimmed() throws {
        var body = Array(#"{" continuation_token ":"  ct-1 ","challenge_type":"password"}"#.utf8)
        guard case .passwordRequired(let continuation) = try NativeAuthParser.parse(status: 200, body: &body, retryAfter: nil) else {
            Issue.record("not a password challenge")
            return
        }
        #expect(continuation.unsafeString() == "ct-1")
        #expect(!String(decoding: body, as: UTF8.self).contains("ct-1"))
    }
}
