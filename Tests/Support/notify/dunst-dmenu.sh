#!/usr/bin/env bash
# The dmenu of a Tests/Support/notify session (DIR/dunstrc `dmenu`): dunst runs
# it for a context menu (ContextMenuCall, a middle click) with one line per
# action of each notification on stdin,
#     #LABEL (SUMMARY) [ID,KEY]
# and invokes the action of the line it prints (ActionInvoked(ID, KEY), to
# the client that sent the notification). No one picks here: it prints the
# first line that ends with the text in DIR/menu.choice (as ctl.sh writes it:
# "[ID,KEY]" or ",KEY]"), or nothing (no action), and consumes the choice.
# It saves its input as DIR/menu.in and then what it printed as DIR/menu.out.
set -euo pipefail
dir="${NOTIFY_DIR:?NOTIFY_DIR is not set}"
input="$(cat)"
printf '%s\n' "$input" >"$dir/menu.in.tmp"
mv "$dir/menu.in.tmp" "$dir/menu.in"
choice=""
if [ -e "$dir/menu.choice" ]; then
    choice="$(cat "$dir/menu.choice")"
    rm -f "$dir/menu.choice"
fi
picked=""
if [ -n "$choice" ]; then
    while IFS= read -r line; do
        if [[ "$line" == *"$choice" ]]; then picked="$line"; break; fi
    done <<<"$input"
fi
# dunst first, then the file ctl.sh waits for.
[ -z "$picked" ] || printf '%s\n' "$picked"
exec 1>&-
printf '%s' "$picked" >"$dir/menu.out.tmp"
mv "$dir/menu.out.tmp" "$dir/menu.out"
