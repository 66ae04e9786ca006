#!/usr/bin/env python3
"""A stdlib-only client for vaultd (docs/protocol.md), small enough to copy.

    import tokenvault
    tokenvault.token("work", min_ttl=300)   # the access token string
    tokenvault.dpop_proof("work", "GET", url)  # a DPoP-bound account: headers for one request
    tokenvault.call("status")               # any op: the reply dict
    except tokenvault.VaultError as e:      # e.code: "unknown_account", ...

The socket is `path`, else $TOKENVAULT_SOCKET, else
$XDG_RUNTIME_DIR/tokenvault/vaultd.sock. `python3 tokenvault.py ACCOUNT`
prints the bare token, or one `tokenvault.py: error: ...` line and exits 1.

Every reply is checked before use: a line over 1 MiB, not UTF-8, not JSON,
nested too deep, not an object of the protocol's shape, or answering
another id is a VaultError with code "internal", never a TypeError,
KeyError or RecursionError. A socket that cannot be reached, or a reply not
whole within `timeout` seconds, is an OSError.
"""
import json, os, socket, struct, sys, time, unicodedata

MAX_REPLY_BYTES = 1 << 20  # a reply line, newline excluded; replies are far shorter


class VaultError(Exception):
    def __init__(self, code, message):
        super().__init__(f"{message} ({code})")
        self.code, self.message = code, message


def socket_path(path=None):
    path = path or os.environ.get("TOKENVAULT_SOCKET")
    if not path and not os.environ.get("XDG_RUNTIME_DIR"):
        raise VaultError("bad_request", "XDG_RUNTIME_DIR is not set; pass a path or set TOKENVAULT_SOCKET")
    return path or os.path.join(os.environ["XDG_RUNTIME_DIR"], "tokenvault", "vaultd.sock")


def _bad_reply(what):
    return VaultError("internal", f"vaultd sent {what}; check that vaultd, not another program, serves the socket, and read its log: journalctl --user -u vaultd")


def _kind(value):
    """The JSON kind of a decoded value, never the value itself (it may be a secret)."""
    return {bool: "true/false", str: "a string", int: "a number", float: "a number",
            list: "an array", dict: "an object", type(None): "null"}.get(type(value), "a value")


def _read_line(sock, buffer, deadline):
    """The next line from `sock` without its newline, at most MAX_REPLY_BYTES long."""
    while True:
        end = buffer.find(b"\n")
        if end > MAX_REPLY_BYTES or (end < 0 and len(buffer) > MAX_REPLY_BYTES):
            raise _bad_reply(f"a reply line longer than {MAX_REPLY_BYTES} bytes")
        if end >= 0:
            line = bytes(buffer[:end])
            del buffer[:end + 1]
            return line
        if deadline is not None:  # the whole reply within `timeout`, however it trickles in
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise VaultError("internal", "vaultd closed the connection without a reply")
        buffer += chunk


def _decode(line):
    try:
        return json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise _bad_reply("a reply line that is not UTF-8") from None
    except RecursionError:
        raise _bad_reply("a reply line nested too deep") from None
    except ValueError:  # json.JSONDecodeError, NaN/Infinity, over-long integers
        raise _bad_reply("a reply line that is not JSON") from None


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def call(op, path=None, timeout=60, **fields):
    """Sends one request and returns the reply dict, or raises VaultError."""
    request_id = 1
    deadline = None if timeout is None else time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        path = socket_path(path)
        sock.connect(path)
        # Before a byte is sent: the server must run as this user, or whoever
        # made a socket at this path would be sent what the request carries.
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.geteuid():
            raise VaultError("forbidden", f"{path} is served by uid {uid}, not by you (uid {os.geteuid()}); nothing was sent to it")
        sock.sendall(json.dumps({**fields, "id": request_id, "op": op}).encode() + b"\n")
        buffer = bytearray()
        while True:
            reply = _decode(_read_line(sock, buffer, deadline))
            if not isinstance(reply, dict):
                raise _bad_reply(f"a reply that is {_kind(reply)}, not a JSON object")
            # Event lines (after subscribe) have an "event" and no "id" and no "ok": skipped.
            if "id" not in reply and "ok" not in reply and isinstance(reply.get("event"), str):
                continue
            break
    if "id" not in reply:
        raise _bad_reply("a reply without an 'id'")
    reply_id = reply["id"]
    # By type too: in Python True == 1 and 1.0 == 1, and neither is this request's id.
    # id null: vaultd could not read our line, and says why in an error.
    if reply_id is not None and not (type(reply_id) is int and reply_id == request_id):
        raise _bad_reply(f"a reply whose 'id' ({_kind(reply_id)}) is not this request's {request_id}")
    ok = reply.get("ok")
    if type(ok) is not bool:
        raise _bad_reply(f"a reply whose 'ok' is {'missing' if 'ok' not in reply else _kind(ok)}, not true or false")
    if not ok:
        error = reply.get("error")
        if not isinstance(error, dict):
            raise _bad_reply(f"a failure whose 'error' is {'missing' if 'error' not in reply else _kind(error)}, not an object")
        code, message = error.get("code"), error.get("message")
        if type(code) is not str or not code or type(message) is not str:
            raise _bad_reply("a failure whose error 'code' or 'message' is not a string")
        raise VaultError(code, message)
    if reply_id is None:
        raise _bad_reply("a success with 'id' null, tied to no request")
    return reply


