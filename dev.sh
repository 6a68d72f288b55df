#!/usr/bin/env bash
# dev.sh — set up, build and run dtrain on a Debian machine (run as root, or
# with the packages already installed).
#
#   ./dev.sh demo [ARGS]     install what is missing, build, run the main job:
#                            dtrain-launch -n 4 ./minigpt [ARGS]
#   ./dev.sh test            install what is missing, build, run every test suite
#   ./dev.sh test-sanitize   the same tests in an AddressSanitizer+UBSan build
#
# Builds go to build/ (and build-sanitize/). Warnings are errors.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES="gcc pkg-config meson ninja-build libuv1-dev libsodium-dev libjansson-dev
          libcriterion-dev libopenblas-dev python3 openmpi-bin"

install_missing() {
    local missing=()
    for p in $PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "dev.sh: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

build() { # build DIR [meson options...]
    local dir=$1; shift
    [ -f "$dir/build.ninja" ] || meson setup "$dir" -Dwerror=true "$@" >/dev/null
    ninja -C "$dir"
    if grep -q 'device_cuda\.c' "$dir/build.ninja"; then
        echo "dev.sh: CUDA parts built (tests that need a GPU skip without one)"
    else
        echo "dev.sh: CPU-only build (no CUDA toolkit found; see README, CUDA)"
    fi
}

# Runs the suites in DIR and prints "N passed, N failed, N skipped" counted
# over every Criterion test (a suite that crashed without reporting counts as
# a failure; a test that needs hardware this machine lacks, such as a GPU,
# reports "# SKIP" in TAP or exits 77, and is counted as skipped, never passed).
run_tests() {
    local dir=$1 rc=0
    meson test -C "$dir" --num-processes 2 --print-errorlogs || rc=$?
    python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, re, sys
passed = failed = skipped = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = t.get("stdout", "")
    skip = len(re.findall(r"^ok\b.*#\s*SKIP", out, re.M | re.I))
    ok = len(re.findall(r"^ok\b", out, re.M)) - skip
    bad = len(re.findall(r"^not ok\b", out, re.M))
    if t["result"] == "SKIP" and ok + bad + skip == 0:
        skip = 1
    elif t["result"] not in ("OK", "EXPECTEDFAIL", "SKIP") and bad == 0:
        bad = 1
    passed += ok
    failed += bad
    skipped += skip
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
    return $rc
}

case "${1:-}" in
demo)
    install_missing
    build build
    shift
    cd build/train
    exec ../launcher/dtrain-launch -n 4 ./minigpt "$@"
    ;;
test)
    install_missing
    build build
    run_tests build
    ;;
test-sanitize)
    install_missing
    build build-sanitize -Db_sanitize=address,undefined -Db_lundef=false
    export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
    export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    run_tests build-sanitize
    ;;
*)
    sed -n '2,10p' "$0"
    exit 2
    ;;
esac
