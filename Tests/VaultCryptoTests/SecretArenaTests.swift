#if canImport(Glibc)
import Glibc
#endif
import Testing
@testable import VaultCrypto

/// Lines in /proc/self/maps: one per memory mapping of this process.
private func mappingCount() -> Int? {
    guard let file = fopen("/proc/self/maps", "r") else { return nil }
    defer { fclose(file) }
    var lines = 0
    while true {
        let character = getc(file)
        if character == EOF { return lines }
        if character == 0x0A { lines += 1 }
    }
}

private let hasProcMaps = mappingCount() != nil

/// The size of the mapping that holds `address`, from /proc/self/maps.
private func mappingBytes(at address: UInt) -> Int? {
    guard let file = fopen("/proc/self/maps", "r") else { return nil }
    defer { fclose(file) }
    var line: UnsafeMutablePointer<CChar>?
    defer { free(line) }
    var capacity = 0
    while getline(&line, &capacity, file) > 0, let line {
        let fields = String(cString: line).split(separator: " ")
        let range = fields.first?.split(separator: "-").compactMap { UInt($0, radix: 16) } ?? []
        if range.count == 2, range[0] <= address, address < range[1] { return Int(range[1] - range[0]) }
    }
    return nil
}

/// The `VmFlags` of the mapping that holds `address`, from /proc/self/smaps.
private func mappingFlags(at address: UInt) -> [Substring]? {
    guard let file = fopen("/proc/self/smaps", "r") else { return nil }
    defer { fclose(file) }
    var line: UnsafeMutablePointer<CChar>?
    defer { free(line) }
    var capacity = 0
    var inside = false
    while getline(&line, &capacity, file) > 0, let line {
        let fields = String(cString: line).split(whereSeparator: \.isWhitespace)
        // A mapping starts with "start-end perms offset dev inode [path]".
        let range = fields.first?.split(separator: "-").compactMap { UInt($0, radix: 16) } ?? []
        if range.count == 2 {
            inside = range[0] <= address && address < range[1]
        } else if inside, fields.first == "VmFlags:" {
            return Array(fields.dropFirst())
        }
    }
    return nil
}

/// A byte that differs between secrets and positions, never zero.
private func pattern(_ secret: Int, _ position: Int) -> UInt8 {
    UInt8(truncatingIfNeeded: (secret &* 31 &+ position) % 251 + 1)
}

private func makeSecret(_ id: Int, count: Int) throws -> SecretBytes? {
    try SecretBytes(count: count) { buffer in
        for position in 0..<buffer.count { buffer[position] = pattern(id, position) }
        return true
    }
}

private func holds(_ secret: SecretBytes, _ id: Int, count: Int) -> Bool {
    secret.count == count && secret.withUnsafeBytes { bytes in
        bytes.indices.allSatisfy { bytes[$0] == pattern(id, $0) }
    }
}

