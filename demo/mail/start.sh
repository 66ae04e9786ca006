#!/usr/bin/env bash
# Start a throw-away mail server on 127.0.0.1 that only lets OAuth 2 bearer
# tokens in: Dovecot (IMAP and submission, SASL XOAUTH2 and OAUTHBEARER) with
# an oauth2 passdb that checks every token with the test Glewlwyd
# (demo/glewlwyd/start.sh), and an SMTP sink (smtp-sink.py) that submission
# relays to. Dovecot runs unprivileged, as the caller (as root: see
# MAIL_RUN_USER); nothing listens anywhere but 127.0.0.1.
#
#   demo/mail/start.sh DIR ISSUER
#
# ISSUER is the Glewlwyd issuer (what demo/glewlwyd/start.sh prints). DIR
# (created if missing, normally a fresh temp dir) receives dovecot.conf,
# dovecot-oauth2.conf.ext, run/ (Dovecot's base_dir: sockets, master.pid),
# state/, home/USER/Maildir (INBOX holds one message, Subject "Hello from
# tokenvault"), sink/ (each relayed message as NNNNNN.eml plus NNNNNN.json with
# its envelope), dovecot.log, smtp-sink.pid, smtp-sink.log, tls/ (MAIL_TLS=1)
# and, once every port greets, DIR/env: shell-sourceable KEY='VALUE' lines
# (MAIL_IMAP_PORT, MAIL_SUBMISSION_PORT, MAIL_USER, MAIL_SINK, ...; see the
# end of this script). A one-line summary goes to stdout; progress and errors
# to stderr. Stop it with demo/mail/stop.sh DIR. Starting again on the same
# DIR (after stop.sh) begins afresh: mailbox and sink are emptied.
#
# Environment knobs:
#   MAIL_TOKEN_CHECK        how Dovecot checks a token (default userinfo):
#                           userinfo      GET the userinfo endpoint with
#                                         "Authorization: Bearer TOKEN"; the
#                                         login name is the "email" claim;
#                                         tokens of every client work
#                           introspection POST token=TOKEN to the RFC 7662
#                                         endpoint as the client below; the
#                                         login name is "username"; only that
#                                         client's tokens are active
#   MAIL_INTROSPECTION_CLIENT_ID      default confidential-app
#   MAIL_INTROSPECTION_CLIENT_SECRET  default s3cret-confidential
#   MAIL_USER               the login name clients must send (default
#                           ada@example.org for userinfo, ada for
#                           introspection); Dovecot compares it, lower-cased,
#                           with the claim above
#   MAIL_MECHANISMS         SASL mechanisms offered (default "xoauth2
#                           oauthbearer"). Offer one alone to make a client
#                           that always prefers the other use it: curl before
#                           8.7 (Debian 12 has 7.88) picks OAUTHBEARER
#                           whatever --login-options says
#   MAIL_TLS                1: also TLS, with a fresh self-signed certificate
#                           for 127.0.0.1/localhost (DIR/tls/cert.pem):
#                           STARTTLS on both ports plus implicit TLS on
#                           MAIL_IMAPS_PORT; plaintext logins stay allowed.
#                           For clients that send tokens only over TLS
#                           (NeoMutt's IMAP). Default 0: ssl = no
#   MAIL_AUTH_FAILURE_DELAY Dovecot's auth_failure_delay in seconds (default 0;
#                           Dovecot's own default is 2). Even at 0 a refusal
#                           takes up to 0.5 s (Dovecot's failure timer)
#   MAIL_DEBUG              1: auth_debug, mail_debug and oauth2 debug lines in
#                           dovecot.log (default 0)
#   MAIL_START_TIMEOUT      seconds to wait for readiness (default 30)
#   MAIL_RUN_USER           only when start.sh runs as root: the unprivileged
#                           user Dovecot runs as (default nobody; Dovecot
#                           refuses root for its login and mail processes).
#                           Dovecot's files in DIR go to that user, DIR gets
#                           o+x, and every parent of DIR must let it through
#
# Needs the Debian packages dovecot-core, dovecot-imapd, dovecot-submissiond,
# python3, util-linux (setpriv, as root) and openssl (MAIL_TLS=1).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

