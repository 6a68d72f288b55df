#!/bin/sh
# mpirun_minigpt.sh — minigpt runs correctly under OpenMPI's mpirun.
#
# mpirun starts the 4 ranks and tells each its place through
# OMPI_COMM_WORLD_RANK/SIZE; dtrain's rendezvous still needs a URL, passed
# with -x. The run must exit 0, report the seed preset's numbers (29,824
# parameters, 89,472 optimizer bytes per rank, identical replicas), and
# train exactly like the same job started with dtrain-launch's variables
# (RANK, WORLD_SIZE, DT_INIT_URL set by hand here): the two loss tables must
# be identical, because nothing but the way ranks are numbered differs.
#
# No test is skipped: a machine without mpirun fails the first one (install
# Debian's openmpi-bin). Output is TAP.
#
# usage: mpirun_minigpt.sh PATH/TO/minigpt
minigpt=$1
tmp=$(mktemp -d /tmp/dtrain-mpirun-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK DT_INIT_URL DT_SECRET DT_JOB_ID
echo "1..5"
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do echo "# $l"; done; }

if command -v mpirun >/dev/null 2>&1; then
    ok "mpirun is installed ($(mpirun --version 2>/dev/null | head -n 1))"
else
    not_ok "mpirun is installed" "install Debian's openmpi-bin"
fi

# --oversubscribe: more ranks than cores; --allow-run-as-root: CI runs as root
if timeout 120 mpirun --allow-run-as-root --oversubscribe -n 4 \
        -x "DT_INIT_URL=file://$tmp/mpi-store" \
        "$minigpt" --preset seed >"$tmp/mpi.out" 2>&1; then
    ok "mpirun -n 4 minigpt --preset seed exits 0"
else
    not_ok "mpirun -n 4 minigpt --preset seed exits 0" "$(tail -n 20 "$tmp/mpi.out")"
fi

if grep -q "29,824 parameters; 4 ranks" "$tmp/mpi.out" &&
   grep -q "optimizer shard bytes per rank: 89472" "$tmp/mpi.out"; then
    ok "every rank found its place: 4 ranks, 89472 optimizer bytes per rank"
else
    not_ok "every rank found its place: 4 ranks, 89472 optimizer bytes per rank" \
        "$(head -n 5 "$tmp/mpi.out")"
fi

if grep -q "replicas: all 4 ranks hold bitwise identical parameters" "$tmp/mpi.out"; then
    ok "the 4 replicas end bitwise identical"
else
    not_ok "the 4 replicas end bitwise identical" "$(grep -i replica "$tmp/mpi.out")"
fi

# the same job, ranks numbered the launcher's way
pids=""
for r in 0 1 2 3; do
    RANK=$r WORLD_SIZE=4 DT_INIT_URL="file://$tmp/env-store" \
        timeout 120 "$minigpt" --preset seed >"$tmp/env$r.out" 2>&1 &
    pids="$pids $!"
done
env_rc=0
for p in $pids; do wait "$p" || env_rc=1; done
sed -n '/^loss table/,/^optimizer/p' "$tmp/mpi.out" >"$tmp/mpi.table"
sed -n '/^loss table/,/^optimizer/p' "$tmp/env0.out" >"$tmp/env.table"
if [ "$env_rc" = 0 ] && [ -s "$tmp/mpi.table" ] && cmp -s "$tmp/mpi.table" "$tmp/env.table"; then
    ok "the loss table under mpirun equals the one under RANK/WORLD_SIZE"
else
    not_ok "the loss table under mpirun equals the one under RANK/WORLD_SIZE" \
        "env run exit: $env_rc" "$(diff "$tmp/mpi.table" "$tmp/env.table" | head -n 10)"
fi
