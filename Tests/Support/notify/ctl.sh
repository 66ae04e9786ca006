#!/usr/bin/env bash
# Look at and act on the notifications of a Tests/Support/notify session, as
# a test or a person at the screen would.
#
#   ctl.sh showing DIR          the notifications dunst displays now, one JSON
#                               object a line, by id: {"id", "app", "summary",
#                               "body" (as sent, markup and all), "urgency",
#                               "timeout_ms" (0 = never expires), "icon",
#                               "category"}; nothing when none
#   ctl.sh invoke DIR ID KEY    invoke action KEY of notification ID, through
#                               dunst's own context menu: the client gets
#                               ActionInvoked(ID, KEY); the notification stays
#                               until the client closes or replaces it
#   ctl.sh click DIR            a real left click (X pointer, xdotool) on the
#                               top notification: ActionInvoked(ID, "default"),
#                               or the only action when there is one, then
#                               NotificationClosed(ID, 2)
#   ctl.sh click DIR KEY        a middle click on the top notification: its
#                               action menu, where KEY is picked
#   ctl.sh dismiss DIR          a right click on the top notification:
#                               NotificationClosed(ID, 2), no action
#   ctl.sh screenshot DIR FILE  the whole screen as PNG (ImageMagick import)
#   ctl.sh forge DIR ID KEY     ActionInvoked(ID, KEY) as any other program on
#                               the bus can send it, not from dunst: with
#                               dbus-send, once broadcast and once addressed
#                               to each connection but dunst's (which no
#                               match rule filters), each time from a
#                               connection of its own
#   ctl.sh flood DIR SECONDS    a peer that keeps sending: ActionInvoked of no
#                               notification, addressed to each connection
#                               but dunst's, as fast as the bus takes them,
#                               for SECONDS (flood.py); prints how many
#
# dunstctl works on the session too, with DIR/env's environment:
# `dunstctl count displayed`, `dunstctl history` (closed ones, JSON),
# `dunstctl action 0` (the "default" action of the first notification; dunst
# 1.9.0 refuses any other position unless as many wait as are displayed).
#
# How `showing` knows: dunst has no call that lists what it displays, so
# DIR/dunstrc runs dunst-script.sh for every notification displayed
# (DIR/shown/ID, rewritten when ID is replaced), and every notification that
# leaves the screen goes to dunst's history with the same id and timestamp
# (stack_duplicates is off and history unlimited). Displayed = recorded and
# not in history; it waits up to NOTIFY_CTL_TIMEOUT seconds (default 5) for
# that to agree with dunst's own count, and says so on stderr if it never
# does. A client that sends x-dunst-stack-tag or synchronous hints makes
# dunst replace by tag, which this does not follow.
#
# Clicks hit the top notification of dunst's window (sort = yes: the most
# urgent, then the oldest); ask `showing` which that is.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { echo "notify/ctl.sh: $*" >&2; }
fail() { say "error: $*"; exit 1; }
usage() { echo "usage: $0 showing DIR | invoke DIR ID KEY | click DIR [KEY] | dismiss DIR | screenshot DIR FILE | forge DIR ID KEY | flood DIR SECONDS" >&2; exit 2; }

[ $# -ge 2 ] || usage
COMMAND="$1"
[ -d "$2" ] || fail "no folder $2"
DIR="$(cd "$2" && pwd)"
shift 2
[ -s "$DIR/env" ] || fail "no session in $DIR (no $DIR/env); run $HERE/start.sh $DIR"
# shellcheck disable=SC1091
. "$DIR/env"
export DBUS_SESSION_BUS_ADDRESS DISPLAY NOTIFY_DIR
TIMEOUT="${NOTIFY_CTL_TIMEOUT:-5}"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] && [ "$TIMEOUT" -gt 0 ] || fail "NOTIFY_CTL_TIMEOUT must be a positive integer"
now() { date +%s%N; }
deadline=$(( $(now) + TIMEOUT * 1000000000 ))
deadline_passed() { [ "$(now)" -gt "$deadline" ]; }

dunst_call() {
    dbus-send --session --print-reply=literal --reply-timeout=5000 \
        --dest=org.freedesktop.Notifications /org/freedesktop/Notifications "$@"
}

