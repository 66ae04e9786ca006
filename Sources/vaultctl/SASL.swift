import ArgumentParser
import FoundationEssentials

/// The SASL initial responses mail clients send for an OAuth 2.0 bearer
/// token, base64-encoded as they take them from a command: Google's and
/// Microsoft's XOAUTH2, and OAUTHBEARER (RFC 7628).
enum SASLMechanism: String, ExpressibleByArgument, CaseIterable {
    case xoauth2
    case oauthbearer

    /// The initial response for `user` with `token`; nil when `user` cannot
    /// be written into one (a control character, or empty).
    func initialResponse(user: String, token: String) -> String? {
        guard Self.isWritable(user) else { return nil }
        let message: String
        switch self {
        case .xoauth2:
            message = "user=\(user)\u{1}auth=Bearer \(token)\u{1}\u{1}"
        case .oauthbearer:
            // RFC 7628 §3.1: the GS2 header's authzid is a saslname (RFC 5801),
            // with "," and "=" escaped.
            let authzid = user.replacing("=", with: "=3D").replacing(",", with: "=2C")
            message = "n,a=\(authzid),\u{1}auth=Bearer \(token)\u{1}\u{1}"
        }
        return Data(message.utf8).base64EncodedString()
    }

    /// A mail address as a SASL message may carry it: not empty, at most
    /// 320 bytes, no control characters (the messages are split on ^A).
    static func isWritable(_ user: String) -> Bool {
        !user.isEmpty && user.utf8.count <= 320 && !user.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
    }
}
