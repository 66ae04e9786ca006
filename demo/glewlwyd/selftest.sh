#!/usr/bin/env bash
# Start a fresh Glewlwyd, run selftest.py against it, stop it; ROUNDS times.
#
#   demo/glewlwyd/selftest.sh [ROUNDS]     (default 2)
#
# Prints how long each start.sh took. Exit 0 only when every round passed.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${1:-2}"
rc=0
for r in $(seq "$ROUNDS"); do
    DIR="$(mktemp -d "${TMPDIR:-/tmp}/glewlwyd-selftest.XXXXXX")"
    t0=$(date +%s%N)
    if ! ISSUER="$("$HERE/start.sh" "$DIR")"; then
        echo "round $r: start.sh failed" >&2; rc=1; continue
    fi
    t1=$(date +%s%N)
    echo "round $r: start.sh took $(( (t1 - t0) / 1000000 )) ms, issuer $ISSUER"
    python3 "$HERE/selftest.py" "$DIR" || rc=1
    "$HERE/stop.sh" "$DIR" || rc=1
    if [ -s "$DIR/glewlwyd.pid" ]; then echo "round $r: pid file left behind" >&2; rc=1; fi
    rm -rf "$DIR"
done
exit $rc
