#!/bin/sh
# torch_skip.sh — without torch, meson skips the dtrain_torch module with
# one line and configures everything else.
#
# Usage: torch_skip.sh SOURCE_DIR
# Configures SOURCE_DIR twice into temporary build folders (`meson setup`
# only: what it prints and `meson introspect --targets` are the evidence,
# nothing is compiled), with the torch parts unavailable:
#   1. -Dtorch_python=P, where P is a Python that cannot import torch: a
#      virtual environment of /usr/bin/python3 made without its packages,
#      so the check that finds torch's ABI fails as on a machine without
#      python3-torch;
#   2. -Dtorch_backend=disabled.
# Each must print exactly one "torch_backend: not built: WHY" line naming
# the cause, define no dtrain_torch target, and still define the library
# and the programs (libdtrain, dtrain-launch, minigpt). Prints TAP.
set -u
src=$(cd "${1:?usage: torch_skip.sh SOURCE_DIR}" && pwd)
tmp=$(mktemp -d /tmp/torch_skip_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "1..2"

# case NUMBER TITLE EXPECTED_WHY MESON_ARGS...
case_() {
    n=$1 title=$2 why=$3
    shift 3
    out=$(meson setup "$tmp/build$n" "$src" "$@" 2>&1)
    rc=$?
    bad=""
    [ $rc = 0 ] || bad="meson setup exited $rc"
    lines=$(printf '%s\n' "$out" | grep -c 'torch_backend: not built: ')
    [ "$lines" = 1 ] || bad="$bad; $lines 'torch_backend: not built' lines, not 1"
    printf '%s\n' "$out" | grep 'torch_backend: not built: ' | grep -qF -- "$why" ||
        bad="$bad; the line does not say '$why'"
    targets=$(meson introspect --targets "$tmp/build$n" 2>/dev/null |
        python3 -c 'import json, sys; print(" ".join(t["name"] for t in json.load(sys.stdin)))' 2>/dev/null)
    case " $targets " in *dtrain_torch*) bad="$bad; a dtrain_torch target is defined" ;; esac
    for t in dtrain dtrain-launch minigpt; do
        case " $targets " in *" $t "*) ;; *) bad="$bad; no $t target" ;; esac
    done
    if [ -z "$bad" ]; then
        echo "ok $n - $title"
    else
        echo "not ok $n - $title:${bad#;}"
        printf '%s\n' "$out" | tail -n 15 | sed 's/^/#   /'
    fi
}

/usr/bin/python3 -m venv --without-pip "$tmp/venv" || { echo "Bail out! no venv"; exit 1; }
case_ 1 "a Python without torch: one skip line, the rest configured" \
    "cannot import torch (python3-torch)" -Dtorch_python="$tmp/venv/bin/python3"
case_ 2 "-Dtorch_backend=disabled: one skip line, the rest configured" \
    "-Dtorch_backend=disabled" -Dtorch_backend=disabled
