#!/bin/sh
# launch_minigpt.sh — minigpt's threaded paths end to end under dtrain-launch:
# DDP and ZeRO-1 on 4 ranks, checkpoints, a rank SIGKILLed mid-run and the
# group restarted from the latest checkpoint; ZeRO-2 and DDP with bf16
# gradients (their buffers change hands between the trainer and the
# communicator's thread). Written for the ThreadSanitizer
# build (./dev.sh test-tsan), where the runtime reports any race it sees;
# it checks outcomes too, so it is an ordinary test in every build.
# Output is TAP.
#
# usage: launch_minigpt.sh PATH/TO/dtrain-launch PATH/TO/minigpt
set -u
launch=$1
minigpt=$2
tmp=$(mktemp -d /tmp/dtrain-launch-minigpt-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK DT_INIT_URL DT_SECRET DT_JOB_ID
echo "1..5"
n=0
failed=0

# run NAME CHECK-PATTERN minigpt-args...: exit 0 and a line matching CHECK.
run() {
    name=$1 want=$2
    shift 2
    n=$((n + 1))
    out="$tmp/run$n.out"
    if timeout 240 "$launch" -n 4 --max-restarts 1 "$minigpt" "$@" >"$out" 2>&1 &&
            grep -q "$want" "$out"; then
        echo "ok $n - $name"
    else
        echo "not ok $n - $name"
        failed=$((failed + 1))
        tail -n 30 "$out" | sed 's/^/# /'
    fi
}

common="-n 30 --log-every 10 --eval-every 0 --sample 0 --check-replicas"
# shellcheck disable=SC2086 # common is words on purpose
run "DDP: a rank killed at step 15 restarts from step 10 with identical replicas" \
    "resume: .*step_00000010" \
    $common --parallel ddp --bucket-mb 0.01 --ckpt-dir "$tmp/ddp" --ckpt-every 10 \
    --die-at-step 15 --resume auto
# shellcheck disable=SC2086
run "ZeRO-1: a rank killed at step 15 restarts from step 10 with identical replicas" \
    "resume: .*step_00000010" \
    $common --parallel zero1 --ckpt-dir "$tmp/zero1" --ckpt-every 10 --keep 2 \
    --die-at-step 15 --resume auto
# shellcheck disable=SC2086
run "ZeRO-2 with bf16 gradients: identical replicas" "bitwise identical" \
    $common --parallel zero2 --bucket-mb 0.01 --grad-comm bf16
# shellcheck disable=SC2086
run "DDP with bf16 gradients: identical replicas" "bitwise identical" \
    $common --parallel ddp --bucket-mb 0.01 --grad-comm bf16
run "seed preset: ZeRO-1 with a checkpoint reloaded and verified" \
    "RESUME VERIFIED" --preset seed --ckpt-dir "$tmp/seed"
[ $failed -eq 0 ]
