#!/bin/sh
# gpt2_small.sh — `--preset gpt2-small` (GPT-2 small's shapes: V 50257,
# C 768, H 12, L 12; T 64 and one sequence per rank for a CPU; 162M
# parameters) runs to its end on 2 ranks, in DDP and in ZeRO-3, and its
# checkpoint saves, verifies and resumes bitwise (issue 34).
#
# For each mode: a run of the preset's 3 steps saves at step 2 and ends
# with the replica check's hash of the parameters; `dtrain-ckpt verify`
# checks the checkpoint (every shard's bytes and SHA-256 against its
# manifest); a second run resumes it (--resume auto), makes step 3 and
# must end with the same hash and the same step-3 loss, bit for bit.
# No sample (--sample 0) keeps it short; the runs' memory tables are
# printed as TAP comments. Memory: DDP's model states are 16Ψ = 2.6 GB a
# rank, ZeRO-3's 16Ψ/2 = 1.3 GB plus its units; one run at a time.
#
# Every timeout is its default (DT_* unset); each run is bounded by
# `timeout`. Output is TAP.
#
# usage: gpt2_small.sh PATH/TO/dtrain-launch PATH/TO/minigpt PATH/TO/dtrain-ckpt
launch=$1; minigpt=$2; ckpt=$3
tmp=$(mktemp -d /tmp/dtrain-gpt2small-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for v in $(env | sed -n 's/^\(DT_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK
echo "1..6"
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
if grep -q -a "__asan_init\|__tsan_init\|__msan_init" "$minigpt"; then
    for i in 1 2 3 4 5 6; do
        echo "ok $i - gpt2-small # SKIP a sanitizer build: 162M parameters at its speed and memory overhead outrun the suite's bound"
    done
    exit 0
fi

# run OUT ARGS...: the preset on 2 ranks; 0 if it exited 0
run() {
    out=$1; shift
    timeout 900 "$launch" -n 2 "$minigpt" --preset gpt2-small --sample 0 "$@" >"$out" 2>&1
}

# The replica check's hash at the end of a run, and step 3's logged loss.
final_hash() { sed -n 's/.*hold bitwise identical parameters (hash \([0-9a-f]*\)).*/\1/p' "$1"; }
step3_loss() { sed -n 's/^\[0\]  *3  *\([0-9]*\.[0-9]*\) .*/\1/p' "$1" | head -n 1; }

for mode in ddp zero3; do
    dir="$tmp/$mode"
    name="$mode: the preset runs 3 steps on 2 ranks, saves at step 2, evaluation printed"
    if run "$tmp/$mode.a" --parallel "$mode" --ckpt-dir "$dir" --ckpt-every 2 &&
       grep -q "162,263,040 parameters" "$tmp/$mode.a" &&
       grep -q "checkpoint: step 2 saved" "$tmp/$mode.a" &&
       grep -q "eval @ step 3: val loss" "$tmp/$mode.a" && [ -n "$(final_hash "$tmp/$mode.a")" ]; then
        ok "$name"
        grep "ms/step\|^\[0\]  *[1-3]  *[0-9]*\.\|summary:\|^\[0\]   ZeRO-3 \|memory per rank\|^\[0\]   rank \|^\[0\]  *[01]  *[0-9]* .*|" \
            "$tmp/$mode.a" | sed "s/^/# /"
    else
        not_ok "$name" "$(tail -n 8 "$tmp/$mode.a")"
        not_ok "$mode: dtrain-ckpt verify accepts the step-2 checkpoint" "no checkpoint: the run failed"
        not_ok "$mode: resumed at step 2, step 3 ends bitwise" "no checkpoint: the run failed"
        continue
    fi
    name="$mode: dtrain-ckpt verify accepts the step-2 checkpoint"
    if "$ckpt" verify "$dir" >"$tmp/$mode.v" 2>&1; then
        ok "$name"
    else
        not_ok "$name" "$(tail -n 5 "$tmp/$mode.v")"
    fi
    name="$mode: resumed at step 2, step 3 ends bitwise where the uninterrupted run did"
    want=$(final_hash "$tmp/$mode.a"); want_loss=$(step3_loss "$tmp/$mode.a")
    if run "$tmp/$mode.b" --parallel "$mode" --ckpt-dir "$dir" --resume auto; then
        got=$(final_hash "$tmp/$mode.b"); got_loss=$(step3_loss "$tmp/$mode.b")
        if [ -n "$got" ] && [ "$got" = "$want" ] && [ -n "$got_loss" ] && [ "$got_loss" = "$want_loss" ]; then
            ok "$name"
        else
            not_ok "$name" "hash $got, step 3 loss $got_loss after resuming;" \
                "hash $want, step 3 loss $want_loss uninterrupted"
        fi
    else
        not_ok "$name" "$(tail -n 8 "$tmp/$mode.b")"
    fi
done
