#!/usr/bin/env bash
# Builds the release products and prints the folder they are in.
#
#   scripts/release.sh                    # vaultd and vaultctl
#   scripts/release.sh vaultd vaultbench  # these products
#   scripts/release.sh --bin-path         # build nothing, print the folder
#   SCRATCH=.build-release scripts/release.sh   # another build folder
#
# A static Swift runtime: vaultctl is a static executable, and neither
# program looks for the runtime's libraries at start. Every function in a
# section of its own, so that the linker lays out the functions each program
# runs (link/vaultd.order and link/vaultctl.order, made by
# scripts/order-files.sh) next to each other: the kernel maps code 64 KiB
# around each page a process touches, so code spread over 23 MB costs far
# more resident memory and page faults than the 2 MB that runs.
set -euo pipefail
cd "$(dirname "$0")/.."
flags=(-c release --static-swift-stdlib -Xswiftc -Xfrontend -Xswiftc -function-sections -Xcc -ffunction-sections)
[ -n "${SCRATCH:-}" ] && flags+=(--scratch-path "$SCRATCH")
products=("$@")
[ ${#products[@]} -gt 0 ] || products=(vaultd vaultctl)
[ "${products[0]}" = --bin-path ] && products=()
for product in "${products[@]}"; do
    swift build "${flags[@]}" --product "$product" >&2
done
swift build "${flags[@]}" --show-bin-path
