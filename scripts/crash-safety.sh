#!/usr/bin/env bash
# Crash safety of vaultd against a real, rotating OpenID provider.
#
#   scripts/crash-safety.sh [KILLS]          (default 300)
#
# Starts Glewlwyd on 127.0.0.1 (scripts/glewlwyd/start.sh) with 2-second access
# tokens, signs ada in on its rotating confidential client (one-use refresh
# tokens: every refresh spends the token and hands out its successor), runs
# vaultd with the sealed-file backend in a temporary XDG tree, and keeps
# companions asking for tokens: one running `vaultctl token`, the others
# speaking the socket protocol. Then KILLS times: wait a random 0-3 s, SIGKILL
# vaultd, restart it, and check that
#   - the vault opens: vaultd starts and answers `status` (and the sealed file
#     parses and authenticates independently of vaultd: header check box,
#     every record under its account name, no trailing bytes; accounts.json
#     parses);
#   - no record is corrupt: the account is there and signed in;
#   - the session survives: a token can be had with the refresh token the
#     vault held at the kill.
# A session may be lost only when the kill fell between the issuer's answer
# and the durable write of the rotated refresh token. Glewlwyd's database
# tells: the refresh token the vault held is already spent and the issuer
# issued exactly one successor, the newest token it issued, which the vault
# never held. Such losses are counted "lost in the window" (and ada signs in
# again); any other loss is unexplained. For each of them the script also
# checks that the access token of that lost answer never reached a companion
# (the rotated refresh token is written before anyone is answered).
#
# Exit 0 when no record was corrupt, no loss was unexplained, no lost answer
# was served, and nothing else failed.
#
# Three companions: one `vaultctl token --min-ttl 1` loop and two socket
# loops (min_ttl 0 and 1), 10 ms between requests.
#
# Environment:
#   CRASH_BIN     a folder holding vaultd and vaultctl (else a release build)
#   CRASH_SEED    seed for the kill moments (default: from the clock)
#   CRASH_KEEP=1  keep the work folder (kept anyway on failure)
#
# Needs what scripts/glewlwyd/start.sh needs, plus libsodium (already a build
# dependency) for the independent check of the sealed file.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"

KILLS="${1:-300}"
[[ "$KILLS" =~ ^[0-9]+$ ]] && [ "$KILLS" -gt 0 ] || { echo "usage: $0 [KILLS]" >&2; exit 2; }
BUILD=release
COMPANIONS=3
MIN_TTLS=(1 0 1)
PAUSE_MS=10
MAX_DELAY_MS=3000
AT_SECONDS=2
SEED="${CRASH_SEED:-$(( $(date +%s) % 32768 ))}"

say() { echo "crash-safety: $*" >&2; }
fail() { say "error: $*"; exit 1; }

# --- Build ---------------------------------------------------------------
if [ -n "${CRASH_BIN:-}" ]; then
    BIN="$CRASH_BIN"
else
    flags=(-c release --static-swift-stdlib)
    say "building vaultd and vaultctl ($BUILD)"
    (cd "$ROOT" && swift build "${flags[@]}" --product vaultd >&2 \
        && swift build "${flags[@]}" --product vaultctl >&2) || fail "the build failed"
    BIN="$ROOT/.build/$BUILD"
fi
[ -x "$BIN/vaultd" ] && [ -x "$BIN/vaultctl" ] || fail "no vaultd and vaultctl in $BIN"

# --- Work folder, provider -------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/crash-safety.XXXXXX")"
GW="$WORK/glewlwyd"
STATE="$WORK/state"
CONFIG="$WORK/config"
RUN="$WORK/run"
SOCK="$RUN/vaultd.sock"
LOGS="$WORK/logs"
mkdir -p "$LOGS" "$RUN" && chmod 700 "$RUN"
LIB="$WORK/crashlib.py"

