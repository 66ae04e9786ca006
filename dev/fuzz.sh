#!/usr/bin/env bash
# Fuzzes vaultd with libFuzzer: the request path (Fuzz/FuzzRequest.swift: line
# codec and dispatcher, every op, against a real broker with no network), the
# request decoder alone (Fuzz/FuzzRequestDecode.swift, which links only
# VaultProtocol: request-decode; both share Fuzz/RequestLines.swift), the
# sealed vault file (Fuzz/FuzzVaultFile.swift: the file
# parser and the record codec) and what issuers send (Fuzz/FuzzIssuer.swift:
# token, native-auth, device, discovery and JWKS answers, Retry-After and
# Cache-Control, numbers bounded). dev/test.sh runs request-decode for
# 30 s; the others only run here.
#
#   dev/fuzz.sh SECONDS              build, then run each harness SECONDS
#   dev/fuzz.sh SECONDS request      ... only the named harness(es)
#   dev/fuzz.sh --build-only [NAME]  build the harnesses only
#   dev/fuzz.sh --no-build SECONDS   run what was built
#   dev/fuzz.sh --runs N SECONDS ... stop each harness after N inputs, or SECONDS
#
# How it builds. libFuzzer brings its own main(), so a harness cannot be a
# SwiftPM product. Instead:
#  1. SwiftPM builds the library modules, with the fuzzer and address
#     sanitizers, into .build-fuzz/ (never .build/); VaultProtocol alone when
#     request-decode is the only harness asked for:
#       swift build -c release --scratch-path .build-fuzz \
#         --sanitize=fuzzer --sanitize=address --target VaultDaemon \
#         -Xswiftc -enable-testing \
#         -Xswiftc -sanitize-coverage=edge,trace-cmp,pc-table,inline-8bit-counters
#     --target builds VaultDaemon and what it depends on, and links nothing;
#     -enable-testing lets FuzzVaultFile and FuzzIssuer `@testable import`; the
#     coverage flags are needed because `-sanitize=fuzzer` alone instruments
#     only what swiftc compiles and links in one step.
#  2. swiftc compiles each harness against those modules (the C modules' maps
#     and include paths are read from SwiftPM's build manifest) and links it
#     with every object file of step 1:
#       swiftc -sanitize=fuzzer,address -parse-as-library -O -swift-version 6 \
#         -use-ld=lld -I .build-fuzz/release/Modules <C module flags> \
#         Fuzz/X.swift <objects>
#     (lld ships with the toolchain; gold links too, with a warning for every
#     local symbol of the address sanitizer.)
#
# How it runs. Each harness fuzzes a scratch copy of its corpus
# (Fuzz/corpus/NAME/, kept small in git) in .build-fuzz/corpus/NAME/, with
# -max_total_time=SECONDS, inputs up to 66,000 bytes (a line is at most
# 65,536), a 10 s limit per input, Fuzz/NAME.dict when there is one, and its
# final stats printed. A crash, a timeout or a failed property leaves the input
# in .build-fuzz/crashes/ and makes the script exit non-zero once every
# harness has run. Replay one with:
#   .build-fuzz/fuzz-NAME .build-fuzz/crashes/NAME-crash-...
# Run it niced on a shared machine: nice -n 10 dev/fuzz.sh 600
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: dev/fuzz.sh [--no-build] [--runs N] SECONDS [NAME]... | --build-only [NAME]... | --typecheck  (NAME: request request-decode vaultfile issuer)" >&2
    exit 64
}

build=yes
run=yes
typecheck=no
seconds=
runs=
harnesses=()
while [ $# -gt 0 ]; do
    case $1 in
    --build-only) run=no ;;
    --typecheck) typecheck=yes ;;
    --no-build) build=no ;;
    --runs)
        [[ ${2:-} =~ ^[0-9]+$ ]] || usage
        runs=$2
        shift
        ;;
    request | request-decode | vaultfile | issuer) harnesses+=("$1") ;;
    -h | --help) usage ;;
    *[!0-9]* | '') usage ;;
    *) seconds=$1 ;;
    esac
    shift
