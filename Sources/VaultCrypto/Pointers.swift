/// libsodium declares its pointer arguments non-null even for empty inputs;
/// these hand it a valid address for a zero-length buffer.
/// libsodium never reads or writes through it for zero-length buffers.
nonisolated(unsafe) private let emptyByte = UnsafeMutablePointer<UInt8>.allocate(capacity: 1)

extension UnsafeRawBufferPointer {
    var bytes: UnsafePointer<UInt8> {
        self.baseAddress.map { $0.assumingMemoryBound(to: UInt8.self) } ?? UnsafePointer(emptyByte)
    }
}

extension UnsafeMutableRawBufferPointer {
    var mutableBytes: UnsafeMutablePointer<UInt8> {
        self.baseAddress.map { $0.assumingMemoryBound(to: UInt8.self) } ?? emptyByte
    }
}
