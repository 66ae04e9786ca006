internal import CSodium
import Glibc
import Synchronization

/// Guarded memory for small secrets, carved out of large `sodium_malloc`
/// regions so that a vault with thousands of accounts does not spend two pages
/// of RAM and four memory mappings on every token (Linux refuses new mappings
/// past `vm.max_map_count`, 65,530 by default).
///
/// A region is one `sodium_malloc`: guard pages at both ends, `mlock` where
/// `RLIMIT_MEMLOCK` allows, left out of core dumps. It is cut into slots of
/// one size class (a power of two from 32 to 8,192 bytes). A class's first
/// region is the fewest pages that hold one slot, and each next one twice its
/// last, up to 128 KiB: a vault of a few accounts locks one page per class in
/// use (two and three for the 4 and 8 KiB classes), not 128 KiB.
/// A slot holds the secret's `count` bytes, then a 16-byte canary, then zeros.
/// Freeing checks the canary, stopping the process if an overrun changed it,
/// and zeroes the whole slot before it goes back on its class's free list.
///
/// Regions are kept for the life of the arena: the number of live secrets
/// follows the number of accounts, and a freed slot is reused before any new
/// region is mapped, so memory stays at the peak, never grows past it.
final class SecretArena: Sendable {
    static let shared = SecretArena()

    static let canaryBytes = 16
    static let smallestSlot = 32
    /// Room for every token and key the vault holds: keys are 32 bytes, and
    /// even JWTs with many claims are a few KiB.
    static let largestSlot = 8192
    /// The largest secret the arena holds; longer ones get their own `sodium_malloc`.
    static let largestCount = largestSlot - canaryBytes
    /// Four mappings per 128 KiB of secrets, and under 1.2 MiB locked when
    /// every size class is in use: well inside the usual 8 MiB `RLIMIT_MEMLOCK`.
    static let largestRegionPages = 128 * 1024 / pageBytes
    static let pageBytes = Int(sysconf(Int32(_SC_PAGESIZE)))
    /// `sodium_malloc` puts a canary of its own just before the bytes it
    /// returns, in the same locked pages. A region asks for whole pages less
    /// these bytes: asked for whole pages, it would lock one more for them.
    static let sodiumCanaryBytes = 16

    /// The bytes of a class's next region, given its last one's (0 before
    /// its first): whole pages, less sodium's canary.
    static func regionBytes(slot: Int, last: Int) -> Int {
        let pages = last == 0
            ? (slot + sodiumCanaryBytes + pageBytes - 1) / pageBytes
            : min(2 * (last + sodiumCanaryBytes) / pageBytes, largestRegionPages)
        return pages * pageBytes - sodiumCanaryBytes
    }

    private struct State {
        /// Addresses of the free slots of each size class, smallest class
        /// first. Addresses, not pointers, so that they may cross the lock.
        var free: [[UInt]]
        /// The size of each class's last region, 0 before its first.
        var lastRegionBytes: [Int]
        var regions: [(start: UnsafeMutableRawPointer, bytes: Int)] = []
    }

    private let state: Mutex<State>
    /// Random per arena, so an overrun cannot write the expected value by chance.
    private let canary: [UInt8]

    init() {
        let classes = Self.classIndex(forSlot: Self.largestSlot) + 1
        self.state = Mutex(State(free: Array(repeating: [], count: classes), lastRegionBytes: Array(repeating: 0, count: classes)))
        var canary = [UInt8](repeating: 0, count: Self.canaryBytes)
        _ = try? Sodium.ensureInitialized()
        randombytes_buf(&canary, canary.count)
        self.canary = canary
    }

    deinit {
        self.state.withLock { state in
            for region in state.regions { sodium_free(region.start) }
        }
    }

    /// The size of the slot that holds `count` bytes and the canary, or nil
    /// when the secret is too large for the arena.
    static func slotBytes(forCount count: Int) -> Int? {
        guard count >= 0, count <= largestCount else { return nil }
        var slot = smallestSlot
        while slot < count + canaryBytes { slot <<= 1 }
        return slot
    }

    private static func classIndex(forSlot slot: Int) -> Int {
        slot.trailingZeroBitCount - smallestSlot.trailingZeroBitCount
    }

    /// A zeroed slot for `count` bytes, or nil when `count` is too large for
    /// the arena.
    func allocate(count: Int) throws(SodiumError) -> UnsafeMutableRawPointer? {
        guard let slotBytes = Self.slotBytes(forCount: count) else { return nil }
        let index = Self.classIndex(forSlot: slotBytes)
        let address = try self.state.withLock { state throws(SodiumError) -> UInt in
            if state.free[index].isEmpty {
                let bytes = Self.regionBytes(slot: slotBytes, last: state.lastRegionBytes[index])
                guard let region = sodium_malloc(bytes) else {
                    throw SodiumError(operation: "sodium_malloc")
                }
                // sodium_malloc fills new memory with a non-zero pattern.
                sodium_memzero(region, bytes)
                state.regions.append((region, bytes))
                state.lastRegionBytes[index] = bytes
                // Reversed so that slots are handed out in address order.
                let start = UInt(bitPattern: region)
                state.free[index] = stride(from: bytes - slotBytes, through: 0, by: -slotBytes)
                    .map { start + UInt($0) }
            }
            return state.free[index].removeLast()
        }
        let slot = UnsafeMutableRawPointer(bitPattern: address)!
        self.canary.withUnsafeBytes { (slot + count).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        return slot
    }

    /// Checks the canary after `count` bytes, zeroes the slot and makes it
    /// available again. `count` must be the one `allocate` was given.
    func free(_ slot: UnsafeMutableRawPointer, count: Int) {
        guard let slotBytes = Self.slotBytes(forCount: count) else {
            preconditionFailure("SecretArena.free: size \(count) was never allocated here")
        }
        let intact = self.canary.withUnsafeBytes { sodium_memcmp(slot + count, $0.baseAddress!, $0.count) == 0 }
        guard intact else {
            // Says nothing of the bytes: they may be a neighbour's secret.
            fatalError("SecretBytes: the guard bytes after a \(count)-byte secret were overwritten (buffer overrun)")
        }
        sodium_memzero(slot, slotBytes)
        let address = UInt(bitPattern: slot)
        self.state.withLock { $0.free[Self.classIndex(forSlot: slotBytes)].append(address) }
    }

    /// How many regions the arena has mapped.
    var regionCount: Int { self.state.withLock { $0.regions.count } }

    /// The bytes of secrets its regions hold, in all.
    var regionBytesInAll: Int { self.state.withLock { $0.regions.reduce(0) { $0 + $1.bytes } } }
}
