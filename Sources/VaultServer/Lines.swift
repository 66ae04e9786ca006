import NIOCore
import VaultProtocol

extension ByteBufferAllocator {
    /// `response` as one line of the protocol, its newline included: every
    /// reply and every last word the socket layer writes.
    func line(for response: Response) -> ByteBuffer {
        self.line(LineCodec.line(for: response))
    }

    /// `event` as one line of the protocol, its newline included.
    func line(for event: Event) -> ByteBuffer {
        self.line(LineCodec.line(for: event))
    }

    private func line(_ bytes: some Collection<UInt8>) -> ByteBuffer {
        var buffer = self.buffer(capacity: bytes.count + 1)
        buffer.writeBytes(bytes)
        buffer.writeInteger(UInt8(ascii: "\n"))
        return buffer
    }
}
