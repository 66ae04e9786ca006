#!/usr/bin/env bash
# Soak test: vaultd under many clients against a rotating Glewlwyd, with
# sign-outs and SIGKILLs along the way. Tests/Soak/soak.py says what it does and
# what it prints.
#
#   Tests/Soak/soak.sh [SECONDS]          (default SOAK_SECONDS, else 600)
#
# Environment:
#   SOAK_BIN           a folder holding vaultd (else a release build is made)
#   SOAK_SECONDS       how long to run (600)
#   SOAK_CLIENTS       client threads (200)
#   SOAK_KILL_SECONDS  about how often vaultd is SIGKILLed (20)
#   SOAK_SEED          seed for the clients' choices and the kill moments
#   SOAK_KEEP=1        keep the work folder (kept anyway when a goal failed)
#
# Exit 0 when every goal figure is 0, 1 when one is not, 2 when the setup failed.
# Needs what demo/glewlwyd/start.sh needs (glewlwyd, sqlite3, openssl, python3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

if [ -n "${SOAK_BIN:-}" ]; then
    BIN="$SOAK_BIN"
else
    echo "soak: building vaultd (release)" >&2
    BIN="$("$ROOT/scripts/release.sh" vaultd)" || { echo "soak: the build failed" >&2; exit 2; }
fi
[ -x "$BIN/vaultd" ] || { echo "soak: no vaultd in $BIN" >&2; exit 2; }

exec python3 "$HERE/soak.py" --bin "$BIN" "$@"
