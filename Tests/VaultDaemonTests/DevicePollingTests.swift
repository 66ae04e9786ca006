import Testing
@testable import VaultDaemon
import VaultOIDC
import VaultProtocol

/// RFC 8628 §3.5 polling, without waiting for the clock.
struct DevicePollingTests {
    @Test func slowDownAddsFiveSecondsForEveryLaterPoll() {
        var polling = DevicePolling(interval: 5)
        #expect(polling.next(after: .rejected(error: "authorization_pending", description: nil), account: "work") == nil)
        #expect(polling.interval == 5)
        #expect(polling.next(after: .rejected(error: "slow_down", description: nil), account: "work") == nil)
        #expect(polling.interval == 10)
        #expect(polling.next(after: .rejected(error: "authorization_pending", description: nil), account: "work") == nil)
        #expect(polling.interval == 10, "the slower interval stays")
        #expect(polling.next(after: .rejected(error: "slow_down", description: nil), account: "work") == nil)
        #expect(polling.interval == 15)
    }

    @Test func slowDownNeverStretchesThePollPastAMinute() {
        var polling = DevicePolling(interval: 5)
        for _ in 0..<100 { _ = polling.next(after: .rejected(error: "slow_down", description: nil), account: "work") }
        #expect(polling.interval == 60)
    }

    @Test func anUnreachableIssuerDoublesTheIntervalUpToAMinute() {
        var polling = DevicePolling(interval: 20)
        #expect(polling.next(after: .unavailable(reason: "reset", retryAfterSeconds: nil), account: "work") == nil)
        #expect(polling.interval == 40)
        _ = polling.next(after: .unavailable(reason: "reset", retryAfterSeconds: nil), account: "work")
        #expect(polling.interval == 60)
    }

    @Test func denialExpiryAndOtherErrorsEndTheFlow() {
        var polling = DevicePolling(interval: 5)
        let denied = polling.next(after: .rejected(error: "access_denied", description: nil), account: "work")
        #expect(denied?.code == .idpError && denied?.error == "access_denied")
        #expect(polling.next(after: .rejected(error: "authorization_declined", description: nil), account: "work")?.error == "access_denied")
        #expect(polling.next(after: .rejected(error: "expired_token", description: nil), account: "work")?.code == .codeExpired)
        #expect(polling.next(after: .invalidGrant, account: "work") != nil)
    }
}
