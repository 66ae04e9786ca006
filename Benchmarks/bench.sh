#!/usr/bin/env bash
# Build the release products vaultbench runs (vaultd, vaultctl, vaultctl-notify
# and vaultbench only, as scripts/release.sh builds them) and run it: vaultd beside oidc-agent on one Glewlwyd, the C echo
# floor, vaultd alone, scaling with accounts, start-up. Prints the tables of
# BENCHMARKS.md.
#
#   Benchmarks/bench.sh                     # build (release, static Swift runtime) and run
#   Benchmarks/bench.sh --no-build          # run what is built
#   SCRATCH=.build-release Benchmarks/bench.sh   # another build folder
#
# Needs cc and libsodium-dev (the C load client is compiled at run time),
# glewlwyd for the side-by-side run, oidc-agent-cli for the peer's column.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ "${1:-}" = "--no-build" ]; then
    bin="$(scripts/release.sh --bin-path)"
else
    bin="$(scripts/release.sh vaultd vaultctl vaultctl-notify vaultbench)"
fi
# How a program's file came into the page cache (the link wrote it, a copy
# read it whole, or faults read it in) changes how much the kernel maps
# around each of the program's page faults: vaultd's idle RSS, one build,
# was 11,444-11,492 KiB started from an evicted file, 11,616-11,632 after
# `cat vaultd`, and 11,876-12,148 just after the link. Both programs leave
# the page cache first, so that each run starts them as after a boot.
sync
for program in vaultd vaultctl; do
    dd if="$bin/$program" iflag=nocache count=0 status=none
done
# How much of the link order files still names this code: a stale list costs
# the idle RSS that vaultbench's rows show, never a failed build or test.
Benchmarks/order-report.py "$bin"
exec "$bin/vaultbench"
