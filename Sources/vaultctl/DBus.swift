import FoundationEssentials
import Glibc
import VaultProtocol

/// The little of the D-Bus wire protocol (the D-Bus Specification,
/// "Message Protocol" and "Authentication Protocol") that `vaultctl notify`
/// speaks to the session bus: EXTERNAL authentication, method calls with
/// string, integer and array arguments, and the signals of
/// org.freedesktop.Notifications. vaultctl is a static executable, which
/// cannot load libdbus; this is the part of it one command needs.
final class DBusConnection {
    enum Failure: Error, CustomStringConvertible {
        case noBus(String)
        case refused(String)
        case protocolError(String)
        case flooded
        case closed

        var description: String {
            switch self {
            case .noBus(let reason): "no session bus (\(reason))"
            case .refused(let name): "the session bus answered \(name)"
            case .protocolError(let what): "the session bus broke the protocol (\(what))"
            case .flooded: "more than \(DBusConnection.maximumPending) signals came unread while a call waited for its reply; closed"
            case .closed: "the session bus closed the connection"
            }
        }
    }

    /// A message as read: its kind, the header fields this client reads, and its body.
    struct Message {
        var type: UInt8
        var serial: UInt32
        var replySerial: UInt32?
        /// The unique name (`:1.42`) of the connection that sent it, as the
        /// bus writes it: what tells a signal of one peer from another's
        /// with the same interface and member.
        var sender: String?
        var interface: String?
        var member: String?
        var errorName: String?
        var signature: String
        var body: Reader
    }

    private var fd: Int32
    private var buffer: [UInt8] = []
    private var serial: UInt32 = 0
    /// Signals of `signalsFrom` that arrived while a call waited for its reply.
    private var pending: [Message] = []
    /// Why the connection is of no more use, once it is not.
    private var failure: Failure?
    /// Messages past this size are refused rather than buffered.
    private static let maximumMessageBytes = 1 << 20
    /// How many signals may wait in `pending` before the connection gives
    /// up (`flooded`) rather than grow: far more than a notification
    /// service sends while one call waits.
    static let maximumPending = 256

    /// The one peer whose signals this connection keeps, by unique name
    /// (nil: nobody's yet). Any peer on the bus can address a signal to
    /// this connection, whatever its match rules; others' are dropped as
    /// they are read and never kept, so a peer that keeps sending can make
    /// this client read but neither fill its memory nor pass for the one.
    var signalsFrom: String?
    /// The sender of the first signal dropped for coming from another peer
    /// (the bus's own, such as NameAcquired, aside): for a line on stderr.
    private(set) var firstStranger: String?

    var descriptor: Int32 { self.fd }

    /// Connects to the session bus named by `DBUS_SESSION_BUS_ADDRESS`, else
    /// `$XDG_RUNTIME_DIR/bus` (where systemd's user bus listens); never
    /// starts one.
    init(environment: [String: String]) throws(Failure) {
        guard let path = Self.socketPath(environment) else {
            throw .noBus("neither DBUS_SESSION_BUS_ADDRESS nor $XDG_RUNTIME_DIR/bus names one")
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0, let address = UnixAddress(path, abstractAt: true) else { throw .noBus("cannot make a socket for \(path)") }
        guard address.withSockaddr({ connect(fd, $0, $1) }) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw .noBus("\(path): \(reason)")
        }
        // A bus or service that stops answering ends the connection after
        // 5 s instead of holding `notify` (and its reminders) for ever.
        var limit = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        self.fd = fd
        do {
            try self.authenticate()
            _ = try self.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus", member: "Hello")
        } catch {
            close(fd)
            self.fd = -1
            throw error
        }
    }

    deinit {
        if self.fd >= 0 { close(self.fd) }
    }

