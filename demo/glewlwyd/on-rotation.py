#!/usr/bin/env python3
"""Signals a process the moment the test Glewlwyd issues a new refresh token.

  on-rotation.py DIR --pid PID [--signal KILL] [--timeout 10]

DIR is the folder start.sh made. Watches DIR/glewlwyd.log from its current
end until Glewlwyd logs "Refresh token generated" (it has stored the new
token and, for a rotating client, spent the one it was given, and is about
to answer), then sends SIGNAL to PID at once. This puts a crash right
between the provider's answer and whatever the client does with it.

It only reads the log: reading the SQLite database while Glewlwyd writes it
makes Glewlwyd's own queries fail ("Error executing sql query", HTTP 500),
sometimes after it has spent the token it was given.

Prints {"fired": true|false, "waited_ms": N}. Exit 0 when the signal was
sent; 1 when the timeout passed or PID was gone first; 2 usage.
"""

import argparse
import json
import os
import signal
import sys
import time

sys.dont_write_bytecode = True  # keep the work tree free of __pycache__


EVENT = b"Refresh token generated"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--signal", default="KILL")
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args()
    try:
        signum = getattr(signal, "SIG" + args.signal.upper().removeprefix("SIG"))
    except AttributeError:
        print("on-rotation.py: unknown signal %s" % args.signal, file=sys.stderr)
        sys.exit(2)
    log = os.path.join(args.dir, "glewlwyd.log")
    start = time.monotonic()
    deadline = start + args.timeout
    fired = False
    with open(log, "rb") as f:
        f.seek(0, os.SEEK_END)
        pending = b""
        while time.monotonic() < deadline:
            chunk = f.read()
            if chunk:
                pending += chunk
                if EVENT in pending:
                    try:
                        os.kill(args.pid, signum)
                        fired = True
                    except ProcessLookupError:
                        pass
                    break
                pending = pending[-len(EVENT):]
                continue
            try:
                os.kill(args.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.0005)
    print(json.dumps({"fired": fired, "waited_ms": int((time.monotonic() - start) * 1000)}))
    sys.exit(0 if fired else 1)


if __name__ == "__main__":
    main()
