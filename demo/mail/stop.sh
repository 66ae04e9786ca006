#!/usr/bin/env bash
# Stop the Dovecot and the SMTP sink that demo/mail/start.sh DIR started.
#
#   demo/mail/stop.sh DIR
#
# Sends SIGTERM to the Dovecot master (DIR/run/master.pid; it takes its
# login, imap and submission processes down with it) and to the sink
# (DIR/smtp-sink.pid), waits up to 5 s for each, then SIGKILL. Only a process
# whose command line names this DIR is signalled (a PID may have been reused).
# Succeeds (exit 0) when nothing is running any more, including when it was
# already stopped. Leaves DIR's files (logs, mailbox, sink/) for post-mortems.
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
[ -d "$1" ] || { echo "mail/stop.sh: no directory $1; nothing to stop" >&2; exit 0; }
DIR="$(cd "$1" && pwd)"

state() { awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true; }
is_ours() {  # is_ours PID PATTERN: PID runs (a zombie counts as stopped) with PATTERN in " ARGV0 ARG1 ... "
    [ -r "/proc/$1/cmdline" ] || return 1
    { printf ' '; tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null; } | grep -qF -- "$2" || return 1
    [ "$(state "$1")" != Z ]
}

stop_one() {  # stop_one NAME PIDFILE PATTERN
    local name="$1" pidfile="$2" pat="$3" pid
    [ -s "$pidfile" ] || return 0
    pid="$(cat "$pidfile")"
    if ! [[ "$pid" =~ ^[0-9]+$ ]]; then
        echo "mail/stop.sh: bad pid in $pidfile" >&2
        return 1
    fi
    if is_ours "$pid" "$pat"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            is_ours "$pid" "$pat" || break
            sleep 0.05
        done
        if is_ours "$pid" "$pat"; then
            echo "mail/stop.sh: $name (pid $pid) ignored SIGTERM; sending SIGKILL" >&2
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile"
}

rc=0
stop_one dovecot "$DIR/run/master.pid" " -c $DIR/dovecot.conf " || rc=1
stop_one smtp-sink "$DIR/smtp-sink.pid" " --dir $DIR/sink " || rc=1
exit $rc
