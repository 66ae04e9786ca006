#!/usr/bin/env python3
"""The checks and companions of Tests/Soak/crash-safety.sh, one subcommand each
(python3 Tests/Soak/crash-safety.py NAME ARGS...). Never prints a token or a
password."""
import base64, ctypes, ctypes.util, hashlib, json, os, random, re, signal, socket, sqlite3, struct, sys, time

sys.dont_write_bytecode = True
sys.path.insert(0, os.environ["GLEWLWYD_SCRIPTS"])
from importlib import import_module
chain_module = import_module("refresh-chain")


def call(path, request, timeout=30.0):
    """One request on a fresh connection; the reply as a dict."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall((json.dumps(request) + "\n").encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return json.loads(data)
    finally:
        s.close()


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmd_ready(sock, pid, seconds):
    """Waits until vaultd answers status (or dies); prints the status reply."""
    deadline = time.time() + float(seconds)
    while time.time() < deadline:
        try:
            print(json.dumps(call(sock, {"id": "ready", "op": "status"}, timeout=5)))
            return 0
        except (OSError, ValueError):
            if not alive(int(pid)):
                return 3
            time.sleep(0.01)
    return 4


def cmd_token(sock, seconds):
    """A token for 'work', waiting out a busy issuer; prints the outcome, never the token."""
    deadline = time.time() + float(seconds)
    last = "no answer"
    while time.time() < deadline:
        try:
            reply = call(sock, {"id": "check", "op": "token", "account": "work", "min_ttl": 1}, timeout=15)
        except (OSError, ValueError) as e:
            last = "socket: %s" % type(e).__name__
            time.sleep(0.05)
            continue
        if reply.get("ok") and reply.get("access_token"):
            print("ok")
            return 0
        code = (reply.get("error") or {}).get("code", "?")
        if code != "idp_unavailable":
            print(code)
            return 0
        last = code
        time.sleep(min(max((reply["error"].get("retry_after_ms") or 100) / 1000.0, 0.05), 2))
    print(last.replace(" ", "_"))
    return 0


def cmd_companion(sock, min_ttl, pause_ms, out):
    """Asks for tokens until SIGTERM; keeps the SHA-512 of every distinct token
    served (in out.hashes) and a running count (in out.count)."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    served, errors, seen = 0, {}, set()
    hashes = open(out + ".hashes", "a")
    last_write = 0.0
    conn, buf = None, b""
    request = (json.dumps({"op": "token", "account": "work", "min_ttl": int(min_ttl)}) + "\n").encode()
    while not stop:
        try:
            if conn is None:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.settimeout(30)
                conn.connect(sock)
                buf = b""
            conn.sendall(request)
            while b"\n" not in buf:
                chunk = conn.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            reply = json.loads(line)
            if reply.get("ok"):
                served += 1
                digest = hashlib.sha512(reply["access_token"].encode()).hexdigest()
                if digest not in seen:
                    seen.add(digest)
                    hashes.write(digest + "\n")
                    hashes.flush()
            else:
                code = (reply.get("error") or {}).get("code", "?")
                errors[code] = errors.get(code, 0) + 1
                time.sleep(0.05)
        except (OSError, ValueError):
            if conn is not None:
                conn.close()
            conn = None
            errors["no_daemon"] = errors.get("no_daemon", 0) + 1
            time.sleep(0.02)
        now = time.time()
        if now - last_write > 1:
            write_count(out, served, errors)
            last_write = now
        if int(pause_ms) > 0:
            time.sleep(int(pause_ms) / 1000.0)
    write_count(out, served, errors)
    return 0


def write_count(out, served, errors):
    with open(out + ".count.tmp", "w") as f:
        json.dump({"served": served, "errors": errors}, f)
    os.replace(out + ".count.tmp", out + ".count")


def cmd_quiet(port, seconds):
    """Waits until the provider holds no connection open (every request of the
    killed daemon has finished there). Prints how long it took."""
    port = int(port)
    t0 = time.time()
    deadline = t0 + float(seconds)
    while True:
        busy = 0
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                local_port = int(fields[1].split(":")[1], 16)
                state = fields[3]
                # Established, FIN-WAIT, CLOSE-WAIT, LAST-ACK, CLOSING: not yet done.
                if local_port == port and state not in ("0A", "06", "07"):
                    busy += 1
        if busy == 0:
            print("%.3f" % (time.time() - t0))
            return 0
        if time.time() > deadline:
            print("timeout")
            return 0
        time.sleep(0.005)


_sodium = None


def sodium():
    global _sodium
    if _sodium is None:
        _sodium = ctypes.CDLL(ctypes.util.find_library("sodium") or "libsodium.so.23")
        if _sodium.sodium_init() < 0:
            raise RuntimeError("sodium_init failed")
    return _sodium


