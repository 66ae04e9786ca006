/// Paths taken apart the one way vaultd, its stores and vaultctl do.
public enum FilePaths {
    /// The folder `path` is in: "." for a bare name, "/" for one at the root.
    public static func folder(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }
}
