#!/bin/sh
# ddp_overhead.sh — what data parallelism costs on the 865k config.
#
# Runs minigpt --preset 865k (V=256 C=128 H=4 L=4 T=64, 8 sequences per
# rank, DDP, 1 MB buckets) in fifteen setups, one after another, and repeats
# the whole cycle R times, so that a shared machine's drift hits every setup
# alike (side by side, not one setup now and another a minute later):
#
#   1        one process alone
#   2, 4     DDP on 2 and 4 ranks
#   2z, 4z   ZeRO-1 (--parallel zero1, the same 1 MB buckets) on 2 and 4
#   2w, 4w   ZeRO-2 (--parallel zero2, the same 1 MB buckets) on 2 and 4
#   2t, 4t   ZeRO-3 (--parallel zero3, the same 1 MB buckets) on 2 and 4
#   2r, 4r   DDP with --recompute (blocks keep their input, one more forward
#            in backward) on 2 and 4
#   2d, 4d   DDP with --deterministic (rank-order sums, one division) on 2
#            and 4
#   2s, 4s   2 and 4 independent single processes at once, no communication:
#            the same per-rank compute with the same sharing of cores and
#            caches as the DDP run, minus the all-reduces
#
# From the JSONL metrics of rank 0 (the first process), steps after the
# first 5 of every run pooled over the repeats, it prints medians of:
#
#   ms/step     wall time of a step
#   comm ms     time the buckets' all-reduces were running
#   exposed ms  time rank 0 waited for them after backward
#   hidden      1 - sum(exposed)/sum(comm): share of the all-reduce behind backward
#   vs 1 proc   ms/step / (one process × N/min(N, cores)): the step against
#               the same per-rank work in one process, the ranks beyond the
#               core count serialised (4 ranks on 2 cores cannot beat 2 steps)
#   vs N solo   ms/step / (N independent processes' ms/step): communication's
#               own cost, the core sharing factored out
#   vs DDP      ZeRO, recompute and --deterministic rows: median over repeats of (their ms/step / DDP
#               ms/step), both from the same cycle
#
# Then rank 0's memory table of the last DDP and ZeRO-1 runs on 4 ranks
# (accounted buffers, the allocator's heap and the kernel's peak RSS per
# rank), and the measured saving beside the formula.
#
# Ranks are started with the launcher's variables (RANK, WORLD_SIZE,
# DT_INIT_URL), each with one compute thread (--threads 1).
#
# usage: bench/ddp_overhead.sh [BUILD_DIR] [STEPS] [REPEATS] [extra minigpt flags]
set -eu
build=${1:-build}; steps=${2:-40}; repeats=${3:-3}
[ $# -ge 3 ] && shift 3 || shift $#
minigpt=$build/train/minigpt
[ -x "$minigpt" ] || { echo "no $minigpt: build first (ninja -C $build)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/dtrain-ddp-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)

run() { # run SETUP REP: metrics of rank 0 in $tmp/m<SETUP>.<REP>.jsonl
    setup=$1; rep=$2; shift 2
    n=${setup%[szwtrd]}; pids=""; mode=ddp; extra=""
    [ "$setup" = "${n}z" ] && mode=zero1
    [ "$setup" = "${n}w" ] && mode=zero2
    [ "$setup" = "${n}t" ] && mode=zero3
    [ "$setup" = "${n}r" ] && extra=--recompute
    [ "$setup" = "${n}d" ] && extra=--deterministic
    for r in $(seq 0 $((n - 1))); do
        m="$tmp/m$setup.$rep.jsonl"; [ "$r" = 0 ] || m="$tmp/ignored.$setup.$r.jsonl"
        if [ "$n" = 1 ] || [ "$setup" = "${n}s" ]; then
            env -u RANK -u WORLD_SIZE "$minigpt" --preset 865k --steps "$steps" --threads 1 \
                --metrics "$m" "$@" >"$tmp/out$setup.$r" 2>&1 &
        else
            RANK=$r WORLD_SIZE=$n DT_INIT_URL="file://$tmp/store$setup.$rep" \
                "$minigpt" --preset 865k --steps "$steps" --threads 1 --parallel $mode $extra \
                --metrics "$m" "$@" >"$tmp/out$setup.$r" 2>&1 &
        fi
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || { cat "$tmp/out$setup.0" >&2; exit 1; }; done
}

echo "config: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
echo "command: $0 $build $steps $repeats $*"
for rep in $(seq "$repeats"); do
    for setup in 1 2s 2 2z 2w 2t 2r 2d 4s 4 4z 4w 4t 4r 4d; do run "$setup" "$rep" "$@"; done
done
head -n 3 "$tmp/out4.0" | sed "s/^/  [4] /"
python3 - "$tmp" "$cores" "$repeats" <<'PY'
import json, statistics, sys
tmp, cores, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def steps(setup):
    out = []
    for rep in range(1, repeats + 1):
        rows = [json.loads(l) for l in open(f"{tmp}/m{setup}.{rep}.jsonl")]
        out += [r for r in rows if r["event"] == "step"][5:]
    return out
def med(setup):
    s = steps(setup)
    m = lambda k: statistics.median(r.get(k, 0) for r in s)
    comm, exposed = sum(r.get("comm_ms", 0) for r in s), sum(r.get("exposed_ms", 0) for r in s)
    hidden = 1 - exposed / comm if comm > 0 else float("nan")
    return m("ms_per_step"), m("comm_ms"), m("exposed_ms"), hidden
base = med("1")[0]
def rep_median(setup, rep):
    rows = [json.loads(l) for l in open(f"{tmp}/m{setup}.{rep}.jsonl")]
    return statistics.median([r["ms_per_step"] for r in rows if r["event"] == "step"][5:])
print(f"{'ranks':>8} {'ms/step':>9} {'comm ms':>9} {'exposed':>9} {'hidden':>7} "
      f"{'solo ms':>9} {'vs 1 proc':>10} {'vs N solo':>10} {'vs DDP':>8}")
for setup in ("1", "2", "2z", "2w", "2t", "2r", "2d", "4", "4z", "4w", "4t", "4r", "4d"):
    n = int(setup.rstrip("zwtrd"))
    ms, comm, exp, hid = med(setup)
    solo = med(f"{n}s")[0] if n > 1 else base
    serial = n / min(n, cores)
    hs = "-" if hid != hid else f"{100*hid:.0f}%"
    vs = "-"
    if setup[-1] in "zwtrd":
        vs = statistics.median(rep_median(setup, k) / rep_median(str(n), k)
                               for k in range(1, repeats + 1))
        vs = f"{vs:.2f}x"
    name = {"z": f"{n} zero1", "w": f"{n} zero2", "t": f"{n} zero3", "r": f"{n} recomp", "d": f"{n} det"}.get(setup[-1], f"{n} ddp" if n > 1 else "1")
    print(f"{name:>8} {ms:>9.2f} {comm:>9.2f} {exp:>9.2f} {hs:>7} {solo:>9.2f} "
          f"{ms/(base*serial):>9.2f}x {ms/solo:>9.2f}x {vs:>8}")
print(f"medians over {repeats} interleaved repeats, steps after the 5th; "
      "hidden = 1 - sum(exposed)/sum(comm); vs DDP = median of per-repeat ratios")
PY
for setup in 4 4z; do
    echo "memory per rank, $( [ $setup = 4 ] && echo DDP || echo ZeRO-1 ) on 4 ranks (rank 0's table, last repeat):"
    sed -n '/^memory per rank/,$p' "$tmp/out$setup.0" | sed -n '2,6p' | sed 's/^/  /'
done
python3 - "$tmp/out4.0" "$tmp/out4z.0" <<'PY'
import re, sys
def rows(path):
    out = {}
    for line in open(path):
        m = re.match(r"\s+(\d+)((?:\s+\d+){6})\s+\|\s+(\d+)\s+(\d+)\s*$", line)
        if m:
            out[int(m.group(1))] = (int(m.group(3)), int(m.group(4)))
    return out
ddp, z = rows(sys.argv[1]), rows(sys.argv[2])
P = None
for line in open(sys.argv[1]):
    m = re.search(r"([\d,]+) parameters", line)
    if m:
        P = int(m.group(1).replace(",", "")); break
for r in sorted(ddp):
    if r in z:
        print(f"  rank {r}: measured DDP - ZeRO-1: heap {ddp[r][0] - z[r][0]:,} B, "
              f"peak RSS {ddp[r][1] - z[r][1]:,} B")
if P:
    print(f"  formula: 12Psi(N-1)/N = {12 * P * 3 // 4:,} B against a DDP with an fp32 "
          f"master; this DDP keeps none (m, v only): 8Psi - 12Psi/N = {8 * P - 3 * P:,} B")
PY
