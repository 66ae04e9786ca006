#!/usr/bin/env bash
# A private, headless Secret Service for tests: its own session bus and a
# gnome-keyring whose `login` keyring is the default collection, unlocked.
#
#   Tests/Support/keyring/session.sh start DIR       start; prints the bus address
#   Tests/Support/keyring/session.sh stop DIR        stop the keyring and the bus
#   Tests/Support/keyring/session.sh run DIR CMD...  start, run CMD inside, stop
#
# and, for tests, on a running session:
#   lock DIR             lock the default collection (Secret Service Lock)
#   unlock DIR           unlock it: restarts the keyring with its password
#   stop-keyring DIR     stop only the keyring: no Secret Service on the bus
#   start-keyring DIR    start it again (= unlock)
#   freeze DIR           SIGSTOP the keyring: it owns its name, never answers
#   thaw DIR             SIGCONT it
#
# DIR (created if missing; empty or a session folder from before; keep it
# short, the bus socket lives in it) receives home/, data/, config/, cache/,
# runtime/ (the keyring's HOME and XDG_* folders), bus.conf, bus.log,
# keyring.log and, once the collection answers unlocked, DIR/env:
# shell-sourceable KEY='VALUE' lines (DBUS_SESSION_BUS_ADDRESS, HOME, XDG_*,
# the two pids, the collection path, the password). Run secret-tool, gdbus
# or a test client with that environment.
#
# The bus is a session bus with its own configuration (DIR/bus.conf) and no
# service files: nothing is D-Bus-activated, neither from this machine's
# /usr/share/dbus-1/services nor otherwise, so the only Secret Service is the
# keyring this script starts, and after stop-keyring there is none at all.
# (A session bus with the standard configuration would activate
# gnome-keyring-daemon on the first call, with a locked `login`.)
#
# Facts this relies on: services the
# bus activates inherit the bus daemon's environment, so HOME and XDG_* are
# set before the bus starts; DISPLAY and WAYLAND_DISPLAY are unset so no
# prompt waits for a person; `gnome-keyring-daemon --unlock` with the
# password on stdin starts the keyring and creates or unlocks `login`; it is
# the only prompt-free way to unlock `login` (a running daemon ignores a later
# --unlock), so `unlock` restarts the daemon.
#
# Environment knobs:
#   KEYRING_PASSWORD        the login keyring's password (default tokenvault-test)
#   KEYRING_START_TIMEOUT   seconds to wait for readiness (default 10)
#
# Needs the Debian packages gnome-keyring, libsecret-tools and dbus
# (dev/install-test-deps.sh).
set -euo pipefail
# shellcheck source=../session-bus.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../session-bus.sh"

say() { echo "keyring/session.sh: $*" >&2; }
fail() { say "error: $*"; exit 1; }
usage() { echo "usage: $0 start|stop|lock|unlock|stop-keyring|start-keyring|freeze|thaw DIR | run DIR CMD..." >&2; exit 2; }

[ $# -ge 2 ] || usage
COMMAND="$1"
mkdir -p "$2"
DIR="$(cd "$2" && pwd)"
shift 2

PASSWORD="${KEYRING_PASSWORD:-tokenvault-test}"
TIMEOUT="${KEYRING_START_TIMEOUT:-10}"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] && [ "$TIMEOUT" -gt 0 ] || fail "KEYRING_START_TIMEOUT must be a positive integer"
SECRETS=org.freedesktop.secrets
COLLECTION_ALIAS=default

for cmd in dbus-daemon gnome-keyring-daemon gdbus; do
    command -v "$cmd" >/dev/null 2>&1 || fail "'$cmd' not found (run dev/install-test-deps.sh)"
done

# The environment every process of the session runs with.
session_environment() {
    export HOME="$DIR/home"
    export XDG_DATA_HOME="$DIR/data"
    export XDG_CONFIG_HOME="$DIR/config"
    export XDG_CACHE_HOME="$DIR/cache"
    export XDG_RUNTIME_DIR="$DIR/runtime"
    unset DISPLAY WAYLAND_DISPLAY GNOME_KEYRING_CONTROL SSH_AUTH_SOCK DBUS_STARTER_ADDRESS DBUS_STARTER_BUS_TYPE
}

now() { date +%s%N; }
deadline_passed() { [ "$(now)" -gt "$1" ]; }
new_deadline() { echo $(( $(now) + TIMEOUT * 1000000000 )); }

# A process is ours when it runs with this session's runtime folder.
is_ours() {
    local pid="$1"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    grep -qzxF "XDG_RUNTIME_DIR=$DIR/runtime" "/proc/$pid/environ" 2>/dev/null
}

is_running() {
    local state
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo gone)"
    [ "$state" != gone ] && [ "$state" != Z ]
}

