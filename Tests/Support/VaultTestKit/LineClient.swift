import Foundation
import Glibc
import VaultClient

/// A raw line client: writes bytes, reads lines, with a receive deadline so
/// a missing answer fails the test instead of hanging it.
package final class LineClient: @unchecked Sendable {
    package let fd: Int32
    private var buffer: [UInt8] = []

    /// Connects as vaultctl does (`VaultConnection`: the address, and the
    /// server's uid checked before a byte is sent), then takes the socket.
    package init(path: String, timeoutSeconds: Int = 30) throws {
        let fd = try VaultConnection(path: path).detach()
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        self.fd = fd
    }

    deinit { close(self.fd) }

    package func send(_ text: String) { self.send(Array(text.utf8)) }

    package func send(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(self.fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            offset += n
        }
    }

    /// The next line, or nil at end of stream, on error or at the deadline.
    package func readLine() async -> String? {
        await blocking { self.blockingReadLine() }
    }

    private func blockingReadLine() -> String? {
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            if let newline = self.buffer.firstIndex(of: 0x0A) {
                let line = String(decoding: self.buffer[..<newline], as: UTF8.self)
                self.buffer.removeSubrange(...newline)
                return line
            }
            let n = recv(self.fd, &chunk, chunk.count, 0)
            if n <= 0 { return nil }
            self.buffer.append(contentsOf: chunk[0..<n])
        }
    }

    /// The next line as a JSON object.
    package func readObject() async -> [String: Any]? {
        guard let line = await self.readLine(), let data = line.data(using: .utf8) else { return nil }
        return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
    }

    package func call(_ text: String) async -> [String: Any]? {
        self.send(text + "\n")
        return await self.readObject()
    }
}

extension Dictionary where Key == String, Value == Any {
    package var errorCode: String? { (self["error"] as? [String: Any])?["code"] as? String }
}
