internal import CSodium

/// A libsodium call that failed. Carries the operation's name, never any data.
public struct SodiumError: Error, Hashable, Sendable, CustomStringConvertible {
    public var operation: String

    public init(operation: String) {
        self.operation = operation
    }

    public var description: String { "libsodium: \(self.operation) failed" }
}

enum Sodium {
    /// `sodium_init()` runs once per process; it is thread-safe and idempotent.
    private static let initialized: Bool = sodium_init() >= 0

    static func ensureInitialized() throws(SodiumError) {
        guard Self.initialized else { throw SodiumError(operation: "sodium_init") }
    }
}

/// Zeroes `buffer` in a way the optimiser may not drop (`sodium_memzero`).
public func secureZero(_ buffer: UnsafeMutableRawBufferPointer) {
    guard let base = buffer.baseAddress else { return }
    sodium_memzero(base, buffer.count)
}

extension Array where Element == UInt8 {
    /// Zeroes the array's bytes in place; for the short-lived unguarded copies
    /// that file reads and writes cannot avoid.
    public mutating func secureZero() {
        self.withUnsafeMutableBytes { VaultCrypto.secureZero($0) }
    }
}
