#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine: installs what it needs,
# builds everything (warnings are errors), runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
swift build --build-tests -Xswiftc -warnings-as-errors
swift test --skip-build
