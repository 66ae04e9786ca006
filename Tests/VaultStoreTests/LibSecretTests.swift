import Foundation
import Glibc
import Testing
@testable import VaultStore

/// libsecret loaded at run time (LibSecret.swift): what happens without it,
/// that every function is found through its handle, and that shim.h's own
/// declarations of its ABI agree with the system's headers.
@Suite
struct LibSecretTests {
    @Test func aMissingLibraryIsTheKeyringsClearError() throws {
        guard case .failure(let error) = LibSecret.load("libsecret-1-not-installed.so.0") else {
            Issue.record("a library that is not installed loaded")
            return
        }
        #expect(error.kind == .unavailable)
        #expect(error.message.hasPrefix("the keyring backend needs libsecret-1-not-installed.so.0: "), "\(error.message)")
        #expect(error.message.contains("cannot open shared object file"), "dlerror's text: \(error.message)")
        #expect(error.message.hasSuffix("or choose --backend file"), "\(error.message)")
    }

    /// The GLib, GObject and GIO functions come through libsecret's handle
    /// (dlsym searches the libraries it needs), not the global scope: vaultd
    /// links none of them, and RTLD_LOCAL keeps them out of it.
    @Test func everyFunctionIsFoundThroughLibsecretsHandle() throws {
        _ = try LibSecret.load(LibSecret.soname).get()
        let global = UnsafeMutableRawPointer(bitPattern: 0)  // RTLD_DEFAULT
        for name in ["secret_service_open_sync", "g_object_unref", "g_main_context_new", "g_bus_get_sync"] {
            #expect(dlsym(global, name) == nil, "\(name) is in the process's global scope")
        }
    }

    /// shim.h compiles after the system's <libsecret/secret.h> (its
    /// prototypes agree with the real ones, or the compiler says which
    /// conflicts), and the layouts and constants vaultd hands libsecret
    /// come out the same from the real headers and from shim.h.
    @Test func theDeclarationsAgreeWithTheSystemHeaders() async throws {
        let clang = try #require(Self.executable("clang"), "no clang on PATH")
        let flags = try await runTool("/usr/bin/pkg-config", ["--cflags", "libsecret-1"])
        try #require(flags.status == 0, "pkg-config finds no libsecret-1 (libsecret-1-dev): \(flags.errorText)")
        let include = flags.text.split(whereSeparator: \.isWhitespace).map(String.init)
        let shim = keyringPackageRoot + "/Sources/CLibSecret/shim.h"

        let agree = try await runTool(
            clang,
            ["-fsyntax-only", "-Werror", "-Wno-unused-function", "-DTV_CHECK_SYSTEM_HEADERS", "-include", "libsecret/secret.h", "-x", "c", shim]
                + include
        )
        #expect(agree.status == 0, "\(agree.errorText)")

        let folder = try Self.temporaryFolder()
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let program = folder + "/abi.c"
        try Self.layoutProgram.write(toFile: program, atomically: true, encoding: .utf8)
        var printed: [String] = []
        for (name, arguments) in [("real", ["-DREAL"] + include), ("shim", ["-I", keyringPackageRoot + "/Sources/CLibSecret"])] {
            let binary = folder + "/abi-" + name
            let built = try await runTool(clang, ["-Werror", "-o", binary, program] + arguments)
            try #require(built.status == 0, "\(name): \(built.errorText)")
            let run = try await runTool(binary, [])
            try #require(run.status == 0)
            printed.append(run.text)
        }
        #expect(printed[0].split(separator: "\n").count > 30)
        #expect(printed[0] == printed[1])
    }

