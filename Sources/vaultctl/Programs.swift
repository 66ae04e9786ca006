import FoundationEssentials
import Glibc
import VaultProtocol

/// Other programs: the browser opener and the QR code printer.
enum Programs {
    /// The executable `name` on $PATH.
    static func find(_ name: String) -> String? {
        guard let path = TokenVault.environment("PATH") else { return nil }
        for directory in path.split(separator: ":") {
            let candidate = "\(directory)/\(name)"
            var info = stat()
            if stat(candidate, &info) == 0, info.st_mode & S_IFMT == S_IFREG, access(candidate, X_OK) == 0 {
                return candidate
            }
        }
        return nil
    }

    /// `text` as a QR code drawn for a terminal, when qrencode is installed.
    /// The text goes on stdin: on the command line, every user could read it.
    static func qrCode(_ text: String) -> [UInt8]? {
        guard let qrencode = Self.find("qrencode") else { return nil }
        return Self.output(qrencode, ["-t", "UTF8", "-o", "-"], input: text)
    }

    /// Starts `path` in its own process group (Ctrl-C here does not reach
    /// it), with stdin, stdout and stderr on /dev/null, and does not wait.
    static func launch(_ path: String, _ arguments: [String]) -> pid_t? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        return Self.spawn(path, arguments, &actions, newGroup: true)
    }

    /// Starts `path` in its own process group with `environment` added to
    /// vaultctl's, sharing its stdin, stdout and stderr, and does not wait.
    static func start(_ path: String, _ arguments: [String], environment: [String: String]) -> pid_t? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        return Self.spawn(path, arguments, &actions, newGroup: true, environment: environment)
    }

    /// What `path` writes on stdout when given `input` on stdin, when it
    /// exits 0 (stderr stays ours). `input` is small: written whole before
    /// the output is read.
    static func output(_ path: String, _ arguments: [String], input: String) -> [UInt8]? {
        // Socket pairs rather than pipes: SOCK_CLOEXEC, where pipe2 is not imported.
        var pipe: [Int32] = [-1, -1]
        var feed: [Int32] = [-1, -1]
        let kind = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard input.utf8.count <= 4096, socketpair(AF_UNIX, kind, 0, &pipe) == 0 else { return nil }
        guard socketpair(AF_UNIX, kind, 0, &feed) == 0 else {
            pipe.forEach { close($0) }
            return nil
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, feed[1], 0)
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 1)
        let pid = Self.spawn(path, arguments, &actions, newGroup: false)
        close(pipe[1])
        close(feed[1])
        defer { close(pipe[0]) }
        // Written before anything is read: 4 KiB fit in the socket's buffer.
        let bytes = Array(input.utf8)
        var offset = 0
        while pid != nil && offset < bytes.count {
            let n = bytes.withUnsafeBytes { send(feed[0], $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            offset += n
        }
        close(feed[0])
        guard let pid else { return nil }
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while output.count < 1 << 20 {
            let n = chunk.withUnsafeMutableBytes { read(pipe[0], $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            output.append(contentsOf: chunk[0..<n])
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // WIFEXITED and WEXITSTATUS, which Swift does not import.
        return status & 0x7F == 0 && (status >> 8) & 0xFF == 0 ? output : nil
    }

    private static func spawn(
        _ path: String,
        _ arguments: [String],
        _ actions: inout posix_spawn_file_actions_t,
        newGroup: Bool,
        environment: [String: String] = [:]
    ) -> pid_t? {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // The child starts with no signal blocked (watch blocks SIGCHLD to wait for it).
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var flags = Int16(POSIX_SPAWN_SETSIGMASK)
        if newGroup {
            flags |= Int16(POSIX_SPAWN_SETPGROUP)
            posix_spawnattr_setpgroup(&attributes, 0)
        }
        posix_spawnattr_setflags(&attributes, flags)
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let merged = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        let envp = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        guard posix_spawn(&pid, path, &actions, &attributes, argv, envp) == 0 else { return nil }
        return pid
    }
}
