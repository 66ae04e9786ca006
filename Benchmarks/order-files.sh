#!/usr/bin/env bash
# Writes link/vaultd.order and link/vaultctl.order: the functions each
# program runs and the data it reads and writes, which the linker puts next
# to each other (see scripts/release.sh and Package.swift). Run it after
# changes that add or rename much of the code on these paths; a stale list
# only costs memory and start-up time, never correctness (a name the linker
# does not find is skipped); Benchmarks/bench.sh reports how much of each
# list no longer names the code (Benchmarks/order-report.py).
#
#   Benchmarks/order-files.sh
#
# It builds the release products, then runs them under callgrind (valgrind),
# which sees every function that runs: vaultd through start-up, two password
# sign-ins at a Glewlwyd on 127.0.0.1 (as vaultbench sets it up), cached
# tokens, a refresh, `status`, many connections, and a clean stop; vaultctl
# through `token`, `exec` and `git-credential`. A second run of vaultd, and
# one of `vaultctl token`, under lackey (valgrind) see every byte of data
# they touch. Takes about 17 minutes on two cores (lackey is most of it);
# needs valgrind and glewlwyd.
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
        [ -d "$work/$issuer" ] && demo/glewlwyd/stop.sh "$work/$issuer" >/dev/null 2>&1 || true
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

issuer="$(demo/glewlwyd/start.sh "$work/glewlwyd")"
short="$(GLEWLWYD_ACCESS_TOKEN_SECONDS=5 demo/glewlwyd/start.sh "$work/glewlwyd-short")"
socket="$work/vaultd.sock"

# The client side of a profile: `drive setup` does what vaultbench does
# before it measures vaultd idle (two password sign-ins, a token, status);
# `drive rest` the rest of a day: more tokens, connections one after another
# and many at once, and a refresh.
drive() {
    python3 - "$1" "$socket" "$issuer" "$short" <<'PY'
import json, socket, sys, time

phase, path, issuer, short = sys.argv[1:]
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
    for _ in range(5):
        lines.write(json.dumps(request) + "\n")
        lines.flush()
        reply = lines.readline()
        # Under valgrind vaultd runs 50 times slower, and may miss its own
        # deadline for the issuer's answer.
        if '"idp_unavailable"' not in reply:
            break
    if '"ok":true' not in reply:
        sys.exit(f"order-files.sh: {request['op']} failed: {reply[:200]}")
    return reply

if phase == "setup":
    for name, at, client, secret in (("bench", issuer, "confidential-app", "s3cret-confidential"),
                                     ("burst", short, "confidential-rotating", "s3cret-rotating")):
        call({"id": 1, "op": "account.add", "name": name, "issuer": at, "client_id": client,
              "client_secret": secret, "scopes": ["openid", "offline_access"]})
        call({"id": 2, "op": "signin.start", "account": name, "method": "password",
              "username": "ada", "password": "correct horse"})
    call({"id": 3, "op": "token", "account": "bench"})
    call({"id": 4, "op": "status"})
    sys.exit()
started = time.monotonic()
for i in range(50):
    call({"id": i, "op": "token", "account": "bench"})
for i in range(50):
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    c.sendall(b'{"id":1,"op":"token","account":"bench"}\n')
    c.recv(4096)
    c.close()
# Many connections at once with requests in flight on each, as under load.
held = [socket.socket(socket.AF_UNIX) for _ in range(200)]
for c in held:
    c.connect(path)
for _ in range(5):
    for c in held:
        c.sendall(b'{"id":1,"op":"token","account":"bench"}\n' * 4)
    for c in held:
        answers = b""
        while answers.count(b"\n") < 4:
            answers += c.recv(65536)
for c in held:
    c.close()
# The burst account's 5-second token expires: the next token is a refresh.
time.sleep(max(0, 5.5 - (time.monotonic() - started)))
# On a new connection: under lackey the rounds above outlast vaultd's
# 10-minute idle timeout, which closes the first one.
s = socket.socket(socket.AF_UNIX)
s.connect(path)
lines = s.makefile("rw")
call({"id": 3, "op": "token", "account": "burst"})
PY
}

# Starts vaultd on a new vault under valgrind with the given options, drives
# it through the set-up, runs `$mark` (which tells the profile's two parts
# apart), and drives it through the rest; it runs on until stop_vaultd.
profile_vaultd() {
    rm -rf "$work/state" "$work/config"
    XDG_STATE_HOME="$work/state" XDG_CONFIG_HOME="$work/config" \
        valgrind "$@" "$work/vaultd" --socket "$socket" --log-level warning 2>>"$work/vaultd.log" &
    echo $! >"$work/vaultd.pid"
    drive setup
    $mark
    drive rest
}

stop_vaultd() {
    kill -TERM "$(cat "$work/vaultd.pid")"
    wait "$(cat "$work/vaultd.pid")" || true
    rm -f "$work/vaultd.pid"
}

