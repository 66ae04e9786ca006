#!/usr/bin/env bash
# Installs the Debian packages tokenvault builds and tests with. Idempotent:
# it does nothing when they are all present.
set -euo pipefail

packages=(
    libsodium-dev libsecret-1-dev pkg-config   # build
    zlib1g-dev libstdc++-12-dev                # the archives scripts/release.sh links in
    binutils                                   # strip, for scripts/install.sh
    gnome-keyring libsecret-tools dbus         # Secret Service tests
    glewlwyd sqlite3 openssl                   # the third-party OpenID provider in the tests
    util-linux python3                         # setpriv and a stdlib client, for the other-user test
    tmux                                       # a real terminal for vaultctl's prompts in the tests
    qrencode                                   # vaultctl signin --device draws its QR code with it
    openssh-server openssh-client              # a forwarded share over real ssh, in the tests
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# kubectl for the exec-credential tests: any kubectl will do, else Debian's.
command -v kubectl >/dev/null || missing+=(kubernetes-client)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
