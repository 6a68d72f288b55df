#!/bin/sh
# compare_builds.sh — one collective's time in two builds of dtrain-bench,
# side by side: the runs alternate A, B, A, B, ... R times, so a shared
# machine's drift hits both builds alike, and the medians over the repeats
# are printed with their ratio B/A per size. Made to price a change (e.g. the
# root agreement of rooted ops: A = the build before it, B = after).
#
# usage: bench/compare_builds.sh BENCH_A BENCH_B REPEATS [dtrain-bench flags]
#   e.g. bench/compare_builds.sh old/bench/dtrain-bench build/bench/dtrain-bench 7 \
#            --ranks 4 -c broadcast -b 4 -e 1M -f 262144 -n 200 -w 20
set -eu
a=${1:?usage: compare_builds.sh BENCH_A BENCH_B REPEATS [flags]}
b=${2:?}; repeats=${3:?}; shift 3
tmp=$(mktemp -d /tmp/dtrain-compare-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
i=0
while [ "$i" -lt "$repeats" ]; do
    # rows: size time_us, one file per build
    "$a" "$@" | awk '!/^#/ {print $1, $5}' >>"$tmp/a"
    "$b" "$@" | awk '!/^#/ {print $1, $5}' >>"$tmp/b"
    i=$((i + 1))
done
median() { # size file -> median time_us of that size
    awk -v s="$1" '$1 == s {print $2}' "$2" | sort -g |
        awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
printf '# %s, %s repeats, medians\n# %10s %12s %12s %8s\n' "$*" "$repeats" size A_us B_us B/A
for size in $(awk '{print $1}' "$tmp/a" | sort -gu); do
    ma=$(median "$size" "$tmp/a"); mb=$(median "$size" "$tmp/b")
    awk -v s="$size" -v a="$ma" -v b="$mb" 'BEGIN {printf "%12d %12.1f %12.1f %8.2f\n", s, a, b, b / a}'
done
