import Glibc
import Synchronization
import VaultClient
import VaultCrypto
import VaultProtocol

/// What a sign-in asks and shows at the terminal: the username, codes and
/// passwords (no echo), Ctrl-C, and the spinner while it waits. Every
/// question checks for Ctrl-C once answered.
struct SignInTerminal {
    /// stdin is a terminal (else codes and passwords come one per line of stdin).
    let interactive: Bool

    /// stderr is a terminal: a spinner and QR codes are drawn there.
    var drawsOnStderr: Bool { isatty(2) == 1 }

    /// The next code, without empty lines; throws at end of input.
    func askCode() throws(VaultError) -> SecretBytes {
        while true {
            let code: SecretBytes?
            do throws(SodiumError) {
                code = try Prompt.secretLine("Code (or r to send a new one): ") { !Self.isSpace($0) }
            } catch {
                throw Self.memoryError
            }
            try self.checkInterrupt()
            guard let code else {
                throw VaultError(
                    .endOfInput,
                    self.interactive
                        ? "no code was entered; the sign-in was cancelled"
                        : "stdin ended before the issuer accepted a code; the sign-in was cancelled"
                )
            }
            if code.count > 0 { return code }
        }
    }

    func askUsername() throws(VaultError) -> String {
        while true {
            let line = Prompt.line("Username: ")
            try self.checkInterrupt()
            guard let line else {
                throw VaultError(.endOfInput, "no username was entered; the sign-in was cancelled")
            }
            let username = String(line.drop(while: \.isWhitespace).reversed().drop(while: \.isWhitespace).reversed())
            if !username.isEmpty { return username }
        }
    }

    func askPassword() throws(VaultError) -> SecretBytes {
        while true {
            let password: SecretBytes?
            do throws(SodiumError) {
                password = try Prompt.secretLine("Password: ")
            } catch {
                throw Self.memoryError
            }
            try self.checkInterrupt()
            if let password, password.count > 0 { return password }
            if password == nil || !self.interactive {
                throw VaultError(
                    .endOfInput,
                    self.interactive ? "no password was entered; the sign-in was cancelled" : "stdin held no password"
                )
            }
        }
    }

    func checkInterrupt() throws(VaultError) {
        if Interrupt.requested {
            throw VaultError(.interrupted, "the sign-in was cancelled")
        }
    }

    /// A spinner for `activity`, when stderr is a terminal.
    func spinner(_ activity: String) -> Spinner? {
        self.drawsOnStderr ? Spinner(activity) : nil
    }

    /// "An 8-digit code was sent by email to a**@example.org."
    static func codeSent(_ result: SignInResult, again: Bool) -> String {
        let length = result.codeLength.map { "\($0)-digit " } ?? ""
        let article = again ? "A new" : (length.hasPrefix("8") || length.hasPrefix("11-") || length.hasPrefix("18-") ? "An" : "A")
        let channel: String
        switch result.channel {
        case nil, "": channel = ""
        case "email": channel = " by email"
        case "sms": channel = " by text message"
        case let other?: channel = " by \(other)"
        }
        let to = result.sentTo.map { " to \($0)" } ?? ""
        return "\(article) \(length)code was sent\(channel)\(to)."
    }

    static func attempts(_ left: Int?) -> String {
        guard let left else { return "try again." }
        return "\(left) attempt\(left == 1 ? "" : "s") left."
    }

    static func asksForNewCode(_ code: SecretBytes) -> Bool {
        code.withUnsafeBytes { $0.count == 1 && ($0[0] == UInt8(ascii: "r") || $0[0] == UInt8(ascii: "R")) }
    }

    private static func isSpace(_ byte: UInt8) -> Bool {
        byte == 0x20 || (0x09...0x0D).contains(byte)
    }

    private static let memoryError = VaultError(.internalError, "could not get locked memory to hold the secret")
}

/// Ctrl-C: the first one asks the sign-in to stop at its next step (and
/// cancel its flow); a second one ends vaultctl at once.
enum Interrupt {
    private static let flag = Atomic<Bool>(false)

    static var requested: Bool { Self.flag.load(ordering: .relaxed) }

    static func install() {
        // Initialise the flag before the handler can be the first to touch it.
        _ = Self.flag.load(ordering: .relaxed)
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in
            if Interrupt.flag.exchange(true, ordering: .relaxed) { _exit(130) }
        }
        sigemptyset(&action.sa_mask)
        // No SA_RESTART: a read at a prompt returns, so the prompt ends.
        action.sa_flags = 0
        sigaction(SIGINT, &action, nil)
    }
}

/// "⠹ Waiting for the browser sign-in… 4:37 left" on one line of stderr.
final class Spinner {
    private let activity: String
    private var frame = 0
    private static let frames = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"]

    init(_ activity: String) {
        self.activity = activity
    }

    func show(secondsLeft: Int?) {
        let left = secondsLeft.map { " \($0 / 60):\($0 % 60 < 10 ? "0" : "")\($0 % 60) left" } ?? ""
        Output.toStderr("\r\(Self.frames[self.frame % Self.frames.count]) \(self.activity)…\(left)\u{1B}[K")
        self.frame += 1
    }

    func clear() {
        Output.toStderr("\r\u{1B}[K")
    }
}
