#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: installs what it needs,
# builds everything (warnings are errors), runs every test, then fuzzes the
# request decoder for 30 seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

dev/install-test-deps.sh
# Each target declares exactly what it imports, and builds with the strict settings.
dev/check-imports.py
swift build --build-tests -Xswiftc -warnings-as-errors
# Every fuzz harness compiles against this build (only request-decode is
# fuzzed below; the others take a sanitizer build of the whole daemon).
dev/fuzz.sh --typecheck
# The vault fsyncs every write; right after a cold build those fsyncs queue
# behind gigabytes of build output. Flush that first so tests time the vault.
sync
# One test at a time: the suite measures what vaultd does under load (clients
# that never read, issuers that hang, memory mappings, RSS), and run side by
# side on two cores those tests measured each other instead; one after
# another the whole suite takes about 3.5 minutes.
swift test --skip-build --no-parallel
# The Python client companions copy, against hostile replies from a fake vaultd.
python3 -B -m unittest clients/test_tokenvault.py
# Every line a local client sends reaches the request decoder first; a crash
# there ends vaultd for everyone. 30 s of libFuzzer (about 45 s with its
# sanitizer build of VaultProtocol alone), from Fuzz/corpus/request/, which
# keeps every input that once crashed it. dev/fuzz.sh says how to run more.
dev/fuzz.sh 30 request-decode