say() { echo "mail/start.sh: $*" >&2; }
fail() { say "error: $*"; exit 1; }

[ $# -eq 2 ] || { echo "usage: $0 DIR ISSUER" >&2; exit 2; }
DIR="$1"
ISSUER="${2%/}"

CHECK="${MAIL_TOKEN_CHECK:-userinfo}"
INTRO_ID="${MAIL_INTROSPECTION_CLIENT_ID:-confidential-app}"
INTRO_SECRET="${MAIL_INTROSPECTION_CLIENT_SECRET:-s3cret-confidential}"
case "$CHECK" in
    userinfo) LOGIN="${MAIL_USER:-ada@example.org}" ;;
    introspection) LOGIN="${MAIL_USER:-ada}" ;;
    *) fail "MAIL_TOKEN_CHECK must be userinfo or introspection (got '$CHECK')" ;;
esac
MECHS="$(printf '%s' "${MAIL_MECHANISMS:-xoauth2 oauthbearer}" | tr '[:upper:]' '[:lower:]')"
for m in $MECHS; do
    [[ "$m" =~ ^(xoauth2|oauthbearer)$ ]] || fail "MAIL_MECHANISMS may only list xoauth2 and oauthbearer (got '$m')"
done
[ -n "${MECHS// }" ] || fail "MAIL_MECHANISMS is empty"
TLS="${MAIL_TLS:-0}"
FAILURE_DELAY="${MAIL_AUTH_FAILURE_DELAY:-0}"
DEBUG="${MAIL_DEBUG:-0}"
TIMEOUT="${MAIL_START_TIMEOUT:-30}"
[[ "$TLS" =~ ^[01]$ ]] || fail "MAIL_TLS must be 0 or 1 (got '$TLS')"
[[ "$FAILURE_DELAY" =~ ^[0-9]+$ ]] || fail "MAIL_AUTH_FAILURE_DELAY must be a whole number of seconds (got '$FAILURE_DELAY')"
[[ "$DEBUG" =~ ^[01]$ ]] || fail "MAIL_DEBUG must be 0 or 1 (got '$DEBUG')"
if ! [[ "$TIMEOUT" =~ ^[0-9]+$ ]] || [ "$TIMEOUT" -eq 0 ]; then
    fail "MAIL_START_TIMEOUT must be a positive integer (got '$TIMEOUT')"
