#!/usr/bin/env bash
# Stop what Tests/Support/notify/start.sh DIR started: dunst, Xvfb, the bus.
#
#   Tests/Support/notify/stop.sh DIR
#
# Stops the pids in DIR/env and any other dunst, Xvfb or dbus-daemon whose
# environment has NOTIFY_DIR=DIR (a start that failed half-way), never
# another process: a pid is signalled only while its environment says it is
# this session's. SIGTERM, up to 5 s, then SIGKILL; a zombie counts as
# stopped. Succeeds when nothing is left, including when nothing ran. Removes
# DIR/env; leaves the logs and records for post-mortems.
set -euo pipefail

say() { echo "notify/stop.sh: $*" >&2; }

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
[ -d "$1" ] || exit 0
DIR="$(cd "$1" && pwd)"

now() { date +%s%N; }
is_running() {
    local state
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo gone)"
    [ "$state" != gone ] && [ "$state" != Z ]
}
is_ours() {
    [[ "$1" =~ ^[0-9]+$ ]] && grep -qzxF "NOTIFY_DIR=$DIR" "/proc/$1/environ" 2>/dev/null
}

stop_process() {
    local pid="$1" name="$2"
    is_ours "$pid" && is_running "$pid" || return 0
    kill "$pid" 2>/dev/null || true
    local deadline=$(( $(now) + 5000000000 ))
    while is_running "$pid"; do
        if [ "$(now)" -gt "$deadline" ]; then
            say "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.02
    done
}

# dunst first (it says goodbye on the bus and the display), the bus last.
if [ -s "$DIR/env" ]; then
    # shellcheck disable=SC1091
    . "$DIR/env"
    stop_process "${NOTIFY_DUNST_PID:-}" dunst
    stop_process "${NOTIFY_XVFB_PID:-}" Xvfb
    stop_process "${NOTIFY_BUS_PID:-}" dbus-daemon
fi
for name in dunst Xvfb dbus-daemon; do
    for file in $(grep -lzxF "NOTIFY_DIR=$DIR" /proc/[0-9]*/environ 2>/dev/null || true); do
        pid="$(echo "$file" | cut -d/ -f3)"
        [ "$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | head -n 1 | xargs -r basename 2>/dev/null)" = "$name" ] || continue
        stop_process "$pid" "$name"
    done
done
rm -f "$DIR/env" "$DIR/env.tmp" "$DIR/display.fifo"
