#!/usr/bin/env bash
# make_figures.sh — the docs' pictures, drawn from small real runs of dtrain.
#
#   ./dev.sh figures                         (installs python3-matplotlib, builds, runs this)
#   bash docs/figures/make_figures.sh [BUILD]   BUILD defaults to build/
#
# Every figure reads dtrain's own output: minigpt's --metrics JSONL, its
# memory and bubble tables, its --trace Chrome trace, dtrain-bench's rows and
# checkpoint manifests. The runs are kept small for a 2-core machine (two to
# three minutes in all, most of it the bubble table); make_figures.py turns them into docs/figures/*.png.
# Timings come from whatever machine runs this: on a busy or small machine
# the measured bubble and bandwidth are that machine's, and the figures say
# what they were measured on.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=$(cd "${1:-build}" && pwd)
LAUNCH=$BUILD/launcher/dtrain-launch
MINIGPT=$BUILD/train/minigpt
RUNS=$(mktemp -d /tmp/dtrain-figures-XXXXXX)
[ -n "${KEEP_RUNS:-}" ] || trap 'rm -rf "$RUNS"' EXIT
quiet() { "$@" >"$RUNS/last.log" 2>&1 || { cat "$RUNS/last.log"; exit 1; }; }

echo "figures: training curves (2 ranks, DDP, 600 steps)"
quiet "$LAUNCH" -n 2 "$MINIGPT" --metrics "$RUNS/curves.jsonl" --eval-every 25 --log-every 600

echo "figures: the same run with --precision bf16"
quiet "$LAUNCH" -n 2 "$MINIGPT" --metrics "$RUNS/curves_bf16.jsonl" --eval-every 25 \
    --log-every 600 --precision bf16

echo "figures: all-reduce busbw by algorithm (4 ranks, 3 runs each)"
for algo in ring rd; do
    for run in 1 2 3; do
        "$BUILD/bench/dtrain-bench" --ranks 4 -c allreduce --algo "$algo" -b 1K -e 4M -f 2 \
            -n 20 -w 5 >"$RUNS/busbw_${algo}_$run.txt"
    done
done

echo "figures: bubble against micro-batches (2 stages on 2 ranks, the 865k model; the longest run)"
quiet "$LAUNCH" -n 2 "$MINIGPT" --pp 2 --bubble-table -n 1 -V 256 -C 128 -L 4 -T 64 -B 8 \
    --data random --sample 0
cp "$RUNS/last.log" "$RUNS/bubble.txt"

echo "figures: memory per rank, DDP, ZeRO-1, ZeRO-2 and ZeRO-3 (4 ranks)"
for mode in ddp zero1 zero2 zero3; do
    quiet "$LAUNCH" -n 4 "$MINIGPT" --parallel $mode -n 5 --log-every 5 --sample 0
    cp "$RUNS/last.log" "$RUNS/memory_$mode.txt"
done

echo "figures: one pipeline step per schedule, traced (4 stages, 8 micro-batches)"
for s in gpipe 1f1b zb; do
    quiet "$LAUNCH" -n 4 "$MINIGPT" --pp 4 --microbatches 8 --schedule $s -n 4 --log-every 4 \
        -C 64 -L 4 -T 32 -B 4 --data random --sample 0 --trace "$RUNS/trace_$s.json"
    cp "$RUNS/last.log" "$RUNS/pipeline_$s.txt"
done

echo "figures: resharding a ZeRO-1 checkpoint from 4 ranks to 3"
quiet "$LAUNCH" -n 4 "$MINIGPT" --parallel zero1 -n 2 --ckpt-dir "$RUNS/ckpt4" --ckpt-every 2 \
    --log-every 2 --sample 0
quiet "$BUILD/checkpoint/dtrain-ckpt" reshard "$RUNS/ckpt4" "$RUNS/ckpt3" 3

[ -z "${RUNS_ONLY:-}" ] || { echo "runs kept in $RUNS"; exit 0; }
/usr/bin/python3 docs/figures/make_figures.py "$RUNS" docs/figures
