#!/bin/sh
# ddp_overhead.sh — what data parallelism costs on the 865k config.
#
# Runs minigpt --preset 865k (V=256 C=128 H=4 L=4 T=64, 8 sequences per
# rank, DDP, 1 MB buckets) alone and on 2 and 4 ranks, and prints from the
# JSONL metrics (medians over the steps after the first 5):
#
#   ms/step     wall time of a step on rank 0
#   comm ms     time the buckets' all-reduces were running
#   exposed ms  time rank 0 waited for them after backward
#   hidden      1 - exposed/comm: share of the all-reduce behind backward
#   overhead    ms/step / (1-process ms/step x N/min(N, cores)): a step's
#               cost against the same per-rank compute in one process,
#               with the compute of ranks beyond the core count serialised
#               (4 ranks on 2 cores cannot be faster than 2 steps' worth)
#
# Ranks are started with the launcher's variables (RANK, WORLD_SIZE,
# DT_INIT_URL), each with one OpenBLAS thread.
#
# usage: bench/ddp_overhead.sh [BUILD_DIR] [STEPS] [extra minigpt flags]
set -eu
build=${1:-build}; steps=${2:-40}
[ $# -ge 2 ] && shift 2 || shift $#
minigpt=$build/train/minigpt
[ -x "$minigpt" ] || { echo "no $minigpt: build first (ninja -C $build)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/dtrain-ddp-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)

run() { # run N: N ranks, metrics of rank 0 in $tmp/mN.jsonl
    n=$1; shift; pids=""
    for r in $(seq 0 $((n - 1))); do
        if [ "$n" = 1 ]; then
            env -u RANK -u WORLD_SIZE "$minigpt" --preset 865k --steps "$steps" \
                --metrics "$tmp/m1.jsonl" "$@" >"$tmp/out1.$r" 2>&1 &
        else
            RANK=$r WORLD_SIZE=$n DT_INIT_URL="file://$tmp/store$n" \
                "$minigpt" --preset 865k --steps "$steps" \
                --metrics "$tmp/m$n.jsonl" "$@" >"$tmp/out$n.$r" 2>&1 &
        fi
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || { cat "$tmp/out$n.0" >&2; exit 1; }; done
}

echo "config: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
echo "command: $0 $build $steps $*"
for n in 1 2 4; do
    run "$n" "$@"
    head -n 3 "$tmp/out$n.0" | sed "s/^/  [$n] /"
done
python3 - "$tmp" "$cores" <<'PY'
import json, statistics, sys
tmp, cores = sys.argv[1], int(sys.argv[2])
def med(n):
    rows = [json.loads(l) for l in open(f"{tmp}/m{n}.jsonl")]
    steps = [r for r in rows if r["event"] == "step"][5:]
    m = lambda k: statistics.median(r.get(k, 0) for r in steps)
    comm, exposed = sum(r["comm_ms"] for r in steps), sum(r["exposed_ms"] for r in steps)
    hidden = 1 - exposed / comm if comm > 0 else float("nan")
    return m("ms_per_step"), m("comm_ms"), m("exposed_ms"), hidden
base = med(1)[0]
print(f"{'ranks':>5} {'ms/step':>9} {'comm ms':>9} {'exposed':>9} {'hidden':>7} {'raw x':>7} {'overhead':>9}")
for n in (1, 2, 4):
    ms, comm, exp, hid = med(n)
    serial = n / min(n, cores)
    hs = "-" if hid != hid else f"{100*hid:.0f}%"
    print(f"{n:>5} {ms:>9.2f} {comm:>9.2f} {exp:>9.2f} {hs:>7} {ms/base:>7.2f} {ms/(base*serial):>8.2f}x")
print("hidden = 1 - sum(exposed)/sum(comm) over the measured steps")
PY
