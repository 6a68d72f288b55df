#!/bin/sh
# pipeline_speedup.sh — what two pipeline stages buy over one process.
#
# The same model and the same step — M micro-batches of 8 sequences (the
# 865k config: V=256 C=128 H=4 T=64, L blocks, 4 by default) — trained by:
#
#   1       one process, --grad-accum M
#   gpipe   2 ranks, --pp 2 --microbatches M --schedule gpipe
#   1f1b    the same with 1F1B
#   zb      the same with ZB-H1
#
# one setup after another, the whole cycle repeated R times, so that a
# shared machine's drift hits every setup alike. From rank 0's JSONL
# metrics, steps after the 5th of every run pooled over the repeats, it
# prints the median ms/step, tokens/s and the speed-up over one process
# (ideal with p = 2 on 2 free cores: 2 (1 - bubble) = 2 M / (M + 1)),
# and each stage's bubble as minigpt measures it (1 - compute / step time,
# the step lasting from the start of the stage's run until the loss is
# shared; the median over repeats) beside the closed form (equal stages)
# and the simulated one (the schedule run on paper with each stage's own
# measured F, B and W and free transfers): measured minus simulated is
# what the executor and the wire add, simulated minus closed form what
# unequal stages cost.
#
# Ranks are started with the launcher's variables (RANK, WORLD_SIZE,
# DT_INIT_URL), each with one compute thread (--threads 1).
#
# usage: bench/pipeline_speedup.sh [BUILD_DIR] [STEPS] [REPEATS] [M] [L]
set -eu
build=${1:-build}; steps=${2:-30}; repeats=${3:-3}; m=${4:-8}; layers=${5:-4}
minigpt=$build/train/minigpt
[ -x "$minigpt" ] || { echo "no $minigpt: build first (ninja -C $build)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/dtrain-pipe-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
common="--preset 865k --layers $layers --steps $steps --log-every 1000 --threads 1"

run() { # run SETUP REP
    setup=$1; rep=$2
    if [ "$setup" = 1 ]; then
        env -u RANK -u WORLD_SIZE "$minigpt" $common --grad-accum "$m" \
            --metrics "$tmp/m1.$rep.jsonl" >"$tmp/out1.$rep" 2>&1
        return
    fi
    pids=""
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 DT_INIT_URL="file://$tmp/store$setup.$rep" \
            "$minigpt" $common --pp 2 --microbatches "$m" --schedule "$setup" \
            --metrics "$tmp/m$setup.$rep.$r.jsonl" >"$tmp/out$setup.$rep.$r" 2>&1 &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || { cat "$tmp/out$setup.$rep.0" >&2; exit 1; }; done
    mv "$tmp/m$setup.$rep.0.jsonl" "$tmp/m$setup.$rep.jsonl"
}

echo "config: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
echo "command: $0 $build $steps $repeats $m $layers"
for rep in $(seq "$repeats"); do
    for setup in 1 gpipe 1f1b zb; do run "$setup" "$rep"; done
done
grep -m1 '^minigpt' "$tmp/out1f1b.1.0" | sed 's/^/  /'
python3 - "$tmp" "$repeats" "$m" <<'PY'
import json, re, statistics, sys
tmp, repeats, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def ms(setup):
    out = []
    for rep in range(1, repeats + 1):
        rows = [json.loads(l) for l in open(f"{tmp}/m{setup}.{rep}.jsonl")]
        out += [r["ms_per_step"] for r in rows if r["event"] == "step"][5:]
    return statistics.median(out)
def bubbles(setup):
    per = {}
    for rep in range(1, repeats + 1):
        for line in open(f"{tmp}/out{setup}.{rep}.0"):
            f = re.match(r"\s+(\d+)\s+\[\d+, \d+\)\s+\d+\s+\d+\s+\d+\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%", line)
            if f:
                per.setdefault(int(f.group(1)), []).append(tuple(float(f.group(k)) for k in (2, 3, 4)))
    return {s: (statistics.median(b[0] for b in v), v[0][1], statistics.median(b[2] for b in v))
            for s, v in sorted(per.items())}
tokens = m * 8 * 64
base = ms("1")
print(f"{'setup':>6} {'ms/step':>9} {'tokens/s':>10} {'vs 1 proc':>10}  bubble per stage (measured / closed form / simulated)")
print(f"{'1':>6} {base:>9.2f} {tokens / base * 1e3:>10.0f} {1:>9.2f}x")
for s in ("gpipe", "1f1b", "zb"):
    t = ms(s)
    b = "  ".join(f"s{k}: {v[0]:.1f} / {v[1]:.1f} / {v[2]:.1f}%" for k, v in bubbles(s).items())
    print(f"{s:>6} {t:>9.2f} {tokens / t * 1e3:>10.0f} {base / t:>9.2f}x  {b}")
print(f"medians over {repeats} interleaved repeats, steps after the 5th; ideal speed-up "
      f"2 M/(M+1) = {2 * m / (m + 1):.2f}x")
PY