# The data vaultd reads and writes, from a trace of every access (lackey);
# the trace's length after the set-up parts it. lackey writes each access,
# instructions included, with a write of its own: into a file, the set-up
# had written 14 GB and not finished after 20 minutes, vaultd missing its
# deadlines. Through a pipe that keeps only the data accesses, it takes
# about a minute and 0.5-0.6 GB.
exec 9> >(LC_ALL=C grep -v '^I' >"$work/vaultd.lackey")
filter=$!
# The trace is marked a second after the set-up, when grep has written what
# the pipe held: all of the set-up but grep's last block of 4 KiB. An idle
# vaultd under lackey writes about 8 KB a second.
mark_trace() { sleep 1; stat -c %s "$work/vaultd.lackey" >"$work/vaultd.lackey.setup"; }
mark=mark_trace profile_vaultd --tool=lackey --trace-mem=yes --log-fd=9
# valgrind loads the position-independent vaultd at an address of its own.
grep -m1 " $work/vaultd\$" "/proc/$(cat "$work/vaultd.pid")/maps" | cut -d- -f1 >"$work/vaultd.base"
stop_vaultd
exec 9>&-
wait "$filter"
# The functions it runs (callgrind), the set-up's in a profile of their own
# (vaultd.vaultd.callgrind.1); vaultctl's runs below talk to this vaultd.
mark_profile() { callgrind_control -d "$(cat "$work/vaultd.pid")" >/dev/null; }
mark=mark_profile profile_vaultd --tool=callgrind --demangle=no --callgrind-out-file="$work/vaultd.vaultd.callgrind"

for command in "token bench --socket $socket" "git-credential bench --host example.org get --socket $socket" \
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
valgrind --tool=lackey --trace-mem=yes --log-fd=9 \
    "$work/vaultctl" token bench --socket "$socket" 9>&1 >/dev/null |
    LC_ALL=C grep -v '^I' >"$work/vaultctl.lackey"
stop_vaultd

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

def traced(trace, start=0, end=None):
    """The addresses (to 8 bytes) a lackey trace read or wrote between two
    of its byte offsets, in the program's first 64 MB. The trace is large
    (0.5-0.6 GB for vaultd): it is read in blocks."""
    access = re.compile(rb"^ [LSM] (0[0-3][0-9a-f]{6}),", re.M)
    addresses, rest = set(), b""
    with open(trace, "rb") as lines:
        lines.seek(start)
        left = end - start if end is not None else None
        while block := lines.read(1 << 24 if left is None else min(1 << 24, left)):
            if left is not None:
                left -= len(block)
            block = rest + block
            stop = block.rfind(b"\n") + 1
            rest = block[stop:]
            addresses.update(int(a, 16) & ~7 for a in access.findall(block, 0, stop))
    return addresses

def data_touched(binary, addresses, base=0):
    """Data symbols of `binary` at `addresses`, sorted. `base`: where the
    trace had the program (valgrind loads a position-independent executable
    at an address of its own). An access outside every symbol (a constant
    without a name) names nothing: naming the symbol before it would move
    whole sections that are read in one or two places, such as Unicode
    tables, into the stretch that is read throughout."""
    symbols = []
    for line in subprocess.run(["nm", "-S", "-n", "--defined-only", binary],
                               capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in "bBdDrRvV":
            symbols.append((int(fields[0], 16), int(fields[1], 16), fields[3]))
    starts = [start for start, _, _ in symbols]
    seen = set()
    for address in addresses:
        address -= base
        i = bisect.bisect_right(starts, address + 7) - 1
        # The 8 bytes at `address` overlap the symbol at `i`.
        if i >= 0 and address < symbols[i][0] + max(symbols[i][1], 1):
            seen.add(symbols[i][2])
    return sorted(seen)

def then(*lists):
    """The names of `lists`, each list's after the earlier lists'."""
    names = {}
    for names_of_one in lists:
        for name in names_of_one:
            names.setdefault(name, None)
    return list(names)

work = sys.argv[1]
# vaultd: what its set-up runs and touches first, so that a vaultd that only
# did that keeps one short stretch of each section; then the rest.
setup = functions("vaultd", [f"{work}/vaultd.vaultd.callgrind.1"])
rest = functions("vaultd", [f"{work}/vaultd.vaultd.callgrind"])
trace, base = f"{work}/vaultd.lackey", int(open(f"{work}/vaultd.base").read(), 16)
middle = int(open(f"{work}/vaultd.lackey.setup").read())
vaultd = then(setup, rest,
              data_touched(f"{work}/vaultd", traced(trace, 0, middle), base),
              data_touched(f"{work}/vaultd", traced(trace, middle), base))
vaultctl = then(functions("vaultctl", [f"{work}/{name}.vaultctl.callgrind" for name in ("token", "git-credential", "exec")]),
                data_touched(f"{work}/vaultctl", traced(f"{work}/vaultctl.lackey")))
for program, names in (("vaultd", vaultd), ("vaultctl", vaultctl)):
    if len(names) < 100:
        sys.exit(f"order-files.sh: only {len(names)} names for {program}")
    with open(f"link/{program}.order", "w") as out:
        out.write("\n".join(names) + "\n")
    print(f"link/{program}.order: {len(names)} symbols")
PY
# The build does not see these lists as inputs: relink with them next time.
rm -f "$bin/vaultd" "$bin/vaultctl"
