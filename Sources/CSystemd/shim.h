/* sd-bus, Debian's libsystemd (libsystemd-dev): the session bus of
 * vaultctl-notify (Sources/vaultctl-notify/Desktop.swift). Linked into that
 * program only; vaultctl, a static executable, never links it. */
#include <systemd/sd-bus.h>
