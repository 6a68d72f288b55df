#!/bin/sh
# run_fuzzers.sh — runs every libFuzzer harness of a -Dfuzz=true build for a
# bounded time, each on a fresh copy of its committed seed corpus
# (corpus/NAME/), and prints TAP: one line per harness with its executions
# and coverage, then "N passed, N failed". A crash, sanitizer report, leak,
# timeout (an input running over 30 s) or out-of-memory fails the harness;
# its log and the input that did it are kept under BUILD/fuzz/, and
# `BUILD/tests/fuzz/NAME FILE` replays it.
#
#   run_fuzzers.sh BUILD-DIR SECONDS-EACH [NAME...]
set -u
build=$(cd "$1" && pwd)
seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
out=$build/fuzz
rm -rf "$out"
mkdir -p "$out"
names=${*:-$(ls "$here/corpus")}
set -- $names
echo "1..$#"
i=0 failed=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
for name in $names; do
    i=$((i + 1))
    work=$out/$name.corpus
    log=$out/$name.log
    mkdir -p "$work"
    "$build/tests/fuzz/$name" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
        -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$out/$name-" \
        "$work" "$here/corpus/$name" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    stats=$(grep -E '^#[0-9]+' "$log" | tail -n 1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+')
    summary="$name: ${runs:-?} runs in ${seconds} s, ${stats:-no coverage line}"
    if [ $rc -eq 0 ]; then
        echo "ok $i - $summary"
    else
        echo "not ok $i - $summary (exit $rc; log $log)"
        failed=$((failed + 1))
        grep -E 'ERROR|SUMMARY|Test unit written|runtime error|fuzz_' "$log" | head -n 20 |
            sed 's/^/# /'
    fi
done
echo "$((i - failed)) passed, $failed failed"
[ $failed -eq 0 ]
