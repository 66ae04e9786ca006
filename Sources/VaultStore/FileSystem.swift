import Glibc
import VaultProtocol

/// The few file operations the vault needs, done the durable way.
public enum FileSystem {
    /// Creates `path` and any missing parents, each new one mode 0700.
    /// Folders that exist are left as they are.
    public static func createDirectories(_ path: String) throws(StoreError) {
        var built = path.hasPrefix("/") ? "" : "."
        for component in path.split(separator: "/") {
            built += "/" + component
            if mkdir(built, 0o700) != 0 && errno != EEXIST {
                throw StoreError(.io, "cannot create \(built): \(Self.reason())")
            }
        }
    }

    /// Creates `path` and its parents, and makes sure the folder itself is
    /// the user's and mode 0700. Only for tokenvault's own folders, once
    /// `PrivateFolder.check` has found the path to them trustworthy: this
    /// makes the vault's own folder private; that refuses a path another
    /// user could change, which vaultd cannot and must not repair.
    public static func ensurePrivateDirectory(_ path: String) throws(StoreError) {
        try Self.createDirectories(path)
        var info = stat()
        guard lstat(path, &info) == 0 else { throw StoreError(.io, "cannot inspect \(path): \(Self.reason())") }
        guard info.st_mode & S_IFMT == S_IFDIR else { throw StoreError(.io, "\(path) is not a folder") }
        guard info.st_uid == getuid() else { throw StoreError(.io, "\(path) belongs to another user") }
        if info.st_mode & 0o077 != 0, chmod(path, 0o700) != 0 {
            throw StoreError(.io, "cannot make \(path) private (mode 0700): \(Self.reason())")
        }
    }

    /// The file's bytes, or nil when it does not exist. Files over `limit` are refused.
    public static func read(_ path: String, limit: Int) throws(StoreError) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw StoreError(.io, "cannot open \(path): \(Self.reason())")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw StoreError(.io, "cannot inspect \(path): \(Self.reason())") }
        guard info.st_size <= limit else { throw StoreError(.corrupt, "\(path) is larger than \(limit) bytes") }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw StoreError(.io, "cannot read \(path): \(Self.reason())")
            }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
            guard bytes.count <= limit else { throw StoreError(.corrupt, "\(path) is larger than \(limit) bytes") }
        }
        return bytes
    }

    /// Replaces `path` with `bytes` so that a crash at any moment leaves
    /// either the old file or the new one: write a temporary file, fsync it,
    /// rename it over the old one, fsync the folder. The temporary file's
    /// name is new each time (`O_EXCL`), so two writers never share one.
    public static func writeAtomically(_ bytes: [UInt8], to path: String, mode: UInt32 = 0o600) throws(StoreError) {
        let mode = mode_t(mode)
        let temporary = path + ".tmp-" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode)
        guard fd >= 0 else { throw Self.failure("cannot create \(temporary)") }
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress?.advanced(by: written), $0.count - written) }
            if n < 0 {
                if errno == EINTR { continue }
                let failure = Self.failure("cannot write \(temporary)")
                close(fd)
                unlink(temporary)
                throw failure
            }
            written += n
        }
        if fchmod(fd, mode) != 0 || fsync(fd) != 0 {
            let failure = Self.failure("cannot flush \(temporary) to disk")
            close(fd)
            unlink(temporary)
            throw failure
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let failure = Self.failure("cannot replace \(path)")
            unlink(temporary)
            throw failure
        }
        try Self.syncDirectory(of: path)
    }

    /// Removes the temporary files `writeAtomically` left beside `path`
    /// when the process died mid-write (the file itself is whole either way).
    public static func removeTemporaries(of path: String) {
        let prefix = String(path.split(separator: "/").last ?? "") + ".tmp-"
        let directory = Self.directory(of: path)
        guard let stream = opendir(directory) else { return }
        defer { closedir(stream) }
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name.hasPrefix(prefix) { unlink(directory + "/" + name) }
        }
    }

    /// Removes `path`; true when it existed.
    public static func remove(_ path: String) throws(StoreError) -> Bool {
        if unlink(path) == 0 {
            try Self.syncDirectory(of: path)
            return true
        }
        if errno == ENOENT { return false }
        throw Self.failure("cannot remove \(path)")
    }

    static func syncDirectory(of path: String) throws(StoreError) {
        let directory = Self.directory(of: path)
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw StoreError(.io, "cannot open \(directory): \(Self.reason())") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw StoreError(.io, "cannot flush \(directory) to disk: \(Self.reason())") }
    }

    /// The folder `path` is in (`FilePaths.folder(of:)`).
    public static func directory(of path: String) -> String {
        FilePaths.folder(of: path)
    }

    static func reason() -> String { String(cString: strerror(errno)) }

    /// What a failed call on a file means, by `errno`: `what` and the system's reason.
    static func failure(_ what: String) -> StoreError {
        let code = errno
        return StoreError.system("\(what): \(String(cString: strerror(code)))", errno: code)
    }
}

/// An exclusive `flock` held for the life of the process: one daemon per vault.
public final class LockFile: Sendable {
    private let fd: Int32

    /// Takes the lock or throws at once; it never waits.
    public init(path: String) throws(StoreError) {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw StoreError(.io, "cannot open \(path): \(FileSystem.reason())") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let busy = errno == EWOULDBLOCK
            let reason = FileSystem.reason()
            close(fd)
            if busy { throw StoreError(.io, "another vaultd holds \(path)") }
            throw StoreError(.io, "cannot lock \(path): \(reason)")
        }
        self.fd = fd
    }

    deinit { close(self.fd) }
}
