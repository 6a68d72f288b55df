#!/bin/sh
# three_d_shapes.sh — every dp x tp x pp shape of up to W ranks (default 8)
# trains the embedded task (digit reversal): one line per shape with the
# exact-match accuracy at the last step and the run's wall time.
#
#   bench/three_d_shapes.sh [BUILD] [W] [STEPS] [-- more minigpt flags]
#
# Each shape runs `dtrain-launch -n D*T*P minigpt --dp D --tp T --pp P` with
# about the same global batch (D x --grad-accum 16/D micro-batches of --batch
# 16: 16 when D divides 16), so the shapes of one D follow the same curve up
# to the order of their sums. Shapes
# the model cannot take (T not dividing the heads or the vocabulary, P more
# stages than blocks) are run too: minigpt refuses them, and the line says
# why. A world of one rank is plain minigpt, not a grid: skipped.
set -u
BUILD=${1:-build}
W=${2:-8}
STEPS=${3:-300}
shift $(($# > 3 ? 3 : $#))
[ "${1:-}" = "--" ] && shift
LAUNCH=$BUILD/launcher/dtrain-launch
MINIGPT=$BUILD/train/minigpt
printf '%-12s %5s %12s %8s\n' shape ranks exact-match seconds
for P in 1 2 3 4 5 6 7 8; do
    for T in 1 2 3 4 5 6 7 8; do
        for D in 1 2 3 4 5 6 7 8; do
            N=$((D * T * P))
            [ "$N" -le "$W" ] && [ "$N" -ge 2 ] || continue
            t0=$(date +%s.%N)
            out=$("$LAUNCH" -n "$N" "$MINIGPT" --dp "$D" --tp "$T" --pp "$P" \
                --grad-accum $((16 / D)) --steps "$STEPS" --eval-every 0 --sample 0 \
                --log-every "$STEPS" --threads 1 "$@" 2>&1)
            t1=$(date +%s.%N)
            acc=$(printf '%s\n' "$out" | sed -n 's/.*exact-match accuracy \([0-9.]*%\).*/\1/p' | tail -1)
            if [ -z "$acc" ]; then
                why=$(printf '%s\n' "$out" | grep -m1 'minigpt: ' | sed 's/^\[[0-9]*\] //')
                printf '%-12s %5d %12s %8s  %s\n' "dp${D}xtp${T}xpp${P}" "$N" refused - "$why"
            else
                printf '%-12s %5d %12s %8.1f\n' "dp${D}xtp${T}xpp${P}" "$N" "$acc" \
                    "$(echo "$t1 - $t0" | bc)"
            fi
        done
    done
done
