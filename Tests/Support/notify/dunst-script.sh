#!/usr/bin/env bash
# dunst's rule script in a Tests/Support/notify session (DIR/dunstrc, [record]):
# dunst runs it for every notification it displays, and again when one is
# replaced while displayed, with DUNST_* in the environment. It writes
# DIR/shown/ID: NUL-terminated fields, in this order: timestamp (ms, dunst's
# monotonic clock; the same notification has the same one in dunst's
# history), app name, summary, body (as sent: markup not rendered), urgency,
# timeout (ms, 0 = never), icon path, category. ctl.sh showing reads them.
set -euo pipefail
[ -n "${NOTIFY_DIR:-}" ] && [ -d "$NOTIFY_DIR/shown" ] || exit 0
[[ "${DUNST_ID:-}" =~ ^[0-9]+$ ]] || exit 0
file="$NOTIFY_DIR/shown/$DUNST_ID"
printf '%s\0' "${DUNST_TIMESTAMP:-}" "${DUNST_APP_NAME:-}" "${DUNST_SUMMARY:-}" "${DUNST_BODY:-}" \
    "${DUNST_URGENCY:-}" "${DUNST_TIMEOUT:-}" "${DUNST_ICON_PATH:-}" "${DUNST_CATEGORY:-}" >"$file.tmp.$$"
mv "$file.tmp.$$" "$file"
