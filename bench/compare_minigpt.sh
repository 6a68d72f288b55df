#!/bin/sh
# compare_minigpt.sh — one minigpt training step in several setups (two
# builds, or one build with other flags), side by side: the setups run one
# after another, the whole cycle repeated R times, so that a shared
# machine's drift hits every setup alike. Made to price a change: A = the
# build before it, B = after.
#
# Each run starts WORLD ranks with the launcher's variables (RANK,
# WORLD_SIZE, DT_INIT_URL), the cores shared among them (minigpt's default --threads: cores / ranks), and reads rank 0's
# JSONL metrics: per setup, the medians over the steps after the 5th of
# every run pooled over the repeats of ms/step, of the time collectives ran
# (comm_ms), of the part of it rank 0 sat waiting (exposed_ms) and of the
# share hidden behind compute; then each repeat's median ms/step.
#
# usage: bench/compare_minigpt.sh WORLD REPEATS 'SETUP' 'SETUP' ... -- FLAGS
#   SETUP: a minigpt binary and flags of its own; FLAGS: every setup's.
#   e.g. bench/compare_minigpt.sh 4 3 old/train/minigpt build/train/minigpt \
#            -- --preset 865k --layers 8 --pp 2 --dp 2 --parallel zero1 \
#               --microbatches 8 --steps 20
set -eu
world=${1:?usage: compare_minigpt.sh WORLD REPEATS SETUP... -- FLAGS}
repeats=${2:?}; shift 2
tmp=$(mktemp -d /tmp/dtrain-compare-minigpt-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
n=0
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    n=$((n + 1)); printf '%s\n' "$1" >"$tmp/setup$n"; shift
done
[ $# -gt 0 ] && shift # --
[ "$n" -ge 1 ] || { echo "compare_minigpt.sh: no setup to run" >&2; exit 2; }

flags=$* # every setup's, split on blanks

run() { # run SETUP REP
    pids=""
    r=0
    while [ "$r" -lt "$world" ]; do
        # shellcheck disable=SC2046,SC2086 # a setup and the flags, word by word
        RANK=$r WORLD_SIZE=$world DT_INIT_URL="file://$tmp/store$1.$2" \
            $(cat "$tmp/setup$1") $flags --log-every 1000 --metrics "$tmp/m$1.$2.$r.jsonl" \
            >"$tmp/out$1.$2.$r" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
    done
    for p in $pids; do wait "$p" || { cat "$tmp/out$1.$2.0" >&2; exit 1; }; done
}

echo "config: $(nproc) cores, $world ranks; flags: $flags"
for rep in $(seq "$repeats"); do
    s=1
    while [ "$s" -le "$n" ]; do
        run "$s" "$rep"
        s=$((s + 1))
    done
done
python3 - "$tmp" "$n" "$repeats" <<'PY'
import json, statistics, sys
tmp, n, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(f"{'setup':40} {'ms/step':>8} {'comm ms':>8} {'exposed':>8} {'hidden':>7}  ms/step by repeat")
for s in range(1, n + 1):
    rows, per_rep = [], []
    for rep in range(1, repeats + 1):
        lines = [json.loads(l) for l in open(f"{tmp}/m{s}.{rep}.0.jsonl")]
        steps = [l for l in lines if l["event"] == "step"][5:]
        rows += steps
        per_rep.append(statistics.median(r["ms_per_step"] for r in steps))
    med = lambda k: statistics.median(r.get(k, 0) for r in rows)
    name = open(f"{tmp}/setup{s}").read().strip()
    print(f"{name[-40:]:40} {med('ms_per_step'):8.1f} {med('comm_ms'):8.1f} "
          f"{med('exposed_ms'):8.1f} {100 * med('hidden'):6.1f}%  "
          + " ".join(f"{v:.0f}" for v in per_rep))
PY
