import Glibc

/// Unix time in seconds. A parameter of the broker so tests move time by
/// hand instead of sleeping.
public protocol WallClock: Sendable {
    func now() -> Double
}

/// The system's real-time clock.
public struct SystemClock: WallClock {
    public init() {}

    public func now() -> Double {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
    }
}
