#!/usr/bin/env bash
# A private, headless desktop-notification server for tests: its own session
# bus, its own Xvfb display, and a real dunst owning
# org.freedesktop.Notifications on that bus and drawing on that display.
#
#   Tests/Support/notify/start.sh DIR    start; prints the bus address
#   Tests/Support/notify/stop.sh DIR     stop it (idempotent)
#   Tests/Support/notify/ctl.sh CMD DIR  see the notifications, invoke an
#                                        action, click one, take a screenshot
#
# DIR (created if missing; empty or a notify folder from before; keep it
# short, the bus socket lives in it) receives bus.conf, dunstrc, bus.log,
# xvfb.log, dunst.log, shown/ (one record per notification dunst displayed,
# see ctl.sh), the menu.* files of the dmenu stand-in and, once dunst owns its
# name, DIR/env: shell-sourceable KEY='VALUE' lines (DBUS_SESSION_BUS_ADDRESS,
# DISPLAY, NOTIFY_DIR, NOTIFY_BUS_PID, NOTIFY_XVFB_PID, NOTIFY_DUNST_PID).
# Run the client under test, notify-send, gdbus or dunstctl with DBUS_SESSION_BUS_ADDRESS
# and DISPLAY from there.
#
# The bus is a session bus with its own configuration (DIR/bus.conf) and no
# service files: nothing is D-Bus-activated. (This machine's
# /usr/share/dbus-1/services names dunst and notification-daemon for
# org.freedesktop.Notifications; a bus with the standard configuration would
# start one of them, with a user's config, on the first Notify.) dunst runs
# with `-config DIR/dunstrc`, which reads that file only: no user config, no
# drop-ins. The settings that matter to tests:
#   mouse_left_click = do_action, close_current   the "default" action (or the
#       only action), then closed with reason 2 (dismissed)
#   mouse_middle_click = context    the notification's action menu, answered
#       by the dmenu stand-in (dunst-dmenu.sh), so any named action works
#   mouse_right_click = close_current               dismiss, no action
#   idle_threshold = 0      nobody touches Xvfb: with a threshold, dunst would
#                           count the user as idle and let nothing expire
#   stack_duplicates = false, history_length = 0 (unlimited)   every Notify
#                           stays one notification; ctl.sh showing relies on it
#   urgency timeouts 10 s (low, normal), 0 (critical): for expire_timeout -1
# Stock dunst differs: there a left click only dismisses (close_current) and a
# middle click does the action.
#
# Xvfb chooses a free display number itself (-displayfd) and says so once it
# accepts connections; sessions can run side by side. Every process started
# here has NOTIFY_DIR=DIR in its environment: stop.sh stops only those.
#
# Environment knobs:
#   NOTIFY_START_TIMEOUT   seconds to wait for readiness (default 10)
#   NOTIFY_SCREEN          Xvfb screen WIDTHxHEIGHTxDEPTH (default 1024x768x24)
#
# Needs the Debian packages dbus, xvfb and dunst; ctl.sh also xdotool,
# imagemagick and python3 (dev/install-test-deps.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../session-bus.sh
. "$HERE/../session-bus.sh"
NAME=org.freedesktop.Notifications

say() { echo "notify/start.sh: $*" >&2; }
fail() { say "error: $*"; exit 1; }

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
mkdir -p "$1"
DIR="$(cd "$1" && pwd)"

TIMEOUT="${NOTIFY_START_TIMEOUT:-10}"
SCREEN="${NOTIFY_SCREEN:-1024x768x24}"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] && [ "$TIMEOUT" -gt 0 ] || fail "NOTIFY_START_TIMEOUT must be a positive integer"
[[ "$SCREEN" =~ ^[0-9]+x[0-9]+x(8|16|24)$ ]] || fail "NOTIFY_SCREEN must be WIDTHxHEIGHTxDEPTH (got '$SCREEN')"
# dunstrc and dmenu's command line are split on blanks; keep the paths plain.
[[ "$HERE" =~ ^[A-Za-z0-9_./+-]+$ ]] || fail "$HERE has characters dunstrc cannot carry"

for cmd in dbus-daemon dbus-send Xvfb dunst; do
    command -v "$cmd" >/dev/null 2>&1 || fail "'$cmd' not found (run dev/install-test-deps.sh)"
done

now() { date +%s%N; }
deadline=$(( $(now) + TIMEOUT * 1000000000 ))
t0="$(now)"
deadline_passed() { [ "$(now)" -gt "$deadline" ]; }

is_running() {
    local state
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo gone)"
    [ "$state" != gone ] && [ "$state" != Z ]
}
is_ours() {
    [[ "$1" =~ ^[0-9]+$ ]] && grep -qzxF "NOTIFY_DIR=$DIR" "/proc/$1/environ" 2>/dev/null
}

if [ -s "$DIR/env" ]; then
    # shellcheck disable=SC1091
    old="$(. "$DIR/env"; echo "$NOTIFY_BUS_PID $NOTIFY_XVFB_PID $NOTIFY_DUNST_PID")"
    for pid in $old; do
        ! { is_ours "$pid" && is_running "$pid"; } \
            || fail "a session started from $DIR is still running (pid $pid); run $HERE/stop.sh $DIR"
    done
