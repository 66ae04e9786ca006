#!/usr/bin/env bash
# Start a throw-away, fully provisioned Glewlwyd OpenID provider on 127.0.0.1.
#
#   demo/glewlwyd/start.sh DIR
#
# DIR (created if missing, normally a fresh temp dir) receives the SQLite db,
# config, RSA keys, glewlwyd.pid, glewlwyd.log and, once everything answers,
# DIR/env: shell-sourceable KEY='VALUE' lines (every value single-quoted,
# none contains a quote). The issuer is printed on stdout; progress and errors
# go to stderr. Stop it with demo/glewlwyd/stop.sh DIR.
#
# Environment knobs:
#   GLEWLWYD_ACCESS_TOKEN_SECONDS   access-token lifetime (default 3)
#   GLEWLWYD_REFRESH_TOKEN_SECONDS  refresh-token lifetime (default 1209600)
#   GLEWLWYD_DEVICE_INTERVAL        device-flow polling interval (default 1)
#   GLEWLWYD_DPOP                   off (default), on (DPoP allowed, RFC 9449),
#                                   or nonce:N (on, with server nonces that
#                                   rotate after N uses)
#   GLEWLWYD_REGISTRATION           off (default), open (dynamic client
#                                   registration, RFC 7591, without an initial
#                                   access token; RFC 7592 management on), or
#                                   token (registration needs an initial access
#                                   token with scope register: initial-token.py
#                                   DIR prints one; DIR/env names the registrar
#                                   client that gets it)
#   GLEWLWYD_PAR                    off (default), on (pushed authorization
#                                   requests allowed at ISSUER/par, RFC 9126),
#                                   or required (every authorization request
#                                   of the issuer must be pushed; a plain
#                                   /auth request is refused with 403)
#   GLEWLWYD_START_TIMEOUT          seconds to wait for readiness (default 30)
#   GLEWLWYD_LOG_LEVEL              NONE|ERROR|WARNING|INFO|DEBUG (default INFO)
#
# Needs the Debian packages glewlwyd, sqlite3, openssl, and python3.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCHEMA=/usr/share/dbconfig-common/data/glewlwyd/install/sqlite3
BASE_CONF=/etc/glewlwyd/glewlwyd.conf
WEBAPP=/usr/share/glewlwyd/webapp/

say() { echo "glewlwyd/start.sh: $*" >&2; }
fail() { say "error: $*"; exit 1; }

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
DIR="$1"

AT_SECONDS="${GLEWLWYD_ACCESS_TOKEN_SECONDS:-3}"
RT_SECONDS="${GLEWLWYD_REFRESH_TOKEN_SECONDS:-1209600}"
DEVICE_INTERVAL="${GLEWLWYD_DEVICE_INTERVAL:-1}"
DPOP="${GLEWLWYD_DPOP:-off}"
[[ "$DPOP" =~ ^(off|on|nonce:[1-9][0-9]*)$ ]] || fail "GLEWLWYD_DPOP must be off, on or nonce:N (got '$DPOP')"
REGISTRATION="${GLEWLWYD_REGISTRATION:-off}"
[[ "$REGISTRATION" =~ ^(off|open|token)$ ]] || fail "GLEWLWYD_REGISTRATION must be off, open or token (got '$REGISTRATION')"
PAR="${GLEWLWYD_PAR:-off}"
[[ "$PAR" =~ ^(off|on|required)$ ]] || fail "GLEWLWYD_PAR must be off, on or required (got '$PAR')"
TIMEOUT="${GLEWLWYD_START_TIMEOUT:-30}"
LOG_LEVEL="${GLEWLWYD_LOG_LEVEL:-INFO}"
check_positive() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -gt 0 ] || fail "$1 must be a positive integer (got '$2')"; }
check_positive GLEWLWYD_ACCESS_TOKEN_SECONDS "$AT_SECONDS"
check_positive GLEWLWYD_REFRESH_TOKEN_SECONDS "$RT_SECONDS"
check_positive GLEWLWYD_DEVICE_INTERVAL "$DEVICE_INTERVAL"
check_positive GLEWLWYD_START_TIMEOUT "$TIMEOUT"

for cmd in glewlwyd sqlite3 openssl python3; do
    command -v "$cmd" >/dev/null 2>&1 || fail "'$cmd' not found (apt-get install glewlwyd sqlite3 openssl python3)"
done
[ -r "$SCHEMA" ] || fail "schema $SCHEMA missing (is the glewlwyd package installed?)"
[ -r "$BASE_CONF" ] || fail "config $BASE_CONF missing (is the glewlwyd package installed?)"

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
PIDFILE="$DIR/glewlwyd.pid"
LOG="$DIR/glewlwyd.log"

