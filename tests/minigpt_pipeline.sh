#!/bin/sh
# minigpt_pipeline.sh — minigpt --pp end to end, through dtrain-launch.
#
# A pipelined run is the same training as one process accumulating the
# same micro-batches: `dtrain-launch -n 2 minigpt --pp 2 --microbatches 4`
# must print a loss table identical, digit for digit, to `minigpt
# --grad-accum 4` with the same flags, for every schedule (the stages add
# the micro-batches' gradients in the same order, so the sums are
# bitwise equal), also with --recompute, and the same evaluation line (its
# forwards streamed through the stages); the bytes a step reports sending
# are each counted once (one replica: the pipeline group is the world).
# Two pipelines of 2 stages,
# data-parallel (a world of 4), print the loss table of `dtrain-launch -n 2 minigpt --grad-accum 4`,
# under DDP and ZeRO-1 (and ZeRO-3, whose stages gather each unit before
# the executor reads it, and ZeRO-2, whose pieces leave during each
# stage's last backward under every schedule: ZeRO-1's table), and every
# stage's replicas agree bitwise (--check-replicas), also on the gloo wire
# (--wire gloo); ZeRO-2's and ZeRO-3's checkpoints are ZeRO-1's, byte for
# byte; with --precision bf16 (the stages exchange the fp32 residual
# stream) every schedule prints one bf16 process's table, 2 x 2 ranks
# print bf16 DDP's and ZeRO-1's, and a resumed run saves the
# uninterrupted run's bytes; --grad-comm bf16 sends a stage's gradients
# in half the bytes with identical replicas; so do one-stage pipelines (--pp 1) under ZeRO-2 and ZeRO-3. A --pp that
# does not divide the world size is refused with a message saying what
# to run instead. --preset pipeline
# prints a measured Gantt chart of its 4 stages and the bubble table of
# every schedule for m = 1..64 beside the closed forms, with each
# schedule's activation sets per stage. Output is TAP.
#
# usage: minigpt_pipeline.sh PATH/TO/dtrain-launch PATH/TO/minigpt PATH/TO/dtrain-ckpt
launch=$1; minigpt=$2; ckpt=$3
tmp=$(mktemp -d /tmp/dtrain-pipe-e2e-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK DT_INIT_URL DT_SECRET DT_JOB_ID
echo "1..42"
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }
flags="--data random --steps 4 --batch 4 --layers 3 --loss-table --log-every 100"

# the loss table's rows, without the launcher's rank prefix
losses() { sed -n 's/^\(\[0\] \)\{0,1\}  *\([0-9][0-9]*\)   *\([0-9.]*\)$/\2 \3/p' "$1"; }

timeout 120 "$minigpt" $flags --grad-accum 4 >"$tmp/one.out" 2>&1
losses "$tmp/one.out" >"$tmp/one.loss"
for s in gpipe 1f1b zb; do
    name="2 stages with $s print the loss table of one process with --grad-accum 4"
    if timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 \
            --schedule "$s" >"$tmp/$s.out" 2>&1 &&
       losses "$tmp/$s.out" >"$tmp/$s.loss" && [ -s "$tmp/$s.loss" ] &&
       cmp -s "$tmp/one.loss" "$tmp/$s.loss"; then
        ok "$name"
    else
        not_ok "$name" "$(paste "$tmp/one.loss" "$tmp/$s.loss" 2>&1)" \
            "$(tail -n 5 "$tmp/$s.out")"
    fi
done

# the evaluation streams each forward through the stages, no rank holding
# the whole model: the validation loss of the same training in one process
name="2 stages print the evaluation line of one process with --grad-accum 4"
want=$(grep "eval @ step 4: val loss" "$tmp/one.out")
got=$(sed -n 's/^\[0\] \(eval @ step 4: val loss.*\)/\1/p' "$tmp/gpipe.out")
if [ -n "$want" ] && [ "$want" = "$got" ]; then
    ok "$name"
else
    not_ok "$name" "one process: $want" "2 stages: $got"
