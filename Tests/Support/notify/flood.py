#!/usr/bin/env python3
"""A peer on a Tests/Support/notify session bus that keeps sending (ctl.sh flood).

    flood.py SECONDS NAME...

From one connection of its own, sends ActionInvoked(4294967295, "default")
(an id no notification has) addressed to each NAME in turn, as fast as the
bus takes them, for SECONDS; then prints how many it sent. Speaks the D-Bus
wire protocol itself (SASL EXTERNAL, Hello, signals): dbus-send is one
process per message, far too slow to keep a client busy. Needs
DBUS_SESSION_BUS_ADDRESS (a unix:path= address).
"""
import os
import socket
import struct
import sys
import time


def padded(data, alignment):
    return data + b"\0" * (-len(data) % alignment)


def string(value):
    raw = value.encode()
    return struct.pack("<I", len(raw)) + raw + b"\0"


def field(code, signature, value):
    """A header field (a struct, 8-aligned): code, variant signature, value."""
    body = bytes([code, len(signature)]) + signature.encode() + b"\0"
    if signature == "g":
        raw = value.encode()
        body += bytes([len(raw)]) + raw + b"\0"
    else:
        body = padded(body, 4) + string(value)
    return body


def message(kind, serial, fields, body, flags=0):
    array = b""
    for item in fields:
        array = padded(array, 8) + field(*item)
    header = b"l" + bytes([kind, flags, 1]) + struct.pack("<III", len(body), serial, len(array))
    return padded(header + array, 8) + body


def main():
    seconds, names = float(sys.argv[1]), sys.argv[2:]
    address = os.environ["DBUS_SESSION_BUS_ADDRESS"]
    path = next(p[5:] for a in address.split(";") for p in a[5:].split(",") if a.startswith("unix:") and p.startswith("path="))
    bus = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bus.connect(path)
    bus.sendall(b"\0AUTH EXTERNAL " + str(os.geteuid()).encode().hex().encode() + b"\r\n")
    if not bus.recv(4096).startswith(b"OK "):
        sys.exit("flood.py: the bus refused authentication")
    bus.sendall(b"BEGIN\r\n")
    hello = [(1, "o", "/org/freedesktop/DBus"), (6, "s", "org.freedesktop.DBus"),
             (2, "s", "org.freedesktop.DBus"), (3, "s", "Hello")]
    bus.sendall(message(1, 1, hello, b""))
    body = struct.pack("<I", 4294967295) + string("default")
    signals = [message(4, 0, [(1, "o", "/org/freedesktop/Notifications"),
                              (2, "s", "org.freedesktop.Notifications"), (3, "s", "ActionInvoked"),
                              (6, "s", name), (8, "g", "us")], body, flags=1) for name in names]
    # What the bus sends back (the Hello reply, NameAcquired) is never read.
    sent, serial, end = 0, 2, time.monotonic() + seconds
    while time.monotonic() < end:
        batch = b""
        for template in signals:
            for _ in range(64):
                batch += template[:8] + struct.pack("<I", serial) + template[12:]
                serial += 1
        bus.sendall(batch)
        sent += 64 * len(signals)
    print(sent)


main()