# A live process whose command line names this DIR's config is ours from before.
if [ -s "$PIDFILE" ] && [ -r "/proc/$(cat "$PIDFILE")/cmdline" ] \
   && tr '\0' ' ' <"/proc/$(cat "$PIDFILE")/cmdline" | grep -qF -- "$DIR/glewlwyd.conf" \
   && [ "$(awk '{print $3}' "/proc/$(cat "$PIDFILE")/stat" 2>/dev/null)" != Z ]; then
    fail "a Glewlwyd started from $DIR is still running (pid $(cat "$PIDFILE")); run stop.sh first"
fi

PID=""
cleanup_on_error() {
    local rc=$?
    if [ $rc -ne 0 ]; then
        # Only clean up what this run created (never another instance's files).
        if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
            kill "$PID" 2>/dev/null || true
            for _ in $(seq 50); do
                [ "$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null || echo Z)" != Z ] || break
                sleep 0.1
            done
            [ "$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null || echo Z)" = Z ] || kill -9 "$PID" 2>/dev/null || true
            wait "$PID" 2>/dev/null || true
        fi
        rm -f "$PIDFILE" "$DIR/env"
        if [ -s "$LOG" ]; then
            say "last lines of $LOG:"
            tail -n 20 "$LOG" >&2 || true
        fi
    fi
}
trap cleanup_on_error EXIT

t0=$(date +%s.%N)

# Fresh state.
rm -f "$DIR/glewlwyd.db" "$DIR/env" "$DIR/env.tmp" "$LOG" "$PIDFILE"
sqlite3 "$DIR/glewlwyd.db" <"$SCHEMA" || fail "could not create $DIR/glewlwyd.db"
openssl genrsa -out "$DIR/oidc-key.pem" 2048 2>/dev/null || fail "openssl genrsa failed"
openssl rsa -in "$DIR/oidc-key.pem" -pubout -out "$DIR/oidc-pub.pem" 2>/dev/null || fail "openssl rsa -pubout failed"
chmod 600 "$DIR/oidc-key.pem"

cat >"$DIR/glewlwyd-db.conf" <<EOF
database = {
  type = "sqlite3"
  path = "$DIR/glewlwyd.db"
};
EOF

free_port() {
    python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Wait until something answers HTTP at $1 (any status), or the process dies,
# or the deadline passes. Exit 0 = answered, 3 = process gone, 4 = timeout.
wait_http() {
    python3 - "$1" "$2" "$3" <<'EOF'
import os, sys, time, urllib.request, urllib.error
url, pid, deadline = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
delay = 0.02
while True:
    try:
        opener.open(url, timeout=2).read()
        sys.exit(0)
    except urllib.error.HTTPError:
        sys.exit(0)
    except Exception:
        pass
    try:
        os.kill(pid, 0)
        with open("/proc/%d/stat" % pid) as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                sys.exit(3)
    except (ProcessLookupError, FileNotFoundError):
        sys.exit(3)
    if time.time() > deadline:
        sys.exit(4)
    time.sleep(delay)
    delay = min(delay * 1.5, 0.25)
EOF
}

deadline=$(python3 -c "import time; print(time.time() + $TIMEOUT)")
PORT=""
for attempt in 1 2 3; do
    PORT="$(free_port)"
    sed -E \
        -e '/^[[:space:]]*(port|bind_address|external_url|log_mode|log_level|log_file|static_files_path)[[:space:]]*=/d' \
        -e '/^[[:space:]]*@include/d' \
        "$BASE_CONF" >"$DIR/glewlwyd.conf"
    cat >>"$DIR/glewlwyd.conf" <<EOF

# --- tokenvault test instance (demo/glewlwyd/start.sh) ---
port=$PORT
bind_address="127.0.0.1"
external_url="http://127.0.0.1:$PORT"
log_mode="file"
log_level="$LOG_LEVEL"
log_file="$LOG"
static_files_path="$WEBAPP"
@include "$DIR/glewlwyd-db.conf"
EOF
    glewlwyd -c "$DIR/glewlwyd.conf" </dev/null >>"$DIR/glewlwyd.stdout" 2>&1 &
    PID=$!
    echo "$PID" >"$PIDFILE"
    set +e
    wait_http "http://127.0.0.1:$PORT/config.json" "$PID" "$deadline"
    rc=$?
    set -e
    case $rc in
        0) break ;;
        3) wait "$PID" 2>/dev/null || true
           say "glewlwyd exited during start-up on port $PORT (attempt $attempt)"
           PID=""; rm -f "$PIDFILE"
           [ $attempt -lt 3 ] || fail "glewlwyd would not start; see $LOG and $DIR/glewlwyd.stdout" ;;
        *) fail "glewlwyd did not answer on 127.0.0.1:$PORT within ${TIMEOUT}s" ;;
    esac
done

BASE="http://127.0.0.1:$PORT"
python3 "$HERE/provision.py" --base "$BASE" \
    --key "$DIR/oidc-key.pem" --cert "$DIR/oidc-pub.pem" \
    --access-token-seconds "$AT_SECONDS" --refresh-token-seconds "$RT_SECONDS" \
    --device-interval "$DEVICE_INTERVAL" --dpop "$DPOP" --registration "$REGISTRATION" --par "$PAR" \
    || fail "provisioning through the admin API failed"