/// These share the process-wide arena and count the process's mappings, so
/// they run one at a time.
@Suite(.serialized) struct SecretArenaTests {
    @Test(.enabled(if: hasProcMaps))
    func manySmallSecretsShareFewMappings() throws {
        let before = try #require(mappingCount())
        let secrets = try (0..<20_000).map { id in try #require(try makeSecret(id, count: id % 160)) }
        let added = try #require(mappingCount()) - before
        #expect(added < 200, "20,000 secrets added \(added) mappings")
        #expect(secrets.indices.allSatisfy { holds(secrets[$0], $0, count: $0 % 160) })
    }

    /// Counts the shared arena's regions, not the process's mappings: other
    /// suites map and unmap memory (threads, libsecret) while this one runs.
    /// They hold secrets of their own too, so a few regions may still come;
    /// without reuse, nine rounds add about a hundred.
    @Test func freedSecretsLeaveTheirMemoryForTheNext() throws {
        var afterFirstRound = 0
        for round in 0..<10 {
            let secrets = try (0..<10_000).map { id in try #require(try makeSecret(id, count: id % 160)) }
            #expect(secrets.count == 10_000)
            if round == 0 { afterFirstRound = SecretArena.shared.regionCount }
        }
        let grown = SecretArena.shared.regionCount - afterFirstRound
        #expect(grown < 10, "nine more rounds of the same secrets added \(grown) regions")
    }

    @Test(.enabled(if: hasProcMaps))
    func secretsStayOutOfCoreDumps() throws {
        let secret = try #require(try makeSecret(7, count: 40))
        let address = secret.withUnsafeBytes { UInt(bitPattern: $0.baseAddress) }
        let flags = try #require(mappingFlags(at: address))
        #expect(flags.contains("dd"), "MADV_DONTDUMP")
        #expect(flags.contains("rd") && flags.contains("wr"))
    }

    @Test func regionsAreReusedOnceFreed() throws {
        let arena = SecretArena()
        var regions: Int?
        for _ in 0..<10 {
            let slots = try (0..<5_000).map { count in (try #require(try arena.allocate(count: count % 300)), count % 300) }
            for (slot, count) in slots { arena.free(slot, count: count) }
            if regions == nil { regions = arena.regionCount }
            #expect(arena.regionCount == regions)
        }
    }

    @Test func aFewSecretsLockAFewPagesAndRegionsGrowWithUse() throws {
        let arena = SecretArena()
        let page = SecretArena.pageBytes
        // One token and one key: two classes, a page each, less sodium's canary.
        let token = try #require(try arena.allocate(count: 900))
        let key = try #require(try arena.allocate(count: 32))
        #expect(arena.regionBytesInAll == 2 * (page - 16))
        // 2,000 more keys (64-byte slots, 63 to a page): regions of 1, 2, 4,
        // 8, 16 and 32 pages, 128 KiB being the largest.
        let keys = try (0..<2_000).map { _ in try #require(try arena.allocate(count: 32)) }
        #expect(arena.regionBytesInAll == (page - 16) + (1 + 2 + 4 + 8 + 16 + 32) * page - 6 * 16)
        #expect(SecretArena.regionBytes(slot: 64, last: 32 * page - 16) == 32 * page - 16)
        // The largest slot: two pages do not hold it and sodium's canary.
        #expect(SecretArena.regionBytes(slot: SecretArena.largestSlot, last: 0) == 3 * page - 16)
        for slot in keys { arena.free(slot, count: 32) }
        arena.free(key, count: 32)
        arena.free(token, count: 900)
    }

    @Test func aRegionLocksNoPageForSodiumsCanary() throws {
        let arena = SecretArena()
        let key = try #require(try arena.allocate(count: 32))
        defer { arena.free(key, count: 32) }
        // The mapping that holds the key is the region's one page: asked
        // for a whole page, sodium_malloc would have mapped two.
        let address = UInt(bitPattern: key)
        #expect(try #require(mappingBytes(at: address)) == SecretArena.pageBytes)
    }

    @Test func roundTripsEverySizeClassBoundary() throws {
        var counts: Set = [0, 1, SecretArena.largestCount, SecretArena.largestCount + 1, 3 * SecretArena.largestSlot]
        var slot = SecretArena.smallestSlot
        while slot <= SecretArena.largestSlot {
            // A class holds up to `slot - canaryBytes` bytes.
            let limit = slot - SecretArena.canaryBytes
            counts.formUnion([limit - 1, limit, limit + 1, slot - 1, slot, slot + 1])
            slot <<= 1
        }
        #expect(SecretArena.slotBytes(forCount: SecretArena.largestCount) == SecretArena.largestSlot)
        #expect(SecretArena.slotBytes(forCount: SecretArena.largestCount + 1) == nil)
        #expect(SecretArena.slotBytes(forCount: 16) == 32)
        #expect(SecretArena.slotBytes(forCount: 17) == 64)
        // Neighbouring slots of every class, each filled to its last byte.
        let secrets = try counts.sorted().flatMap { count in
            try (0..<3).map { copy in (try #require(try makeSecret(count &* 3 &+ copy, count: count)), count &* 3 &+ copy, count) }
        }
        for (secret, id, count) in secrets {
            #expect(holds(secret, id, count: count), "\(count) bytes")
            let bytes = secret.withUnsafeBytes { Array($0) }
            #expect(try SecretBytes(copying: bytes) == secret)
        }
    }

    @Test func freedSlotIsZeroed() throws {
        let arena = SecretArena()
        let slot = try #require(try arena.allocate(count: 20))
        let bytes = UnsafeMutableRawBufferPointer(start: slot, count: 32)
        #expect(bytes.allSatisfy { $0 == 0 } == false, "the canary follows the secret")
        for index in 0..<20 { bytes[index] = 0xA5 }
        arena.free(slot, count: 20)
        // The arena keeps its regions mapped, and nothing else uses this one.
        #expect(bytes.allSatisfy { $0 == 0 })
        #expect(try arena.allocate(count: 20) == slot, "the freed slot is handed out again")
    }

    @Test func overrunStopsTheProcessWithoutShowingBytes() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let arena = SecretArena()
            let count = 20
            guard let slot = try? arena.allocate(count: count) else { return }
            for index in 0..<count { slot.storeBytes(of: UInt8(ascii: "Q"), toByteOffset: index, as: UInt8.self) }
            let first = slot.load(fromByteOffset: count, as: UInt8.self)
            slot.storeBytes(of: ~first, toByteOffset: count, as: UInt8.self)
            arena.free(slot, count: count)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("buffer overrun"))
        #expect(!stderr.contains("QQQQ"))
    }

    @Test func manyTasksAllocateAndFreeAtOnce() async throws {
        try await withThrowingTaskGroup { group in
            for task in 0..<16 {
                group.addTask {
                    var live: [(SecretBytes, Int, Int)] = []
                    for step in 0..<2_000 {
                        let id = task &* 100_000 &+ step
                        let count = id % 300
                        live.append((try #require(try makeSecret(id, count: count)), id, count))
                        if live.count > 8 {
                            let (secret, id, count) = live.removeFirst()
                            #expect(holds(secret, id, count: count))
                        }
                    }
                    #expect(live.allSatisfy { holds($0.0, $0.1, count: $0.2) })
                }
            }
            try await group.waitForAll()
        }
    }
}
