#!/usr/bin/env bash
# Builds tokenvault in release mode and runs vaultd in the foreground with the
# default set-up: the sealed-file backend keyed by a key file made on first
# start. Extra arguments go to vaultd (see: vaultd --help).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    # No session runtime folder: make a private one. Never one another user
    # made first: mkdir without -p fails when it exists, and then it must be
    # a real folder of ours, mode 0700.
    XDG_RUNTIME_DIR="/tmp/tokenvault-$(id -u)"
    mkdir -m 0700 "$XDG_RUNTIME_DIR" 2>/dev/null || true
    if [ -L "$XDG_RUNTIME_DIR" ] || [ ! -d "$XDG_RUNTIME_DIR" ] ||
        [ "$(stat -c '%u %a' "$XDG_RUNTIME_DIR")" != "$(id -u) 700" ]; then
        echo "run.sh: $XDG_RUNTIME_DIR is not a folder of yours with mode 0700; remove it or set XDG_RUNTIME_DIR" >&2
        exit 1
    fi
fi
export XDG_RUNTIME_DIR

scripts/install-deps.sh
bin="$(scripts/release.sh)"
echo "vaultd: socket at ${TOKENVAULT_SOCKET:-$XDG_RUNTIME_DIR/tokenvault/vaultd.sock}; try: $bin/vaultctl status" >&2
exec "$bin/vaultd" "$@"