    /// The socket of the first `unix:path=` or `unix:abstract=` address (an
    /// abstract one with a leading `@`), or the systemd user bus.
    static func socketPath(_ environment: [String: String]) -> String? {
        if let addresses = environment["DBUS_SESSION_BUS_ADDRESS"], !addresses.isEmpty {
            for address in addresses.split(separator: ";") where address.hasPrefix("unix:") {
                for pair in address.dropFirst(5).split(separator: ",") {
                    let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
                    guard parts.count == 2, let value = Self.unescaped(parts[1]) else { continue }
                    if parts[0] == "path" { return value }
                    if parts[0] == "abstract" { return "@" + value }
                }
            }
            return nil
        }
        guard let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty else { return nil }
        let path = runtime + "/bus"
        return access(path, F_OK) == 0 ? path : nil
    }

    /// An address value with its `%XX` escapes undone.
    private static func unescaped(_ value: String) -> String? {
        var bytes: [UInt8] = []
        var input = Array(value.utf8)[...]
        while let byte = input.popFirst() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard input.count >= 2, let high = Self.hex(input.removeFirst()), let low = Self.hex(input.removeFirst()) else { return nil }
            bytes.append(high << 4 | low)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func hex(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    // MARK: Authentication

    /// SASL EXTERNAL with this process's uid, which the bus reads from the socket.
    private func authenticate() throws(Failure) {
        let digits = Array("0123456789abcdef".utf8)
        let uid = String(decoding: String(geteuid()).utf8.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 15)]] }, as: UTF8.self)
        try self.write(Array("\0AUTH EXTERNAL \(uid)\r\n".utf8))
        let answer = try self.readAuthLine()
        guard answer.hasPrefix("OK ") else { throw .refused("authentication: \(answer.prefix(64))") }
        try self.write(Array("BEGIN\r\n".utf8))
    }

    private func readAuthLine() throws(Failure) -> String {
        while true {
            if let end = self.buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: self.buffer[..<end].filter { $0 != UInt8(ascii: "\r") }, as: UTF8.self)
                self.buffer.removeSubrange(...end)
                return line
            }
            guard self.buffer.count < 4096 else { throw .protocolError("an authentication line too long") }
            try self.fill()
        }
    }

    // MARK: Calls

    /// Calls `member` and waits for its reply (signals of `signalsFrom`
    /// that come meanwhile are kept for `readSignals`, up to `maximumPending`).
    @discardableResult
    func call(
        destination: String,
        path: String,
        interface: String,
        member: String,
        signature: String = "",
        arguments: (inout Writer) -> Void = { _ in }
    ) throws(Failure) -> Message {
        if let failure = self.failure { throw failure }
        let serial = try self.send(destination: destination, path: path, interface: interface, member: member, signature: signature, arguments: arguments)
        while true {
            let message = try self.read()
            // A reply is a method return or an error, which the bus lets only
            // the called peer send; a signal can carry any reply serial.
            guard message.type == 2 || message.type == 3, message.replySerial == serial else {
                if self.keeps(message) {
                    guard self.pending.count < Self.maximumPending else {
                        self.pending = []
                        self.failure = .flooded
                        throw .flooded
                    }
                    self.pending.append(message)
                }
                continue
            }
            if message.type == 3 { throw .refused(message.errorName ?? "an error") }
            return message
        }
    }

    private func send(
        destination: String,
        path: String,
        interface: String,
        member: String,
        signature: String,
        arguments: (inout Writer) -> Void
    ) throws(Failure) -> UInt32 {
        self.serial &+= 1
        if self.serial == 0 { self.serial = 1 }
        var body = Writer()
        arguments(&body)
        var message = Writer()
        message.byte(UInt8(ascii: "l"))
        message.byte(1)  // METHOD_CALL
        message.byte(0)
        message.byte(1)  // protocol version
        message.uint32(UInt32(body.bytes.count))
        message.uint32(self.serial)
        message.array(alignment: 8) { fields in
            fields.field(1, "o", path) { $0.string(path) }
            fields.field(6, "s", destination) { $0.string(destination) }
            fields.field(2, "s", interface) { $0.string(interface) }
            fields.field(3, "s", member) { $0.string(member) }
            if !signature.isEmpty { fields.field(8, "g", signature) { $0.signature(signature) } }
        }
        message.pad(to: 8)
        try self.write(message.bytes + body.bytes)
        return self.serial
    }

    /// The signals of `signalsFrom` kept, buffered, and in one read of the
    /// socket when it is readable now; other messages are skipped. One read
    /// at most, so that a peer that keeps sending cannot hold the caller
    /// here: what it sent after is for the next call.
    func readSignals() throws(Failure) -> [Message] {
        if let failure = self.failure { throw failure }
        var signals = self.pending
        self.pending = []
        var read = false
        while true {
            if let message = try self.parse() {
                if self.keeps(message) { signals.append(message) }
                continue
            }
            var ready = pollfd(fd: self.fd, events: Int16(POLLIN), revents: 0)
            guard !read, poll(&ready, 1, 0) > 0 else { return signals }
            try self.fill()
            read = true
        }
    }

    /// Whether `message` is a signal of `signalsFrom` (else noted in `firstStranger`).
    private func keeps(_ message: Message) -> Bool {
        guard message.type == 4 else { return false }
        if let sender = message.sender, sender == self.signalsFrom { return true }
        if self.firstStranger == nil, message.sender != "org.freedesktop.DBus" { self.firstStranger = message.sender ?? "a peer" }
        return false
    }

    /// Whether a whole message waits in memory (poll would not say so).
    var hasBuffered: Bool { !self.pending.isEmpty || ((try? self.messageLength()) ?? nil).map { self.buffer.count >= $0 } == true }

    // MARK: Reading

    private func read() throws(Failure) -> Message {
        while true {
            if let message = try self.parse() { return message }
            try self.fill()
        }
    }

    /// The whole length of the message at the buffer's head, once its fixed header is in.
    private func messageLength() throws(Failure) -> Int? {
        guard self.buffer.count >= 16 else { return nil }
        let little = self.buffer[0] == UInt8(ascii: "l")
        guard little || self.buffer[0] == UInt8(ascii: "B") else { throw .protocolError("an unknown byte order") }
        let bodyLength = Int(Reader.uint32(self.buffer, at: 4, little: little))
        let fieldsLength = Int(Reader.uint32(self.buffer, at: 12, little: little))
        let total = 16 + (fieldsLength + 7) / 8 * 8 + bodyLength
        guard total <= Self.maximumMessageBytes else { throw .protocolError("a message of \(total) bytes") }
        return total
    }

    private func parse() throws(Failure) -> Message? {
        guard let total = try self.messageLength(), self.buffer.count >= total else { return nil }
        let bytes = Array(self.buffer[..<total])
        self.buffer.removeSubrange(..<total)
        let little = bytes[0] == UInt8(ascii: "l")
        let fieldsLength = Int(Reader.uint32(bytes, at: 12, little: little))
        var message = Message(
            type: bytes[1],
            serial: Reader.uint32(bytes, at: 8, little: little),
            signature: "",
            body: Reader(bytes: [], little: little)
        )
        var fields = Reader(bytes: bytes, little: little, position: 16)
        let fieldsEnd = 16 + fieldsLength
        while fields.position < fieldsEnd {
            fields.align(8)
            guard fields.position < fieldsEnd else { break }
            guard let code = fields.byte(), let signature = fields.signature() else { throw .protocolError("a header field") }
            switch signature {
            case "s", "o":
                guard let value = fields.string() else { throw .protocolError("a header string") }
                switch code {
                case 2: message.interface = value
                case 3: message.member = value
                case 4: message.errorName = value
                case 7: message.sender = value
                default: break
                }
            case "g":
                guard let value = fields.signature() else { throw .protocolError("a header signature") }
                if code == 8 { message.signature = value }
            case "u":
                guard let value = fields.uint32() else { throw .protocolError("a header number") }
                if code == 5 { message.replySerial = value }
            default:
                throw .protocolError("a header field of type \(signature)")
            }
        }
        message.body = Reader(bytes: Array(bytes[((fieldsEnd + 7) / 8 * 8)...]), little: little)
        return message
    }

    private func fill() throws(Failure) {
        var chunk = [UInt8](repeating: 0, count: 8192)
        while true {
            let n = recv(self.fd, &chunk, chunk.count, 0)
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw .closed }
            self.buffer.append(contentsOf: chunk[..<n])
            return
        }
    }

    private func write(_ bytes: [UInt8]) throws(Failure) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(self.fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw .closed }
            offset += n
        }
    }
}

