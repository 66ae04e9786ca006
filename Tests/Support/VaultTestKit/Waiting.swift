package import Testing

/// The one wait for what happens on another process's or thread's time (a
/// socket closing, a child exiting, a request reaching an issuer): checks
/// `condition` every 5 ms until it holds, and fails the test (recorded, and
/// thrown) after `seconds`. Time the vault reads is a parameter the tests
/// move instead (`ManualClock`).
@discardableResult
package func eventually(
    seconds: Double = 20,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () async throws -> Bool
) async throws -> Bool {
    guard try await within(seconds: seconds, condition) else {
        Issue.record("not within \(seconds) s", sourceLocation: sourceLocation)
        throw ToolFailure(message: "timed out")
    }
    return true
}

/// `eventually`'s loop, for a caller that handles the timeout itself:
/// whether `condition` held within `seconds`.
package func within(seconds: Double, _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while try await !condition() {
        guard ContinuousClock.now < deadline else { return false }
        try await Task.sleep(for: .milliseconds(5))
    }
    return true
}
