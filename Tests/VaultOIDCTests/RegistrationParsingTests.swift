import Foundation
import Testing
import VaultCrypto
@testable import VaultOIDC

/// What an issuer answers a registration with (RFC 7591 §3.2) is hostile
/// until read: the secrets go to guarded memory, the client id and the
/// client's URI are held to their rules, and an error's words are escaped.
struct RegistrationParsingTests {
    static let issuer = "https://id.example.org"

    static func read(_ status: UInt, _ text: String) -> Result<ClientRegistration, ProviderError> {
        var body = Array(text.utf8)
        do throws(ProviderError) {
            return .success(try OIDCClient.registration(status: status, body: &body, issuer: Self.issuer))
        } catch {
            return .failure(error)
        }
    }

    @Test func aRegistrationIsReadWithItsSecretsInGuardedMemory() throws {
        let answer = #"{"client_id":"abc123","client_secret":"s3cret","registration_access_token":"rat-1","registration_client_uri":"https://id.example.org/register/abc123","client_id_issued_at":1}"#
        let registration = try Self.read(201, answer).get()
        #expect(registration.clientID == "abc123")
        #expect(registration.clientSecret?.unsafeString() == "s3cret")
        #expect(registration.accessToken?.unsafeString() == "rat-1")
        #expect(registration.clientURI == "https://id.example.org/register/abc123")
        // Glewlwyd answers 200, not RFC 7591's 201.
        #expect(try Self.read(200, #"{"client_id":"abc123"}"#).get().accessToken == nil)
    }

    @Test(arguments: [
        #"{"client_id":"has space"}"#,
        #"{"client_id":"tab\there"}"#,
        #"{"client_id":""}"#,
        #"{"client_id":7}"#,
        #"{"client_id":null}"#,
        #"{"registration_access_token":"rat"}"#,
        #"{"client_id":"\#(String(repeating: "a", count: 513))"}"#,
        #"{"client_id":"c","registration_access_token":"rat","registration_client_uri":"http://id.example.org/register/c"}"#,
        #"{"client_id":"c","registration_access_token":"rat","registration_client_uri":"not a url"}"#,
        #"{"client_id":"c","registration_access_token":"a","registration_access_token":"b","registration_client_uri":"https://id.example.org/r"}"#,
        #"{"client_id":"c","client_secret":"with space"}"#,
        #"[{"client_id":"c"}]"#,
        "",
    ])
    func anAnswerOutsideTheRulesIsNotTrusted(_ answer: String) {
        guard case .failure(.untrusted) = Self.read(201, answer) else {
            Issue.record("trusted: \(answer.prefix(80))")
            return
        }
    }

    /// A registration token without the URI to use it on (or the other way
    /// round) is of no use: neither is kept.
    @Test func halfOfTheManagementPairIsDropped() throws {
        let tokenOnly = try Self.read(201, #"{"client_id":"c","registration_access_token":"rat"}"#).get()
        #expect(tokenOnly.accessToken == nil && tokenOnly.clientURI == nil)
        let uriOnly = try Self.read(201, #"{"client_id":"c","registration_client_uri":"https://id.example.org/r/c"}"#).get()
        #expect(uriOnly.accessToken == nil && uriOnly.clientURI == nil)
    }

    @Test func anIssuersRefusalIsItsOwnWordsEscaped() {
        let refused = Self.read(400, #"{"error":"invalid_redirect_uri","error_description":"no \u001b]0;owned\u0007 here"}"#)
        guard case .failure(.rejected(let error, let description)) = refused else {
            Issue.record("\(refused)")
            return
        }
        #expect(error == "invalid_redirect_uri")
        #expect(description?.contains("\u{1B}") == false && description?.contains(#"\u{1B}"#) == true, "\(description ?? "")")
        // Glewlwyd's 401 has no body: the initial access token is missing or refused.
        guard case .failure(.rejected("invalid_token", _)) = Self.read(401, "") else {
            Issue.record("a 401 is not invalid_token")
            return
        }
        guard case .failure(.unavailable) = Self.read(500, "<html>oops</html>") else {
            Issue.record("a 500 is not unavailable")
            return
        }
    }
}
