import Testing
import VaultProtocol

@Suite struct DPoPTargetTests {
    /// docs/protocol.md: `htu` is an absolute URL *with a host*; a port alone names none.
    @Test(arguments: ["https://:443/x", "http://:8080", "https://:/x", "https://[]:443/x", "https://[/x", "https://?q=1"])
    func aURLWithoutAHostIsRefused(url: String) {
        #expect(DPoPTarget(method: "GET", url: url) == nil)
        #expect(DPoPNonce.origin(url) == nil)
        let line = #"{"id":1,"op":"dpop.proof","account":"w","htm":"GET","htu":"\#(url)"}"#
        guard case .failure(let error) = LineCodec.request(from: Array(line.utf8)).command else {
            Issue.record("\(line) was taken")
            return
        }
        #expect(error.code == .badRequest)
    }

    @Test(arguments: ["https://rs.example:443/x", "http://a/", "https://[::1]:9/x", "https://[::1]/", "http://127.0.0.1:8080"])
    func aURLWithAHostIsTaken(url: String) {
        #expect(DPoPTarget(method: "GET", url: url) != nil)
    }
}
