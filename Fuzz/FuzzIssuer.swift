// libFuzzer entry point for what an issuer sends: the readers of token
// answers, native-authentication answers, device authorization answers,
// discovery documents and JWKS, and of the `Retry-After` and `Cache-Control`
// headers. No network: each reader gets the bytes as a body.
//
// The first byte of an input picks the reader and the HTTP status it is
// given; the rest is the body (or the header's value). Every reader must
// throw or succeed, never crash, and whatever number it returns must lie in
// its bound (IssuerNumber): lifetimes 0 … ten years (a token's 1 … ten
// years, or none), device intervals 1 … 60 s, waits 0 … 3600 s, a code
// length 1 … 32, a max-age 0 … a day.
//
// Built and run by scripts/fuzz.sh; the corpus is Fuzz/corpus/issuer/.

import FoundationEssentials
import JWTKit
@testable import VaultOIDC
import VaultJSON
import VaultProtocol

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzIssuer(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let selector = data[0]
    let body = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    let statuses: [UInt] = [200, 200, 200, 400, 401, 404, 429, 503]
    let status = statuses[Int(selector >> 5)]
    switch selector % 7 {
    case 0: checkToken(status, body)
    case 1: checkNative(status, body)
    case 2: checkDevice(status, body)
    case 3: checkDiscovery(body)
    case 4: checkKeySet(body)
    case 5: checkHeaders(body)
    default: checkNumber(body)
    }
    return 0
}

/// Stops the process with a message libFuzzer reports as a crash.
func fail(_ message: String) -> Never {
    fatalError("fuzz property failed: \(message)")
}

let tenYears = 1...IssuerNumber.maximumLifetime

func checkToken(_ status: UInt, _ body: [UInt8]) {
    var body = body
    guard let response = try? TokenResponseParser.parse(status: status, body: &body, retryAfter: nil) else { return }
    if let seconds = response.expiresIn, !tenYears.contains(seconds) { fail("a token lifetime of \(seconds) s") }
}

func checkNative(_ status: UInt, _ body: [UInt8]) {
    var body = body
    do {
        switch try NativeAuthParser.parse(status: status, body: &body, retryAfter: 7) {
        case .codeSent(_, _, _, let length):
            guard (1...32).contains(length) else { fail("a code length of \(length)") }
        case .tokens(let response):
            if let seconds = response.expiresIn, !tenYears.contains(seconds) { fail("a token lifetime of \(seconds) s") }
        case .continuation, .passwordRequired, .redirect:
            break
        }
    } catch {
        if case .refused(_, _, let code) = error, let code, abs(code) > 1_000_000_000_000 { fail("an error code of \(code)") }
    }
}

func checkDevice(_ status: UInt, _ body: [UInt8]) {
    guard let device = try? DeviceAuthorization.parse(status: status, body: body, retryAfter: nil) else { return }
    guard IssuerNumber.lifetimes.contains(device.expiresIn) else { fail("a device code lifetime of \(device.expiresIn) s") }
    guard IssuerNumber.intervals.contains(device.interval) else { fail("a polling interval of \(device.interval) s") }
}

func checkDiscovery(_ body: [UInt8]) {
    guard let metadata = try? JSONDecoder().decode(ProviderMetadata.self, from: Data(body)) else { return }
    for endpoint in metadata.endpoints { _ = try? OIDCClient.requireSecure(endpoint) }
    _ = NativeAuthEndpoints(metadata: metadata)
}

func checkKeySet(_ body: [UInt8]) {
    guard let jwks = try? JSONDecoder().decode(JWKS.self, from: Data(body)) else { return }
    _ = jwks.keys.map { $0.keyIdentifier?.string }
}

func checkHeaders(_ body: [UInt8]) {
    let text = String(decoding: body, as: UTF8.self)
    if let seconds = IssuerNumber.retryAfter(text), !IssuerNumber.waits.contains(seconds) {
        fail("a Retry-After of \(seconds) s")
    }
    let directives = text.split(separator: ",")
    if let maxAge = IssuerNumber.maxAge(directives), !(0...86400).contains(maxAge) { fail("a max-age of \(maxAge) s") }
}

func checkNumber(_ body: [UInt8]) {
    guard let value = try? JSONDecoder().decode(JSONValue.self, from: Data(body)) else { return }
    for range in [IssuerNumber.lifetimes, IssuerNumber.intervals, IssuerNumber.waits] {
        if let number = IssuerNumber.bounded(value, range), !range.contains(number) { fail("\(number) outside \(range)") }
    }
    _ = value.intValue
}
