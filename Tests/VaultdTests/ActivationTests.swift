import Foundation
import Glibc
import Testing
import VaultTestKit

/// vaultd under systemd: socket activation and sd_notify, with systemd's
/// own systemd-socket-activate and a datagram socket standing in for the
/// service manager.
@Suite(.timeLimit(.minutes(1)))
struct ActivationTests {
    @Test func theFirstConnectionStartsTheDaemonAndIsAnswered() async throws {
        let folder = try temporaryFolder()
        let socket = folder + "/a.sock"
        let variables = [
            "XDG_STATE_HOME": folder + "/state", "XDG_CONFIG_HOME": folder + "/config",
            "XDG_RUNTIME_DIR": folder, "HOME": folder,
        ]
        let launcher = ["/usr/bin/systemd-socket-activate", "-l", socket, "--fdname=vaultd"]
            + variables.map { "-E\($0.key)=\($0.value)" }
        try await using(DaemonProcess(folder: folder, socketPath: socket, launcher: launcher)) { daemon in
            #expect(await daemon.waitForLog("Listening on"))
            #expect(!daemon.output.contains("vault opened"), "vaultd has not started before the first connection")
            let client = try LineClient(path: socket)
            let hello = try #require(await client.call(#"{"id":1,"op":"hello"}"#))
            #expect(hello["server"] as? String == "vaultd", "\(hello)")
            #expect(daemon.output.contains("activation=systemd"), "vaultd adopted the socket: \(daemon.output)")
            #expect(await daemon.terminate() == 0)
        }
    }

    @Test func readyComesOnlyOnceTheSocketServesAndStoppingOnSIGTERM() async throws {
        let folder = try temporaryFolder()
        let notify = try NotifyListener(path: folder + "/notify")
        let daemon = try DaemonProcess(folder: folder, environment: ["NOTIFY_SOCKET": notify.path])
        let ready = try #require(await notify.next(containing: "READY=1"))
        #expect(ready.contains("STATUS=serving on"), "\(ready)")
        // READY=1 means served: a connection made right now is answered.
        let client = try LineClient(path: daemon.socketPath)
        #expect(await client.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
        kill(daemon.pid, SIGTERM)
        #expect(await notify.next(containing: "STOPPING=1") != nil)
        #expect(await daemon.waitForExit() == 0)
    }

    @Test func theWatchdogIsFedWhenSystemdAsks() async throws {
        let folder = try temporaryFolder()
        let notify = try NotifyListener(path: folder + "/notify")
        try await using(DaemonProcess(folder: folder, environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"])) { daemon in
            #expect(await notify.next(containing: "WATCHDOG=1") != nil)
            #expect(await notify.next(containing: "WATCHDOG=1") != nil, "again, within the interval")
        }
    }

    /// A service manager that stops reading $NOTIFY_SOCKET does not keep
    /// vaultd from serving or from stopping: a notification that would wait
    /// is dropped.
    @Test func aNotifySocketThatIsFullNeitherBlocksNorKeepsVaultdRunning() async throws {
        let folder = try temporaryFolder()
        let notify = try NotifyListener(path: folder + "/notify")
        notify.fill()
        try await using(DaemonProcess(folder: folder, environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "20000"])) { daemon in
            #expect(await daemon.waitForLog("listening"))
            let client = try LineClient(path: daemon.socketPath)
            #expect(await client.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
            #expect(await daemon.terminate(within: 10) == 0, "\(daemon.output)")
        }
    }

    @Test func aSocketActivatedDaemonExitsWhenIdle() async throws {
        let folder = try temporaryFolder()
        let socket = folder + "/a.sock"
        let variables = ["XDG_STATE_HOME": folder + "/state", "XDG_CONFIG_HOME": folder + "/config", "XDG_RUNTIME_DIR": folder]
        let launcher = ["/usr/bin/systemd-socket-activate", "-l", socket, "--fdname=vaultd"]
            + variables.map { "-E\($0.key)=\($0.value)" }
        try await using(DaemonProcess(folder: folder, socketPath: socket, arguments: ["--exit-idle-after", "1"], launcher: launcher)) { daemon in
            #expect(await daemon.waitForLog("Listening on"))
            do {
                let client = try LineClient(path: socket)
                #expect(await client.call(#"{"id":1,"op":"hello"}"#)?["ok"] as? Bool == true)
            }
            #expect(await daemon.waitForExit() == 0, "vaultd ended by itself once idle")
            #expect(daemon.output.contains("idle; exiting"), "\(daemon.output)")
        }
    }
}

/// A datagram socket playing the service manager's end of $NOTIFY_SOCKET.
final class NotifyListener: @unchecked Sendable {
    let path: String
    let fd: Int32

    init(path: String) throws {
        self.path = path
        self.fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        let bound = bind(self.fd, unixPath: path)
        guard bound == 0 else { throw ToolFailure(message: "cannot bind \(path)") }
        var timeout = timeval(tv_sec: 20, tv_usec: 0)
        setsockopt(self.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(self.fd) }

    /// Sends datagrams to this socket until its queue is full, as when the
    /// service manager has stopped reading.
    func fill() {
        let sender = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        defer { close(sender) }
        let message = Array("STATUS=filler".utf8)
        while true {
            let sent = send(sender, message, toUnixPath: self.path, flags: Int32(MSG_DONTWAIT))
            if sent < 0 { return }
        }
    }

    /// The next datagram that contains `text`, or nil at the deadline.
    func next(containing text: String) async -> String? {
        await blocking {
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = recv(self.fd, &buffer, buffer.count, 0)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { return nil }
                let message = String(decoding: buffer[0..<n], as: UTF8.self)
                if message.contains(text) { return message }
            }
        }
    }
}
