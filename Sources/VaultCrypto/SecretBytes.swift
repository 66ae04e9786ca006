internal import CSodium

/// Bytes that must not be logged, printed, compared in variable time, or kept
/// longer than needed: refresh tokens, access tokens, client secrets, keys.
///
/// The bytes live in guarded memory: `mlock`ed where `RLIMIT_MEMLOCK` allows
/// (so not swapped), left out of core dumps, and zeroed when the last copy
/// goes away. `description`, `debugDescription` and `dump()` show only the
/// length.
///
/// Secrets of up to `SecretArena.largestCount` (8,176) bytes share large
/// `sodium_malloc` regions (`SecretArena`), so thousands of them cost a few
/// hundred memory mappings rather than four each. The trade-off: guard pages
/// surround a region, not each secret, so a bug that overruns one secret can
/// read or write its neighbours in the same region. A random canary after
/// each secret is checked when it is freed, and a changed one stops the
/// process; reads past the end go unnoticed. Longer secrets get their own
/// `sodium_malloc`, guard pages and canary included.
public struct SecretBytes: Sendable {
    private let storage: Storage

    /// Copies `bytes` into guarded memory.
    public init(copying bytes: some Collection<UInt8>) throws(SodiumError) {
        self.storage = try Storage(count: bytes.count) { buffer in
            _ = buffer.initializeMemory(as: UInt8.self, from: bytes)
        }
    }

    /// Copies the UTF-8 bytes of `string` into guarded memory. The `String`
    /// itself cannot be wiped; convert at the edge and drop it.
    public init(utf8 string: String) throws(SodiumError) {
        var string = string
        self.storage = try Storage(count: string.utf8.count) { buffer in
            string.withUTF8 { buffer.copyMemory(from: UnsafeRawBufferPointer($0)) }
        }
    }

    /// `count` bytes from the system's CSPRNG.
    public init(randomCount count: Int) throws(SodiumError) {
        self.storage = try Storage(count: count) { buffer in
            if let base = buffer.baseAddress { randombytes_buf(base, buffer.count) }
        }
    }

    /// Lets `fill` write exactly `count` bytes straight into guarded memory
    /// (key derivation, decryption), so no unguarded copy exists. Returns nil
    /// when `fill` reports failure by returning false.
    public init?(count: Int, fill: (UnsafeMutableRawBufferPointer) -> Bool) throws(SodiumError) {
        var filled = false
        self.storage = try Storage(count: count) { buffer in filled = fill(buffer) }
        guard filled else { return nil }
    }

    public var count: Int { self.storage.buffer.count }

    /// Zeroes the bytes in place, for every copy of this value at once: for a
    /// secret that is being destroyed (a refresh token at sign-out), so that
    /// a copy some task still holds keeps nothing of it either.
    public func wipe() {
        sodium_memzero(self.storage.buffer.baseAddress, self.storage.buffer.count)
    }

    /// The only way to read the bytes. Do not let the pointer escape `body`.
    public func withUnsafeBytes<R, E: Error>(
        _ body: (UnsafeRawBufferPointer) throws(E) -> R
    ) throws(E) -> R {
        try body(UnsafeRawBufferPointer(self.storage.buffer))
    }

    /// A `String` of the bytes, for the one place that must hand a token to
    /// the outside world (the reply line, an HTTP form). It cannot be wiped.
    public func unsafeString() -> String {
        String(decoding: UnsafeRawBufferPointer(self.storage.buffer), as: UTF8.self)
    }
}

extension SecretBytes: Equatable {
    /// Constant time in the length of the shorter operand (`sodium_memcmp`).
    public static func == (lhs: SecretBytes, rhs: SecretBytes) -> Bool {
        guard lhs.count == rhs.count else { return false }
        if lhs.count == 0 { return true }
        return lhs.withUnsafeBytes { l in
            rhs.withUnsafeBytes { r in
                sodium_memcmp(l.baseAddress, r.baseAddress, l.count) == 0
            }
        }
    }
}

extension SecretBytes: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var description: String { "SecretBytes(\(self.count) bytes, redacted)" }
    public var debugDescription: String { self.description }
    public var customMirror: Mirror { Mirror(self, children: [:]) }
}

/// `@unchecked Sendable` is sound: the bytes are written once, inside `init`,
/// before the object is shared, and only read afterwards.
private final class Storage: @unchecked Sendable {
    let buffer: UnsafeMutableRawBufferPointer
    /// Whether the bytes are a slot of `SecretArena.shared` rather than their
    /// own `sodium_malloc`.
    private let inArena: Bool

    init(count: Int, initialize: (UnsafeMutableRawBufferPointer) -> Void) throws(SodiumError) {
        try Sodium.ensureInitialized()
        let base: UnsafeMutableRawPointer
        if let slot = try SecretArena.shared.allocate(count: count) {
            (base, self.inArena) = (slot, true)
        } else if let own = sodium_malloc(count) {
            (base, self.inArena) = (own, false)
        } else {
            throw SodiumError(operation: "sodium_malloc")
        }
        self.buffer = UnsafeMutableRawBufferPointer(start: base, count: count)
        initialize(self.buffer)
    }

    deinit {
        guard let base = self.buffer.baseAddress else { return }
        if self.inArena {
            // Checks the canary, zeroes the slot and puts it back for reuse.
            SecretArena.shared.free(base, count: self.buffer.count)
        } else {
            // Zeroes, unlocks and unmaps the guarded pages.
            sodium_free(base)
        }
    }
}
