import CSystemd
import Glibc
import VaultClient

/// The desktop's notification service (org.freedesktop.Notifications), on
/// the session bus through sd-bus.
///
/// Nothing here waits: `show` and `close` send their call and return, and
/// what comes in (the service's signals, `Notify`'s answers) is read one
/// message at a time as `serve` is called from `Notifier`'s poll loop, and
/// collected for `take`. A synchronous call would keep every message that
/// arrives while it waits in memory, as many as a peer cares to send.
final class Desktop {
    enum Signal {
        case action(UInt32, String)
        case closed(UInt32)
    }

    enum Event {
        case signal(Signal)
        /// The answer to the `show` that returned `call`: the notification's
        /// id, or why there is none (a refusal, no answer in time, the bus gone).
        case shown(call: UInt64, Result<UInt32, Failure>)
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    private let bus: OpaquePointer
    private var events: [Event] = []
    /// The unique name (`:1.42`) of the peer that answered `Notify`: its
    /// actions and dismissals are the only ones that count. Any other peer
    /// on the bus can send the same signals (a `dbus-send` would start a
    /// sign-in); nil: nobody's yet.
    private var service: String?
    /// Whether the first signal of another peer than the service was said on stderr.
    private var saidStranger = false
    /// Whether sd-bus said the connection is over.
    private var disconnected = false

    private static let name = "org.freedesktop.Notifications"
    private static let path = "/org/freedesktop/Notifications"
    /// How long `Notify` may go unanswered before it counts as refused.
    private static let answerWithin: UInt64 = 5_000_000  // µs
    /// Messages `serve` handles at most before it lets vaultd's events have a turn.
    private static let messagesPerTurn = 64

    private init(bus: OpaquePointer) {
        self.bus = bus
    }

    deinit {
        sd_bus_close_unref(self.bus)
    }

    /// The service, or nil when there is no session bus (said on stderr).
    /// The bus is the one of `DBUS_SESSION_BUS_ADDRESS`, else of
    /// `$XDG_RUNTIME_DIR/bus` (where systemd's user bus listens); one is
    /// never started.
    static func connect() -> Desktop? {
        var opened: OpaquePointer?
        let result = sd_bus_open_user(&opened)
        guard result >= 0, let bus = opened else {
            Output.error("no session bus (\(Self.whereTheBusIs()): \(Self.text(result))); printing instead")
            return nil
        }
        let desktop = Desktop(bus: bus)
        let userdata = Unmanaged.passUnretained(desktop).toOpaque()
        // Every message that is no reply to a call comes through `received`.
        var added = sd_bus_add_filter(bus, nil, { message, userdata, _ in
            Unmanaged<Desktop>.fromOpaque(userdata!).takeUnretainedValue().received(message)
        }, userdata)
        // The broker routes the service's broadcasts here (it matches
        // `sender` against the name's owner); a signal addressed to this
        // connection comes whatever the rule, and `received` drops it. Sent
        // without waiting for the broker's answer (a refusal closes the bus).
        if added >= 0 {
            added = sd_bus_match_signal_async(bus, nil, Self.name, Self.path, Self.name, nil, { _, _, _ in 0 }, nil, nil)
        }
        guard added >= 0 else {
            Output.error("the session bus cannot be followed (\(Self.text(added))); printing instead")
            return nil
        }
        return desktop
    }

    /// The descriptor to poll, the events to poll it for, and when sd-bus
    /// wants `serve` called anyway (a call's time limit; CLOCK_MONOTONIC
    /// seconds, nil: never).
    var descriptor: Int32 { sd_bus_get_fd(self.bus) }
    var pollEvents: Int16 {
        let events = sd_bus_get_events(self.bus)
        return Int16(events < 0 ? Int32(POLLIN) : events)
    }
    var due: Double? {
        var usec: UInt64 = 0
        guard sd_bus_get_timeout(self.bus, &usec) >= 0, usec != UInt64.max else { return nil }
        return Double(usec) / 1e6
    }