showing() {
    command -v busctl >/dev/null 2>&1 || fail "'busctl' not found (systemd; dunstctl history needs it too)"
    command -v python3 >/dev/null 2>&1 || fail "'python3' not found"
    python3 - "$DIR" "$deadline" <<'EOF'
import json, os, subprocess, sys, time
folder, deadline = sys.argv[1], int(sys.argv[2]) / 1e9
bus = ["--user", "--json=short", "--no-pager"]
where = ["org.freedesktop.Notifications", "/org/freedesktop/Notifications"]

def displayed_length():
    out = subprocess.run(["busctl", *bus, "get-property", *where, "org.dunstproject.cmd0",
                          "displayedLength"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["data"]

def history():
    out = subprocess.run(["busctl", *bus, "call", *where, "org.dunstproject.cmd0",
                          "NotificationListHistory"], check=True, capture_output=True, text=True).stdout
    return {(e["id"]["data"], e["timestamp"]["data"] // 1000) for e in json.loads(out)["data"][0]}

def records():
    shown = os.path.join(folder, "shown")
    for name in os.listdir(shown):
        if not name.isdigit():
            continue
        with open(os.path.join(shown, name), "rb") as f:
            fields = f.read().decode("utf-8", "replace").split("\0")
        if len(fields) < 9:
            continue
        ts, app, summary, body, urgency, timeout, icon, category = fields[:8]
        yield {"id": int(name), "ts": int(ts or 0), "app": app, "summary": summary, "body": body,
               "urgency": urgency, "timeout_ms": int(timeout or 0), "icon": icon, "category": category}

while True:
    before = displayed_length()
    gone = history()
    now_showing = sorted((r for r in records() if (r["id"], r["ts"]) not in gone), key=lambda r: r["id"])
    after = displayed_length()
    if before == after == len(now_showing):
        break
    if time.time() > deadline:
        print("notify/ctl.sh: warning: dunst displays %d, the records say %d" % (after, len(now_showing)),
              file=sys.stderr)
        break
    time.sleep(0.05)
for r in now_showing:
    del r["ts"]
    print(json.dumps(r, ensure_ascii=False))
EOF
}

# Waits for the dmenu stand-in to answer the menu; prints what it picked.
menu_answer() {
    until [ -e "$DIR/menu.out" ]; do
        deadline_passed && fail "dunst opened no menu within ${TIMEOUT}s (no notification with actions showing?); see $DIR/dunst.log"
        sleep 0.02
    done
    cat "$DIR/menu.out"
}

choose() {
    rm -f "$DIR/menu.out" "$DIR/menu.in"
    printf '%s' "$1" >"$DIR/menu.choice.tmp"
    mv "$DIR/menu.choice.tmp" "$DIR/menu.choice"
}

invoke() {
    local id="$1" key="$2"
    [[ "$id" =~ ^[0-9]+$ ]] || fail "ID must be a number (got '$id')"
    [ -n "$key" ] || fail "KEY must not be empty"
    choose "[$id,$key]"
    dunst_call org.dunstproject.cmd0.ContextMenuCall >/dev/null || fail "ContextMenuCall failed"
    [ -n "$(menu_answer)" ] || fail "notification $id shows no action '$key'; the menu offered:
$(cat "$DIR/menu.in" 2>/dev/null)"
}

# The unique names on the bus but dunst's, one a line.
others() {
    local dunst name
    bus_call() {
        dbus-send --session --print-reply=literal --reply-timeout=5000 \
            --dest=org.freedesktop.DBus /org/freedesktop/DBus "org.freedesktop.DBus.$1" "${@:2}"
    }
    dunst="$(bus_call GetNameOwner string:org.freedesktop.Notifications | tr -d '[:space:]')"
    [[ "$dunst" == :* ]] || fail "nobody owns org.freedesktop.Notifications"
    for name in $(bus_call ListNames); do
        [[ "$name" == :* ]] && [ "$name" != "$dunst" ] && echo "$name"
    done
    true
}

forge() {
    local id="$1" key="$2" names name
    [[ "$id" =~ ^[0-9]+$ ]] || fail "ID must be a number (got '$id')"
    names="$(others)"
    signal() {
        dbus-send --session --type=signal "$@" /org/freedesktop/Notifications \
            org.freedesktop.Notifications.ActionInvoked "uint32:$id" "string:$key"
    }
    signal || fail "dbus-send could not send the signal"
    for name in $names; do
        signal --dest="$name" || fail "dbus-send could not send the signal to $name"
    done
}

flood() {
    local names
    [[ "$1" =~ ^[0-9]+$ ]] || fail "SECONDS must be a number (got '$1')"
    command -v python3 >/dev/null 2>&1 || fail "'python3' not found"
    names="$(others)"
    # shellcheck disable=SC2086
    python3 "$HERE/flood.py" "$1" $names
}

# Clicks the top notification with BUTTON (1 left, 2 middle, 3 right).
click_top() {
    command -v xdotool >/dev/null 2>&1 || fail "'xdotool' not found (run dev/install-test-deps.sh)"
    local win="" X Y WIDTH
    until win="$(xdotool search --onlyvisible --class Dunst 2>/dev/null | head -n 1)" && [ -n "$win" ]; do
        deadline_passed && fail "no dunst window on $DISPLAY within ${TIMEOUT}s (nothing showing?)"
        sleep 0.02
    done
    eval "$(xdotool getwindowgeometry --shell "$win" | grep -E '^(X|Y|WIDTH)=[0-9]+$')"
    # 15 px down: inside the first notification (frame 3, padding 8, a line).
    xdotool mousemove "$(( X + WIDTH / 2 ))" "$(( Y + 15 ))" click "$1" mousemove 0 0
}

case "$COMMAND" in
    showing) [ $# -eq 0 ] || usage; showing ;;
    invoke) [ $# -eq 2 ] || usage; invoke "$1" "$2" ;;
    click)
        [ $# -le 1 ] || usage
        if [ $# -eq 0 ]; then
            click_top 1
        else
            choose ",$1]"
            click_top 2
            [ -n "$(menu_answer)" ] || fail "the top notification shows no action '$1'; its menu offered:
$(cat "$DIR/menu.in" 2>/dev/null)"
        fi
        ;;
    dismiss) [ $# -eq 0 ] || usage; click_top 3 ;;
    forge) [ $# -eq 2 ] || usage; forge "$1" "$2" ;;
    flood) [ $# -eq 1 ] || usage; flood "$1" ;;
    screenshot)
        [ $# -eq 1 ] || usage
        command -v import >/dev/null 2>&1 || fail "'import' not found (imagemagick)"
        import -window root -display "$DISPLAY" "png:$1" || fail "import failed"
        ;;
    *) usage ;;
esac
