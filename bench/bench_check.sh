#!/bin/sh
# bench_check.sh — CI's correctness pass over dtrain-bench: every collective,
# a few dtypes and reductions, the forced algorithms, 4 local ranks, sizes
# 4 B .. 1 MiB, each with --check (exit status 0 only when no element of any
# rank's output is wrong). Prints TAP so meson counts each run as a test.
# Timing is printed but never asserted. `--device fake` checks every
# collective on (fake) device buffers too, staged through host memory.
#
#   bench_check.sh path/to/dtrain-bench
set -u
bench=${1:?usage: bench_check.sh path/to/dtrain-bench}
sizes="-b 4 -e 1M -f 8 -n 2 -w 1"

# One line per run: the extra flags after --ranks 4 --check and the sizes.
cases='-c allreduce -d f32 -o sum
-c allreduce -d f32 -o sum --algo ring
-c allreduce -d f32 -o sum --algo rd
-c allreduce -d bf16 -o avg
-c allreduce -d i8 -o max
-c allreduce -d i32 -o bxor
-c allreduce -d f16 -o prod
-c reduce_scatter -d f32 -o sum
-c reduce_scatter -d f64 -o avg
-c reduce_scatter -d u8 -o min
-c allgather -d f32
-c allgather -d f16
-c broadcast -d f32 -r 3
-c broadcast -d i64 --algo tree
-c broadcast -d i64 --algo chain
-c barrier
-c alltoall -d f32
-c alltoall -d u8
-c reduce -d f32 -o sum -r 2
-c reduce -d bf16 -o avg
-c all -d f32 --device fake'

total=$(printf '%s\n' "$cases" | wc -l)
echo "1..$total"
i=0
failed=0
printf '%s\n' "$cases" | {
    while IFS= read -r flags; do
        i=$((i + 1))
        # shellcheck disable=SC2086 # flags are words on purpose
        out=$("$bench" --ranks 4 --check $sizes $flags 2>&1)
        rc=$?
        if [ $rc -eq 0 ]; then
            echo "ok $i - dtrain-bench $flags"
        else
            echo "not ok $i - dtrain-bench $flags (exit $rc)"
            failed=$((failed + 1))
        fi
        printf '%s\n' "$out" | sed 's/^/# /'
    done
    [ $failed -eq 0 ]
}
