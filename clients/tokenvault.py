#!/usr/bin/env python3
"""A stdlib-only client for vaultd (docs/protocol.md), small enough to copy.

    import tokenvault
    tokenvault.token("work", min_ttl=300)   # the access token string
    tokenvault.call("status")               # any op: the reply dict
    except tokenvault.VaultError as e:      # e.code: "unknown_account", ...

The socket is `path`, else $TOKENVAULT_SOCKET, else
$XDG_RUNTIME_DIR/tokenvault/vaultd.sock. `python3 tokenvault.py ACCOUNT`
prints the bare token, or one `tokenvault.py: error: ...` line and exits 1.
"""
import json, os, socket, struct, sys


class VaultError(Exception):
    def __init__(self, code, message):
        super().__init__(f"{message} ({code})")
        self.code, self.message = code, message


def socket_path(path=None):
    path = path or os.environ.get("TOKENVAULT_SOCKET")
    if not path and not os.environ.get("XDG_RUNTIME_DIR"):
        raise VaultError("bad_request", "XDG_RUNTIME_DIR is not set; pass a path or set TOKENVAULT_SOCKET")
    return path or os.path.join(os.environ["XDG_RUNTIME_DIR"], "tokenvault", "vaultd.sock")


def call(op, path=None, timeout=60, **fields):
    """Sends one request and returns the reply dict, or raises VaultError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        path = socket_path(path)
        sock.connect(path)
        # Before a byte is sent: the server must run as this user, or whoever
        # made a socket at this path would be sent what the request carries.
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.geteuid():
            raise VaultError("forbidden", f"{path} is served by uid {uid}, not by you (uid {os.geteuid()}); nothing was sent to it")
        sock.sendall(json.dumps({**fields, "id": 1, "op": op}).encode() + b"\n")
        lines = sock.makefile("rb")
        while True:  # skip event lines (no "id"); id null means our line was refused
            line = lines.readline(1 << 20)  # capped: replies are far shorter than 1 MiB
            if not line.endswith(b"\n"):
                raise VaultError("internal", "vaultd closed the connection without a reply")
            reply = json.loads(line)
            if reply.get("id", 0) in (1, None):
                break
    if not reply.get("ok"):
        error = reply.get("error") or {}
        raise VaultError(error.get("code", "internal"), error.get("message", "vaultd failed"))
    return reply


def token(account, min_ttl=60, scope=None, path=None):
    scoped = {} if scope is None else {"scope": scope}
    return call("token", path, account=account, min_ttl=min_ttl, **scoped)["access_token"]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tokenvault.py ACCOUNT")
    try:
        print(token(sys.argv[1]))
    except OSError as error:
        sys.exit(f"tokenvault.py: error: cannot reach vaultd ({error.strerror or error}); is it running?")
    except (VaultError, ValueError) as error:
        sys.exit(f"tokenvault.py: error: {error}")
