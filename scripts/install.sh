#!/usr/bin/env bash
# Installs tokenvault for the current user, the way its systemd units expect:
#   ~/.local/bin/vaultd, ~/.local/bin/vaultctl, ~/.local/bin/vaultctl-notify (which `vaultctl notify` runs)
#   ~/.config/systemd/user/vaultd.socket, vaultd.service, vaultctl-notify.service
#   shell completions (bash, zsh, fish) and the vaultctl(1) and vaultd(1) man pages under ~/.local/share
# then enables the socket when a systemd user manager is running, and the
# sign-in notifications when a graphical session is.
#
#   scripts/install.sh             build a release (static Swift runtime) and install it
#   scripts/install.sh --from DIR  install vaultd, vaultctl and vaultctl-notify already built in DIR
set -euo pipefail
cd "$(dirname "$0")/.."

from=""
if [ "${1:-}" = "--from" ]; then
    [ -n "${2:-}" ] || { echo "usage: $0 [--from DIR]" >&2; exit 64; }
    from="$2"
fi

manual=""
if [ -z "$from" ]; then
    scripts/install-deps.sh
    from="$(scripts/release.sh vaultd vaultctl vaultctl-notify)"
    swift package plugin --allow-writing-to-package-directory generate-manual >/dev/null
    manual=".build/plugins/GenerateManual/outputs"
fi

home="${HOME:?HOME is not set}"
bin="$home/.local/bin"                              # where vaultd.service looks
data="${XDG_DATA_HOME:-$home/.local/share}"
units="${XDG_CONFIG_HOME:-$home/.config}/systemd/user"

install -d -m 0755 "$bin" "$units" "$data/bash-completion/completions" \
    "$data/zsh/site-functions" "$data/fish/vendor_completions.d" "$data/man/man1"
# Stripped: the debug information is two thirds of vaultd's 120 MB, and useless installed.
install -s -m 0755 "$from/vaultd" "$from/vaultctl" "$from/vaultctl-notify" "$bin/"
install -m 0644 systemd/vaultd.socket systemd/vaultd.service systemd/vaultctl-notify.service "$units/"
"$bin/vaultctl" --generate-completion-script bash >"$data/bash-completion/completions/vaultctl"
"$bin/vaultctl" --generate-completion-script zsh >"$data/zsh/site-functions/_vaultctl"
"$bin/vaultctl" --generate-completion-script fish >"$data/fish/vendor_completions.d/vaultctl.fish"
[ -z "$manual" ] || install -m 0644 "$manual/vaultctl/vaultctl.1" "$manual/vaultd/vaultd.1" "$data/man/man1/"
echo "installed vaultd, vaultctl and vaultctl-notify in $bin, the units in $units"

if systemctl --user is-system-running >/dev/null 2>&1 || [ "$(systemctl --user is-system-running 2>/dev/null)" = "degraded" ]; then
    systemctl --user daemon-reload
    systemctl --user enable --now vaultd.socket
    echo "vaultd.socket is enabled: vaultd starts on the first connection"
    if systemctl --user is-active --quiet graphical-session.target; then
        systemctl --user enable --now vaultctl-notify.service
        echo "vaultctl-notify.service is enabled: a desktop notification says when an account needs a sign-in"
    else
        echo "no graphical session: vaultctl-notify.service is installed, not enabled"
    fi
else
    echo "no systemd user manager answers here; in your session run:"
    echo "    systemctl --user daemon-reload && systemctl --user enable --now vaultd.socket"
fi