done
if [ "$run" = yes ] && [ "$typecheck" = no ] && [ -z "$seconds" ]; then usage; fi

scratch=.build-fuzz
[ ${#harnesses[@]} -gt 0 ] || harnesses=(request request-decode vaultfile issuer)
source_of() {
    case $1 in
    request) echo Fuzz/FuzzRequest.swift Fuzz/RequestLines.swift ;;
    request-decode) echo Fuzz/FuzzRequestDecode.swift Fuzz/RequestLines.swift ;;
    vaultfile) echo Fuzz/FuzzVaultFile.swift ;;
    issuer) echo Fuzz/FuzzIssuer.swift ;;
    esac
}
# The corpus and dictionary a harness shares with another.
base_of() {
    case $1 in
    request-decode) echo request ;;
    *) echo "$1" ;;
    esac
}

# The search paths and C module maps SwiftPM compiled TARGET with, from its
# build MANIFEST, one argument per line.
module_flags() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
args = None
with open(sys.argv[1]) as manifest:
    for line in manifest:
        if line.startswith('  "C.%s-' % sys.argv[2]) and line.rstrip().endswith('.module":'):
            for line in manifest:
                if line.strip().startswith("args: "):
                    args = json.loads(line.strip()[len("args: "):])
                    break
            break
if args is None:
    sys.exit("the build manifest has no compile step for " + sys.argv[2])
# -Xcc X, -I PATH and -IPATH (pkg-config's paths of the system libraries).
i = 0
while i < len(args):
    if args[i] in ("-Xcc", "-I") and i + 1 < len(args):
        print(args[i], args[i + 1], sep="\n")
        i += 2
    else:
        if args[i].startswith("-I"):
            print(args[i])
        i += 1
EOF
}

# The package's strict settings (Package.swift), as for every target.
# A harness is of the package, as SwiftPM's targets are: it sees what the
# modules declare `package`. SwiftPM names a root package after its folder,
# lowercased, with what is not a letter, digit or _ made _.
package_name="$(basename "$PWD" | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9_]/_/g')"
strict=(-parse-as-library -swift-version 6 -warnings-as-errors -package-name "$package_name"
    -enable-upcoming-feature ExistentialAny -enable-upcoming-feature MemberImportVisibility
    -enable-upcoming-feature InternalImportsByDefault)

if [ "$typecheck" = yes ]; then
    # Every harness against the debug build (which SwiftPM makes testable),
    # without the sanitizer build: a harness that no longer compiles fails
    # here, in seconds, rather than when someone next fuzzes.
    module_flags .build/debug.yaml VaultDaemon >.build/harness.flags
    for name in "${harnesses[@]}"; do
        swiftc -typecheck "${strict[@]}" -module-cache-path .build/ModuleCache @.build/harness.flags $(source_of "$name")
        echo "fuzz.sh: $name type-checks"
    done
    exit 0
fi

if [ "$build" = yes ]; then
    scripts/install-deps.sh
    # What libFuzzer reads. swiftc adds it to a module only when it also links
    # (as for a harness), so SwiftPM's compile steps must ask for it.
    coverage=edge,trace-cmp,pc-table,inline-8bit-counters
    target=VaultProtocol
    for name in "${harnesses[@]}"; do [ "$name" = request-decode ] || target=VaultDaemon; done
    swiftpm=(swift build -c release --scratch-path "$scratch" --sanitize=fuzzer --sanitize=address
        --target "$target" -Xswiftc -enable-testing -Xswiftc "-sanitize-coverage=$coverage")
    "${swiftpm[@]}"
    bin=$("${swiftpm[@]}" --show-bin-path)

    module_flags "$scratch/release.yaml" "$target" >"$scratch/harness.flags"
    # Every object file the build made that the manifest still names (an
    # object left behind by a file since moved or deleted would clash), but
    # of this package's own targets only those the target depends on: an
    # earlier build of another target left objects this build did not
    # remake, which may name what no longer exists. In a response file that
    # quotes them: some names have spaces.
    swift package dump-package >"$scratch/package.json"
    python3 - "$scratch/release.yaml" "$scratch/package.json" "$target" >"$scratch/harness.objects" <<'EOF'