fi

# --recompute: every stage rebuilds its blocks in one workspace, same bits
for s in gpipe 1f1b zb; do
    name="2 stages with $s and --recompute print the loss table of one process with --grad-accum 4"
    if timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 \
            --schedule "$s" --recompute >"$tmp/re-$s.out" 2>&1 &&
       losses "$tmp/re-$s.out" >"$tmp/re-$s.loss" && [ -s "$tmp/re-$s.loss" ] &&
       cmp -s "$tmp/one.loss" "$tmp/re-$s.loss" &&
       grep -q "recompute: blocks keep only" "$tmp/re-$s.out"; then
        ok "$name"
    else
        not_ok "$name" "$(paste "$tmp/one.loss" "$tmp/re-$s.loss" 2>&1)" \
            "$(tail -n 5 "$tmp/re-$s.out")"
    fi
done

# --precision bf16: each stage keeps a bf16 store of its blocks per
# micro-batch in flight and the stages exchange the fp32 residual stream,
# so the stages compute what one bf16 process accumulating the same
# micro-batches computes: the same loss table, and the same parameters
# at the end, compared through dtrain-ckpt's export of the saved step (the
# table's four decimals do not tell bf16 from fp32 on this small model;
# the parameters do)
params() { # run's checkpoint root -> its step 4, exported
    "$ckpt" export "$1" "$1.safetensors" >/dev/null 2>&1 && echo "$1.safetensors"
}
timeout 120 "$minigpt" $flags --grad-accum 4 --ckpt-dir "$tmp/one32-ck" --ckpt-every 4 \
    >"$tmp/one32.out" 2>&1
timeout 120 "$minigpt" $flags --grad-accum 4 --precision bf16 --ckpt-dir "$tmp/one16-ck" \
    --ckpt-every 4 >"$tmp/one16.out" 2>&1
losses "$tmp/one16.out" >"$tmp/one16.loss"
one16=$(params "$tmp/one16-ck")
name="one bf16 process with --grad-accum 4 ends with other parameters than fp32's"
if [ -s "$tmp/one16.loss" ] && [ -n "$one16" ] && one32=$(params "$tmp/one32-ck") &&
   ! cmp -s "$one16" "$one32"; then
    ok "$name"
else
    not_ok "$name" "$(tail -n 5 "$tmp/one16.out")"
fi
for s in gpipe 1f1b zb; do
    name="2 stages with $s in bf16 print the loss table and end with the parameters of one bf16 process with --grad-accum 4"
    if timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 --schedule "$s" \
            --precision bf16 --ckpt-dir "$tmp/bf16-$s-ck" --ckpt-every 4 >"$tmp/bf16-$s.out" 2>&1 &&
       losses "$tmp/bf16-$s.out" >"$tmp/bf16-$s.loss" && [ -s "$tmp/bf16-$s.loss" ] &&
       cmp -s "$tmp/one16.loss" "$tmp/bf16-$s.loss" &&
       got=$(params "$tmp/bf16-$s-ck") && cmp -s "$one16" "$got" &&
       grep -q "precision: bf16 compute" "$tmp/bf16-$s.out"; then
        ok "$name"
    else
        not_ok "$name" "$(paste "$tmp/one16.loss" "$tmp/bf16-$s.loss" 2>&1)" \
            "$(tail -n 5 "$tmp/bf16-$s.out")"
    fi
done

# a resumed bf16 pipeline (fp32 masters and AdamW state in the
# checkpoint) saves step 4 byte for byte as the uninterrupted run does
name="2 stages with 1f1b in bf16 resumed at step 2 save the uninterrupted run's step 4"
bad=""
timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 --schedule 1f1b \
    --precision bf16 --ckpt-dir "$tmp/ck16-whole" --ckpt-every 2 >"$tmp/ck16-whole.out" 2>&1 ||
    bad="$bad the whole run failed: $(tail -n 3 "$tmp/ck16-whole.out");"
timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 --schedule 1f1b \
    --precision bf16 --ckpt-dir "$tmp/ck16-resumed" --ckpt-every 2 --steps 2 \
    >"$tmp/ck16-first.out" 2>&1 || bad="$bad the first half failed: $(tail -n 3 "$tmp/ck16-first.out");"
timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 --schedule 1f1b \
    --precision bf16 --ckpt-dir "$tmp/ck16-resumed" --ckpt-every 2 --resume auto \
    >"$tmp/ck16-second.out" 2>&1 || bad="$bad the resumed run failed: $(tail -n 3 "$tmp/ck16-second.out");"
for f in "$tmp"/ck16-whole/step_00000004/rank*.bin; do
    cmp -s "$f" "$tmp/ck16-resumed/step_00000004/${f##*/}" || bad="$bad ${f##*/} differs;"
done
[ -s "$tmp/ck16-whole/step_00000004/rank00001.bin" ] || bad="$bad no step 4 saved;"
if [ -z "$bad" ]; then
    ok "$name"
else
    not_ok "$name" "$bad"
fi

# the traffic a step reports counts each byte once, also where the
# pipeline group is the world itself (one replica): stage 0 of 2 sends
# only its 4 micro-batches' activations, 4 x B·T·C floats (B 4, T 16, C 32)
name="2 stages of one replica report what stage 0 sends per step, its activations, once"
if timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 \
        --metrics "$tmp/bytes.jsonl" >"$tmp/bytes.out" 2>&1 &&
   sent=$(sed -n 's/.*"event": *"step".*"bytes_sent": *\([0-9]*\).*/\1/p' "$tmp/bytes.jsonl" |
          sort -u) && [ "$sent" = $((4 * 4 * 16 * 32 * 4)) ]; then
    ok "$name"
else
    not_ok "$name" "bytes_sent per step: $(echo $sent), expected $((4 * 4 * 16 * 32 * 4))" \
        "$(tail -n 5 "$tmp/bytes.out")"
fi

# --act-comm bf16: the same transfers rounded to bf16, half the bytes
# stage 0 sends per step (dtrain's traffic counters), no longer one
# process's bits but the same on every replica, resumed bitwise, and the
# task still learned
name="--act-comm bf16 halves what stage 0 sends per step: 4 x B·T·C bf16 values"
if timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 --act-comm bf16 \
        --metrics "$tmp/bytes16.jsonl" >"$tmp/bytes16.out" 2>&1 &&
   sent=$(sed -n 's/.*"event": *"step".*"bytes_sent": *\([0-9]*\).*/\1/p' "$tmp/bytes16.jsonl" |
          sort -u) && [ "$sent" = $((4 * 4 * 16 * 32 * 2)) ] &&
   grep -q "pipeline transfers: activations and their gradients rounded to bf16" \
       "$tmp/bytes16.out"; then
    ok "$name"
else
    not_ok "$name" "bytes_sent per step: $(echo $sent), expected $((4 * 4 * 16 * 32 * 2))" \
        "$(tail -n 5 "$tmp/bytes16.out")"
fi

for run in 1f1b:ddp zb:zero1; do
    s=${run%:*}; par=${run#*:}
    name="2 x 2 ranks with $s, $par and --act-comm bf16 keep every stage's replicas identical"
    if timeout 120 "$launch" -n 4 "$minigpt" $flags --pp 2 --microbatches 4 --schedule "$s" \
            --parallel $par --precision bf16 --act-comm bf16 --check-replicas \
            >"$tmp/ac16-$s.out" 2>&1 &&
       grep -q "replicas: the 2 ranks of each of the 2 stages hold bitwise identical" \
           "$tmp/ac16-$s.out"; then
        ok "$name"
    else
        not_ok "$name" "$(tail -n 5 "$tmp/ac16-$s.out")"
    fi
done

name="2 stages with --act-comm bf16 resumed at step 2 save the uninterrupted run's step 4"
bad=""
for half in whole first second; do
    case $half in
        whole) dir=ac16-whole; more="" ;;
        first) dir=ac16-resumed; more="--steps 2" ;;
        *) dir=ac16-resumed; more="--resume auto" ;;
    esac
    timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 2 --microbatches 4 --schedule zb \
        --precision bf16 --act-comm bf16 --ckpt-dir "$tmp/$dir" --ckpt-every 2 $more \
        >"$tmp/ac16-$half.out" 2>&1 || bad="$bad the $half run failed: $(tail -n 3 "$tmp/ac16-$half.out");"