/// Marshals values, each aligned as the D-Bus wire format wants, little-endian.
struct Writer {
    private(set) var bytes: [UInt8] = []

    mutating func pad(to alignment: Int) {
        while self.bytes.count % alignment != 0 { self.bytes.append(0) }
    }

    mutating func byte(_ value: UInt8) { self.bytes.append(value) }

    mutating func uint32(_ value: UInt32) {
        self.pad(to: 4)
        withUnsafeBytes(of: value.littleEndian) { self.bytes.append(contentsOf: $0) }
    }

    mutating func int32(_ value: Int32) { self.uint32(UInt32(bitPattern: value)) }

    mutating func string(_ value: String) {
        let utf8 = Array(value.utf8)
        self.uint32(UInt32(utf8.count))
        self.bytes.append(contentsOf: utf8)
        self.bytes.append(0)
    }

    mutating func signature(_ value: String) {
        let utf8 = Array(value.utf8)
        self.bytes.append(UInt8(utf8.count))
        self.bytes.append(contentsOf: utf8)
        self.bytes.append(0)
    }

    /// An array whose elements align to `alignment`: its length counts
    /// from the first element, after the padding before it.
    mutating func array(alignment: Int, _ elements: (inout Writer) -> Void) {
        self.uint32(0)
        let lengthAt = self.bytes.count - 4
        self.pad(to: alignment)
        let start = self.bytes.count
        elements(&self)
        let length = UInt32(self.bytes.count - start).littleEndian
        withUnsafeBytes(of: length) { self.bytes.replaceSubrange(lengthAt..<lengthAt + 4, with: $0) }
    }

