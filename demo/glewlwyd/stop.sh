#!/usr/bin/env bash
# Stop the Glewlwyd that demo/glewlwyd/start.sh DIR started.
#
#   demo/glewlwyd/stop.sh DIR
#
# Sends SIGTERM to the PID in DIR/glewlwyd.pid, waits up to 5 s, then SIGKILL.
# Succeeds (exit 0) when nothing is running any more, including when it was
# already stopped. Leaves DIR's files in place for post-mortems.
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
DIR="$1"
PIDFILE="$DIR/glewlwyd.pid"

[ -s "$PIDFILE" ] || { echo "glewlwyd/stop.sh: no $PIDFILE; nothing to stop" >&2; exit 0; }
PID="$(cat "$PIDFILE")"
ABS="$(cd "$DIR" && pwd)"
[[ "$PID" =~ ^[0-9]+$ ]] || { echo "glewlwyd/stop.sh: bad pid in $PIDFILE" >&2; exit 1; }

# Only signal the process if it really is the glewlwyd we started (the PID may
# have been reused since).
is_ours() {
    [ -r "/proc/$PID/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$PID/cmdline" | grep -qF -- "$ABS/glewlwyd.conf"
}

if is_ours; then
    kill "$PID" 2>/dev/null || true
    for _ in $(seq 100); do
        is_ours || break
        # A zombie (our child, not yet reaped) counts as stopped.
        state="$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null || true)"
        [ "$state" != "Z" ] || break
        sleep 0.05
    done
    if is_ours && [ "$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null || true)" != "Z" ]; then
        echo "glewlwyd/stop.sh: pid $PID ignored SIGTERM; sending SIGKILL" >&2
        kill -9 "$PID" 2>/dev/null || true
    fi
fi
rm -f "$PIDFILE"
