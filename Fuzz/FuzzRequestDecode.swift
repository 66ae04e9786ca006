// libFuzzer entry point for the request decoder alone: the bytes a client
// sends, cut into lines as vaultd cuts them, each decoded by
// `LineCodec.request(from:)` (never a crash), and every request that decodes
// re-encoded to a line that decodes to the same request (RequestLines.swift);
// the secret-field scanner refuses nothing JSONDecoder reads, and takes
// what JSONDecoder decodes under the secret keys;
// the plain path for `token` lines reads and writes every line as Codable does.
// No broker and no daemon: it links VaultProtocol and what that needs only,
// for many more inputs a second than the request harness.
//
// Built and run by dev/fuzz.sh as `request-decode`; it shares the
// request harness's corpus (Fuzz/corpus/request/) and dictionary.

import VaultProtocol

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRequestDecode(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    for line in RequestLines.lines(of: Array(UnsafeBufferPointer(start: data, count: size))) {
        RequestLines.checkPlainAgrees(line)
        RequestLines.checkSecretFieldsAgree(line)
        RequestLines.checkRoundTrip(LineCodec.request(from: line))
    }
    return 0
}
