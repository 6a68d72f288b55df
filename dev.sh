#!/usr/bin/env bash
# dev.sh — set up, build and run dtrain on a Debian machine (run as root, or
# with the packages already installed).
#
#   ./dev.sh demo [ARGS]     install what is missing, build, run the main job:
#                            dtrain-launch -n 4 ./minigpt [ARGS]
#                            (demo --help: minigpt's flags, printed once)
#   ./dev.sh test            install what is missing, build, run every test suite
#   ./dev.sh test-sanitize   the same tests in an AddressSanitizer+UBSan build
#   ./dev.sh test-clang      the same tests built by clang instead of gcc
#   ./dev.sh test-tsan       the threaded programs (suite tsan) under
#                            ThreadSanitizer; any report fails it
#   ./dev.sh fuzz [SECONDS]  every libFuzzer harness (tests/fuzz/), SECONDS
#                            each (default 60); any finding fails it
#   ./dev.sh test-torch      PyTorch 1.13's TCPStore and FileStore beside dtrain's store,
#                            an `export --names seed` in the seed's MiniGPT, and
#                            dtrain ranks in torch gloo groups (tests/torch_gloo.py),
#                            torch on backend "dtrain" against "gloo", ops and DDP
#                            (tests/torch_backend.py, tests/torch_ddp.py,
#                            tests/torch_work.py)
#                            (installs Debian's python3-torch and libtorch-dev, large)
#   ./dev.sh test-netns      2 hosts made of network namespaces: a job across
#                            them, through rate-limited links, and a link cut
#                            (needs root; tests/netns/multihost.sh)
#   ./dev.sh format-check    every C, CUDA and C++ file as .clang-format says
#                            (clang-format 14); prints the first differences
#   ./dev.sh test-slurm      a one-node Slurm cluster: srun and sbatch run
#                            minigpt (needs root; tests/slurm/slurm_minigpt.sh)
#   ./dev.sh docs-check      run the commands the docs quote and compare their
#                            output; every path a doc names exists; the docs
#                            read as CommonMark (python3-markdown-it) renders them
#   ./dev.sh figures         regenerate docs/figures/*.png from small real runs
#
#   ./dev.sh --help          this text
#
# Builds go to build/ (and build-sanitize/, build-clang/, build-tsan/,
# build-fuzz/). Warnings are errors.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES="gcc clang libclang-rt-dev pkg-config meson ninja-build libuv1-dev libsodium-dev
          libssl-dev libjansson-dev libcriterion-dev libopenblas-dev libomp-dev python3
          openmpi-bin"

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
    if [ -f "$dir/install/libdtrain-cuda.so" ]; then
        echo "dev.sh: CUDA module built, $dir/install/libdtrain-cuda.so (tests that need a GPU skip without one)"
    else
        echo "dev.sh: CPU-only build (no CUDA toolkit found; see README, CUDA)"
    fi
}

# Runs the suites in DIR (all, or those the meson test ARGS name) and prints
# "N passed, N failed, N skipped" counted over every TAP test (a suite that
# crashed without reporting counts as a failure; a test that needs hardware
# this machine lacks, such as a GPU, reports "# SKIP" in TAP or exits 77,
# and is counted as skipped, never passed). With TSAN_REPORTS set to a
# folder, every ThreadSanitizer report file in it is shown and counts as a
# failure too (a rank killed on purpose still leaves its report there).
run_tests() {
    local dir=$1 rc=0
    shift
    rm -f "$dir"/meson-logs/testlog*.json # a --wrapper run names its own
    meson test -C "$dir" --num-processes 2 --print-errorlogs "$@" || rc=$?
    python3 - "$dir/meson-logs" "${TSAN_REPORTS:-}" <<'PY' || rc=1
import glob, json, os, re, sys
passed = failed = skipped = 0
logs = glob.glob(os.path.join(sys.argv[1], "testlog*.json"))
for line in open(logs[0]) if logs else ['{"result": "no test log", "stdout": ""}']:
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
for report in sorted(glob.glob(os.path.join(sys.argv[2], "*"))) if sys.argv[2] else []:
    print(open(report, errors="replace").read())
    failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
PY
    return $rc
}

# The comment block at the top of this file, without its '#'s.
usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; }

case "${1:-}" in
demo)
    install_missing
    build build
    shift
    cd build/train
    for arg in "$@"; do # help is one page, not one per rank
        case "$arg" in -h | --help) exec ./minigpt --help ;; esac
    done
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
test-clang)
    install_missing
    CC=clang build build-clang
    run_tests build-clang
    ;;
test-tsan)
    install_missing
    build build-tsan -Db_sanitize=thread
    TSAN_REPORTS=$(mktemp -d /tmp/dtrain-tsan-reports-XXXXXX)
    export TSAN_REPORTS TSAN_OPTIONS="log_path=$TSAN_REPORTS/report"
    rc=0
    # without address randomisation: TSan's fixed memory layout cannot
    # start under the larger ASLR of some kernels (vm.mmap_rnd_bits = 32)
    run_tests build-tsan --suite tsan --wrapper "setarch $(uname -m) -R" || rc=$?
    rm -rf "$TSAN_REPORTS"
    exit $rc
    ;;
