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
#
# libstdc++ is linked statically too: the Swift runtime uses little of it,
# and vaultd kept 1.1 MB of libstdc++.so resident (its relocations and its
# static constructors). A folder that holds only libstdc++.a, searched
# first, makes the runtime's -lstdc++ find the archive.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="${SCRATCH:-.build}"
case "$scratch" in /*) ;; *) scratch="$PWD/$scratch" ;; esac
# The clang of the Swift toolchain, which links: the libstdc++ of the GCC it picks.
archive="$(clang -print-file-name=libstdc++.a)"
[ -f "$archive" ] || { echo "release.sh: no libstdc++.a (Debian: apt-get install libstdc++-12-dev)" >&2; exit 1; }
mkdir -p "$scratch/static-libstdc++"
ln -sf "$archive" "$scratch/static-libstdc++/libstdc++.a"
flags=(-c release --static-swift-stdlib --scratch-path "$scratch"
    -Xswiftc -Xfrontend -Xswiftc -function-sections -Xcc -ffunction-sections
    -Xswiftc -L"$scratch/static-libstdc++")
products=("$@")
[ ${#products[@]} -gt 0 ] || products=(vaultd vaultctl)
[ "${products[0]}" = --bin-path ] && products=()
for product in "${products[@]}"; do
    swift build "${flags[@]}" --product "$product" >&2
done
swift build "${flags[@]}" --show-bin-path
