import Glibc
public import VaultProtocol

extension TokenVault {
    /// The path of tokenvault's program `name` in the folder of the running
    /// executable (/proc/self/exe, links resolved): scripts/install.sh puts
    /// vaultctl and vaultctl-notify side by side, as a build does. Nil when
    /// /proc/self/exe cannot be read; the program itself may be missing.
    public static func program(_ name: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        let executable = String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let slash = executable.lastIndex(of: "/") else { return nil }
        return executable[...slash] + name
    }
}
