#!/usr/bin/env bash
# Builds tokenvault in release mode and runs vaultd in the foreground with the
# default set-up: the sealed-file backend keyed by a key file made on first
# start. Extra arguments go to vaultd (see: vaultd --help).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
# A static Swift runtime halves vaultctl's start-up; it runs in every script.
swift build -c release --static-swift-stdlib --product vaultd
swift build -c release --static-swift-stdlib --product vaultctl
: "${XDG_RUNTIME_DIR:=/tmp/tokenvault-$(id -u)}"
export XDG_RUNTIME_DIR
mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
echo "vaultd: socket at ${TOKENVAULT_SOCKET:-$XDG_RUNTIME_DIR/tokenvault/vaultd.sock}; try: $(swift build -c release --static-swift-stdlib --show-bin-path)/vaultctl status" >&2
exec "$(swift build -c release --static-swift-stdlib --show-bin-path)/vaultd" "$@"
