#!/usr/bin/env bash
# Installs what the test suite runs against, on top of what building and
# running tokenvault needs (scripts/install-deps.sh). Idempotent. A user's
# install never runs this: these are servers and tools for the tests only.
#
#   dev/install-test-deps.sh            install what is missing
#   dev/install-test-deps.sh --list     print the package names, one per line
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
    gnome-keyring libsecret-tools dbus         # a real Secret Service, headless
    glewlwyd sqlite3 openssl                   # the third-party OpenID provider (demo/glewlwyd)
    util-linux python3                         # setpriv and a stdlib client, for the other-user tests
    tmux                                       # a real terminal for vaultctl's prompts
    openssh-server openssh-client              # a forwarded share over real ssh
    curl                                       # a resource server called with vaultctl dpop's headers
    dunst xvfb fonts-dejavu-core               # a real notification server on a private display (Tests/Support/notify)
    xdotool imagemagick                        # click it and screenshot it
    dovecot-core dovecot-imapd                 # a real IMAP server that takes OAuth 2 bearer tokens (demo/mail)
    dovecot-submissiond                        # and its SMTP submission service, relaying to a sink
    msmtp neomutt                              # real mail clients with the vault's tokens (XOAUTH2)
)
# kubectl for the exec-credential tests: any kubectl will do, else Debian's.
command -v kubectl >/dev/null || packages+=(kubernetes-client)
if [ "${1:-}" = "--list" ]; then
    printf '%s\n' "${packages[@]}"
    exit 0
fi

scripts/install-deps.sh --also "${packages[@]}"