    /// Prints what vaultd relies on: the structs it reads or hands over,
    /// the sizes and signedness of GLib's integer types, the constants.
    static let layoutProgram = """
        #include <stdio.h>
        #include <stddef.h>
        #ifdef REAL
        #include <libsecret/secret.h>
        #else
        #include "shim.h"
        #endif
        #define P(x) printf("%s = %ld\\n", #x, (long)(x));
        int main(void) {
            P(sizeof(SecretSchema)) P(offsetof(SecretSchema, name)) P(offsetof(SecretSchema, flags))
            P(offsetof(SecretSchema, attributes)) P(offsetof(SecretSchema, reserved)) P(offsetof(SecretSchema, reserved7))
            P(sizeof(SecretSchemaAttribute)) P(offsetof(SecretSchemaAttribute, name)) P(offsetof(SecretSchemaAttribute, type))
            P(sizeof(GError)) P(offsetof(GError, domain)) P(offsetof(GError, code)) P(offsetof(GError, message))
            P(sizeof(GList)) P(offsetof(GList, data)) P(offsetof(GList, next)) P(offsetof(GList, prev))
            P(sizeof(gsize)) P((gsize)-1 > 0) P(sizeof(gssize)) P((gssize)-1 > 0) P(sizeof(GType)) P((GType)-1 > 0)
            P(sizeof(GQuark)) P((GQuark)-1 > 0) P(sizeof(guint64)) P((guint64)-1 > 0) P(sizeof(gboolean)) P((gboolean)-1 > 0)
            P(sizeof(GBusType)) P(sizeof(SecretSchemaFlags)) P(sizeof(SecretSearchFlags)) P(sizeof(SecretCollectionFlags))
            P(sizeof(SecretServiceFlags)) P(sizeof(SecretItemCreateFlags))
            P(G_BUS_TYPE_SESSION) P(SECRET_SCHEMA_DONT_MATCH_NAME) P(SECRET_SCHEMA_ATTRIBUTE_STRING)
            P(SECRET_SEARCH_ALL) P(SECRET_SEARCH_LOAD_SECRETS) P(SECRET_COLLECTION_NONE) P(SECRET_SERVICE_NONE)
            P(SECRET_ITEM_CREATE_REPLACE) P(SECRET_ERROR_IS_LOCKED)
            return 0;
        }
        """

    /// GLib's session bus, as far as it can be told without GLib.
    @Test func aSessionBusThatIsPlainlyAbsentIsToldWithoutGLib() throws {
        let folder = try Self.temporaryFolder()
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let existing = folder + "/bus"
        _ = FileManager.default.createFile(atPath: existing, contents: nil)
        func absence(_ environment: [String: String]) -> String? { SessionBus.absence { environment[$0] } }

        let noFile = "Could not connect: No such file or directory"
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(folder)/none"]) == noFile)
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(folder)/none,guid=0123abcd"]) == noFile)
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(folder)%2fnone"]) == noFile, "%2f is a slash")
        // There may be a bus: GLib decides.
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(existing)"]) == nil)
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(folder)%2fbus"]) == nil)
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": "unix:abstract=/tmp/dbus-x"]) == nil)
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(folder)/none;unix:path=\(existing)"]) == nil)
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": "tcp:host=localhost,port=1"]) == nil)
        #expect(absence(["DBUS_SESSION_BUS_ADDRESS": ""]) == nil)

        let autolaunch = "Cannot autolaunch D-Bus without X11 $DISPLAY"
        #expect(absence(["XDG_RUNTIME_DIR": folder + "/run"]) == autolaunch)
        #expect(absence(["XDG_RUNTIME_DIR": folder]) == nil, "$XDG_RUNTIME_DIR/bus is there")
        #expect(absence(["XDG_RUNTIME_DIR": folder + "/run", "DISPLAY": ":0"]) == nil, "dbus-launch may start one")
        // No $XDG_RUNTIME_DIR: GLib's runtime folder is the cache folder.
        #expect(absence(["HOME": folder + "/home"]) == autolaunch)
        #expect(absence(["XDG_CACHE_HOME": folder + "/cache"]) == autolaunch)
        #expect(absence(["XDG_CACHE_HOME": folder]) == nil, "$XDG_CACHE_HOME/bus is there")
        try FileManager.default.createDirectory(atPath: folder + "/busy/.cache", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: folder + "/busy/.cache/bus", contents: nil)
        #expect(absence(["HOME": folder + "/busy"]) == nil, "~/.cache/bus is there")
        #expect(absence([:]) == nil, "no home: GLib asks the password database")
        #expect(absence(["XDG_RUNTIME_DIR": "run"]) == nil, "relative: GLib's business")
    }

    static func temporaryFolder() throws -> String {
        let folder = NSTemporaryDirectory() + "tv-libsecret-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        return folder
    }

    static func executable(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}
