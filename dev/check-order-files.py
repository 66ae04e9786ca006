#!/usr/bin/env python3
"""Fails when link/*.order no longer names the code it is meant to lay out.

Benchmarks/order-files.sh writes link/vaultd.order and link/vaultctl.order
from profiles of a release build (about 17 minutes); scripts/release.sh
links with them. A list made for older code still links, and costs memory
instead: the order of 7cbdc0f cost the gate's vaultd 1.2-1.4 MB of idle RSS
(BENCHMARKS.md). This check needs no release build: it reads the names of
tokenvault's own functions in each list, and counts those the debug build
just made no longer defines. Some never were in a debug build (the release
build's specializations); their count when the list was made is recorded in
link/PROGRAM.order.check. More than that, by over 1 % of the list's own
names (at least 20), means functions were renamed, moved or removed since:
the list is stale.

    dev/check-order-files.py            check against .build/debug (dev/test.sh)
    dev/check-order-files.py --record   record the counts (Benchmarks/order-files.sh)
"""
import re
import subprocess
import sys

PROGRAMS = {
    "vaultd": ["VaultDaemon", "VaultStore", "VaultOIDC", "VaultProtocol", "VaultCrypto", "VaultJSON", "vaultd"],
    "vaultctl": ["VaultClient", "VaultProtocol", "VaultCrypto", "VaultJSON", "vaultctl"],
}


def own(names, modules):
    pattern = re.compile(r"^\$s(" + "|".join(f"{len(m)}{m}" for m in modules) + ")")
    return {n for n in names if pattern.match(n)}


def unknown(program):
    with open(f"link/{program}.order") as f:
        listed = own((line.strip() for line in f), PROGRAMS[program])
    nm = subprocess.run(["nm", "--defined-only", f".build/debug/{program}"], capture_output=True, text=True, check=True)
    defined = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    return len(listed), len(listed - defined)


record = sys.argv[1:] == ["--record"]
stale = []
for program in PROGRAMS:
    listed, missing = unknown(program)
    path = f"link/{program}.order.check"
    if record:
        with open(path, "w") as f:
            f.write(f"{missing}\n")
        print(f"{path}: {missing} of {listed} own names not in a debug build")
        continue
    made = int(open(path).read())
    limit = max(20, listed // 100)
    print(f"check-order-files: link/{program}.order: {missing} of its {listed} own names unknown (when made: {made}; limit {made + limit})")
    if missing - made > limit:
        stale.append(program)
if stale:
    sys.exit(
        f"check-order-files: stale, made for older code: {', '.join(f'link/{p}.order' for p in stale)}. Remake with\n"
        "    Benchmarks/order-files.sh && git add link/\n"
        "(about 17 minutes; it needs valgrind and glewlwyd)."
    )