fi
# The login name becomes a directory name and a Dovecot config value.
[[ "$LOGIN" =~ ^[A-Za-z0-9._+-]+(@[A-Za-z0-9.-]+)?$ ]] || fail "MAIL_USER '$LOGIN' is not a plain user or user@domain"
[[ "$INTRO_ID$INTRO_SECRET" =~ ^[A-Za-z0-9._~-]+$ ]] || fail "introspection client id and secret must be URL-safe (letters, digits, . _ ~ -)"
[[ "$ISSUER" =~ ^https?://[^[:space:]\"\']+$ ]] || fail "ISSUER must be an http(s) URL (got '$ISSUER')"

DOVECOT=/usr/sbin/dovecot
[ -x "$DOVECOT" ] || fail "$DOVECOT not found (apt-get install dovecot-core dovecot-imapd dovecot-submissiond)"
for bin in imap submission; do
    [ -x "/usr/lib/dovecot/$bin" ] || fail "/usr/lib/dovecot/$bin missing (apt-get install dovecot-imapd dovecot-submissiond)"
done
# Debian's interpreter when there is one: a version manager's python3 shim
# costs ~0.1 s a call. Standard library only.
PY=/usr/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)" || fail "'python3' not found"
if [ "$(id -u)" = 0 ]; then
    command -v setpriv >/dev/null 2>&1 || fail "'setpriv' not found (apt-get install util-linux)"
fi
if [ "$TLS" = 1 ]; then
    command -v openssl >/dev/null 2>&1 || fail "'openssl' not found (needed for MAIL_TLS=1)"
fi

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
# DIR ends up unquoted in Dovecot's config, and its sockets must fit in
# sun_path (108 bytes; the longest is run/token-login/tokenlogin).
[[ "$DIR" =~ ^[A-Za-z0-9._/+-]+$ ]] || fail "DIR '$DIR' may only contain letters, digits and . _ / + -"
[ $(( ${#DIR} + 30 )) -le 107 ] || fail "DIR '$DIR' is too long for Dovecot's unix sockets (at most 77 characters)"

CONF="$DIR/dovecot.conf"
DOVECOT_CMD=" -c $CONF "   # in the master's command line (see alive)
OAUTH2_CONF="$DIR/dovecot-oauth2.conf.ext"
RUN="$DIR/run"
MASTER_PIDFILE="$RUN/master.pid"
LOG="$DIR/dovecot.log"
HOMES="$DIR/home"
TLS_DIR="$DIR/tls"
SINK="$DIR/sink"
SINK_PIDFILE="$DIR/smtp-sink.pid"
SINK_LOG="$DIR/smtp-sink.log"
SINK_CMD=" --dir $SINK "  # in the sink's command line

alive() {  # alive PID PATTERN: PID runs (not a zombie) with PATTERN in " ARGV0 ARG1 ... "
    [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] \
        && { printf ' '; tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null; } | grep -qF -- "$2" \
        && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo Z)" != Z ]
}
if [ -s "$MASTER_PIDFILE" ] && alive "$(cat "$MASTER_PIDFILE")" "$DOVECOT_CMD"; then
    fail "a Dovecot started from $DIR is still running (pid $(cat "$MASTER_PIDFILE")); run stop.sh first"
fi
if [ -s "$SINK_PIDFILE" ] && alive "$(cat "$SINK_PIDFILE")" "$SINK_CMD"; then
    fail "an SMTP sink started from $DIR is still running (pid $(cat "$SINK_PIDFILE")); run stop.sh first"
fi

DOVECOT_PID=""
SINK_PID=""
stop_pid() {  # stop_pid PID PATTERN: SIGTERM, up to 5 s, then SIGKILL
    local pid="$1" pat="$2"
    if alive "$pid" "$pat"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            alive "$pid" "$pat" || break
            sleep 0.05
        done
        if alive "$pid" "$pat"; then kill -9 "$pid" 2>/dev/null || true; fi
    fi
    wait "$pid" 2>/dev/null || true
}
stop_started() {
    [ -z "$DOVECOT_PID" ] || stop_pid "$DOVECOT_PID" "$DOVECOT_CMD"
    [ -z "$SINK_PID" ] || stop_pid "$SINK_PID" "$SINK_CMD"
    DOVECOT_PID=""
    SINK_PID=""
    rm -f "$SINK_PIDFILE"
}
cleanup_on_error() {
    local rc=$?
    if [ $rc -ne 0 ]; then
        # Only what this run started (never another instance's processes).
        stop_started
        rm -f "$DIR/env" "$DIR/env.tmp"
        for f in "$LOG" "$DIR/dovecot.stdout" "$SINK_LOG"; do
            if [ -s "$f" ]; then
                say "last lines of $f:"
                tail -n 15 "$f" >&2 || true
            fi
        done
    fi
}
trap cleanup_on_error EXIT

t0=${EPOCHREALTIME/./}
deadline=$(( ${EPOCHREALTIME%.*} + TIMEOUT ))

# Fresh state (the mailbox and the sink of an earlier run go too).
rm -rf "$RUN" "$DIR/state" "$HOMES" "$SINK" "$TLS_DIR"
rm -f "$DIR/env" "$DIR/env.tmp" "$LOG" "$SINK_LOG" "$DIR/dovecot.stdout" "$SINK_PIDFILE"
mkdir -p "$RUN" "$DIR/state" "$SINK"

# Where to check tokens: from the provider's discovery document.
ENDPOINT="$("$PY" - "$ISSUER/.well-known/openid-configuration" "$CHECK" "$deadline" <<'EOF'
import json, sys, time, urllib.request
url, check, deadline = sys.argv[1], sys.argv[2], float(sys.argv[3])
key = {"userinfo": "userinfo_endpoint", "introspection": "introspection_endpoint"}[check]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
while True:
    try:
        doc = json.loads(opener.open(url, timeout=2).read())
        if not doc.get(key):
            print("discovery at %s has no %s" % (url, key), file=sys.stderr)
            sys.exit(1)
        print(doc[key])
        sys.exit(0)
    except Exception as e:
        err = e
    if time.time() > deadline:
        print("discovery at %s did not answer: %s" % (url, err), file=sys.stderr)
        sys.exit(1)
    time.sleep(0.05)
EOF
)" || fail "could not read the provider's discovery document"
[[ "$ENDPOINT" =~ ^(https?)://([^/]+)(/.*)?$ ]] || fail "odd $CHECK endpoint '$ENDPOINT'"

# Who Dovecot runs as: the caller or, when the caller is root, MAIL_RUN_USER.
if [ "$(id -u)" = 0 ]; then
    RUN_USER="${MAIL_RUN_USER:-nobody}"
    id -u "$RUN_USER" >/dev/null 2>&1 || fail "MAIL_RUN_USER '$RUN_USER' does not exist"
    [ "$(id -u "$RUN_USER")" != 0 ] || fail "MAIL_RUN_USER must not be root"
else
    RUN_USER="$(id -un)"
    [ -z "${MAIL_RUN_USER:-}" ] || [ "$MAIL_RUN_USER" = "$RUN_USER" ] \
        || fail "MAIL_RUN_USER only applies when start.sh runs as root"
fi
RUN_UID="$(id -u "$RUN_USER")"
RUN_GID="$(id -g "$RUN_USER")"
RUN_GROUP="$(id -gn "$RUN_USER")"
as_run_user() {
    if [ "$(id -u)" = 0 ]; then
        setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --clear-groups -- "$@"
    else
        "$@"
    fi
}

# The user's mailbox: a Maildir with one unread message in INBOX.
LOGIN_LC="$(printf '%s' "$LOGIN" | tr '[:upper:]' '[:lower:]')"
MAILDIR="$HOMES/$LOGIN_LC/Maildir"
mkdir -p "$MAILDIR/new" "$MAILDIR/cur" "$MAILDIR/tmp"
case "$LOGIN_LC" in *@*) RCPT="$LOGIN_LC" ;; *) RCPT="$LOGIN_LC@example.org" ;; esac
cat >"$MAILDIR/tmp/hello" <<EOF
Return-Path: <tests@tokenvault.invalid>
From: tokenvault tests <tests@tokenvault.invalid>
To: <$RCPT>
Subject: Hello from tokenvault
Date: Thu, 01 Jan 2026 00:00:00 +0000
Message-ID: <hello-1@tokenvault.invalid>
MIME-Version: 1.0
Content-Type: text/plain; charset=us-ascii

If you can read this, Dovecot accepted your OAuth 2 bearer token.
EOF
mv "$MAILDIR/tmp/hello" "$MAILDIR/new/1767225600.M1P1.tokenvault"

# The token check (Dovecot 2.3's oauth2 passdb).
: >"$OAUTH2_CONF"
chmod 600 "$OAUTH2_CONF"
if [ "$CHECK" = userinfo ]; then
    case "$ENDPOINT" in *\?*) SEP="&" ;; *) SEP="?" ;; esac
    cat >>"$OAUTH2_CONF" <<EOF
# demo/mail/start.sh: the bearer token goes to the provider's userinfo
# endpoint (GET, Authorization: Bearer); the login name is its "email" claim.
# The endpoint is set as tokeninfo_url (Dovecot appends the token to it, as a
# parameter the provider ignores, and, since introspection_mode is auth, also
# sends the Bearer header), not as introspection_url: Dovecot 2.3 takes a 401
# from a tokeninfo URL for "invalid token" (a permanent AUTHENTICATIONFAILED,
# with the RFC 7628 error for OAUTHBEARER) but a 401 from an introspection URL
# for "No username returned", a temporary failure. With an introspection_url
# as well, Dovecot would ask the endpoint twice per login.
tokeninfo_url = $ENDPOINT${SEP}dovecot_tokeninfo=
introspection_mode = auth
username_attribute = email
EOF
else
    cat >>"$OAUTH2_CONF" <<EOF
# demo/mail/start.sh: RFC 7662 introspection as $INTRO_ID (Dovecot's HTTP
# client sends the URL's credentials as HTTP Basic); the login name is
# "username"; "active" must be true (Glewlwyd answers 200 {"active":false}
# for an unknown, expired or revoked token, or another client's).
introspection_mode = post
introspection_url = ${BASH_REMATCH[1]}://$INTRO_ID:$INTRO_SECRET@${BASH_REMATCH[2]}${BASH_REMATCH[3]}
username_attribute = username
active_attribute = active
active_value = true
EOF
fi
cat >>"$OAUTH2_CONF" <<EOF
# Named in the RFC 7628 error a refused OAUTHBEARER client gets.
openid_configuration_url = $ISSUER/.well-known/openid-configuration
timeout_msecs = 5000
debug = $([ "$DEBUG" = 1 ] && echo yes || echo no)
EOF

if [ "$TLS" = 1 ]; then
    mkdir -p "$TLS_DIR"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
        -subj "/CN=localhost" -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
        -keyout "$TLS_DIR/key.pem" -out "$TLS_DIR/cert.pem" 2>/dev/null \
        || fail "openssl could not make a self-signed certificate"
    chmod 600 "$TLS_DIR/key.pem"
fi

# Hand Dovecot's files to the user it runs as (nothing to do unless we are
# root), and make sure that user can reach them.
touch "$LOG"
if [ "$(id -u)" = 0 ]; then
    chown -R "$RUN_UID:$RUN_GID" "$RUN" "$DIR/state" "$HOMES" "$OAUTH2_CONF" "$LOG"
    [ "$TLS" = 0 ] || chown -R "$RUN_UID:$RUN_GID" "$TLS_DIR"
    chmod a+x "$DIR"
    as_run_user test -w "$MAILDIR/new" -a -r "$OAUTH2_CONF" \
        || fail "$RUN_USER cannot reach $DIR (when start.sh runs as root every parent directory needs o+x; or set MAIL_RUN_USER)"
fi

# free_ports N: N distinct free TCP ports on 127.0.0.1.
free_ports() {
    "$PY" - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

# wait_ready PIDS LOGS PORT...: exit 0 once every 127.0.0.1:PORT accepts a TCP
# connection and greets (IMAP "* OK", SMTP "220"; tls:PORT after a TLS
# handshake, certificate unchecked). A bare connect is not enough: Dovecot's
# master accepts even when its login processes cannot start. Exit 3 when one
# of PIDS (comma-separated) is gone, 5 when one of LOGS (comma-separated)
# shows a Fatal line, 4 at the deadline. Polls every 20-100 ms.
wait_ready() {
    "$PY" - "$deadline" "$@" <<'EOF'
import socket, ssl, sys, time
deadline, pids, logs, ports = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]

def greets(port):
    try:
        with socket.create_connection(("127.0.0.1", int(port.split(":")[-1])), timeout=0.5) as s:
            s.settimeout(max(0.2, min(1.0, deadline - time.time())))
            if port.startswith("tls:"):
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                s = ctx.wrap_socket(s)
            data = b""
            while b"\n" not in data:
                chunk = s.recv(512)
                if not chunk:
                    return False
                data += chunk
            return data.startswith((b"* OK", b"220"))
    except OSError:
        return False

def gone(pid):
    try:
        with open("/proc/%s/stat" % pid) as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True

def fatal(log):
    try:
        with open(log, errors="replace") as f:
            return any(": Fatal: " in line for line in f)
    except FileNotFoundError:
        return False

def check():
    if any(gone(p) for p in pids.split(",")):
        sys.exit(3)
    if any(fatal(l) for l in logs.split(",")):
        sys.exit(5)
    if time.time() > deadline:
        sys.exit(4)

delay = 0.02
while True:
    pending = []
    for port in ports:
        if not greets(port):
            pending.append(port)
            check()
    ports = pending
    if not ports:
        sys.exit(0)
    check()
    time.sleep(delay)
    delay = min(delay * 1.5, 0.1)
EOF
}

write_conf() {
    cat >"$CONF" <<EOF
# Generated by demo/mail/start.sh for a throw-away test instance: IMAP and
# submission on 127.0.0.1, OAuth 2 bearer tokens only. Everything runs as
# $RUN_USER, without chroot.
base_dir = $RUN
state_dir = $DIR/state
instance_name = tokenvault-mail
protocols = imap submission
listen = 127.0.0.1
default_login_user = $RUN_USER
default_internal_user = $RUN_USER
default_internal_group = $RUN_GROUP
first_valid_uid = $RUN_UID
last_valid_uid = $RUN_UID
first_valid_gid = $RUN_GID
last_valid_gid = $RUN_GID
log_path = $LOG
info_log_path = $LOG
debug_log_path = $LOG
auth_verbose = yes
auth_debug = $([ "$DEBUG" = 1 ] && echo yes || echo no)
mail_debug = $([ "$DEBUG" = 1 ] && echo yes || echo no)
verbose_proctitle = yes
hostname = localhost

$(if [ "$TLS" = 1 ]; then
    printf 'ssl = yes\nssl_cert = <%s\nssl_key = <%s\nssl_min_protocol = TLSv1.2' "$TLS_DIR/cert.pem" "$TLS_DIR/key.pem"
else
    printf '# Loopback only.\nssl = no'
fi)
disable_plaintext_auth = no
auth_mechanisms = $MECHS
auth_failure_delay = ${FAILURE_DELAY}s
# No auth cache (Dovecot's default, spelled out): every login asks the
# provider, so a revoked or expired token is refused at once.
auth_cache_size = 0

passdb {
  driver = oauth2
  mechanisms = $MECHS
  args = $OAUTH2_CONF
}
userdb {
  driver = static
  args = uid=$RUN_UID gid=$RUN_GID home=$HOMES/%Lu
}
mail_location = maildir:~/Maildir
namespace inbox {
  inbox = yes
}

submission_relay_host = 127.0.0.1
submission_relay_port = $SINK_PORT
submission_relay_ssl = no
submission_relay_trusted = no

service imap-login {
  chroot =
  inet_listener imap {
    address = 127.0.0.1
    port = $IMAP_PORT
  }
  inet_listener imaps {
    address = 127.0.0.1
    port = ${IMAPS_PORT:-0}
  }
}
service submission-login {
  chroot =
  inet_listener submission {
    address = 127.0.0.1
    port = $SUBMISSION_PORT
  }
}
service pop3-login {
  chroot =
}
service anvil {
  chroot =
  # With this socket moved away the auth process finds no penalty service,
  # which turns off Dovecot's per-IP auth penalty: after a failed login every
  # later one from 127.0.0.1 would otherwise wait 2-15 s.
  unix_listener anvil-auth-penalty {
    path = anvil-auth-penalty-disabled
  }
}
service auth-worker {
  user = \$default_internal_user
}
EOF
    chmod 644 "$CONF"
}

# Start the sink and Dovecot on fresh ports; again on other ports if one of
# them was taken in between.
SINK_PORT="" IMAP_PORT="" SUBMISSION_PORT="" IMAPS_PORT=""
for attempt in 1 2 3; do
    read -r SINK_PORT IMAP_PORT SUBMISSION_PORT IMAPS_PORT < <(free_ports $((3 + TLS))) \
        || fail "could not pick free ports"
    [ "$TLS" = 1 ] || IMAPS_PORT=""
    : >"$LOG"
    : >"$SINK_LOG"
    : >"$DIR/dovecot.stdout"

    "$PY" "$HERE/smtp-sink.py" --port "$SINK_PORT" --dir "$SINK" </dev/null >>"$SINK_LOG" 2>&1 &
    SINK_PID=$!
    echo "$SINK_PID" >"$SINK_PIDFILE"

    write_conf
    rm -f "$MASTER_PIDFILE"
    # A foreground master (-F), backgrounded here as a simple command (setpriv
    # execs it), so $! is the master's PID; it writes run/master.pid itself.
    if [ "$(id -u)" = 0 ]; then
        setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --clear-groups -- \
            "$DOVECOT" -F -c "$CONF" </dev/null >>"$DIR/dovecot.stdout" 2>&1 &
    else
        "$DOVECOT" -F -c "$CONF" </dev/null >>"$DIR/dovecot.stdout" 2>&1 &
    fi
    DOVECOT_PID=$!

    set +e
    wait_ready "$SINK_PID,$DOVECOT_PID" "$LOG,$DIR/dovecot.stdout" \
        "$SINK_PORT" "$IMAP_PORT" "$SUBMISSION_PORT" ${IMAPS_PORT:+"tls:$IMAPS_PORT"}
    rc=$?
    set -e
    [ $rc -ne 0 ] || break
    [ $rc -ne 4 ] || fail "no greeting on 127.0.0.1 ports $SINK_PORT (sink), $IMAP_PORT, $SUBMISSION_PORT${IMAPS_PORT:+, $IMAPS_PORT} within ${TIMEOUT}s"
    if grep -qsi "address already in use" "$LOG" "$DIR/dovecot.stdout" "$SINK_LOG" && [ $attempt -lt 3 ]; then
        say "a port was taken; trying others (attempt $attempt)"
        stop_started
        continue
    fi
    fail "Dovecot or the SMTP sink failed during start-up; see $LOG, $DIR/dovecot.stdout and $SINK_LOG"
done
# stop.sh goes by run/master.pid (written before any service starts).
[ "$(cat "$MASTER_PIDFILE" 2>/dev/null)" = "$DOVECOT_PID" ] \
    || fail "$MASTER_PIDFILE does not hold the master's PID $DOVECOT_PID"

q() { printf "%s='%s'\n" "$1" "${2//\'/\'\\\'\'}"; }
{
    q MAIL_DIR "$DIR"
    q MAIL_HOST "127.0.0.1"
    q MAIL_IMAP_PORT "$IMAP_PORT"
    q MAIL_SUBMISSION_PORT "$SUBMISSION_PORT"
    q MAIL_USER "$LOGIN"
    q MAIL_SINK "$SINK"
    q MAIL_SUBJECT "Hello from tokenvault"
    q MAIL_MAILDIR "$MAILDIR"
    q MAIL_MECHANISMS "$(printf '%s' "$MECHS" | tr '[:lower:]' '[:upper:]')"
    q MAIL_TOKEN_CHECK "$CHECK"
    q MAIL_TOKEN_ENDPOINT "$ENDPOINT"
    q MAIL_ISSUER "$ISSUER"
    q MAIL_TLS "$TLS"
    q MAIL_IMAPS_PORT "$IMAPS_PORT"
    q MAIL_TLS_CERT "$([ "$TLS" = 0 ] || echo "$TLS_DIR/cert.pem")"
    q MAIL_RUN_USER "$RUN_USER"
    q MAIL_DOVECOT_PID "$DOVECOT_PID"
    q MAIL_DOVECOT_CONF "$CONF"
    q MAIL_DOVECOT_LOG "$LOG"
    q MAIL_SINK_PORT "$SINK_PORT"
    q MAIL_SINK_PID "$SINK_PID"
} >"$DIR/env.tmp"
mv "$DIR/env.tmp" "$DIR/env"

t1=${EPOCHREALTIME/./}
ms=$(( (t1 - t0) / 1000 ))
printf 'mail ready: imap 127.0.0.1:%s%s, submission 127.0.0.1:%s, user %s, %s tokens checked at %s, sink %s, %d.%02ds (env in %s/env)\n' \
    "$IMAP_PORT" "${IMAPS_PORT:+, imaps 127.0.0.1:$IMAPS_PORT}" "$SUBMISSION_PORT" "$LOGIN" \
    "$(printf '%s' "$MECHS" | tr '[:lower:] ' '[:upper:]/')" "$ENDPOINT" "$SINK" \
    $((ms / 1000)) $(( (ms % 1000) / 10 )) "$DIR"
