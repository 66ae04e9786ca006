#!/usr/bin/env python3
"""Where a running vaultd's resident memory is, by ELF section of its binary.

    python3 Benchmarks/rss-sections.py PID [BINARY]

Reads /proc/PID/maps and /proc/PID/pagemap (the "present" bit, which the
process's owner may read) and counts the resident 4 KiB pages of each
mapping of BINARY (default: /proc/PID/exe) by the section they fall in
(`readelf -S`), then the other mappings by file. A page that holds the end
of one section and the start of the next counts for the first.
"""
import collections
import os
import re
import struct
import subprocess
import sys

pid = sys.argv[1]
binary = sys.argv[2] if len(sys.argv) > 2 else os.readlink(f"/proc/{pid}/exe")

sections = []
for line in subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout.splitlines():
    m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
    if m and int(m.group(2), 16):
        start = int(m.group(2), 16)
        sections.append((start, start + int(m.group(4), 16), m.group(1)))
pie = b"DYN" in subprocess.run(["readelf", "-hW", binary], capture_output=True, check=True).stdout.split(b"Type:")[1][:40]

pagemap = open(f"/proc/{pid}/pagemap", "rb")


def resident(start, end):
    for page in range(start, end, 4096):
        pagemap.seek(page // 4096 * 8)
        entry = pagemap.read(8)
        if len(entry) == 8 and struct.unpack("Q", entry)[0] >> 63 & 1:
            yield page


own, others = [], collections.Counter()
for line in open(f"/proc/{pid}/maps"):
    fields = line.split()
    start, end = (int(x, 16) for x in fields[0].split("-"))
    name = fields[5] if len(fields) >= 6 else "[anonymous]"
    if name == binary:
        own.append((start, end, int(fields[2], 16)))
    elif name != "[vsyscall]":
        others[os.path.basename(name)] += 4 * sum(1 for _ in resident(start, end))

base = own[0][0] - own[0][2] if pie else 0
by_section = collections.Counter()
for start, end, _ in own:
    for page in resident(start, end):
        address = page - base
        name = next((n for s, e, n in sections if s <= address + 4095 and address < e), "(between sections)")
        by_section[name] += 4

print(f"{binary}: {sum(by_section.values())} KiB resident")
for name, kib in by_section.most_common(15):
    print(f"  {kib:8d} KiB  {name}")
print(f"other mappings: {sum(others.values())} KiB")
for name, kib in others.most_common(10):
    print(f"  {kib:8d} KiB  {name}")
