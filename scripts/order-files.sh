#!/usr/bin/env bash
# Writes link/vaultd.order and link/vaultctl.order: the functions each
# program runs (and the variables `vaultctl token` touches), which the linker
# puts next to each other (see scripts/release.sh and Package.swift). Run it after changes that add or rename much of the
# code on these paths; a stale list only costs memory and start-up time,
# never correctness (a name the linker does not find is skipped).
#
#   scripts/order-files.sh
#
# It builds the release products, then runs them under callgrind (valgrind),
# which sees every function that runs: vaultd through start-up, two password
# sign-ins at a Glewlwyd on 127.0.0.1 (as vaultbench sets it up), cached
# tokens, a refresh, `status`, many connections, and a clean stop; vaultctl
# through `token`, `exec` and `git-credential`. Needs valgrind and glewlwyd.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
command -v valgrind >/dev/null || { echo "order-files.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
bin="$(scripts/release.sh vaultd vaultctl)"
work="$(mktemp -d)"
cleanup() {
    status=$?
    [ -f "$work/vaultd.pid" ] && kill "$(cat "$work/vaultd.pid")" 2>/dev/null || true
    for issuer in glewlwyd glewlwyd-short; do
        [ -d "$work/$issuer" ] && Tests/Support/glewlwyd/stop.sh "$work/$issuer" >/dev/null 2>&1 || true
    done
    if [ "$status" = 0 ]; then rm -rf "$work"; else echo "order-files.sh: the profiles are in $work" >&2; fi
}
trap cleanup EXIT

# valgrind cannot read the DWARF 5 the toolchain writes: profile copies
# without it (the symbol table stays).
for program in vaultd vaultctl; do
    cp "$bin/$program" "$work/$program"
    strip --strip-debug "$work/$program"
done

issuer="$(Tests/Support/glewlwyd/start.sh "$work/glewlwyd")"
short="$(GLEWLWYD_ACCESS_TOKEN_SECONDS=5 Tests/Support/glewlwyd/start.sh "$work/glewlwyd-short")"
socket="$work/vaultd.sock"
XDG_STATE_HOME="$work/state" XDG_CONFIG_HOME="$work/config" \
    valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/vaultd.vaultd.callgrind" \
    "$work/vaultd" --socket "$socket" --log-level warning 2>"$work/vaultd.log" &
echo $! >"$work/vaultd.pid"

python3 - "$socket" "$issuer" "$short" <<'PY'
import json, socket, sys, time

path, issuer, short = sys.argv[1:]
deadline = time.monotonic() + 120
while True:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("order-files.sh: vaultd did not listen within 120 s")
        time.sleep(0.1)
lines = s.makefile("rw")

def call(request):
    lines.write(json.dumps(request) + "\n")
    lines.flush()
    reply = lines.readline()
    if '"ok":true' not in reply:
        sys.exit(f"order-files.sh: {request['op']} failed: {reply[:200]}")
    return reply

for name, at, client, secret in (("bench", issuer, "confidential-app", "s3cret-confidential"),
                                 ("burst", short, "confidential-rotating", "s3cret-rotating")):
    call({"id": 1, "op": "account.add", "name": name, "issuer": at, "client_id": client,
          "client_secret": secret, "scopes": ["openid", "offline_access"]})
    call({"id": 2, "op": "signin.start", "account": name, "method": "password",
          "username": "ada", "password": "correct horse"})
for i in range(50):
    call({"id": i, "op": "token", "account": "bench"})
call({"id": 1, "op": "status"})
for i in range(50):
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    c.sendall(b'{"id":1,"op":"token","account":"bench"}\n')
    c.recv(4096)
    c.close()
time.sleep(5.5)  # the burst account's 5-second token expires: the next token is a refresh
call({"id": 3, "op": "token", "account": "burst"})
PY

for command in "token bench --socket $socket" "git-credential bench get --socket $socket" \
    "exec bench --socket $socket -- true"; do
    name="${command%% *}"
    # shellcheck disable=SC2086
    printf 'protocol=https\nhost=example.org\n\n' | valgrind --tool=callgrind --demangle=no \
        --callgrind-out-file="$work/$name.vaultctl.callgrind" \
        "$work/vaultctl" $command >/dev/null 2>"$work/$name.vaultctl.log" ||
        { echo "order-files.sh: vaultctl $command failed; see $name.vaultctl.log" >&2; exit 1; }
done
# vaultctl token's writable data too: the kernel gives each page of .data and
# .bss that a process writes its own fault, so the variables it touches are
# laid out together as well.
valgrind --tool=lackey --trace-mem=yes --log-file="$work/vaultctl.lackey" \
    "$work/vaultctl" token bench --socket "$socket" >/dev/null
kill -TERM "$(cat "$work/vaultd.pid")"
wait "$(cat "$work/vaultd.pid")" || true
rm -f "$work/vaultd.pid"

python3 - "$work" <<'PY'
import bisect, re, subprocess, sys

def functions(program, profiles):
    """Functions of `program` the profiles saw run, sorted: which of them
    comes first matters little, and a sorted list changes little from one
    run to the next."""
    seen = {}
    for path in profiles:
        names, objects, current = {}, {}, None
        for raw in open(path):
            line = raw.rstrip("\n")
            m = re.match(r"^(c?ob)=\((\d+)\)(?: (.*))?$", line)
            if m:
                if m.group(3):
                    objects[m.group(2)] = m.group(3)
                if m.group(1) == "ob":
                    current = objects[m.group(2)]
                continue
            m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3)
                if m.group(1) == "fn" and current and current.endswith("/" + program):
                    name = re.sub(r"'\d+$", "", names[m.group(2)])  # callgrind's recursion marks
                    if not name.startswith("0x"):
                        seen.setdefault(name, None)
    return sorted(seen)

def data_touched(binary, trace):
    """Data symbols of `binary` that a lackey memory trace read or wrote, sorted."""
    symbols = []
    for line in subprocess.run(["nm", "-S", "-n", "--defined-only", binary],
                               capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in "bBdDrRvV":
            symbols.append((int(fields[0], 16), int(fields[1], 16), fields[3]))
    starts = [start for start, _, _ in symbols]
    seen = {}
    for line in open(trace):
        fields = line.split()
        if len(fields) == 2 and fields[0] in ("L", "S", "M"):
            address = int(fields[1].split(",")[0], 16)
            i = bisect.bisect_right(starts, address) - 1
            if i >= 0 and address < symbols[i][0] + max(symbols[i][1], 1):
                seen.setdefault(symbols[i][2], None)
    return sorted(seen)

work = sys.argv[1]
for program, profiles in (("vaultd", ["vaultd"]), ("vaultctl", ["token", "git-credential", "exec"])):
    names = functions(program, [f"{work}/{name}.{program}.callgrind" for name in profiles])
    if len(names) < 100:
        sys.exit(f"order-files.sh: only {len(names)} functions of {program} seen")
    if program == "vaultctl":
        names += data_touched(f"{work}/vaultctl", f"{work}/vaultctl.lackey")
    with open(f"link/{program}.order", "w") as out:
        out.write("\n".join(names) + "\n")
    print(f"link/{program}.order: {len(names)} symbols")
PY
# The build does not see these lists as inputs: relink with them next time.
rm -f "$bin/vaultd" "$bin/vaultctl"