    /// Shows a notification with a "Sign in" action, in place of
    /// `replacing` when it still shows; its id comes later, as
    /// `.shown(call:)` with the number returned here.
    func show(summary: String, body: String, replacing: UInt32) throws(Failure) -> UInt64 {
        var created: OpaquePointer?
        try Self.check(sd_bus_message_new_method_call(self.bus, &created, Self.name, Self.path, Self.name, "Notify"))
        guard let message = created else { throw Failure(description: "no message") }
        defer { sd_bus_message_unref(message) }
        try Self.check(Self.append(message, "tokenvault"))
        try Self.check(Self.append(message, replacing))
        try Self.check(Self.append(message, "dialog-password"))
        try Self.check(Self.append(message, summary))
        try Self.check(Self.append(message, body))
        try Self.check(sd_bus_message_open_container(message, Self.type("a"), "s"))
        for action in ["default", "Sign in", "signin", "Sign in"] { try Self.check(Self.append(message, action)) }
        try Self.check(sd_bus_message_close_container(message))
        try Self.check(sd_bus_message_open_container(message, Self.type("a"), "{sv}"))  // no hints
        try Self.check(sd_bus_message_close_container(message))
        var expires: Int32 = 0  // never: the reminder replaces it
        try Self.check(sd_bus_message_append_basic(message, Self.type("i"), &expires))
        let userdata = Unmanaged.passUnretained(self).toOpaque()
        try Self.check(sd_bus_call_async(self.bus, nil, message, { reply, userdata, _ in
            Unmanaged<Desktop>.fromOpaque(userdata!).takeUnretainedValue().answered(reply)
            return 0
        }, userdata, Self.answerWithin))
        var call: UInt64 = 0
        try Self.check(sd_bus_message_get_cookie(message, &call))
        return call
    }

