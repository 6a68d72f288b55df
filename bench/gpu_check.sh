#!/bin/sh
# gpu_check.sh — the checks that need an NVIDIA GPU, in one command:
#
#   bench/gpu_check.sh            (from anywhere; builds into build-gpu/)
#
# 1. builds with -Dcuda=enabled (-Werror);
# 2. runs the device tests on the real device: every test of the device
#    suite and the CUDA half of the staging suite (every collective x dtype
#    x reduction, worlds 1-5, device buffers bitwise equal to host buffers,
#    with real pinned memory, streams and DMA). On a GPU none may skip: a
#    skip counts as a failure here;
# 3. dtrain-bench --device cuda --check at 64 MiB, 4 ranks: staged
#    all-reduce busbw beside host buffers, medians (printed, not asserted).
#
# Prints "N passed, N failed" and exits non-zero on any failure. Without a
# GPU it says so and exits 1: it never reports success it did not check.
# (The model's CUDA backend will add its kernels and the loss-curve
# comparison here.)
set -u
cd "$(dirname "$0")/.." || exit 1
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none, or there is no driver):"
    echo "gpu_check: nothing was checked"
    exit 1
fi
dir=build-gpu
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dwerror=true -Dcuda=enabled >/dev/null || exit 1
fi
ninja -C "$dir" >/dev/null || { echo "gpu_check: the CUDA build failed"; exit 1; }

passed=0
failed=0
# tap NAME FILTER: counts the TAP lines of one suite that FILTER selects
# ("not ok" and "# SKIP" fail; ignored: tests the filter leaves out, and the
# one test that checks the no-GPU message, which has nothing to do here).
ignored='SKIP (test was skipped|a CUDA device is present)'
tap() {
    out=$("$dir/tests/test_$1" --tap=/dev/stdout --jobs=1 --filter="$2" 2>&1 \
          | grep -E '^(not )?ok' | grep -Ev "$ignored")
    printf '%s\n' "$out" | sed 's/^/  /'
    p=$(printf '%s\n' "$out" | grep -E '^ok' | grep -vc 'SKIP')
    f=$(printf '%s\n' "$out" | grep -Ec '^not ok|SKIP')
    passed=$((passed + p))
    failed=$((failed + f))
}
echo "gpu_check: device tests"
tap device '*'
tap staging 'staging/every_collective_on_cuda*'

echo "gpu_check: dtrain-bench --device cuda (64 MiB all-reduce, 4 ranks)"
if "$dir/bench/dtrain-bench" --ranks 4 --device cuda -b 64M -e 64M --check; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