def aead_open(box, key, ad):
    if len(box) < 40:
        return None
    nonce, c = box[:24], box[24:]
    m = ctypes.create_string_buffer(max(len(c) - 16, 1))
    mlen = ctypes.c_ulonglong(0)
    rc = sodium().crypto_aead_xchacha20poly1305_ietf_decrypt(
        m, ctypes.byref(mlen), None, c, ctypes.c_ulonglong(len(c)), ad, ctypes.c_ulonglong(len(ad)), nonce, key)
    return None if rc != 0 else m.raw[:mlen.value]


def parse_vault(path, key):
    """The records of a vault file as {name: {tag: bytes}}; raises ValueError when corrupt."""
    b = open(path, "rb").read()
    if b[:8] != b"TOKENVLT":
        raise ValueError("no magic")
    off = 8
    version, kind = struct.unpack_from(">HB", b, off)
    off += 3 + 16 + 8 + 8
    if version != 1 or kind != 1:
        raise ValueError("version %d kind %d" % (version, kind))
    (count,) = struct.unpack_from(">I", b, off)
    off += 4
    header = b[:off]
    if aead_open(b[off:off + 40], key, header) != b"":
        raise ValueError("the header check box does not open")
    off += 40
    records = {}
    for _ in range(count):
        (nl,) = struct.unpack_from(">H", b, off)
        name = b[off + 2:off + 2 + nl]
        off += 2 + nl
        (bl,) = struct.unpack_from(">I", b, off)
        box = b[off + 4:off + 4 + bl]
        off += 4 + bl
        if len(box) != bl:
            raise ValueError("truncated")
        plain = aead_open(box, key, name)
        if plain is None:
            raise ValueError("a record does not open")
        fields, p = {}, 0
        while p < len(plain):
            if len(plain) - p < 5:
                raise ValueError("a record's fields are cut short")
            tag, ln = plain[p], struct.unpack_from(">I", plain, p + 1)[0]
            if len(plain) - p - 5 < ln:
                raise ValueError("a field runs past its record")
            fields[tag] = plain[p + 5:p + 5 + ln]
            p += 5 + ln
        records[name.decode()] = fields
    if off != len(b):
        raise ValueError("bytes after the last record")
    return records


def newest_rows(db_path):
    db = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True, timeout=10)
    try:
        refresh = db.execute("SELECT max(gpor_id) FROM gpo_refresh_token").fetchone()[0]
        access = db.execute("SELECT gpoa_token_hash FROM gpo_access_token ORDER BY gpoa_id DESC LIMIT 1").fetchone()
    finally:
        db.close()
    return refresh, access[0] if access else None


def hash_id(db_path, stored_hash):
    db = sqlite3.connect("file:%s?mode=ro" % db_path, uri=True, timeout=10)
    try:
        row = db.execute("SELECT gpor_id FROM gpo_refresh_token WHERE gpor_token_hash = ?", (stored_hash,)).fetchone()
    finally:
        db.close()
    return row[0] if row else None


