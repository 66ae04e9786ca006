#!/usr/bin/env python3
"""A tiny SMTP sink: accepts every message and writes it to a directory.

  smtp-sink.py --port PORT --dir SINK [--host 127.0.0.1]

Dovecot's submission service relays to it (demo/mail/start.sh). Each message
becomes SINK/NNNNNN.json (envelope: {"mail_from", "rcpt_to", "size",
"received"}) and then SINK/NNNNNN.eml (the DATA as received, dot-unstuffed,
CRLF line ends), both written atomically, the .eml last: a test that sees
the .eml can read both. Standard library only; no AUTH, no TLS (loopback).
"""

import argparse
import asyncio
import json
import os
import sys
import time

sys.dont_write_bytecode = True


class Sink:
    def __init__(self, directory):
        self.dir = directory
        self.seq = 0
        for name in os.listdir(directory):
            if name.endswith(".eml") and name[:-4].isdigit():
                self.seq = max(self.seq, int(name[:-4]))

    def store(self, mail_from, rcpts, data):
        self.seq += 1
        base = os.path.join(self.dir, "%06d" % self.seq)
        for suffix, payload in (
            (".json", json.dumps({"mail_from": mail_from, "rcpt_to": rcpts, "size": len(data),
                                  "received": time.time()}).encode() + b"\n"),
            (".eml", data),
        ):
            tmp = os.path.join(self.dir, ".%06d%s.tmp" % (self.seq, suffix))
            with open(tmp, "wb") as f:
                f.write(payload)
            os.replace(tmp, base + suffix)
        return self.seq


def address(arg):
    """The path inside <...> of 'FROM:<a@b> PARAMS' (empty for the null path)."""
    arg = arg.split(":", 1)[1].strip() if ":" in arg else arg
    if arg.startswith("<"):
        return arg[1:arg.find(">")] if ">" in arg else arg[1:]
    return arg.split(" ", 1)[0]


async def session(sink, reader, writer):
    async def reply(line):
        writer.write(line.encode() + b"\r\n")
        await writer.drain()

    mail_from, rcpts = None, []
    await reply("220 localhost tokenvault smtp-sink ESMTP")
    try:
        while True:
            raw = await reader.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            verb, _, arg = line.partition(" ")
            verb = verb.upper()
            if verb == "EHLO":
                await reply("250-localhost\r\n250-8BITMIME\r\n250-ENHANCEDSTATUSCODES\r\n250-SMTPUTF8\r\n250 SIZE 52428800")
            elif verb == "HELO":
                await reply("250 localhost")
            elif verb == "MAIL":
                mail_from, rcpts = address(arg), []
                await reply("250 2.1.0 Ok")
            elif verb == "RCPT":
                if mail_from is None:
                    await reply("503 5.5.1 MAIL first")
                else:
                    rcpts.append(address(arg))
                    await reply("250 2.1.5 Ok")
            elif verb == "DATA":
                if not rcpts:
                    await reply("503 5.5.1 RCPT first")
                    continue
                await reply("354 End data with <CR><LF>.<CR><LF>")
                lines = []
                while True:
                    raw = await reader.readline()
                    if not raw:
                        return
                    if raw in (b".\r\n", b".\n"):
                        break
                    if raw.startswith(b"."):
                        raw = raw[1:]
                    lines.append(raw.rstrip(b"\r\n") + b"\r\n")
                n = sink.store(mail_from, rcpts, b"".join(lines))
                mail_from, rcpts = None, []
                await reply("250 2.0.0 Ok: queued as %06d" % n)
            elif verb == "RSET":
                mail_from, rcpts = None, []
                await reply("250 2.0.0 Ok")
            elif verb == "NOOP":
                await reply("250 2.0.0 Ok")
            elif verb == "QUIT":
                await reply("221 2.0.0 Bye")
                return
            else:
                await reply("502 5.5.2 Command not implemented")
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        writer.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    sink = Sink(args.dir)
    server = await asyncio.start_server(lambda r, w: session(sink, r, w), args.host, args.port,
                                        limit=1 << 20)
    print("smtp-sink: listening on %s:%d, writing to %s" % (args.host, args.port, args.dir), flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
