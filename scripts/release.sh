#!/usr/bin/env bash
# Builds the release products and prints the folder they are in.
#
#   scripts/release.sh                    # vaultd and vaultctl
#   scripts/release.sh vaultd vaultctl vaultctl-notify   # what scripts/install.sh installs
#   scripts/release.sh vaultd vaultbench  # these products
#   scripts/release.sh --bin-path         # build nothing, print the folder
#   SCRATCH=.build-release scripts/release.sh   # another build folder
#
# A static Swift runtime: vaultctl is a static executable, and neither
# program looks for the runtime's libraries at start. Every function in a
# section of its own, so that the linker lays out the functions each program
# runs (link/vaultd.order and link/vaultctl.order, made by
# Benchmarks/order-files.sh) next to each other: the kernel maps code 64 KiB
# around each page a process touches, so code spread over 23 MB costs far
# more resident memory and page faults than the 2 MB that runs.
#
# libstdc++, libsodium, zlib and libgcc's unwinder are linked statically
# too. A shared library costs vaultd its headers, its data and 64 KiB of code
# around its start-up code whatever it is used for: libstdc++.so kept 1.1 MB
# resident, libsodium.so 348 KiB (all its code: sodium_init picks an
# implementation in each of its objects), libz.so 84 KiB for nothing vaultd
# calls, libgcc_s.so 84 KiB. Linked in, only what runs is resident, laid out
# with the rest. A folder that holds only the archives, searched first, makes
# -lstdc++, -lsodium and -lz find them. The cost: a fix to one of these
# libraries reaches vaultd when it is rebuilt, as a fix to the Swift runtime
# or to BoringSSL does.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="${SCRATCH:-.build}"
case "$scratch" in /*) ;; *) scratch="$PWD/$scratch" ;; esac
# The clang of the Swift toolchain, which links: the libstdc++ of the GCC it picks.
archives="$scratch/static-libs"
mkdir -p "$archives"
for name in libstdc++ libsodium libz; do
    archive="$(clang -print-file-name=$name.a)"
    [ -f "$archive" ] || { echo "release.sh: no $name.a (scripts/install-deps.sh installs it)" >&2; exit 1; }
    ln -sf "$archive" "$archives/$name.a"
done
flags=(-c release --static-swift-stdlib --scratch-path "$scratch"
    -Xswiftc -Xfrontend -Xswiftc -function-sections -Xcc -ffunction-sections
    -Xswiftc -L"$archives" -Xswiftc -Xclang-linker -Xswiftc -static-libgcc)
products=("$@")
[ ${#products[@]} -gt 0 ] || products=(vaultd vaultctl)
[ "${products[0]}" = --bin-path ] && products=()
for product in "${products[@]}"; do
    swift build "${flags[@]}" --product "$product" >&2
done
swift build "${flags[@]}" --show-bin-path
