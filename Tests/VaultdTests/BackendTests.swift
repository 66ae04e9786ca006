import Foundation
import Testing
import VaultTestKit

/// Which backend holds the secrets, and moving them between backends.
@Suite(.timeLimit(.minutes(1)))
struct BackendTests {
    @Test func migratingToTheBackendInUseOrToOneThatIsNotThere() async throws {
        try await withVault { vault in
            let client = try LineClient(path: vault.socketPath)
            let same = try #require(await client.call(#"{"id":1,"op":"migrate","to":"file"}"#))
            #expect(same["moved"] as? [String] == [], "\(same)")
            let missing = try #require(await client.call(#"{"id":2,"op":"migrate","to":"keyring"}"#))
            #expect(missing.errorCode == "bad_request", "\(missing)")
            #expect(await client.call(#"{"id":3,"op":"migrate","to":"floppy"}"#)?.errorCode == "bad_request")
        }
    }
}
