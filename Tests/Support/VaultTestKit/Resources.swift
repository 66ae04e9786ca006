import Foundation
import Glibc
package import Synchronization
import VaultStore

/// Runs blocking work (socket reads, waiting on a child process) on a thread
/// of its own, so it never ties up the cooperative pool that the in-process
/// daemon's tasks need. Not GCD: its pool grows by about one thread a second
/// while its threads block, which made parallel tests wait on each other.
package func blocking<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread { continuation.resume(returning: body()) }.start()
    }
}

/// A fresh temporary folder, short enough for socket paths (108 bytes).
package func temporaryFolder() throws -> String {
    let path = "/tmp/tv-" + String(UUID().uuidString.prefix(8)).lowercased()
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// The folder holding the built executables (vaultd, vaultctl): the test
/// bundle sits beside them.
package let productsDirectory: String = {
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    let exe = String(decoding: buffer[0..<max(n, 0)].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return FileSystem.directory(of: exe)
}()

/// Something a test starts and must stop before it ends: a daemon, an
/// issuer, a set-up of both.
package protocol Stoppable: Sendable {
    func stop() async
}

/// Runs `body` with `resource`, then stops it and awaits the stop, however
/// `body` ends: returning or throwing.
package func using<R: Stoppable, T>(_ resource: R, _ body: (R) async throws -> T) async throws -> T {
    let result: T
    do {
        result = try await body(resource)
    } catch {
        await resource.stop()
        throw error
    }
    await resource.stop()
    return result
}

/// Two resources, stopped in the reverse order.
package func using<A: Stoppable, B: Stoppable, T>(_ a: A, _ b: B, _ body: (A, B) async throws -> T) async throws -> T {
    try await using(a) { a in try await using(b) { b in try await body(a, b) } }
}

/// Three resources, stopped in the reverse order.
package func using<A: Stoppable, B: Stoppable, C: Stoppable, T>(
    _ a: A,
    _ b: B,
    _ c: C,
    _ body: (A, B, C) async throws -> T
) async throws -> T {
    try await using(a) { a in try await using(b, c) { b, c in try await body(a, b, c) } }
}

/// A value an escaping closure can share (a `Mutex` it cannot capture).
package final class Shared<Value: Sendable>: Sendable {
    package let value: Mutex<Value>
    package init(_ value: Value) { self.value = Mutex(value) }
}

/// The package's root folder, for its scripts.
package let packageRoot: String = {
    var path = #filePath
    for _ in 0..<4 { path = FileSystem.directory(of: path) }
    return path
}()

package struct ToolFailure: Error, CustomStringConvertible {
    package var message: String
    package var description: String { self.message }

    package init(message: String) {
        self.message = message
    }
}
