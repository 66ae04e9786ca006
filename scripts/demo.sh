#!/usr/bin/env bash
# tokenvault in two minutes: a local OpenID provider, vaultd, and a signed-in
# account named `demo`, all on this machine and left running.
#
#   scripts/demo.sh          start, sign in, print what to try
#   scripts/demo.sh stop     stop exactly what the demo started
#
# Everything lives in one private folder (DEMO_DIR, default
# $XDG_RUNTIME_DIR/tokenvault-demo, else ~/.cache/tokenvault-demo): the
# provider (Glewlwyd on 127.0.0.1, run by demo/glewlwyd), vaultd's socket,
# vault and log. DEMO_BIN names a folder holding vaultd and vaultctl to use
# instead of building them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEMO="${DEMO_DIR:-${XDG_RUNTIME_DIR:-$HOME/.cache}/tokenvault-demo}"

say() { echo "demo: $*" >&2; }

# The folder is ours or we stop: another user's folder could hold their socket.
private_folder() {
    mkdir -p -m 0700 "$DEMO"
    [ -d "$DEMO" ] && [ ! -L "$DEMO" ] && [ "$(stat -c %u "$DEMO")" = "$(id -u)" ] \
        || { say "$DEMO is not a folder of yours; set DEMO_DIR"; exit 1; }
    chmod 0700 "$DEMO"
}

# Signals PID only if it is still the program we started (the PID may be reused).
stop_pid() {
    local file="$1" match="$2" pid
    [ -s "$file" ] || return 0
    pid="$(cat "$file")"
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$match"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    fi
    rm -f "$file"
}

if [ "${1:-}" = "stop" ]; then
    [ -d "$DEMO" ] || { say "nothing to stop"; exit 0; }
    stop_pid "$DEMO/vaultd.pid" "$DEMO/run/tokenvault/vaultd.sock"
    [ -d "$DEMO/provider" ] && "$ROOT/demo/glewlwyd/stop.sh" "$DEMO/provider" >/dev/null
    say "stopped; $DEMO holds the logs (remove it when done)"
    exit 0
fi
[ $# -eq 0 ] || { echo "usage: $0 [stop]" >&2; exit 2; }

if [ -z "${DEMO_BIN:-}" ]; then
    # What vaultd and vaultctl need, and the demo's own provider: Glewlwyd
    # from Debian, run by demo/glewlwyd/start.sh, which needs sqlite3,
    # openssl and python3.
    "$ROOT/scripts/install-deps.sh" --also glewlwyd sqlite3 openssl python3
    (cd "$ROOT" && swift build --product vaultd && swift build --product vaultctl) >&2
    DEMO_BIN="$(cd "$ROOT" && swift build --show-bin-path)"
fi
VAULTCTL="$DEMO_BIN/vaultctl"

private_folder
[ -s "$DEMO/vaultd.pid" ] && [ -d "/proc/$(cat "$DEMO/vaultd.pid")" ] \
    && { say "already running; scripts/demo.sh stop first"; exit 1; }
rm -rf "$DEMO/provider" "$DEMO/run" "$DEMO/state" "$DEMO/config"
rm -rf "$DEMO/shares"
mkdir -m 0700 "$DEMO/provider" "$DEMO/run" "$DEMO/state" "$DEMO/config" "$DEMO/shares"

say "starting the OpenID provider (Glewlwyd) on 127.0.0.1"
GLEWLWYD_ACCESS_TOKEN_SECONDS=300 "$ROOT/demo/glewlwyd/start.sh" "$DEMO/provider" >/dev/null
# shellcheck disable=SC1091
. "$DEMO/provider/env"

export XDG_RUNTIME_DIR="$DEMO/run" XDG_STATE_HOME="$DEMO/state" XDG_CONFIG_HOME="$DEMO/config"
export TOKENVAULT_SOCKET="$DEMO/run/tokenvault/vaultd.sock"
say "starting vaultd"
"$DEMO_BIN/vaultd" --socket "$TOKENVAULT_SOCKET" --backend file </dev/null >"$DEMO/vaultd.log" 2>&1 &
echo $! >"$DEMO/vaultd.pid"
for _ in $(seq 200); do
    "$VAULTCTL" status >/dev/null 2>&1 && break
    [ -d "/proc/$(cat "$DEMO/vaultd.pid")" ] || { say "vaultd stopped; see $DEMO/vaultd.log"; exit 1; }
    sleep 0.05
done

say "adding the account 'demo' and signing ada in (password grant)"
printf '%s\n' "$GLEWLWYD_CONFIDENTIAL_CLIENT_SECRET" | "$VAULTCTL" account add demo \
    --issuer "$GLEWLWYD_ISSUER" --client-id "$GLEWLWYD_CONFIDENTIAL_CLIENT_ID" \
    --scope openid --scope offline_access --scope profile --scope email --client-secret >/dev/null
printf '%s\n' "$GLEWLWYD_PASSWORD" | "$VAULTCTL" signin demo --password --username "$GLEWLWYD_USERNAME" >&2

cat <<EOF
tokenvault demo is running: a provider at $GLEWLWYD_ISSUER and vaultd at
$TOKENVAULT_SOCKET, with the account 'demo' signed in as $GLEWLWYD_USERNAME.

Use it from this shell:
  export TOKENVAULT_SOCKET=$TOKENVAULT_SOCKET PATH=$DEMO_BIN:\$PATH

Then try:
  vaultctl token demo                 # an access token, refreshed when it runs low
  vaultctl status                     # the account, its user and the token's expiry
  vaultctl claims demo                # the validated ID token
  vaultctl share demo --socket $DEMO/shares/demo.sock --ttl 600   # lend its tokens, as for ssh -R
  TOKENVAULT_SOCKET=$DEMO/shares/demo.sock vaultctl token demo  # served through the share
  TOKENVAULT_SOCKET=$DEMO/shares/demo.sock vaultctl signout demo   # refused there
  vaultctl signout demo               # revoked at the provider, wiped everywhere
  vaultctl signin demo --password --username $GLEWLWYD_USERNAME   # password: $GLEWLWYD_PASSWORD

vaultd's log: $DEMO/vaultd.log
Stop it all:  $ROOT/scripts/demo.sh stop
EOF