VAULTD_PID=""
COMPANION_PIDS=()
FAILED=1
cleanup() {
    for pid in "${COMPANION_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${COMPANION_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    if [ -n "$VAULTD_PID" ]; then kill -TERM "$VAULTD_PID" 2>/dev/null; wait "$VAULTD_PID" 2>/dev/null; fi
    [ -d "$GW" ] && "$HERE/glewlwyd/stop.sh" "$GW" 2>/dev/null
    if [ "$FAILED" = 0 ] && [ "${CRASH_KEEP:-0}" != 1 ]; then
        rm -rf "$WORK"
    else
        say "work folder kept: $WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat >"$LIB" <<'PYTHON'
"""Helpers of scripts/crash-safety.sh. Never prints a token or a password."""
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
PYTHON

export GLEWLWYD_SCRIPTS="$HERE/glewlwyd"
py() { python3 "$LIB" "$@"; }

T0=$(date +%s.%N)
say "work folder $WORK; $KILLS kills, $COMPANIONS companions (min_ttl ${MIN_TTLS[*]:0:$COMPANIONS}), seed $SEED, $BUILD build"
GLEWLWYD_ACCESS_TOKEN_SECONDS="$AT_SECONDS" "$HERE/glewlwyd/start.sh" "$GW" >/dev/null || fail "Glewlwyd did not start"
# shellcheck disable=SC1091
. "$GW/env"
CLIENT="$GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_ID"

vctl() { TOKENVAULT_SOCKET="$SOCK" "$BIN/vaultctl" "$@"; }

INCARNATION=0
start_vaultd() {
    INCARNATION=$((INCARNATION + 1))
    XDG_STATE_HOME="$STATE" XDG_CONFIG_HOME="$CONFIG" XDG_RUNTIME_DIR="$RUN" \
        DBUS_SESSION_BUS_ADDRESS="unix:path=$WORK/no-bus" JOURNAL_STREAM='' \
        "$BIN/vaultd" --socket "$SOCK" --backend file --key-source keyfile --log-level info \
        </dev/null >/dev/null 2>"$LOGS/vaultd.$INCARNATION.log" &
    VAULTD_PID=$!
}

sign_in() {
    printf '%s\n' "$GLEWLWYD_PASSWORD" | vctl signin work --password --username "$GLEWLWYD_USERNAME" >/dev/null
}

start_vaultd
py ready "$SOCK" "$VAULTD_PID" 30 >/dev/null || fail "vaultd did not start; see $LOGS/vaultd.1.log"
printf '%s\n' "$GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_SECRET" | vctl account add work --issuer "$GLEWLWYD_ISSUER" \
    --client-id "$CLIENT" --client-secret --scope openid --scope offline_access --scope profile --scope email >/dev/null \
    || fail "account add failed"
sign_in || fail "the first sign-in failed"
SIGNINS=1
[ "$(py token "$SOCK" 20)" = ok ] || fail "no token after the first sign-in"

# --- Companions ------------------------------------------------------------
vaultctl_companion() {
    local out="$1" min_ttl="$2" token digest _
    trap 'exit 0' TERM
    while :; do
        if token="$(vctl token work --min-ttl "$min_ttl" 2>/dev/null)" && [ -n "$token" ]; then
            read -r digest _ < <(printf '%s' "$token" | sha512sum)
            echo "$digest" >>"$out.hashes"
        else
            sleep 0.05
        fi
        sleep "$(printf '%d.%03d' $((PAUSE_MS / 1000)) $((PAUSE_MS % 1000)))"
    done
}
HASH_FILES=()
for i in $(seq "$COMPANIONS"); do
    out="$WORK/companion.$i"
    : >"$out.hashes"
    HASH_FILES+=("$out.hashes")
    if [ "$i" = 1 ]; then
        vaultctl_companion "$out" "${MIN_TTLS[0]}" </dev/null >/dev/null &
    else
        python3 "$LIB" companion "$SOCK" "${MIN_TTLS[$((i - 1))]}" "$PAUSE_MS" "$out" </dev/null >/dev/null &
    fi
    COMPANION_PIDS+=($!)
done

# --- The kills -------------------------------------------------------------
mapfile -t DELAYS < <(py delays "$SEED" "$KILLS" "$MAX_DELAY_MS")
restarts_ok=0 corrupt=0 survived=0 lost_window=0 unexplained=0 other=0 lost_served=0 predicted_mismatch=0
tmp_count=0 not_quiet=0 done_kills=0 quiet_sum=0
note() { echo "$*" >>"$WORK/kills.log"; }

for k in $(seq "$KILLS"); do
    delay="${DELAYS[$((k - 1))]}"
    sleep "$delay"
    kill -KILL "$VAULTD_PID" 2>/dev/null
    wait "$VAULTD_PID" 2>/dev/null
    VAULTD_PID=""
    done_kills=$k

    # vaultd is dead: check the files it left, and where its refresh token stands.
    quiet="" intact="" tmp_left="" spent_before=""
    eval "$(py afterkill "$GLEWLWYD_PORT" "$STATE" "$CONFIG" "$GW" "$WORK/snap")"
    if [ "$quiet" = timeout ]; then not_quiet=$((not_quiet + 1)); else quiet_sum="$quiet_sum+$quiet"; fi
    [ "$tmp_left" = yes ] && tmp_count=$((tmp_count + 1))
    if [ "$intact" != yes ]; then
        corrupt=$((corrupt + 1))
        say "kill $k: the vault or accounts.json does not check out: $(cat "$WORK/snap.json")"
        note "kill $k delay $delay: CORRUPT $(cat "$WORK/snap.json")"
        break
    fi

    # Restart: the vault opens, the account is whole, a token comes.
    start_vaultd
    restart="" status="" outcome=""
    eval "$(CRASH_STATUS_DUMP="$WORK/status.json" py check "$SOCK" "$VAULTD_PID")"
    if [ "$restart" != ok ]; then
        if grep -qiE "corrupt|does not open|truncated|not a tokenvault" "$LOGS/vaultd.$INCARNATION.log"; then
            corrupt=$((corrupt + 1))
        else
            other=$((other + 1))
        fi
        say "kill $k: vaultd did not start again ($restart): $(tail -n 3 "$LOGS/vaultd.$INCARNATION.log")"
        note "kill $k delay $delay: NO RESTART ($restart)"
        break
    fi
    restarts_ok=$((restarts_ok + 1))
    if [ "$status" != ok ]; then
        corrupt=$((corrupt + 1))
        say "kill $k: status after the restart: $(cat "$WORK/status.json")"
        note "kill $k delay $delay: BAD STATUS $(cat "$WORK/status.json")"
        break
    fi

    case "$outcome" in
        ok)
            survived=$((survived + 1))
            [ "$spent_before" = yes ] && predicted_mismatch=$((predicted_mismatch + 1))
            note "kill $k delay $delay: survived (provider quiet after $quiet s)"
            ;;
        reauth_required)
            window="" served=""
            eval "$(py loss "$GW" "$WORK/snap" "$spent_before" "${HASH_FILES[@]}")"
            if [ "$window" = yes ]; then
                lost_window=$((lost_window + 1))
                [ "$spent_before" = yes ] || predicted_mismatch=$((predicted_mismatch + 1))
                if [ "$served" = served ]; then
                    lost_served=$((lost_served + 1))
                    say "kill $k: a companion was given the access token of an answer the vault never wrote"
                fi
                note "kill $k delay $delay: lost in the window (spent before the restart: $spent_before; lost answer $served)"
                say "kill $k (after ${delay} s): session lost in the window between the issuer's answer and the durable write"
            else
                unexplained=$((unexplained + 1))
                say "kill $k: session lost outside the window: before $(cat "$WORK/snap.json"), after $(cat "$WORK/snap.after.json")"
                note "kill $k delay $delay: UNEXPLAINED LOSS before $(cat "$WORK/snap.json") after $(cat "$WORK/snap.after.json")"
            fi
            if sign_in && [ "$(py token "$SOCK" 30)" = ok ]; then
                SIGNINS=$((SIGNINS + 1))
            else
                other=$((other + 1))
                say "kill $k: signing in again failed"
                break
            fi
            ;;
        *)
            other=$((other + 1))
            say "kill $k: no token after the restart: $outcome"
            note "kill $k delay $delay: OTHER $outcome"
            if ! { sign_in && [ "$(py token "$SOCK" 30)" = ok ]; }; then break; fi
            SIGNINS=$((SIGNINS + 1))
            ;;
    esac
    if [ $((k % 25)) = 0 ]; then
        say "$k/$KILLS kills: $survived survived, $lost_window lost in the window, $unexplained unexplained, $corrupt corrupt, $other other"
    fi
