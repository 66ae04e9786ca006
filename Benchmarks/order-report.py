#!/usr/bin/env python3
"""Reports how much of link/*.order still names the code it lays out.

Benchmarks/order-files.sh writes link/vaultd.order and link/vaultctl.order
from profiles of a release build (about 17 minutes); scripts/release.sh
links with them. A list made for older code still links, and costs resident
memory instead (the order of 7cbdc0f cost an idle vaultd 1.2-1.4 MB,
BENCHMARKS.md): vaultbench's idle-RSS row, with its goal, is what guards
that memory. This report says why that row moved. It never fails: a rename
must not stop the test suite.

For each program, it reads the names of tokenvault's own functions in its
list (the modules the program links, from `swift package dump-package`) and
counts those the release build given no longer defines.

    Benchmarks/order-report.py [BIN]   BIN: the release build's folder
                                       (default: scripts/release.sh --bin-path)
"""
import json
import re
import subprocess
import sys

PROGRAMS = ["vaultd", "vaultctl"]


def modules_of(package, product):
    """The package's own Swift modules an executable links, itself included."""
    targets = {t["name"]: t for t in package["targets"]}
    seen, todo = set(), [product]
    while todo:
        name = todo.pop()
        if name in seen or name not in targets:
            continue
        seen.add(name)
        for dependency in targets[name].get("dependencies", []):
            for kind in ("byName", "target"):
                if kind in dependency:
                    todo.append(dependency[kind][0])
    return sorted(n for n in seen if targets[n]["type"] in ("regular", "executable"))


def own(names, modules):
    pattern = re.compile(r"^\$s(" + "|".join(f"{len(m)}{re.escape(m)}" for m in modules) + ")")
    return {n for n in names if pattern.match(n)}


def main():
    if len(sys.argv) > 1:
        bin_path = sys.argv[1]
    else:
        bin_path = subprocess.run(["scripts/release.sh", "--bin-path"], capture_output=True, text=True, check=True).stdout.strip()
    package = json.loads(subprocess.run(["swift", "package", "dump-package"], capture_output=True, text=True, check=True).stdout)
    print("## Link order files against this build\n")
    print("| list | modules | own names listed | no longer defined | share |\n|---|---|---|---|---|")
    for program in PROGRAMS:
        modules = modules_of(package, program)
        with open(f"link/{program}.order") as f:
            listed = own((line.strip() for line in f), modules)
        try:
            nm = subprocess.run(["nm", "--defined-only", f"{bin_path}/{program}"], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError) as error:
            print(f"| link/{program}.order | {', '.join(modules)} | {len(listed)} | no {bin_path}/{program} ({error}) | – |")
            continue
        defined = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
        missing = len(listed - defined)
        share = f"{100 * missing / len(listed):.1f} %" if listed else "–"
        print(f"| link/{program}.order | {', '.join(modules)} | {len(listed)} | {missing} | {share} |")
    print(
        "\nNames no longer defined were renamed, moved or removed since the list was made; their code\n"
        "now lies outside the hot block, and the idle-RSS rows below show what that costs. Remake with\n"
        "    Benchmarks/order-files.sh && git add link/\n"
        "(about 17 minutes; it needs valgrind and glewlwyd).\n"
    )


main()