def cmd_snapshot(state, config, gw, prefix):
    """With vaultd dead: checks the vault and accounts.json independently of
    vaultd, and records where the vault's refresh token stands at the
    provider (its hash goes to PREFIX.hash, the newest access token's hash to
    PREFIX.access). Prints one JSON object."""
    out = {"vault_ok": False, "accounts_ok": False, "tmp_left": any(n.startswith("vault.sealed.tmp") for n in os.listdir(state + "/tokenvault"))}
    try:
        names = [a.get("name") for a in json.load(open(config + "/tokenvault/accounts.json"))["accounts"]]
        out["accounts_ok"] = "work" in names
    except Exception as e:
        out["accounts_error"] = type(e).__name__
    try:
        key = open(state + "/tokenvault/vault.key", "rb").read()
        if len(key) != 32:
            raise ValueError("the key file is not 32 bytes")
        records = parse_vault(state + "/tokenvault/vault.sealed", key)
        out["vault_ok"] = True
        out["records"] = sorted(records)
        token = records.get("work", {}).get(1)
        out["has_refresh_token"] = token is not None
        out["has_client_secret"] = records.get("work", {}).get(2) is not None
        db = gw + "/glewlwyd.db"
        newest_refresh, newest_access = newest_rows(db)
        if token is not None:
            stored = chain_module.token_hash(token.decode())
            with open(prefix + ".hash", "w") as f:
                f.write(stored)
            out["chain"] = chain_module.chain_position(db, stored)
            out["stored_id"] = hash_id(db, stored)
        out["newest_refresh_id"] = newest_refresh
        with open(prefix + ".access", "w") as f:
            f.write(base64.b64decode(newest_access[len("{SHA512}"):]).hex() if newest_access else "")
    except Exception as e:
        out["vault_error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out, sort_keys=True))
    return 0


def cmd_chain(gw, prefix):
    stored = open(prefix + ".hash").read().strip()
    facts = chain_module.chain_position(gw + "/glewlwyd.db", stored)
    print(json.dumps(facts, sort_keys=True))
    return 0


def cmd_served(prefix, *hash_files):
    """'served' when the access token recorded in PREFIX.access reached a companion."""
    wanted = open(prefix + ".access").read().strip()
    for path in hash_files:
        if not wanted or not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                if line.split()[:1] == [wanted]:
                    print("served")
                    return 0
    print("unserved")
    return 0


def shell(**values):
    """Prints NAME=VALUE lines for the script to eval; values are reduced to a safe alphabet."""
    for name, value in values.items():
        if isinstance(value, bool):
            value = "yes" if value else "no"
        print("%s=%s" % (name, re.sub(r"[^A-Za-z0-9._-]", "_", str(value))))


def cmd_afterkill(port, state, config, gw, prefix):
    """With vaultd dead: waits for the provider to finish with it, then takes
    the snapshot (PREFIX.json) and says whether the vault's refresh token was
    already spent by an answer the vault never wrote."""
    import io, contextlib
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):
        cmd_quiet(port, 10)
    snap = io.StringIO()
    with contextlib.redirect_stdout(snap):
        cmd_snapshot(state, config, gw, prefix)
    with open(prefix + ".json", "w") as f:
        f.write(snap.getvalue())
    s = json.loads(snap.getvalue())
    chain = s.get("chain") or {}
    intact = (s["vault_ok"] and s["accounts_ok"] and s.get("has_refresh_token") is True
              and s.get("has_client_secret") is True)
    spent = (chain.get("enabled") is False and chain.get("successors") == 1
             and chain.get("successor_id") == s.get("newest_refresh_id"))
    shell(quiet=quiet.getvalue().strip(), intact=intact, tmp_left=s["tmp_left"], spent_before=spent)
    return 0


def cmd_check(sock, pid):
    """After a restart: vaultd answers status, the account is there and signed
    in, and a token can be had. Prints restart=, status=, outcome=."""
    ready = io_capture(cmd_ready, sock, pid, 30)
    if not ready[1]:
        shell(restart="died" if ready[0] == 3 else "timeout", status="none", outcome="none")
        return 0
    status = json.loads(ready[1])
    account = (status.get("accounts") or [{}])[0]
    good = (status.get("ok") is True and status.get("locked") is False and account.get("name") == "work"
            and account.get("signed_in") is True)
    if not good:
        with open(os.environ.get("CRASH_STATUS_DUMP", "/dev/null"), "w") as f:
            json.dump(status, f)
    outcome = io_capture(cmd_token, sock, 30)[1].strip()
    shell(restart="ok", status="ok" if good else "bad", outcome=outcome)
    return 0


def io_capture(fn, *args):
    import io, contextlib
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = fn(*args)
    return rc, out.getvalue()


def cmd_loss(gw, prefix, spent_before, *hash_files):
    """Classifies a lost session: in the window when the provider holds the
    vault's token as spent with exactly one successor it issued. Prints
    window=, served=, and the chain facts to PREFIX.after.json."""
    facts = chain_module.chain_position(gw + "/glewlwyd.db", open(prefix + ".hash").read().strip())
    with open(prefix + ".after.json", "w") as f:
        json.dump(facts, f, sort_keys=True)
    window = facts["known"] and not facts["enabled"] and facts["successors"] == 1
    served = "unknown"
    if window and spent_before == "yes":
        # The successor was the provider's newest token at the kill, so the
        # newest access token came with that lost answer.
        served = io_capture(cmd_served, prefix, *hash_files)[1].strip()
    elif window:
        # The provider answered after vaultd had died: nobody had that answer.
        served = "unserved"
    shell(window=window, served=served)
    return 0


def cmd_field(path, *keys):
    """A field of a JSON object (read from a file or '-'), nested by keys; empty when absent."""
    value = json.load(sys.stdin if path == "-" else open(path))
    for k in keys:
        if isinstance(value, list):
            value = value[int(k)] if int(k) < len(value) else None
        elif isinstance(value, dict):
            value = value.get(k)
        else:
            value = None
    if value is None:
        print("")
    elif isinstance(value, bool):
        print("true" if value else "false")
    else:
        print(value)
    return 0


def cmd_delays(seed, count, max_ms):
    rng = random.Random(int(seed))
    for _ in range(int(count)):
        print("%.3f" % (rng.randint(0, int(max_ms)) / 1000.0))
    return 0


if __name__ == "__main__":
    sys.exit(globals()["cmd_" + sys.argv[1]](*sys.argv[2:]))
