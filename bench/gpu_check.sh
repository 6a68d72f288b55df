#!/bin/sh
# gpu_check.sh — the checks that need an NVIDIA GPU, in one command:
#
#   bench/gpu_check.sh            (from anywhere; builds into build-gpu/)
#
# 1. builds with -Dcuda=enabled (-Werror); the CUDA code is the module
#    build-gpu/install/libdtrain-cuda.so, which every program below loads
#    from the build tree when it asks for a CUDA device (docs/10-cuda.md):
#    it must exist and find its CUDA libraries, and minigpt must not link them;
# 2. runs the device tests on the real device: the CUDA module's suite (with
#    a driver it must load the build tree's module), every test of the device
#    suite and the CUDA half of the staging suite (every collective x dtype
#    x reduction, worlds 1-5, device buffers bitwise equal to host buffers,
#    with real pinned memory, streams and DMA). On a GPU none may skip: a
#    skip counts as a failure here;
# 3. dtrain-bench --device cuda --check at 64 MiB, 4 ranks: staged
#    all-reduce busbw beside host buffers, medians (printed, not asserted).
#
# Prints "N passed, N failed" and exits non-zero on any failure. Without a
# GPU it says so and exits 1: it never reports success it did not check.
# 4.-5. the model's CUDA backend: its kernel suite and the golden fixture on
# the device, and the seed preset's loss curve on GPU vs CPU (see its
# section below).
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
echo "gpu_check: the CUDA module"
module=$dir/install/libdtrain-cuda.so
if [ ! -f "$module" ]; then
    echo "  $module was not built"; failed=$((failed + 1))
elif ldd "$module" | grep -q 'not found'; then
    ldd "$module" | grep 'not found' | sed 's/^/  /'; failed=$((failed + 1))
elif ldd "$dir/train/minigpt" | grep -Eq 'libcudart|libcublas'; then
    echo "  minigpt links CUDA itself"; failed=$((failed + 1))
else
    echo "  ok: $module"; passed=$((passed + 1))
fi
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
tap cuda_module '*'
tap device '*'
tap staging 'staging/every_collective_on_cuda*'

echo "gpu_check: dtrain-bench --device cuda (64 MiB all-reduce, 4 ranks)"
if "$dir/bench/dtrain-bench" --ranks 4 --device cuda -b 64M -e 64M --check; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
fi

# ---- the model's CUDA backend (model/backend_cuda.cu) --------------------------
# 4. the kernel suite on the device: with DT_KERNEL_BACKEND=cuda,
#    tests/test_cuda_kernels runs every kernel, forward and backward, and the
#    PyTorch golden fixture (gradients, ten AdamW losses) through cudaMalloc'd
#    buffers, against the CPU reference; then minigpt --device cuda as a
#    program (tests/test_minigpt_device: it must train, not merely fail well);
# 5. the seed preset trained on the GPU and on the CPU, one process each with
#    --grad-accum 4 (the 4-rank seed's global batch), per-step losses from
#    --metrics compared: each within 1e-4 relative; the GPU run's step-10
#    checkpoint, saved through host copies of the device state, must reload
#    byte-equal (RESUME VERIFIED). With 2 or more GPUs, the same run as one rank per
#    GPU under dtrain-launch (DDP and ZeRO-1 on staged device gradients)
#    against the same CPU curve.
echo "gpu_check: model kernels on the device (DT_KERNEL_BACKEND=cuda)"
DT_KERNEL_BACKEND=cuda
export DT_KERNEL_BACKEND
tap cuda_kernels '*'
unset DT_KERNEL_BACKEND
tap minigpt_device 'minigpt_device/cuda_alone*'

# curve NAME ARGS...: trains the seed preset, writing its metrics to $tmp/NAME
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
curve() {
    name=$1
    shift
    "$@" --preset seed --sample 0 --metrics "$tmp/$name" \
        >"$tmp/$name.log" 2>&1 || { tail -5 "$tmp/$name.log"; return 1; }
    grep -q 'RESUME VERIFIED' "$tmp/$name.log" ||
        { echo "  $name: the checkpoint was not verified"; return 1; }
}
# same_curve A B: every step's loss of A within 1e-4 relative of B's
same_curve() {
    for f in "$1" "$2"; do
        sed -n 's/.*"event":"step","step":\([0-9]*\),"loss":\([-0-9.eE+]*\).*/\1 \2/p' \
            "$tmp/$f" >"$tmp/$f.loss"
    done
    awk 'NR == FNR { ref[$1] = $2; next }
         { n++; d = $2 - ref[$1]; if (d < 0) d = -d; r = ref[$1] < 0 ? -ref[$1] : ref[$1]
           if (!($1 in ref) || d > 1e-4 * r) { bad++; printf "  step %d: %.7g vs %.7g\n", $1, $2, ref[$1] }
           if (d / r > worst) worst = d / r }
         END { printf "  %d steps, worst relative difference %.2g\n", n, worst
               exit (n < 20 || bad) ? 1 : 0 }' "$tmp/$2.loss" "$tmp/$1.loss"
}
count_result() {
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
echo "gpu_check: seed preset, loss curves GPU vs CPU (each step within 1e-4 relative)"
mg="$dir/train/minigpt"
if curve cpu "$mg" --device cpu --grad-accum 4 &&
   curve gpu "$mg" --device cuda --grad-accum 4; then
    count_result same_curve gpu cpu
else
    echo "  a training run failed"; failed=$((failed + 1))
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -ge 2 ]; then
    n=$([ "$gpus" -ge 4 ] && echo 4 || echo 2)
    for mode in ddp zero1; do
        echo "gpu_check: $n ranks, one GPU each, --parallel $mode, against the CPU curve"
        if curve "gpu$n$mode" "$dir/launcher/dtrain-launch" -n "$n" "$mg" --device cuda \
               --grad-accum $((4 / n)) --parallel "$mode"; then
            count_result same_curve "gpu$n$mode" cpu
        else
            echo "  the launched run failed"; failed=$((failed + 1))
        fi
    done
fi
# ---- end of the model's section ----------------------------------------------------

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
