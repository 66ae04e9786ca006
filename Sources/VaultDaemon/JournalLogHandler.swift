import Glibc
package import Logging

/// Writes one line per message to stderr. Under systemd (`JOURNAL_STREAM`
/// set) each line starts with its syslog priority, `<6>`, which journald
/// reads as the level; elsewhere it starts with the level's name.
///
/// Metadata values are written as given: callers log codes, ids, account
/// names and pids, never secret bytes (`SecretBytes` prints as redacted).
package struct JournalLogHandler: LogHandler {
    package var logLevel: Logger.Level
    package var metadata: Logger.Metadata = [:]
    private let label: String
    private let journal: Bool

    package init(label: String, level: Logger.Level) {
        self.label = label
        self.logLevel = level
        self.journal = getenv("JOURNAL_STREAM") != nil
    }

    package subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    package func log(event: LogEvent) {
        var merged = self.metadata
        if let extra = event.metadata { merged.merge(extra) { _, new in new } }
        let fields = merged.sorted { $0.key < $1.key }.map { " \($0.key)=\($0.value)" }.joined()
        let prefix = self.journal ? "<\(Self.priority(event.level))>" : "\(self.label): \(event.level): "
        let line = prefix + "\(event.message)" + fields + "\n"
        var bytes = Array(line.utf8)
        bytes.withUnsafeMutableBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = write(2, buffer.baseAddress?.advanced(by: offset), buffer.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return }
                offset += n
            }
        }
    }

    private static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }
}