fuzz)
    install_missing
    CC=clang build build-fuzz -Db_sanitize=address,undefined -Db_lundef=false \
        -Dfuzz=true -Dtests=disabled -Dcuda=disabled # libFuzzer links with clang, not nvcc
    exec tests/fuzz/run_fuzzers.sh build-fuzz "${2:-60}"
    ;;
test-netns)
    PACKAGES="$PACKAGES iproute2 nftables"
    install_missing
    build build
    exec bash tests/netns/multihost.sh build
    ;;
format-check)
    PACKAGES="$PACKAGES clang-format"
    install_missing
    rc=0
    git ls-files '*.c' '*.h' '*.cu' '*.cc' | xargs clang-format --dry-run --Werror \
        2>"${TMPDIR:-/tmp}/dtrain-format.txt" || rc=1
    head -n 40 "${TMPDIR:-/tmp}/dtrain-format.txt"
    rm -f "${TMPDIR:-/tmp}/dtrain-format.txt"
    [ $rc = 0 ] && echo "1 passed, 0 failed" ||
        echo "0 passed, 1 failed (run: clang-format -i FILE)"
    exit $rc
    ;;
test-slurm)
    PACKAGES="$PACKAGES slurm-wlm munge"
    install_missing
    build build
    exec bash tests/slurm/slurm_minigpt.sh build
    ;;
docs-check)
    PACKAGES="$PACKAGES python3-markdown-it" # the docs parsed as CommonMark, as GitHub does
    install_missing
    build build >/dev/null
    exec /usr/bin/python3 docs/tools/check_docs.py --build build
    ;;
figures)
    PACKAGES="$PACKAGES python3-matplotlib"
    install_missing
    build build >/dev/null
    exec bash docs/figures/make_figures.sh build
    ;;
test-torch)
    PACKAGES="$PACKAGES python3-torch libtorch-dev python3-dev pybind11-dev"
    install_missing
    # a build/ configured before those packages were here skipped the
    # dtrain_torch module (meson keeps its answers): configure it afresh
    if [ -f build/build.ninja ] && ! ls build/torch_backend/dtrain_torch*.so >/dev/null 2>&1; then
        meson setup --wipe build >/dev/null
    fi
    build build
    rc=0
    out=$(/usr/bin/python3 tests/torch_tcpstore.py build/launcher/dtrain-launch 2>&1) || rc=$?
    failed=$((rc != 0))
    rc2=0
    out2=$(/usr/bin/python3 tests/torch_filestore.py build/tests/store_cli 2>&1) || rc2=$?
    failed=$((failed + (rc2 != 0)))
    # dtrain ranks in torch gloo groups: one ok/not ok line per case
    rc3=0
    out3=$(/usr/bin/python3 tests/torch_gloo.py build/tests/gloo_peer 2>&1) || rc3=$?
    notok=$(printf '%s\n' "$out3" | grep -c '^not ok ' || true)
    failed=$((failed + (notok > 0 ? notok : (rc3 != 0))))
    out=$(printf '%s\n%s\n%s' "$out" "$out2" "$out3")
    [ $rc2 = 0 ] || rc=$rc2
    # a checkpoint exported with --names seed, loaded strictly into the seed
    # curriculum's PyTorch MiniGPT, whose logits match dtrain's
    rc4=0
    out4=$(/usr/bin/python3 tests/torch_seed_export.py build/train/minigpt \
        build/checkpoint/dtrain-ckpt build/tests/ckpt_logits 2>&1) || rc4=$?
    failed=$((failed + (rc4 != 0)))
    out=$(printf '%s\n%s' "$out" "$out4")
    [ $rc4 = 0 ] || rc=$rc4
    # torch.distributed's "dtrain" backend against "gloo": one ok/not ok
    # line per op and world, then the failures (tests/torch_backend.py);
    # torch DDP (AdamW, ZeroRedundancyOptimizer) training the 865k MiniGPT
    # on both (tests/torch_ddp.py); the Work objects' timeouts and their
    # life past their group (tests/torch_work.py)
    rc5=0
    if ls build/torch_backend/dtrain_torch*.so >/dev/null 2>&1; then
        out5=$(/usr/bin/python3 tests/torch_backend.py build/torch_backend \
            build/launcher/dtrain-launch 2>&1) || rc5=$?
        out6=$(/usr/bin/python3 tests/torch_ddp.py build/torch_backend 2>&1) || rc5=$?
        out7=$(/usr/bin/python3 tests/torch_work.py build/torch_backend 2>&1) || rc5=$?
        out5=$(printf '%s\n%s\n%s' "$out5" "$out6" "$out7")
    else
        out5="not ok - the dtrain_torch module was not built (libtorch-dev missing?)"
        rc5=1
    fi
    notok5=$(printf '%s\n' "$out5" | grep -c '^not ok ' || true)
    failed=$((failed + (notok5 > 0 ? notok5 : (rc5 != 0))))
    out=$(printf '%s\n%s' "$out" "$out5")
    [ $rc5 = 0 ] || rc=$rc5
    [ $rc3 = 0 ] || rc=$rc3
    printf '%s\n' "$out"
    echo "$(printf '%s\n' "$out" | grep -c '^ok ') passed, $failed failed"
    exit $rc
    ;;
-h | --help | help)
    usage
    ;;
'')
    usage >&2
    exit 2
    ;;
*)
    echo "dev.sh: unknown command '$1'" >&2
    echo "see './dev.sh --help'" >&2
    exit 2
    ;;
esac