import json, os, sys
package = {t["name"]: t for t in json.load(open(sys.argv[2]))["targets"]}
closure, todo = set(), [sys.argv[3]]
while todo:
    name = todo.pop()
    if name in closure or name not in package:
        continue
    closure.add(name)
    for dependency in package[name]["dependencies"]:
        for kind in ("byName", "target"):
            if kind in dependency:
                todo.append(dependency[kind][0])
others = set(package) - closure
objects = set()
with open(sys.argv[1]) as manifest:
    for line in manifest:
        line = line.strip()
        if line.startswith("outputs: ["):
            objects.update(o for o in json.loads(line[len("outputs: "):]) if o.endswith(".o") and os.path.exists(o))
for path in sorted(objects):
    if not any(f"/{name}.build/" in path for name in others):
        print('"%s"' % path)
EOF

    for name in "${harnesses[@]}"; do
        echo "fuzz.sh: linking $scratch/fuzz-$name"
        swiftc -sanitize=fuzzer,address -O "${strict[@]}" -use-ld=lld \
            -module-cache-path "$scratch/ModuleCache" @"$scratch/harness.flags" \
            -o "$scratch/fuzz-$name" $(source_of "$name") @"$scratch/harness.objects"
    done
fi

[ "$run" = yes ] || exit 0

# libFuzzer's own leak check scans the heap after every input whose mallocs
# and frees differ, which with Swift's runtime caches and tasks is most of
# them (it made the request harness three times slower); LeakSanitizer still
# checks the whole process once at exit, with Fuzz/lsan.supp.
export LSAN_OPTIONS="suppressions=$PWD/Fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# AddressSanitizer records a stack for every allocation; Swift's JSON coding
# allocates at every step, and the records made the decoder harness a fifth
# slower. Errors are still caught; to see where a crash's memory was
# allocated, replay it with ASAN_OPTIONS=malloc_context_size=30.
export ASAN_OPTIONS="malloc_context_size=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

status=0
summary=()
mkdir -p "$scratch/crashes"
for name in "${harnesses[@]}"; do
    corpus=$scratch/corpus/$name
    rm -rf "$corpus"
    mkdir -p "$corpus"
    cp Fuzz/corpus/"$(base_of "$name")"/* "$corpus"/
    options=(-max_total_time="$seconds" -print_final_stats=1 -max_len=66000 -timeout=10 -detect_leaks=0
        -artifact_prefix="$scratch/crashes/$name-")
    [ -f "Fuzz/$(base_of "$name").dict" ] && options+=(-dict="Fuzz/$(base_of "$name").dict")
    [ -n "$runs" ] && options+=(-runs="$runs")
    echo "fuzz.sh: fuzzing $name for $seconds s"
    started=$(date +%s)
    set +e
    "$scratch/fuzz-$name" "${options[@]}" "$corpus" 2>&1 | tee "$scratch/$name.log" | grep -v '^#[0-9]'
    result=${PIPESTATUS[0]}
    set -e
    elapsed=$(($(date +%s) - started))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$name.log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$scratch/$name.log" | tail -1)
    units=$(find "$corpus" -type f | wc -l)
    bytes=$(du -sb "$corpus" | cut -f1)
    if [ "$result" -ne 0 ]; then
        status=1
        verdict="FAILED (exit $result; see $scratch/$name.log and $scratch/crashes/)"
    else
        verdict="no crash"
    fi
    summary+=("$name: ${runs:-?} inputs in $elapsed s (${rate:-?}/s), corpus $units files / $bytes bytes: $verdict")
done

echo
printf 'fuzz.sh: %s\n' "${summary[@]}"
exit $status