done

# --- Summary ---------------------------------------------------------------
for pid in "${COMPANION_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
for pid in "${COMPANION_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
COMPANION_PIDS=()
served_total=$(wc -l <"$WORK/companion.1.hashes")
for i in $(seq 2 "$COMPANIONS"); do
    n="$(py field "$WORK/companion.$i.count" served 2>/dev/null)"
    served_total=$((served_total + ${n:-0}))
done
distinct=$(cat "${HASH_FILES[@]}" | sort -u | wc -l)
refreshed=$(cat "$LOGS"/vaultd.*.log | grep -c "token refreshed")
rotations=$(sqlite3 "file:$GW/glewlwyd.db?mode=ro" "SELECT count(*) FROM gpo_refresh_token WHERE gpor_client_id = '$CLIENT'")
rotations=$((rotations - SIGNINS))
unavailable=$(cat "$LOGS"/vaultd.*.log | grep -c "issuer unavailable")
provider_errors=$(grep -c "Error executing sql query" "$GW/glewlwyd.log")
T1=$(date +%s.%N)
wall=$(python3 -c "print('%.1f' % ($T1 - $T0))")
quiet_mean=$(python3 -c "print('%.3f' % (($quiet_sum) / max($done_kills - $not_quiet, 1)))")

cat <<EOF
crash-safety summary ($BUILD vaultd, file backend, seed $SEED)
  kills                         $done_kills of $KILLS
  restarts ok (vault opened)    $restarts_ok
  corrupt records               $corrupt
  sessions survived             $survived
  sessions lost in the window   $lost_window
  unexplained losses            $unexplained
  lost answers served           $lost_served
  other failures                $other
  sign-ins                      $SIGNINS
  tokens served to companions   $served_total ($distinct distinct access tokens)
  refreshes vaultd logged       $refreshed
  rotations the issuer answered $rotations
  issuer unavailable (vaultd)   $unavailable (provider SQL errors: $provider_errors)
  leftover vault.sealed.tmp     $tmp_count
  window prediction mismatches  $predicted_mismatch
  provider quiet after kill     mean ${quiet_mean}s ($not_quiet timeouts)
  wall time                     ${wall}s
EOF

if [ "$corrupt" = 0 ] && [ "$unexplained" = 0 ] && [ "$other" = 0 ] && [ "$lost_served" = 0 ] \
    && [ "$done_kills" = "$KILLS" ] && [ "$restarts_ok" = "$KILLS" ]; then
    FAILED=0
    exit 0
fi
exit 1
