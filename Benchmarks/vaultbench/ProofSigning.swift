import Foundation
import VaultCrypto
import VaultOIDC
import VaultProtocol

/// What one DPoP proof costs vaultd to make, by algorithm, in this process
/// and in one run: ES256 on swift-crypto (BoringSSL's P-256) against
/// Ed25519 on libsodium, each proof with its `ath` as `dpop.proof` makes it.
/// vaultd makes a key of the faster one when the issuer offers both
/// (`DPoPKey.generate`); this row says which that is on this machine.
func proofSigning(rows: inout [(String, String)]) throws {
    let target = DPoPTarget(method: "GET", url: "https://rs.example/api/items?page=2")!
    let token = try SecretBytes(utf8: String(repeating: "t", count: 43))
    var medians: [String: Double] = [:]
    for algorithm in ["EdDSA", "ES256"] {
        guard let key = try DPoPKey.generate(supported: [algorithm]) else { throw BenchError("no \(algorithm) key") }
        for _ in 0..<200 { _ = try key.proof(for: target, issuedAt: 1_700_000_000, accessToken: token) }
        var samples: [Double] = []
        samples.reserveCapacity(5_000)
        for _ in 0..<5_000 {
            let start = Clock.now()
            _ = try key.proof(for: target, issuedAt: 1_700_000_000, accessToken: token)
            samples.append((Clock.now() - start) * 1e6)
        }
        samples.sort()
        medians[algorithm] = samples[samples.count / 2]
        rows.append((
            "DPoP proof made in process, \(algorithm == "EdDSA" ? "Ed25519 (libsodium)" : "ES256 (swift-crypto)"): median / p99",
            String(format: "%.1f µs / %.1f µs", samples[samples.count / 2], samples[samples.count * 99 / 100])
        ))
    }
    let both = try DPoPKey.generate(supported: ["ES256", "EdDSA"])
    let chosen = both?.algorithm.rawValue ?? "none"
    let faster = (medians["EdDSA"] ?? 0) <= (medians["ES256"] ?? 0) ? "EdDSA" : "ES256"
    rows.append((
        "DPoP key made where the issuer offers both: the faster one",
        "\(chosen) (faster here: \(faster), \(String(format: "%.2f", (medians["ES256"] ?? 0) / max(medians["EdDSA"] ?? 1, 0.001)))× ES256 ÷ Ed25519)"
    ))
}
