import Glibc

/// The vault's time: Unix time in seconds, and a sleep until such a time.
/// A parameter of the broker, the flows, the shares and the chores, so a
/// test moves time by hand instead of sleeping.
package protocol WallClock: Sendable {
    func now() -> Double
    /// Returns once `now()` has reached `deadline`; throws when the task is
    /// cancelled first.
    func sleep(until deadline: Double) async throws
    /// Seconds on a clock nobody can set (the time since boot, suspend
    /// included): for a deadline that a stepped wall clock must not move,
    /// such as a share's end.
    func uptime() -> Double
}

extension WallClock {
    /// A clock that is never stepped keeps one time.
    package func uptime() -> Double { self.now() }
}

/// The system's real-time clock.
package struct SystemClock: WallClock {
    package init() {}

    package func now() -> Double {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
    }

    package func uptime() -> Double {
        var spec = timespec()
        clock_gettime(CLOCK_BOOTTIME, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
    }

    package func sleep(until deadline: Double) async throws {
        // Checked again after each sleep: the real-time clock may be set back.
        while true {
            let left = deadline - self.now()
            guard left > 0 else { return }
            try await Task.sleep(for: .nanoseconds(Int64(min(left, 86_400) * 1e9)))
        }
    }
}