done
for f in "$tmp"/ac16-whole/step_00000004/rank*.bin; do
    cmp -s "$f" "$tmp/ac16-resumed/step_00000004/${f##*/}" || bad="$bad ${f##*/} differs;"
done
[ -s "$tmp/ac16-whole/step_00000004/rank00001.bin" ] || bad="$bad no step 4 saved;"
[ -n "$one16" ] && got=$(params "$tmp/ac16-whole") && cmp -s "$one16" "$got" &&
    bad="$bad the rounded transfers left one bf16 process's parameters unchanged;"
if [ -z "$bad" ]; then
    ok "$name"
else
    not_ok "$name" "$bad"
fi

name="the task reaches 100% exact match with --pp 2 --precision bf16 --act-comm bf16"
if timeout 240 "$launch" -n 2 "$minigpt" --pp 2 --precision bf16 --act-comm bf16 \
        >"$tmp/task16.out" 2>&1 &&
   grep -q "eval @ step 600: .*exact-match accuracy 100.0%" "$tmp/task16.out"; then
    ok "$name"
else
    not_ok "$name" "$(grep "eval @" "$tmp/task16.out" | tail -n 3)" "$(tail -n 3 "$tmp/task16.out")"
fi

for bad_flags in "--act-comm bf16:it needs '--pp'" "--act-comm fp16 --pp 2:--act-comm is fp32 or bf16" \
        "--act-comm bf16 --pp 2 --wire gloo:use '--wire dtrain'"; do
    args=${bad_flags%%:*}; want=${bad_flags#*:}
    name="minigpt $args is refused: $want"
    if ! timeout 60 "$minigpt" $flags $args >"$tmp/ac-refused.out" 2>&1 &&
       grep -qF -- "$want" "$tmp/ac-refused.out"; then
        ok "$name"
    else
        not_ok "$name" "$(cat "$tmp/ac-refused.out")"
    fi
done

# --grad-comm bf16 on a pipeline's data-parallel axis: each stage's
# gradients leave rounded to bf16, so rank 0 (stage 0, replica 0) sends
# 2Ψ0 bytes fewer a step under DDP (its all-reduce: 2(N-1)/N of g·Ψ0,
# N = 2) and Ψ0 fewer under ZeRO-2 ((N-1)/N of g·Ψ0), Ψ0 the stage's
# parameters; the activations between stages are unchanged
step_bytes() { sed -n 's/.*"event":"step","step":4,.*"bytes_sent":\([0-9]*\).*/\1/p' "$1"; }
for run in ddp:2 zero2:1; do
    par=${run%:*}; k=${run#*:}
    name="2 x 2 ranks with $par and --grad-comm bf16 keep identical replicas and send ${k}Ψ0 bytes fewer a step"
    for g in fp32 bf16; do
        timeout 120 "$launch" -n 4 "$minigpt" $flags --pp 2 --parallel $par --grad-comm $g \
            --check-replicas --metrics "$tmp/gc-$par-$g.jsonl" >"$tmp/gc-$par-$g.out" 2>&1
    done
    p0=$(sed -n 's/^\[0\]  *0  *\[0, [0-9]*)  *\([0-9]*\) .*/\1/p' "$tmp/gc-$par-bf16.out")
    b32=$(step_bytes "$tmp/gc-$par-fp32.jsonl"); b16=$(step_bytes "$tmp/gc-$par-bf16.jsonl")
    if [ -n "$p0" ] && [ -n "$b32" ] && [ -n "$b16" ] &&
       [ $((b32 - b16)) = $((k * p0)) ] &&
       grep -q "hold bitwise identical parameters" "$tmp/gc-$par-bf16.out"; then
        ok "$name"
    else
        not_ok "$name" "Ψ0 $p0, bytes a step fp32 $b32 bf16 $b16" "$(tail -n 5 "$tmp/gc-$par-bf16.out")"
    fi
done

# dp x pp = 2 x 2 against DDP (or ZeRO-1) on 2 ranks with --grad-accum 4
for par in ddp zero1; do
    timeout 120 "$launch" -n 2 "$minigpt" $flags --parallel $par \
        --grad-accum 4 >"$tmp/dp-$par.out" 2>&1
    losses "$tmp/dp-$par.out" >"$tmp/dp-$par.loss"
done
for run in gpipe:ddp 1f1b:ddp zb:zero1 1f1b:zero3 gpipe:zero2 1f1b:zero2 zb:zero2; do
    s=${run%:*}; par=${run#*:}; case $par in zero2|zero3) ref=zero1 ;; *) ref=$par ;; esac
    name="2 x 2 ranks with $s and $par print the loss table of $ref on 2 ranks with --grad-accum 4"
    if timeout 120 "$launch" -n 4 "$minigpt" $flags --pp 2 --microbatches 4 \
            --schedule "$s" --parallel $par --check-replicas \
            >"$tmp/2x2-$s-$par.out" 2>&1 &&
       losses "$tmp/2x2-$s-$par.out" >"$tmp/2x2-$s-$par.loss" &&
       [ -s "$tmp/2x2-$s-$par.loss" ] && cmp -s "$tmp/dp-$ref.loss" "$tmp/2x2-$s-$par.loss" &&
       grep -q "replicas: the 2 ranks of each of the 2 stages hold bitwise identical" \
           "$tmp/2x2-$s-$par.out"; then
        ok "$name"
    else
        not_ok "$name" "$(paste "$tmp/dp-$ref.loss" "$tmp/2x2-$s-$par.loss" 2>&1)" \
            "$(tail -n 5 "$tmp/2x2-$s-$par.out")"
    fi
done

# the same in bf16, DDP and ZeRO-1 on the data-parallel axis: the loss
# table and the parameters of bf16 DDP (ZeRO-1) on 2 ranks
for par in ddp zero1; do
    timeout 120 "$launch" -n 2 "$minigpt" $flags --parallel $par --precision bf16 \
        --grad-accum 4 --ckpt-dir "$tmp/dp16-$par-ck" --ckpt-every 4 >"$tmp/dp16-$par.out" 2>&1
    losses "$tmp/dp16-$par.out" >"$tmp/dp16-$par.loss"
done
for run in 1f1b:ddp zb:zero1; do
    s=${run%:*}; par=${run#*:}
    name="2 x 2 ranks with $s and $par in bf16 print the loss table and end with the parameters of bf16 $par on 2 ranks"
    if timeout 120 "$launch" -n 4 "$minigpt" $flags --pp 2 --microbatches 4 --schedule "$s" \
            --parallel $par --precision bf16 --check-replicas --ckpt-dir "$tmp/2x2-16-$s-ck" \
            --ckpt-every 4 >"$tmp/2x2-16-$s.out" 2>&1 &&
       losses "$tmp/2x2-16-$s.out" >"$tmp/2x2-16-$s.loss" && [ -s "$tmp/2x2-16-$s.loss" ] &&
       cmp -s "$tmp/dp16-$par.loss" "$tmp/2x2-16-$s.loss" &&
       want=$(params "$tmp/dp16-$par-ck") && got=$(params "$tmp/2x2-16-$s-ck") &&
       cmp -s "$want" "$got" &&
       grep -q "replicas: the 2 ranks of each of the 2 stages hold bitwise identical" \
           "$tmp/2x2-16-$s.out"; then
        ok "$name"
    else
        not_ok "$name" "$(paste "$tmp/dp16-$par.loss" "$tmp/2x2-16-$s.loss" 2>&1)" \
            "$(tail -n 5 "$tmp/2x2-16-$s.out")"
    fi
done

# a pipeline of one stage holds the whole model yet accumulates its
# micro-batches as a stage does: ZeRO-2 and ZeRO-3 keep its gradient whole
for par in zero2 zero3; do
    name="1 stage x 2 ranks with $par prints the loss table of zero1 on 2 ranks with --grad-accum 4"
    if timeout 120 "$launch" -n 2 "$minigpt" $flags --pp 1 --microbatches 4 \
            --parallel $par --check-replicas >"$tmp/1x2-$par.out" 2>&1 &&
       losses "$tmp/1x2-$par.out" >"$tmp/1x2-$par.loss" &&
       [ -s "$tmp/1x2-$par.loss" ] && cmp -s "$tmp/dp-zero1.loss" "$tmp/1x2-$par.loss" &&
       grep -q "eval @ step 4: val loss" "$tmp/1x2-$par.out" &&
       grep -q "replicas: the 2 ranks of the one stage hold bitwise identical" \
           "$tmp/1x2-$par.out"; then
        ok "$name"
    else
        not_ok "$name" "$(paste "$tmp/dp-zero1.loss" "$tmp/1x2-$par.loss" 2>&1)" \
            "$(tail -n 5 "$tmp/1x2-$par.out")"
    fi
done

# ZeRO-2 and ZeRO-3 on the stages of zb against ZeRO-1: the saved step, every shard
name="2 x 2 ranks with zb save the same checkpoint bytes under zero2 and zero3 as under zero1"
bad=""
for par in zero1 zero2 zero3; do
    timeout 120 "$launch" -n 4 "$minigpt" $flags --pp 2 --microbatches 4 --schedule zb \
        --parallel $par --ckpt-dir "$tmp/ck-$par" --ckpt-every 4 >"$tmp/ck-$par.out" 2>&1 ||
        bad="$bad $par failed: $(tail -n 3 "$tmp/ck-$par.out");"
done
for f in "$tmp"/ck-zero1/step_00000004/*; do
    for par in zero2 zero3; do
        cmp -s "$f" "$tmp/ck-$par/step_00000004/${f##*/}" || bad="$bad $par's ${f##*/} differs;"
    done
done
[ -s "$tmp/ck-zero1/step_00000004/rank00003.bin" ] || bad="$bad no step 4 saved;"
if [ -z "$bad" ]; then
    ok "$name"
else
    not_ok "$name" "$bad"
fi

# the same on torch 1.13 gloo's wire: its splits are torch's new_group and
# the stages' sends/recvs stay in flight, so 1F1B's crossing transfers pass
for run in 1f1b:ddp zb:zero1; do
    s=${run%:*}; par=${run#*:}
    name="2 x 2 ranks with $s and $par on the gloo wire print the loss table of $par on 2 ranks"
    if timeout 120 "$launch" -n 4 "$minigpt" $flags --pp 2 --microbatches 4 --wire gloo \
            --schedule "$s" --parallel $par --check-replicas \
            >"$tmp/gloo-$s.out" 2>&1 &&
       losses "$tmp/gloo-$s.out" >"$tmp/gloo-$s.loss" && [ -s "$tmp/gloo-$s.loss" ] &&
       cmp -s "$tmp/dp-$par.loss" "$tmp/gloo-$s.loss" &&
       grep -q "the gloo wire (torch 1.13's)" "$tmp/gloo-$s.out" &&
       grep -q "replicas: the 2 ranks of each of the 2 stages hold bitwise identical" \
           "$tmp/gloo-$s.out"; then
        ok "$name"
    else
        not_ok "$name" "$(paste "$tmp/dp-$par.loss" "$tmp/gloo-$s.loss" 2>&1)" \
            "$(tail -n 5 "$tmp/gloo-$s.out")"
    fi
done

name="--pp 2 in a world of 1 is refused, naming the launch to run"
if ! timeout 60 "$minigpt" $flags --pp 2 >"$tmp/refused.out" 2>&1 &&
   grep -q "needs a world of a multiple of 2 ranks" "$tmp/refused.out" &&
   grep -q "(this one has 1)" "$tmp/refused.out" &&
   grep -q "dtrain-launch -n 2" "$tmp/refused.out"; then
    ok "$name"
else
    not_ok "$name" "$(cat "$tmp/refused.out")"
fi

name="--pp 2 --dp 3 in a world of 4 is refused, naming the world it needs"
if ! timeout 60 "$launch" -n 4 "$minigpt" $flags --pp 2 --dp 3 \
        >"$tmp/refused-dp.out" 2>&1 &&
   grep -q "needs a world of exactly 6 ranks (this one has 4)" "$tmp/refused-dp.out"; then
    ok "$name"
else
    not_ok "$name" "$(cat "$tmp/refused-dp.out")"
fi

# the lesson: 4 stages, 8 micro-batches, Gantt chart and bubble table
timeout 280 "$launch" -n 4 "$minigpt" --preset pipeline >"$tmp/lesson.out" 2>&1
sed 's/^\[0\] //' "$tmp/lesson.out" >"$tmp/lesson.txt"
name="--preset pipeline draws the measured last step of each of its 4 stages"
rows=$(grep -c '^  stage [0-3] |[FB.]*|$' "$tmp/lesson.txt")
fb=$(grep '^  stage [0-3] |' "$tmp/lesson.txt" | grep -c 'F.*B')
if [ "$rows" = 4 ] && [ "$fb" = 4 ]; then
    ok "$name"
else
    not_ok "$name" "$rows Gantt rows, $fb with F then B" "$(tail -n 30 "$tmp/lesson.out")"
fi

# each stage's measured bubble is the idle share of a step: the executor's
# compute times are the last step's, not the run's so far (6 steps)
name="--preset pipeline measures each stage's bubble as a share of the step, between 0% and 100%"
bubbles=$(awk '$1 ~ /^[0-3]$/ && $2 ~ /^\[/ && $7 ~ /%$/ { print $7 }' "$tmp/lesson.txt")
inside=$(printf '%s\n' $bubbles | awk '{ v = $1 + 0 } v >= 0 && v < 100 { n++ } END { print n + 0 }')
if [ "$(printf '%s\n' $bubbles | grep -c %)" = 4 ] && [ "$inside" = 4 ]; then
    ok "$name"
else
    not_ok "$name" "measured bubbles: $bubbles" "$(grep -A5 'stage    blocks' "$tmp/lesson.txt")"
fi

name="--preset pipeline prints the bubble for m = 1..64 beside the closed form, and activation sets"
bad=""
for m in 1 2 4 8 16 32 64; do
    grep -q "^ *$m | " "$tmp/lesson.txt" || bad="$bad no row for m=$m;"
done
# closed forms (p - 1)/(m + p - 1) for GPipe and 1F1B, (p - 1)/(3m + p - 1) for ZB-H1
grep -q '^ *8 |  *27\.3%.*|  *27\.3%.*|  *11\.1%' "$tmp/lesson.txt" || bad="$bad m=8 closed forms;"
grep -q '^ *64 |  *4\.5%.*|  *4\.5%.*|  *1\.5%' "$tmp/lesson.txt" || bad="$bad m=64 closed forms;"
# GPipe keeps all 8 micro-batches (+1 gradient set) on every stage, 1F1B p - s (+1)
grep -q '^  *0  *9 sets  *[0-9]* B  *5 sets' "$tmp/lesson.txt" || bad="$bad stage 0 sets;"
grep -q '^  *3  *9 sets  *[0-9]* B  *2 sets' "$tmp/lesson.txt" || bad="$bad stage 3 sets;"
if [ -z "$bad" ]; then
    ok "$name"
else
    not_ok "$name" "$bad" "$(tail -n 20 "$tmp/lesson.out")"
fi