    /// `text` for a notification's body, which servers read as markup.
    static func markup(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            default: out.append(character)
            }
        }
        return out
    }

    /// Closes notification `id`, without waiting for (or asking for) an answer.
    func close(_ id: UInt32) {
        var created: OpaquePointer?
        guard sd_bus_message_new_method_call(self.bus, &created, Self.name, Self.path, Self.name, "CloseNotification") >= 0,
            let message = created
        else { return }
        defer { sd_bus_message_unref(message) }
        guard Self.append(message, id) >= 0, sd_bus_message_set_expect_reply(message, 0) >= 0 else { return }
        _ = sd_bus_send(self.bus, message, nil)
    }

    /// Lets sd-bus do what is due: write what waits, read and dispatch what
    /// came, `messagesPerTurn` messages at most, so that a peer that keeps
    /// sending cannot hold the caller here. True when there is more to do
    /// now; throws once the connection is over.
    func serve() throws(Failure) -> Bool {
        for _ in 0..<Self.messagesPerTurn {
            let result = sd_bus_process(self.bus, nil)
            if self.disconnected { throw Failure(description: "the session bus closed the connection") }
            if result < 0 { throw Failure(description: Self.text(result)) }
            if result == 0 { return false }
        }
        return true
    }

    /// What came in since the last call.
    func take() -> [Event] {
        defer { self.events = [] }
        return self.events
    }

    // MARK: Callbacks (from sd_bus_process)

    /// `Notify`'s answer, or the error sd-bus makes up when none comes in
    /// time or the bus goes away.
    private func answered(_ reply: OpaquePointer?) {
        guard let reply else { return }
        var call: UInt64 = 0
        guard sd_bus_message_get_reply_cookie(reply, &call) >= 0 else { return }
        if sd_bus_message_is_method_error(reply, nil) > 0 {
            let error = sd_bus_message_get_error(reply)?.pointee
            let name = error?.name.map { String(cString: $0) } ?? "an error"
            let message = error?.message.map { ": " + String(cString: $0) } ?? ""
            self.events.append(.shown(call: call, .failure(Failure(description: name + message))))
            return
        }
        var id: UInt32 = 0
        guard sd_bus_message_has_signature(reply, "u") > 0, sd_bus_message_read_basic(reply, Self.type("u"), &id) > 0 else {
            let signature = sd_bus_message_get_signature(reply, 1).map { String(cString: $0) } ?? ""
            self.events.append(.shown(call: call, .failure(Failure(description: "Notify answered '\(signature)'"))))
            return
        }
        self.service = sd_bus_message_get_sender(reply).map { String(cString: $0) }
        self.events.append(.shown(call: call, .success(id)))
    }

    /// Every message but the replies to calls: the service's actions and
    /// dismissals are kept, other peers' signals dropped (the first one said
    /// on stderr), and so are calls: nothing here is for others to call, and
    /// an answer to each would let a peer fill the outgoing queue. Returns 1
    /// for a message dealt with, 0 for sd-bus to go on.
    private func received(_ message: OpaquePointer?) -> Int32 {
        guard let message else { return 0 }
        var type: UInt8 = 0
        guard sd_bus_message_get_type(message, &type) >= 0, type == UInt8(SD_BUS_MESSAGE_SIGNAL) else { return 1 }
        // sd-bus's own: the connection is over (after the calls waiting were answered with errors).
        if sd_bus_message_is_signal(message, "org.freedesktop.DBus.Local", "Disconnected") > 0 {
            self.disconnected = true
            return 0
        }
        let sender = sd_bus_message_get_sender(message).map { String(cString: $0) }
        // The broker's own (NameAcquired) are nobody's to act on, and no stranger's.
        if sender == "org.freedesktop.DBus" { return 1 }
        guard let sender, sender == self.service else {
            if !self.saidStranger {
                Output.error("ignoring signals from \(sender ?? "a peer") on the session bus: only the notification service's are acted on")
                self.saidStranger = true
            }
            return 1
        }
        var id: UInt32 = 0
        if sd_bus_message_is_signal(message, Self.name, "ActionInvoked") > 0, sd_bus_message_has_signature(message, "us") > 0 {
            var key: UnsafePointer<CChar>?
            guard sd_bus_message_read_basic(message, Self.type("u"), &id) > 0, sd_bus_message_read_basic(message, Self.type("s"), &key) > 0,
                let key
            else { return 1 }
            self.events.append(.signal(.action(id, String(cString: key))))
        } else if sd_bus_message_is_signal(message, Self.name, "NotificationClosed") > 0, sd_bus_message_has_signature(message, "uu") > 0 {
            guard sd_bus_message_read_basic(message, Self.type("u"), &id) > 0 else { return 1 }
            self.events.append(.signal(.closed(id)))
        }
        return 1
    }

    // MARK: Helpers

    private static func type(_ code: Unicode.Scalar) -> CChar {
        CChar(UInt8(ascii: code))
    }

    private static func append(_ message: OpaquePointer, _ text: String) -> Int32 {
        text.withCString { sd_bus_message_append_basic(message, Self.type("s"), $0) }
    }

    private static func append(_ message: OpaquePointer, _ value: UInt32) -> Int32 {
        var value = value
        return sd_bus_message_append_basic(message, Self.type("u"), &value)
    }

    private static func check(_ result: Int32) throws(Failure) {
        if result < 0 { throw Failure(description: Self.text(result)) }
    }

    /// sd-bus's negative errno as words.
    private static func text(_ result: Int32) -> String {
        String(cString: strerror(-result))
    }

    /// Where sd_bus_open_user looked, for the line that says there is no bus.
    private static func whereTheBusIs() -> String {
        if let address = getenv("DBUS_SESSION_BUS_ADDRESS").map({ String(cString: $0) }) {
            return "DBUS_SESSION_BUS_ADDRESS='\(address)'"
        }
        if let runtime = getenv("XDG_RUNTIME_DIR").map({ String(cString: $0) }) {
            return runtime + "/bus"
        }
        return "neither DBUS_SESSION_BUS_ADDRESS nor XDG_RUNTIME_DIR is set"
    }
}
