import Glibc
import VaultProtocol

/// An address opened in the person's browser without putting it on a command
/// line, where every user of the machine can read it (/proc/PID/cmdline): a
/// sign-in address carries the flow's state, nonce and PKCE challenge, a
/// sign-out address the ID token. vaultctl writes a page that sends the
/// browser on to the address, 0600 in a fresh 0700 folder of the user's (in
/// $XDG_RUNTIME_DIR, else /tmp), and gives `xdg-open` only the page's path.
struct BrowserPage {
    let folder: String
    let path: String
    /// The `xdg-open` process, for the caller to reap.
    let opener: pid_t
    /// The process that removes the page after a while, whatever becomes of
    /// vaultctl (the page lives at most that long).
    let remover: pid_t?

    /// Opens `url` in the browser when there is a display and `xdg-open`,
    /// and removes the page in `seconds` at the latest (a browser that starts
    /// slowly may read it after vaultctl has ended); nil when not opened.
    static func open(_ url: String, removedAfter seconds: Int) -> BrowserPage? {
        guard TokenVault.environment("DISPLAY") != nil || TokenVault.environment("WAYLAND_DISPLAY") != nil,
            let opener = Programs.find("xdg-open"), let folder = Self.makeFolder()
        else { return nil }
        let path = folder + "/open.html"
        guard Self.write(Self.page(url), to: path), let pid = Programs.launch(opener, [Self.fileURL(path)]) else {
            unlink(path)
            rmdir(folder)
            return nil
        }
        // In its own process group (launch), so `remove` can end the sleep too.
        let script = "sleep \(seconds); rm -f -- \"$0\"; rmdir -- \"$1\""
        let remover = Programs.launch("/bin/sh", ["-c", script, path, folder])
        return BrowserPage(folder: folder, path: path, opener: pid, remover: remover)
    }

    /// Removes the page now, and the process that would have later.
    func remove() {
        unlink(self.path)
        rmdir(self.folder)
        if let remover = self.remover {
            kill(-remover, SIGTERM)
            while waitpid(remover, nil, 0) < 0 && errno == EINTR {}
        }
    }

    /// A new 0700 folder: mkdtemp makes it, owned by the user, in
    /// $XDG_RUNTIME_DIR when that is the user's own private folder.
    private static func makeFolder() -> String? {
        var base = "/tmp"
        if let runtime = TokenVault.environment("XDG_RUNTIME_DIR"), runtime.hasPrefix("/") {
            var info = stat()
            if lstat(runtime, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == getuid(),
                info.st_mode & 0o022 == 0
            {
                base = runtime
            }
        }
        var template = Array((base + "/tokenvault-open-XXXXXX").utf8CString)
        return template.withUnsafeMutableBufferPointer { buffer in
            mkdtemp(buffer.baseAddress!).map { String(cString: $0) }
        }
    }

    private static func write(_ text: String, to path: String) -> Bool {
        let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            offset += n
        }
        return true
    }

    /// A page that goes on to `url` at once, with a link for a browser that
    /// does not follow the refresh.
    static func page(_ url: String) -> String {
        let href = url.escapingHTML
        return """
            <!DOCTYPE html>
            <html><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
            <meta http-equiv="refresh" content="0; url=\(href)">
            <title>tokenvault</title></head>
            <body><p><a href="\(href)">Continue to the issuer</a></p></body></html>

            """
    }

    /// `file://` and the path, its bytes other than letters, digits and
    /// `/-._~` percent-encoded.
    private static func fileURL(_ path: String) -> String {
        var url = "file://"
        for byte in path.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "/"), UInt8(ascii: "-"), UInt8(ascii: "."),
                UInt8(ascii: "_"), UInt8(ascii: "~"):
                url.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                let hex = String(byte, radix: 16, uppercase: true)
                url += "%" + (hex.count == 1 ? "0" : "") + hex
            }
        }
        return url
    }
}