def token(account, min_ttl=60, scope=None, path=None):
    scoped = {} if scope is None else {"scope": scope}
    access_token = call("token", path, account=account, min_ttl=min_ttl, **scoped).get("access_token")
    if type(access_token) is not str or not access_token:
        raise _bad_reply("a token reply whose 'access_token' is missing, empty or not a string")
    return access_token


def dpop_proof(account, method, url, scope=None, min_ttl=None, path=None):
    """A DPoP proof for one request to a resource server, with the access token
    it goes with, for an account whose tokens are DPoP-bound (else a
    VaultError "bad_request"). Send result["authorization"] as Authorization
    and result["dpop"] as DPoP; ask again for the next request. The dict also
    has token_type ("DPoP"), expires_at, expires_in and scope."""
    fields = {"account": account, "htm": method, "htu": url}
    if scope is not None:
        fields["scope"] = scope
    if min_ttl is not None:
        fields["min_ttl"] = min_ttl
    reply = call("dpop.proof", path, **fields)
    proof, authorization = reply.get("dpop"), reply.get("authorization")
    if type(proof) is not str or not proof:
        raise _bad_reply("a proof reply whose 'dpop' is missing, empty or not a string")
    if type(authorization) is not str or not authorization.startswith("DPoP "):
        raise _bad_reply("a proof reply whose 'authorization' is not 'DPoP' and a token")
    return {name: value for name, value in reply.items() if name not in ("id", "ok")}


def dpop_nonce(account, origin, nonce, path=None):
    """Records a resource server's DPoP-Nonce (from a 401 with
    `WWW-Authenticate: DPoP error="use_dpop_nonce"`, or any answer's DPoP-Nonce
    header) for the account's later proofs to `origin` (scheme://host[:port])."""
    call("dpop.nonce", path, account=account, origin=origin, nonce=nonce)


def _escaped(text):
    """`text` with control characters (C0, DEL, C1), format characters (bidi
    overrides, ...), line separators and lone surrogates written as visible
    escapes (\\x1b, \\u202e, ...), so it stays on one line and cannot drive a
    terminal."""
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    out = []
    for char in str(text):
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            point = ord(char)
            out.append(named.get(char) or (f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}" if point < 0x10000 else f"\\U{point:08x}"))
        else:
            out.append(char)
    return "".join(out)


def _main(argv):
    """The command line: prints the token and returns None, or returns the error line."""
    if len(argv) != 2:
        return "usage: tokenvault.py ACCOUNT"
    try:
        access_token = token(argv[1])
        if _escaped(access_token) != access_token:  # printed to a terminal, or into a shell's $(...)
            raise VaultError("internal", "vaultd sent an access token with control characters; it was not printed")
    except OSError as error:
        return "tokenvault.py: error: " + _escaped(f"cannot reach vaultd ({error.strerror or error}); is it running?")
    except (VaultError, ValueError) as error:
        return "tokenvault.py: error: " + _escaped(error)
    try:
        print(access_token)
    except UnicodeEncodeError:
        return "tokenvault.py: error: the access token cannot be written in this terminal's encoding; set PYTHONIOENCODING=utf-8"


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
