#!/bin/sh
# peak_rss.sh — the peak resident set of every rank, DDP against ZeRO-3,
# on issue 34's 29M-parameter model (V 4096, C 512, H 8, L 8, T 32) on 4
# ranks, two steps, through dtrain-launch.
#
# Model states alone say ZeRO-3 needs 16Ψ/N + two units + buckets where
# DDP needs 16Ψ; the peak resident set says whether some phase of the run
# (start-up, the replica check, evaluation, a checkpoint) holds more. The
# figure is the kernel's (getrusage's ru_maxrss, the "peak RSS" column of
# minigpt's memory table, printed after the final evaluation), one per
# rank; the ratio is ZeRO-3's largest over DDP's largest. Extra flags go to
# both runs (e.g. --data random, which skips the task's 200-prompt
# accuracy: token-by-token generation, each forward under ZeRO-3 an
# all-gather of the model).
#
# usage: bench/peak_rss.sh [BUILD_DIR] [minigpt flags...]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
launch=$build/launcher/dtrain-launch; minigpt=$build/train/minigpt
[ -x "$minigpt" ] || { echo "no $minigpt: build first (ninja -C $build)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/dtrain-peak-rss-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
model="-V 4096 -C 512 -H 8 -L 8 -T 32 -B 1 --steps 2 --eval-every 0 --sample 0"

echo "command: $launch -n 4 $minigpt $model [--parallel zero3] $*"
for mode in ddp zero3; do
    DT_TIMEOUT=${DT_TIMEOUT:-600} "$launch" -n 4 "$minigpt" $model --parallel "$mode" "$@" \
        >"$tmp/$mode.out" 2>&1 || { tail -n 20 "$tmp/$mode.out" >&2; exit 1; }
    # the memory table's rows: "[0]  RANK ... | HEAP RSS"
    sed -n 's/^\[0\]  *\([0-3]\) .*| .* \([0-9][0-9]*\)$/\1 \2/p' "$tmp/$mode.out" >"$tmp/$mode.rss"
    printf '%-5s peak RSS per rank (MB):' "$mode"
    while read -r rank rss; do printf ' %d:%.0f' "$rank" "$(echo "$rss / 1000000" | bc -l)"; done \
        <"$tmp/$mode.rss"
    echo
done
max() { sort -k2 -n "$1" | tail -n 1 | cut -d' ' -f2; }
echo "ZeRO-3 / DDP, largest rank each: $(echo "scale=3; $(max "$tmp/zero3.rss") / $(max "$tmp/ddp.rss")" | bc)"