# SIGTERM, wait up to 5 s (a zombie counts as stopped), then SIGKILL.
stop_process() {
    local pid="$1" name="$2"
    is_ours "$pid" || return 0
    kill "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true  # a frozen keyring must run to exit
    local deadline=$(( $(now) + 5000000000 ))
    while is_running "$pid"; do
        if deadline_passed "$deadline"; then
            say "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.02
    done
}

# This session's gnome-keyring-daemon and dbus-daemon processes, whatever
# the env file says: a start that failed half-way, a keyring started twice.
session_daemons() {
    local file pid
    grep -lzxF "XDG_RUNTIME_DIR=$DIR/runtime" /proc/[0-9]*/environ 2>/dev/null | while read -r file; do
        pid="$(echo "$file" | cut -d/ -f3)"
        case "$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" in
            gnome-keyring-daemon\ * | dbus-daemon\ *) is_running "$pid" && echo "$pid" ;;
        esac
    done
    return 0
}

stop_leftovers() {
    local pid
    for pid in $(session_daemons); do
        stop_process "$pid" "$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -d' ' -f1)"
    done
}

read_env() {
    [ -s "$DIR/env" ] || fail "no session in $DIR (no $DIR/env); run: $0 start $DIR"
    # shellcheck disable=SC1091
    . "$DIR/env"
    export DBUS_SESSION_BUS_ADDRESS
}

bus_call() {
    gdbus call --session --timeout 5 "$@"
}

# The pid owning a bus name, or nothing. Never activates the name.
name_owner_pid() {
    bus_call --dest org.freedesktop.DBus --object-path /org/freedesktop/DBus \
        --method org.freedesktop.DBus.GetConnectionUnixProcessID "$1" 2>/dev/null \
        | sed -nE 's/^\(uint32 ([0-9]+),\)$/\1/p' || true
}

# The default collection's object path, or nothing.
default_collection() {
    bus_call --dest "$SECRETS" --object-path /org/freedesktop/secrets \
        --method org.freedesktop.Secret.Service.ReadAlias "$COLLECTION_ALIAS" 2>/dev/null \
        | sed -nE "s/^\(objectpath '([^']+)',\)$/\1/p" | grep -vx / || true
}

collection_locked() {
    bus_call --dest "$SECRETS" --object-path "$1" --method org.freedesktop.DBus.Properties.Get \
        org.freedesktop.Secret.Collection Locked 2>/dev/null | sed -nE 's/^\(<(true|false)>,\)$/\1/p' || true
}

# Starts gnome-keyring-daemon with the password on stdin (this unlocks, or
# first creates, `login`) and waits until it owns the name and the default
# collection answers unlocked. Sets DAEMON_PID and COLLECTION.
start_keyring() {
    local deadline
    deadline="$(new_deadline)"
    [ -z "$(name_owner_pid "$SECRETS")" ] || fail "something already owns $SECRETS on this bus"
    printf '%s' "$PASSWORD" | gnome-keyring-daemon --unlock --components=secrets \
        >"$DIR/keyring.env" 2>>"$DIR/keyring.log" \
        || fail "gnome-keyring-daemon --unlock failed; see $DIR/keyring.log"
    DAEMON_PID=""
    until [ -n "$DAEMON_PID" ]; do
        deadline_passed "$deadline" && fail "gnome-keyring did not claim $SECRETS within ${TIMEOUT}s; see $DIR/keyring.log"
        DAEMON_PID="$(name_owner_pid "$SECRETS")"
        [ -n "$DAEMON_PID" ] || sleep 0.02
    done
    COLLECTION=""
    local locked=""
    until [ -n "$COLLECTION" ] && [ "$locked" = false ]; do
        deadline_passed "$deadline" && fail "the default collection did not answer unlocked within ${TIMEOUT}s (collection '$COLLECTION', locked '$locked')"
        COLLECTION="$(default_collection)"
        locked=""
        [ -z "$COLLECTION" ] || locked="$(collection_locked "$COLLECTION")"
        [ -n "$COLLECTION" ] && [ "$locked" = false ] || sleep 0.02
    done
}

write_env() {
    q() { printf "%s='%s'\n" "$1" "$2"; }
    {
        q KEYRING_DIR "$DIR"
        q DBUS_SESSION_BUS_ADDRESS "$DBUS_SESSION_BUS_ADDRESS"
        q KEYRING_BUS_PID "$BUS_PID"
        q KEYRING_DAEMON_PID "$DAEMON_PID"
        q KEYRING_COLLECTION "$COLLECTION"
        q KEYRING_PASSWORD "$PASSWORD"
        q HOME "$HOME"
        q XDG_DATA_HOME "$XDG_DATA_HOME"
        q XDG_CONFIG_HOME "$XDG_CONFIG_HOME"
        q XDG_CACHE_HOME "$XDG_CACHE_HOME"
        q XDG_RUNTIME_DIR "$XDG_RUNTIME_DIR"
    } >"$DIR/env.tmp"
    mv "$DIR/env.tmp" "$DIR/env"
}

