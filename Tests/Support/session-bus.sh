# A private session bus for tests, sourced by keyring/session.sh and
# notify/start.sh: the configuration of /usr/share/dbus-1/session.conf less
# its service folders and includes, so that nothing is D-Bus-activated
# (this machine's /usr/share/dbus-1/services would start gnome-keyring,
# dunst or notification-daemon, with a user's configuration, on a first
# call).
#
#   start_session_bus DIR SOCKET
#
# writes DIR/bus.conf, starts dbus-daemon listening on SOCKET (its log in
# DIR/bus.log) and sets and exports DBUS_SESSION_BUS_ADDRESS, and sets
# BUS_PID. Needs `fail` from the sourcing script.
start_session_bus() {
    local dir="$1" socket="$2"
    [ ${#socket} -lt 100 ] || fail "$dir is too long for a socket path; choose a shorter folder"
    cat >"$dir/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <keep_umask/>
  <listen>unix:path=$socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
CONF
    dbus-daemon --config-file="$dir/bus.conf" --fork --nopidfile \
        --print-address=3 --print-pid=4 3>"$dir/bus.address" 4>"$dir/bus.pid" \
        </dev/null >/dev/null 2>"$dir/bus.log" \
        || fail "dbus-daemon did not start; see $dir/bus.log"
    BUS_PID="$(tr -d '[:space:]' <"$dir/bus.pid")"
    DBUS_SESSION_BUS_ADDRESS="$(head -n 1 "$dir/bus.address")"
    [ -n "$BUS_PID" ] && [ -n "$DBUS_SESSION_BUS_ADDRESS" ] || fail "dbus-daemon printed no address or pid"
    export DBUS_SESSION_BUS_ADDRESS
}