fi
if [ -n "$(ls -A "$DIR")" ] && [ ! -e "$DIR/bus.conf" ]; then
    fail "$DIR is neither empty nor a notify session folder; give an empty or new folder"
fi
BUS="$DIR/bus"

rm -rf "$DIR/shown"
rm -f "$DIR"/env "$DIR"/env.tmp "$DIR"/*.log "$DIR"/menu.* "$DIR/display.fifo" "$DIR/bus.address" "$DIR/bus.pid"
mkdir "$DIR/shown"

# Every process of the session: marked, and without a way to a real desktop.
export NOTIFY_DIR="$DIR"
unset DISPLAY WAYLAND_DISPLAY DBUS_SESSION_BUS_ADDRESS DBUS_STARTER_ADDRESS DBUS_STARTER_BUS_TYPE


cat >"$DIR/dunstrc" <<EOF
# Written by Tests/Support/notify/start.sh; see there.
[global]
    font = DejaVu Sans 10
    width = 320
    height = 300
    origin = top-right
    offset = 10x10
    notification_limit = 0
    indicate_hidden = yes
    sort = yes
    markup = full
    format = "<b>%s</b>\n%b"
    show_indicators = yes
    idle_threshold = 0
    stack_duplicates = false
    history_length = 0
    always_run_script = true
    dmenu = $HERE/dunst-dmenu.sh
    browser = /bin/true
    mouse_left_click = do_action, close_current
    mouse_middle_click = context
    mouse_right_click = close_current

[urgency_low]
    timeout = 10
[urgency_normal]
    timeout = 10
[urgency_critical]
    timeout = 0

# No filter: runs for every notification dunst displays, and again when one
# is replaced while displayed.
[record]
    script = $HERE/dunst-script.sh
EOF

BUS_PID=""
XVFB_PID=""
DUNST_PID=""
on_exit() {
    local rc=$?
    if [ $rc -ne 0 ]; then
        say "start failed (status $rc); stopping what it started"
        "$HERE/stop.sh" "$DIR" || true
        rm -f "$DIR/env"
    fi
}
trap on_exit EXIT

start_session_bus "$DIR" "$BUS"

# Xvfb writes the display number it took to the fifo once it accepts
# connections; EOF before that means it died.
mkfifo "$DIR/display.fifo"
setsid Xvfb -displayfd 3 -screen 0 "$SCREEN" -nolisten tcp -s 0 -dpms \
    3>"$DIR/display.fifo" </dev/null >"$DIR/xvfb.log" 2>&1 &
XVFB_PID=$!
seconds_left=$(( (deadline - $(now)) / 1000000000 + 1 ))
NUMBER=""
read -r -t "$seconds_left" NUMBER <"$DIR/display.fifo" || true
rm -f "$DIR/display.fifo"
if ! [[ "$NUMBER" =~ ^[0-9]+$ ]]; then
    is_running "$XVFB_PID" || fail "Xvfb exited during start-up; see $DIR/xvfb.log"
    fail "Xvfb gave no display number within ${TIMEOUT}s; see $DIR/xvfb.log"
fi
export DISPLAY=":$NUMBER"

setsid dunst -config "$DIR/dunstrc" </dev/null >"$DIR/dunst.log" 2>&1 &
DUNST_PID=$!

bus_call() {
    dbus-send --session --print-reply=literal --reply-timeout=2000 \
        --dest=org.freedesktop.DBus /org/freedesktop/DBus "org.freedesktop.DBus.$1" "string:$NAME" 2>/dev/null
}
# dunst answers calls from its main loop, which runs once the display is open.
until [ "$(bus_call NameHasOwner | awk '{print $NF}')" = true ]; do
    is_running "$DUNST_PID" || fail "dunst exited during start-up; see $DIR/dunst.log"
    deadline_passed && fail "dunst did not claim $NAME within ${TIMEOUT}s; see $DIR/dunst.log"
    sleep 0.02
done
owner="$(bus_call GetConnectionUnixProcessID | awk '{print $2}')"
[ "$owner" = "$DUNST_PID" ] || fail "$NAME belongs to pid '$owner', not to our dunst ($DUNST_PID)"

q() { printf "%s='%s'\n" "$1" "${2//\'/\'\\\'\'}"; }
{
    q NOTIFY_DIR "$DIR"
    q DBUS_SESSION_BUS_ADDRESS "$DBUS_SESSION_BUS_ADDRESS"
    q DISPLAY "$DISPLAY"
    q NOTIFY_BUS_PID "$BUS_PID"
    q NOTIFY_XVFB_PID "$XVFB_PID"
    q NOTIFY_DUNST_PID "$DUNST_PID"
} >"$DIR/env.tmp"
mv "$DIR/env.tmp" "$DIR/env"
trap - EXIT
say "ready in $(( ($(now) - t0) / 1000000 )) ms: display $DISPLAY, bus pid $BUS_PID, Xvfb pid $XVFB_PID, dunst pid $DUNST_PID (env in $DIR/env)"
echo "$DBUS_SESSION_BUS_ADDRESS"