# The OIDC plugin must now answer discovery; take the issuer from it. With
# registration on, also wait until discovery lists registration_endpoint, and
# with PAR on or required until it lists pushed_authorization_request_endpoint
# and the matching require_pushed_authorization_requests, so a test can rely
# on them once this script returns. Prints "ISSUER REGISTRATION_ENDPOINT
# PAR_ENDPOINT" (an endpoint is "-" when its feature is off).
DISCOVERED="$(python3 - "$BASE/api/oidc/.well-known/openid-configuration" "$deadline" "$REGISTRATION" "$PAR" <<'EOF'
import json, sys, time, urllib.request, urllib.error
url, deadline, registration, par = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
while True:
    try:
        doc = json.loads(opener.open(url, timeout=2).read())
        issuer = doc["issuer"]
        if registration != "off" and not doc.get("registration_endpoint"):
            err = "no registration_endpoint listed yet"
        elif par != "off" and not doc.get("pushed_authorization_request_endpoint"):
            err = "no pushed_authorization_request_endpoint listed yet"
        elif par != "off" and doc.get("require_pushed_authorization_requests") is not (par == "required"):
            err = "require_pushed_authorization_requests is %r, not %s yet" % (
                doc.get("require_pushed_authorization_requests"), "true" if par == "required" else "false")
        else:
            print(issuer,
                  doc["registration_endpoint"] if registration != "off" else "-",
                  doc["pushed_authorization_request_endpoint"] if par != "off" else "-")
            sys.exit(0)
    except Exception as e:
        err = e
    if time.time() > deadline:
        print("discovery did not answer as expected: %s" % err, file=sys.stderr)
        sys.exit(1)
    time.sleep(0.05)
EOF
)" || fail "OIDC discovery did not come up at $BASE/api/oidc (GLEWLWYD_REGISTRATION=$REGISTRATION, GLEWLWYD_PAR=$PAR)"
read -r ISSUER REGISTRATION_ENDPOINT PAR_ENDPOINT <<<"$DISCOVERED"

q() { printf "%s='%s'\n" "$1" "$2"; }
{
    q GLEWLWYD_DIR "$DIR"
    q GLEWLWYD_PID "$PID"
    q GLEWLWYD_PORT "$PORT"
    q GLEWLWYD_BASE_URL "$BASE"
    q GLEWLWYD_ISSUER "$ISSUER"
    q GLEWLWYD_DISCOVERY_URL "$ISSUER/.well-known/openid-configuration"
    q GLEWLWYD_LOG "$LOG"
    q GLEWLWYD_ACCESS_TOKEN_SECONDS "$AT_SECONDS"
    q GLEWLWYD_REFRESH_TOKEN_SECONDS "$RT_SECONDS"
    q GLEWLWYD_DEVICE_INTERVAL "$DEVICE_INTERVAL"
    q GLEWLWYD_DPOP "$DPOP"
    q GLEWLWYD_REGISTRATION "$REGISTRATION"
    if [ "$REGISTRATION" != off ]; then
        q GLEWLWYD_REGISTRATION_ENDPOINT "$REGISTRATION_ENDPOINT"
    fi
    if [ "$REGISTRATION" = token ]; then
        # As provision.py's REGISTRAR.
        q GLEWLWYD_REGISTRAR_CLIENT_ID "registrar"
        q GLEWLWYD_REGISTRAR_SECRET "s3cret-registrar"
    fi
    q GLEWLWYD_PAR "$PAR"
    if [ "$PAR" != off ]; then
        q GLEWLWYD_PAR_ENDPOINT "$PAR_ENDPOINT"
    fi
    q GLEWLWYD_SCOPE "openid offline_access profile email"
    q GLEWLWYD_REDIRECT_URI "http://127.0.0.1:53682/callback"
    q GLEWLWYD_USERNAME "ada"
    q GLEWLWYD_PASSWORD "correct horse"
    q GLEWLWYD_EMAIL "ada@example.org"
    q GLEWLWYD_ADMIN_USERNAME "admin"
    q GLEWLWYD_ADMIN_PASSWORD "password"
    q GLEWLWYD_PUBLIC_CLIENT_ID "public-app"
    q GLEWLWYD_PUBLIC_ROTATING_CLIENT_ID "public-rotating"
    q GLEWLWYD_CONFIDENTIAL_CLIENT_ID "confidential-app"
    q GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET "s3cret-confidential"
    q GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_ID "confidential-rotating"
    q GLEWLWYD_CONFIDENTIAL_ROTATING_CLIENT_SECRET "s3cret-rotating"
} >"$DIR/env.tmp"
mv "$DIR/env.tmp" "$DIR/env"

t1=$(date +%s.%N)
say "ready: issuer $ISSUER, pid $PID, $(python3 -c "print('%.2f' % ($t1 - $t0))")s (env in $DIR/env)"
echo "$ISSUER"