start() {
    if [ -s "$DIR/env" ]; then
        # shellcheck disable=SC1091
        BUS_PID="$(. "$DIR/env"; echo "$KEYRING_BUS_PID")"
        ! { is_ours "$BUS_PID" && is_running "$BUS_PID"; } \
            || fail "a session started from $DIR is still running (bus pid $BUS_PID); run: $0 stop $DIR"
    fi
    if [ -n "$(ls -A "$DIR")" ] && [ ! -e "$DIR/bus.conf" ]; then
        fail "$DIR is neither empty nor a keyring session folder; give an empty or new folder"
    fi
    local t0
    t0="$(now)"
    session_environment
    rm -rf "$DIR/home" "$DIR/data" "$DIR/config" "$DIR/cache" "$DIR/runtime"
    rm -f "$DIR/env" "$DIR/env.tmp" "$DIR/bus.log" "$DIR/keyring.log" "$DIR/keyring.env"
    mkdir -p "$HOME" "$XDG_DATA_HOME" "$XDG_CONFIG_HOME" "$XDG_CACHE_HOME"
    mkdir -m 700 "$XDG_RUNTIME_DIR"

    unset DBUS_SESSION_BUS_ADDRESS
    BUS_PID=""
    DAEMON_PID=""
    trap 'rc=$?; if [ $rc -ne 0 ]; then say "start failed (status $rc); stopping what it started"; stop_leftovers; rm -f "$DIR/env"; fi' EXIT
    start_session_bus "$DIR" "$XDG_RUNTIME_DIR/bus"

    start_keyring
    write_env
    trap - EXIT
    say "ready in $(( ($(now) - t0) / 1000000 )) ms: bus pid $BUS_PID, keyring pid $DAEMON_PID, collection $COLLECTION (env in $DIR/env)"
    echo "$DBUS_SESSION_BUS_ADDRESS"
}

stop() {
    if [ -s "$DIR/env" ]; then
        # shellcheck disable=SC1091
        . "$DIR/env"
        stop_process "$KEYRING_DAEMON_PID" gnome-keyring
        stop_process "$KEYRING_BUS_PID" dbus-daemon
    fi
    stop_leftovers
    rm -f "$DIR/env"
}

lock() {
    read_env
    bus_call --dest "$SECRETS" --object-path /org/freedesktop/secrets \
        --method org.freedesktop.Secret.Service.Lock "['$KEYRING_COLLECTION']" >/dev/null \
        || fail "Lock failed"
    [ "$(collection_locked "$KEYRING_COLLECTION")" = true ] || fail "$KEYRING_COLLECTION is not locked after Lock"
}

# Stops the keyring and waits until nothing owns its name.
stop_keyring() {
    read_env
    session_environment
    PASSWORD="$KEYRING_PASSWORD"
    BUS_PID="$KEYRING_BUS_PID"
    DAEMON_PID="$KEYRING_DAEMON_PID"
    COLLECTION="$KEYRING_COLLECTION"
    stop_process "$KEYRING_DAEMON_PID" gnome-keyring
    local deadline
    deadline="$(new_deadline)"
    while [ -n "$(name_owner_pid "$SECRETS")" ]; do
        deadline_passed "$deadline" && fail "$SECRETS still has an owner after the keyring stopped"
        sleep 0.02
    done
}

restart_keyring() {
    stop_keyring
    start_keyring
    write_env
}

signal_keyring() {
    read_env
    is_ours "$KEYRING_DAEMON_PID" && is_running "$KEYRING_DAEMON_PID" || fail "the keyring (pid $KEYRING_DAEMON_PID) is not running"
    kill "-$1" "$KEYRING_DAEMON_PID"
}

case "$COMMAND" in
    start) [ $# -eq 0 ] || usage; start ;;
    stop) [ $# -eq 0 ] || usage; stop ;;
    lock) [ $# -eq 0 ] || usage; lock ;;
    unlock | start-keyring) [ $# -eq 0 ] || usage; restart_keyring ;;
    stop-keyring) [ $# -eq 0 ] || usage; stop_keyring ;;
    freeze) [ $# -eq 0 ] || usage; signal_keyring STOP ;;
    thaw) [ $# -eq 0 ] || usage; signal_keyring CONT ;;
    run)
        [ $# -ge 1 ] || usage
        start >/dev/null
        trap 'stop' EXIT
        read_env
        (session_environment; export DBUS_SESSION_BUS_ADDRESS; "$@")
        ;;
    *) usage ;;
esac
