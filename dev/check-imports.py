#!/usr/bin/env python3
"""Checks that each target's declared dependencies are exactly what it imports.

For every Swift target in Package.swift (tests, the benchmark and the test
issuer included) it lists the modules the target's files `import` and the
modules it declares (a product counts by its module name; every product here
is named after its module), and reports both kinds of mismatch, and any Swift
target built without the package's strict settings:
  - imported but not declared (it builds only through another target's
    dependency, and breaks when that one changes);
  - declared but never imported (a dependency for nothing).
The Fuzz/ harnesses are no SwiftPM target: dev/fuzz.sh builds them against
VaultDaemon and everything it depends on, so that closure is what they may
import (and need not all be imported).

    dev/check-imports.py     exit 0 when every target matches, 1 otherwise
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Modules of the toolchain and the OS: never declared.
SYSTEM = {
    "Foundation", "FoundationEssentials", "FoundationNetworking", "Glibc", "Musl", "Darwin",
    "Dispatch", "Synchronization", "Testing", "XCTest", "_Concurrency", "os",
}
IMPORT = re.compile(
    r"^(?:@[A-Za-z_]+(?:\([^)]*\))?\s+)*(?:(?:public|package|internal|private|fileprivate)\s+)?"
    r"import\s+(?:(?:struct|class|enum|func|protocol|typealias|var|let)\s+)?([A-Za-z_][A-Za-z0-9_]*)",
    re.MULTILINE,
)
KINDS = {"target": "Sources", "executableTarget": "Sources", "testTarget": "Tests", "systemLibrary": "Sources"}


def block(text, start):
    """The text from `start` (an opening parenthesis or bracket) to its match."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in "([":
            depth += 1
        elif text[index] in ")]":
            depth -= 1
            if depth == 0:
                return text[start : index + 1]
    raise SystemExit("Package.swift: unbalanced brackets")


def targets(manifest):
    found = {}
    for match in re.finditer(r"\.(target|executableTarget|testTarget|systemLibrary)\(", manifest):
        body = block(manifest, match.end() - 1)
        name = re.search(r'name:\s*"([^"]+)"', body).group(1)
        path = re.search(r'path:\s*"([^"]+)"', body)
        dependencies = set()
        listed = re.search(r"dependencies:\s*\[", body)
        if listed:
            entries = block(body, listed.end() - 1)
            dependencies |= set(re.findall(r'\.product\(name:\s*"([^"]+)"', entries))
            dependencies |= set(re.findall(r'"([^"]+)"', re.sub(r"\.product\([^)]*\)", "", entries)))
        found[name] = {
            "kind": match.group(1),
            "path": path.group(1) if path else KINDS[match.group(1)] + "/" + name,
            "dependencies": dependencies,
            "strict": re.search(r"swiftSettings:\s*strict\b", body) is not None,
        }
    return found


def imports(folder):
    modules = set()
    for directory, _, files in os.walk(os.path.join(ROOT, folder)):
        for file in files:
            if file.endswith(".swift"):
                with open(os.path.join(directory, file), encoding="utf-8") as source:
                    # Column 0 only: indented `import x` lines are Python in test strings.
                    modules |= set(IMPORT.findall(source.read()))
    return modules - SYSTEM


def closure(all_targets, name):
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in all_targets:
            todo.extend(all_targets[current]["dependencies"])
    return seen


def main():
    with open(os.path.join(ROOT, "Package.swift"), encoding="utf-8") as manifest:
        all_targets = targets(manifest.read())
    problems = 0
    for name, target in sorted(all_targets.items()):
        if target["kind"] == "systemLibrary":
            continue
        used = imports(target["path"])
        swift = any(f.endswith(".swift") for _, _, files in os.walk(os.path.join(ROOT, target["path"])) for f in files)
        if swift and not target["strict"]:
            print(f"{name}: builds without the strict settings (swiftSettings: strict)")
            problems += 1
        declared = target["dependencies"]
        for module in sorted(used - declared - {name}):
            print(f"{name}: imports {module} without declaring it")
            problems += 1
        for module in sorted(declared - used):
            print(f"{name}: declares {module} but never imports it")
            problems += 1
    fuzz = imports("Fuzz")
    allowed = closure(all_targets, "VaultDaemon")
    for module in sorted(fuzz - allowed):
        print(f"Fuzz: imports {module}, which dev/fuzz.sh does not build (not in VaultDaemon's dependencies)")
        problems += 1
    if problems == 0:
        print(f"check-imports: {len(all_targets)} targets and Fuzz/ import exactly what they declare")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
