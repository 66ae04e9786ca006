// swift-tools-version:6.1
import PackageDescription

/// Every Swift target builds with these, tests included; each target declares
/// exactly the modules it imports (dev/check-imports.py checks both).
let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

/// The code a program runs, laid out together (lld): the functions named in
/// link/PROGRAM.order first, in that order, then every function without a
/// name, then the rest. The kernel maps code 64 KiB around each page touched,
/// so code spread over a 23 MB binary costs more memory and page faults than
/// the 2 MB of it that runs. Benchmarks/order-files.sh writes the lists;
/// scripts/release.sh builds every function in a section of its own, which
/// this needs to move functions one by one.
func layout(of program: String) -> [String] {
    [
        "-use-ld=lld",
        "-Xlinker", "--symbol-ordering-file=\(Context.packageDirectory)/link/\(program).order",
        "-Xlinker", "--no-warn-symbol-ordering",
        "-Xlinker", "-T", "-Xlinker", "\(Context.packageDirectory)/link/unnamed.ld",
    ]
}

let package = Package(
    name: "tokenvault",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "vaultd", targets: ["vaultd"]),
        .executable(name: "vaultctl", targets: ["vaultctl"]),
        .executable(name: "vaultctl-notify", targets: ["vaultctl-notify"]),
        .library(name: "VaultClient", targets: ["VaultClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.7.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.0.0"),
    ],
    targets: [
        // No pkg-config: it names the system's library folder first, where
        // -lsodium finds libsodium.so before the archive a release build of
        // vaultd links (scripts/release.sh).
        .systemLibrary(name: "CSodium"),
        // No pkg-config: SwiftPM would link its libraries into vaultd, which
        // loads libsecret only when the keyring backend is used (shim.h).
        .systemLibrary(name: "CLibSecret"),
        // Linked (libsystemd.so) into vaultctl-notify only: vaultctl stays a
        // static executable.
        .systemLibrary(name: "CSystemd"),
        .target(name: "CVaultSystem"),
        .target(
            name: "VaultCrypto",
            dependencies: ["CSodium"],
            swiftSettings: strict
        ),
        .target(
            name: "VaultJSON",
            dependencies: ["VaultCrypto"],
            swiftSettings: strict
        ),
        .target(
            name: "VaultStore",
            dependencies: [
                "VaultCrypto",
                "VaultProtocol",
                "CLibSecret",
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "VaultOIDC",
            dependencies: [
                "VaultProtocol",
                "VaultCrypto",
                "VaultJSON",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "VaultTestIssuer",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "JWTKit", package: "jwt-kit"),
            ],
            path: "Tests/Support/VaultTestIssuer",
            swiftSettings: strict
        ),
        .target(
            name: "VaultProtocol",
            dependencies: ["VaultCrypto", "VaultJSON"],
            swiftSettings: strict
        ),
        .target(
            name: "VaultServer",
            dependencies: [
                "VaultProtocol",
                "VaultCrypto",
                "CVaultSystem",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "VaultDaemon",
            dependencies: [
                "VaultServer",
                "VaultJSON",
                "VaultOIDC",
                "VaultProtocol",
                "VaultStore",
                "VaultCrypto",
                "CVaultSystem",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "VaultClient",
            dependencies: ["VaultProtocol"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "vaultd",
            dependencies: [
                "VaultDaemon",
                "VaultProtocol",
                "VaultServer",
                "VaultStore",
                "CVaultSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict,
            // Memory a per-user daemon keeps resident for as long as the
            // session lasts: lld packs the 95,000 relative relocations of a
            // position-independent vaultd into 20 KB (DT_RELR, glibc 2.36),
            // where they took 2.2 MB, and link/vaultd.map keeps its symbols
            // out of the dynamic symbol table.
            linkerSettings: [
                .unsafeFlags(
                    layout(of: "vaultd") + [
                        "-Xlinker", "-z", "-Xlinker", "pack-relative-relocs",
                        "-Xlinker", "--version-script=\(Context.packageDirectory)/link/vaultd.map",
                    ]
                )
            ]
        ),
        .executableTarget(
            name: "vaultctl",
            dependencies: [
                "VaultClient",
                "VaultProtocol",
                "VaultJSON",
                "VaultCrypto",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict,
            // Programs run vaultctl in loops (token, exec, git-credential): a
            // static executable starts without the dynamic loader relocating it
            // and libstdc++. vaultctl needs no NSS lookups, which static glibc
            // would have to dlopen.
            linkerSettings: [
                .unsafeFlags(layout(of: "vaultctl")),
                .unsafeFlags(["-static-executable"], .when(configuration: .release)),
                // Named by a build with --static-swift-stdlib, not by one without.
                .linkedLibrary("_FoundationCShims", .when(configuration: .release)),
                .linkedLibrary("_FoundationCollections", .when(configuration: .release)),
            ]
        ),
        // `vaultctl notify`'s notifier, which vaultctl execs: a long-lived
        // session service on the session bus through sd-bus. Dynamically
        // linked, as libsystemd is; no order file.
        .executableTarget(
            name: "vaultctl-notify",
            dependencies: [
                "CSystemd",
                "VaultClient",
                "VaultProtocol",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "vaultbench",
            dependencies: ["VaultTestIssuer", "VaultProtocol", "VaultCrypto", "VaultOIDC"],
            path: "Benchmarks/vaultbench",
            swiftSettings: strict
        ),
        .testTarget(name: "VaultCryptoTests", dependencies: ["VaultCrypto"], swiftSettings: strict),
        .testTarget(name: "VaultStoreTests", dependencies: ["VaultStore", "VaultCrypto"], swiftSettings: strict),
        .testTarget(name: "VaultProtocolTests", dependencies: ["VaultProtocol", "VaultCrypto", "VaultJSON"], swiftSettings: strict),
        .target(
            name: "VaultTestKit",
            dependencies: [
                "VaultClient",
                "VaultDaemon",
                "VaultOIDC",
                "VaultProtocol",
                "VaultServer",
                "VaultStore",
                "VaultTestIssuer",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Tests/Support/VaultTestKit",
            swiftSettings: strict
        ),
        .testTarget(
            name: "VaultServerTests",
            dependencies: [
                "VaultClient",
                "VaultCrypto",
                "VaultDaemon",
                "VaultProtocol",
                "VaultServer",
                "VaultTestIssuer",
                "VaultTestKit",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "VaultOIDCTests",
            dependencies: [
                "VaultCrypto",
                "VaultJSON",
                "VaultOIDC",
                "VaultProtocol",
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "VaultctlTests",
            dependencies: [
                "VaultClient",
                "VaultCrypto",
                "VaultDaemon",
                "VaultProtocol",
                "VaultServer",
                "VaultTestIssuer",
                "VaultTestKit",
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "VaultdTests",
            dependencies: [
                "VaultCrypto",
                "VaultStore",
                "VaultTestIssuer",
                "VaultTestKit",
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "VaultDaemonTests",
            dependencies: [
                "VaultCrypto",
                "VaultDaemon",
                "VaultJSON",
                "VaultOIDC",
                "VaultProtocol",
                "VaultServer",
                "VaultStore",
                "VaultTestIssuer",
                "VaultTestKit",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strict
        ),
    ]
)
