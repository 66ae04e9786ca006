#!/usr/bin/env bash
# Installs the Debian packages that building and running tokenvault need, and
# nothing else: what scripts/run.sh and scripts/install.sh use. The test
# suite's servers and tools are dev/install-test-deps.sh's business.
# Idempotent: it does nothing when they are all present.
#
#   scripts/install-deps.sh                 install what is missing
#   scripts/install-deps.sh --also P...     ... and the packages P (the demo's provider, the tests' servers)
#   scripts/install-deps.sh --list          print the package names, one per line
set -euo pipefail

packages=(
    libsodium-dev libsecret-1-dev pkg-config   # build: vaultd links libsodium, loads libsecret
    libsystemd-dev                             # build: vaultctl-notify speaks to the session bus with sd-bus
    zlib1g-dev libstdc++-12-dev                # the archives scripts/release.sh links in
    binutils                                   # strip, for scripts/install.sh
    qrencode                                   # run: vaultctl signin --device draws its QR code with it
)
case "${1:-}" in
--list)
    printf '%s\n' "${packages[@]}"
    exit 0
    ;;
--also)
    shift
    packages+=("$@")
    ;;
"") ;;
*)
    echo "usage: $0 [--list | --also PACKAGE...]" >&2
    exit 64
    ;;
esac

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
