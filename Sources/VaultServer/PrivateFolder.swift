import Glibc

/// The one rule for a folder whose contents vaultd trusts: the socket's, the
/// shares', the state folder (the sealed vault, its key) and the config
/// folder (accounts.json, which says where refresh tokens are sent).
public enum PrivateFolder {
    /// Makes `folder` (0700) when it is missing, then checks it and every
    /// folder above it, as OpenSSH's `safe_path` checks the folders of its key
    /// files, all the way to `/`: each must be a folder, not a symbolic link
    /// (none is followed), owned by the user (or root, for those above), and
    /// not writable by group or others. A root-owned sticky folder above, such
    /// as `/tmp`, passes: no one else can rename or remove what the user keeps
    /// in it. Checked from the top down, so once a folder passes no other
    /// user can change what the checks below it see. `role` names the folder
    /// in errors ("the socket's folder").
    public static func check(_ folder: String, role: String) throws(ServerError) {
        guard folder.hasPrefix("/") else {
            throw ServerError("\(role) must be an absolute path")
        }
        let components = folder.split(separator: "/")
        var path = ""
        for index in -1..<components.count {
            path += index < 0 ? "/" : (index == 0 ? "" : "/") + components[index]
            var info = stat()
            if lstat(path, &info) != 0 {
                guard errno == ENOENT, mkdir(path, 0o700) == 0 || errno == EEXIST, lstat(path, &info) == 0 else {
                    throw ServerError("cannot create \(role) \(path): \(String(cString: strerror(errno)))")
                }
            }
            try Self.check(path, info, role: role, isTheFolder: index == components.count - 1)
        }
    }

    /// A file vaultd reads and trusts, in a folder that passed `check`: when
    /// it exists, a regular file of the user's that no one else may write.
    public static func checkFile(_ path: String) throws(ServerError) {
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw ServerError("\(path) is not a regular file (vaultd follows no symbolic link); move it away")
        }
        guard info.st_uid == getuid() else {
            throw ServerError("\(path) belongs to uid \(info.st_uid), not to vaultd's user (uid \(getuid())); move it away")
        }
        guard info.st_mode & 0o022 == 0 else {
            throw ServerError(
                "\(path) is writable by its group or others (mode \(String(info.st_mode & 0o7777, radix: 8))), so another user could change it; run: chmod go-w \(path)"
            )
        }
    }

    private static func check(_ path: String, _ info: stat, role: String, isTheFolder: Bool) throws(ServerError) {
        let me = getuid()
        let mode = String(info.st_mode & 0o7777, radix: 8)
        guard info.st_mode & S_IFMT != S_IFLNK else {
            throw ServerError("\(path) is a symbolic link; vaultd follows none in the path of \(role): name the real folder")
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw ServerError("\(path) is not a folder; \(role) must be one")
        }
        if isTheFolder {
            guard info.st_uid == me else {
                throw ServerError(
                    "\(role) \(path) belongs to uid \(info.st_uid), not to vaultd's user (uid \(me)); choose a folder of your own"
                )
            }
        } else if info.st_uid != me && info.st_uid != 0 {
            throw ServerError(
                "\(path), above \(role), belongs to uid \(info.st_uid); every folder above it must be yours (uid \(me)) or root's"
            )
        }
        let sharedButSticky = !isTheFolder && info.st_uid == 0 && info.st_mode & S_ISVTX != 0
        guard info.st_mode & 0o022 == 0 || sharedButSticky else {
            throw ServerError(
                "\(path) is writable by its group or others (mode \(mode)), so another user could replace what \(role) holds; run: chmod go-w \(path)"
            )
        }
    }

}