    /// A header field: a struct of its code and a variant.
    mutating func field(_ code: UInt8, _ signature: String, _ value: String, _ write: (inout Writer) -> Void) {
        self.pad(to: 8)
        self.byte(code)
        self.signature(signature)
        write(&self)
    }
}

/// Reads values of a message body or header.
struct Reader {
    let bytes: [UInt8]
    let little: Bool
    var position = 0

    static func uint32(_ bytes: [UInt8], at offset: Int, little: Bool) -> UInt32 {
        let value = bytes[offset..<offset + 4].reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        return little ? value : value.byteSwapped
    }

    mutating func align(_ alignment: Int) {
        self.position = (self.position + alignment - 1) / alignment * alignment
    }

    mutating func byte() -> UInt8? {
        guard self.position < self.bytes.count else { return nil }
        defer { self.position += 1 }
        return self.bytes[self.position]
    }

    mutating func uint32() -> UInt32? {
        self.align(4)
        guard self.position + 4 <= self.bytes.count else { return nil }
        defer { self.position += 4 }
        return Self.uint32(self.bytes, at: self.position, little: self.little)
    }

    mutating func string() -> String? {
        guard let length = self.uint32().map(Int.init), self.position + length < self.bytes.count else { return nil }
        defer { self.position += length + 1 }
        return String(decoding: self.bytes[self.position..<self.position + length], as: UTF8.self)
    }

    mutating func signature() -> String? {
        guard let length = self.byte().map(Int.init), self.position + length < self.bytes.count else { return nil }
        defer { self.position += length + 1 }
        return String(decoding: self.bytes[self.position..<self.position + length], as: UTF8.self)
    }
}
