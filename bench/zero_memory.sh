#!/bin/sh
# zero_memory.sh — the ZeRO paper's memory table (its Figure 1), measured on
# dtrain's own ranks: model-state bytes per rank for DDP, ZeRO-1, ZeRO-2
# and ZeRO-3 on N = 1, 2 and 4 ranks, beside the closed form; then the activation
# bytes with and without --recompute.
#
# Each setup runs minigpt --preset 865k with L layers (default 8), two
# steps, each mode with its default bucket size (--bucket-mb 0: DDP and
# ZeRO-1 reduce in place, so buckets cost them nothing; ZeRO-2's default
# is a quarter of a shard). "measured" is rank 0's accounted model states
# from minigpt's memory table: params + grads + optimizer, from the sizes
# of the buffers the rank really holds after training (ZeRO-2's gradient
# column is its shard plus its bucket pool). The closed forms (fp32, Ψ
# parameters, N ranks):
#
#   DDP     16Ψ            weights 4Ψ, gradients 4Ψ, AdamW m and v 8Ψ
#   ZeRO-1  8Ψ + 8Ψ/N      the paper's; dtrain keeps an fp32 master of the
#                          shard too (+4Ψ/N), printed as "+ master"
#   ZeRO-2  4Ψ + 12Ψ/N     plus the gradient buckets in flight (bk)
#   ZeRO-3  16Ψ/N          plus the two gathered units (un) and bk; the
#                          second table sets it against 16Ψ/N + un alone
#
# "accounted" equals the closed form by construction when the code holds
# what it should; the independent measurement is the heap: rank 0's
# mallinfo2 (everything malloc'ed, activations and the communicator's
# buffers included), and "heap saved", DDP's heap minus the mode's, set
# beside the saving the closed form predicts. Activation bytes are the
# model's activation and activation-gradient sets.
#
# Then the same four modes on 4 ranks under --precision bf16, beside two
# closed forms: dtrain's (the fp32 rows, every parameter rounded on use
# from fp32 buffers; ZeRO-2 keeps an fp32 master of its shard, 4Ψ/N, as
# ZeRO-1 does, because its gathers send bf16) and the ZeRO paper's mixed
# precision (bf16 weights 2Ψ, bf16 gradients 2Ψ, fp32 master, m and v
# 12Ψ: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N), with the activation bytes
# against fp32's.
#
# usage: bench/zero_memory.sh [BUILD_DIR] [LAYERS]
set -eu
build=${1:-build}; layers=${2:-8}
minigpt=$build/train/minigpt
[ -x "$minigpt" ] || { echo "no $minigpt: build first (ninja -C $build)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/dtrain-zero-mem-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

run() { # run N MODE [flags]: rank 0's output in $tmp/N.MODE[.flags]
    n=$1; mode=$2; shift 2
    out="$tmp/$n.$mode$(printf '%s' "$*" | tr -d ' -')"; pids=""
    for r in $(seq 0 $((n - 1))); do
        o=$out; [ "$r" = 0 ] || o="$out.rank$r"
        RANK=$r WORLD_SIZE=$n DT_INIT_URL="file://$tmp/store.$n.$mode$$" \
            "$minigpt" --preset 865k -L "$layers" --steps 2 --log-every 1 \
            --parallel "$mode" --bucket-mb 0 --threads 1 "$@" >"$o" 2>&1 &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || { cat "$out" >&2; exit 1; }; done
    rm -f "$tmp"/store.*
}

echo "command: $0 $build $layers"
for n in 1 2 4; do
    for mode in ddp zero1 zero2 zero3; do run $n $mode; done
done
for mode in ddp zero2 zero3; do run 4 $mode --recompute; done
for mode in ddp zero1 zero2 zero3; do run 4 $mode --precision bf16; done

python3 - "$tmp" <<'PY'
import re, sys
tmp = sys.argv[1]
def table(path):
    """Rank 0's row of the memory table and the parameter count."""
    text = open(path).read()
    P = int(re.search(r"([\d,]+) parameters", text).group(1).replace(",", ""))
    row = re.search(r"^\s+0((?:\s+\d+){6})\s+\|\s+(\d+)\s+(\d+)\s*$", text, re.M)
    params, grads, optim, states, staging, acts = map(int, row.group(1).split())
    return P, dict(params=params, grads=grads, optim=optim, states=states, acts=acts,
                   heap=int(row.group(2)), rss=int(row.group(3)))
def closed(mode, P, N, bk, un):
    s = -(-P // N)  # the shard: ceil(P / N) elements
    if mode == "ddp":
        return 16 * P, "16Ψ"
    if mode == "zero1":
        return 8 * P + 12 * s, "8Ψ + 8Ψ/N + master"
    if mode == "zero2":
        return 4 * P + 12 * s + bk, "4Ψ + 12Ψ/N + bk"
    return 16 * s + un + bk, "16Ψ/N + un + bk"
print(f"{'N':>2} {'mode':<6} {'closed form':<20} {'closed B':>12} {'accounted B':>12} "
      f"{'acc/closed':>10} {'vs DDP':>7} {'heap B':>12} {'heap saved':>11} {'closed saved':>12}")
ddp, ddp_heap, z3 = {}, {}, {}
for n in (1, 2, 4):
    for mode in ("ddp", "zero1", "zero2", "zero3"):
        P, t = table(f"{tmp}/{n}.{mode}")
        s = -(-P // n)
        bk = t["grads"] - 4 * s if mode in ("zero2", "zero3") else 0
        un = t["params"] - 4 * s if mode == "zero3" else 0
        c, form = closed(mode, P, n, bk, un)
        if mode == "ddp":
            ddp[n], ddp_heap[n] = t["states"], t["heap"]
        if mode == "zero3":
            z3[n] = (t["states"], 16 * s + un, un, bk)
        print(f"{n:>2} {mode:<6} {form:<20} {c:>12,} {t['states']:>12,} "
              f"{t['states'] / c:>9.3f}x {t['states'] / ddp[n]:>6.3f}x {t['heap']:>12,} "
              f"{ddp_heap[n] - t['heap']:>11,} {16 * P - c:>12,}")
print(f"Ψ = {P:,} parameters; bk = the gradient buckets in flight (the grads column "
      "minus the 4Ψ/N shard), un = ZeRO-3's two gathered units (its params column minus "
      "the 4Ψ/N shard); heap saved = DDP's measured heap minus this mode's, "
      "closed saved = 16Ψ minus the closed form")
print()
print(f"{'N':>2} {'ZeRO-3 accounted':>17} {'16Ψ/N + un':>12} {'ratio':>7} {'un':>11} {'bk':>9}")
for n in (1, 2, 4):
    acc, form, un, bk = z3[n]
    print(f"{n:>2} {acc:>17,} {form:>12,} {acc / form:>6.3f}x {un:>11,} {bk:>9,}")
print()
print(f"{'N':>2} {'mode':<6} {'activations B':>14} {'--recompute B':>14} {'cut':>6}")
for mode in ("ddp", "zero2", "zero3"):
    a = table(f"{tmp}/4.{mode}")[1]["acts"]
    b = table(f"{tmp}/4.{mode}recompute")[1]["acts"]
    print(f" 4 {mode:<6} {a:>14,} {b:>14,} {100 * (1 - b / a):>5.1f}%")
print()
def closed_bf16(mode, P, N, bk, un):
    """dtrain's bf16 model states, and the ZeRO paper's mixed precision."""
    s = -(-P // N)
    paper = {"ddp": (16 * P, "16Ψ"), "zero1": (4 * P + 12 * s, "4Ψ + 12Ψ/N"),
             "zero2": (2 * P + 14 * s, "2Ψ + 14Ψ/N"), "zero3": (16 * s, "16Ψ/N")}[mode]
    if mode == "zero2":
        return (4 * P + 16 * s + bk, "4Ψ + 16Ψ/N + bk"), paper
    return closed(mode, P, N, bk, un), paper
print(f"{'N':>2} {'bf16':<6} {'dtrain closed form':<20} {'closed B':>12} {'accounted B':>12} "
      f"{'acc/closed':>10} {'paper MP':<12} {'paper B':>10} {'acts bf16/fp32':>15}")
for mode in ("ddp", "zero1", "zero2", "zero3"):
    P, t = table(f"{tmp}/4.{mode}precisionbf16")
    s = -(-P // 4)
    bk = t["grads"] - 4 * s if mode in ("zero2", "zero3") else 0
    un = t["params"] - 4 * s if mode == "zero3" else 0
    (c, form), (pc, pform) = closed_bf16(mode, P, 4, bk, un)
    acts32 = table(f"{tmp}/4.{mode}")[1]["acts"]
    print(f" 4 {mode:<6} {form:<20} {c:>12,} {t['states']:>12,} {t['states'] / c:>9.3f}x "
          f"{pform:<12} {pc:>10,} {t['acts'] / acts32:>14.3f}x")
print("dtrain's bf16 keeps its weight replica and its gradients in fp32 buffers (4Ψ + 4Ψ, "
      "the replica holding rounded values), which the portable path's fp32 kernels read; "
      "the paper's column is what bf16 weight and gradient buffers would hold, worth "
      "building with a kernel that multiplies bf16 natively")
PY
