#!/usr/bin/env bash
# slurm_minigpt.sh — minigpt under a real Slurm: srun and sbatch.
#
# Starts a one-node Slurm cluster of its own (slurmctld and slurmd, with a
# private slurm.conf, state directories and ports under a temporary
# directory; munge for authentication, started if it is not running), then:
#   - `srun -n 4 minigpt` trains with ranks from SLURM_PROCID/SLURM_NTASKS
#     to bitwise the parameters `dtrain-launch -n 4` reaches (the hash
#     --check-replicas prints);
#   - the sbatch scripts docs/12-multi-node.md shows a cluster user
#     (docs/slurm_example.sbatch, a file:// rendezvous, and
#     docs/slurm_env_example.sbatch, env:// with rank 0 hosting the store)
#     run as written and reach the same;
#   - two jobs started at once with the same DT_INIT_URL and no DT_JOB_ID
#     do not cross-wire: each takes its job id from SLURM_JOB_ID and
#     SLURM_STEP_ID, and both reach the same parameters.
# Everything it starts it stops, and everything it creates it removes, also
# after a failure. Needs root (slurmd runs jobs as any user) and the
# slurm-wlm and munge packages (./dev.sh test-slurm installs them).
#
# usage: slurm_minigpt.sh BUILD_DIR
set -u
build=${1:?usage: slurm_minigpt.sh BUILD_DIR}
launch=$(realpath "$build/launcher/dtrain-launch")
minigpt=$(realpath "$build/train/minigpt")
here=$(cd "$(dirname "$0")" && pwd)
sbatch_example=$(realpath "$here/../../docs/slurm_example.sbatch")
sbatch_env_example=$(realpath "$here/../../docs/slurm_env_example.sbatch")
tmp=$(mktemp -d /tmp/dtrain-slurm-XXXXXX)
chmod 755 "$tmp"
unset RANK WORLD_SIZE LOCAL_RANK DT_INIT_URL DT_SECRET DT_JOB_ID MASTER_ADDR MASTER_PORT
export SLURM_CONF="$tmp/slurm.conf"
started_munge=""

cleanup() {
    timeout 10 scancel --quiet --user root 2>/dev/null
    for pid in "$tmp/slurmctld.pid" "$tmp/slurmd.pid"; do
        [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null
    done
    [ -n "$started_munge" ] && pkill -x munged
    sleep 0.5
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

skip() { echo "1..0 # SKIP $1"; echo "0 passed, 0 failed"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root to start slurmd"
command -v slurmctld >/dev/null && command -v munged >/dev/null ||
    skip "slurm-wlm and munge are not installed (./dev.sh test-slurm installs them)"

# ---- a cluster of one node ---------------------------------------------------

node=$(hostname)
mkdir -p "$tmp/ctld" "$tmp/spool"
cat >"$SLURM_CONF" <<EOF
ClusterName=dtrain-test
SlurmctldHost=$node
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
SlurmUser=root
StateSaveLocation=$tmp/ctld
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
# 4 tasks however few cores the machine has: the test is about the
# environment, not the speed
SlurmdParameters=config_overrides
NodeName=$node CPUs=8 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

if ! echo | timeout 10 munge >/dev/null 2>&1; then # no munged answering
    mkdir -p /run/munge && chown munge: /run/munge 2>/dev/null
    munged --force 2>"$tmp/munged.err" || skip "munged does not start: $(cat "$tmp/munged.err")"
    started_munge=1
    echo | timeout 10 munge >/dev/null 2>&1 || skip "munged started but does not answer"
fi
slurmctld 2>"$tmp/start.err" && slurmd 2>>"$tmp/start.err" ||
    skip "slurmctld/slurmd do not start: $(cat "$tmp/start.err")"
t=0
until timeout 5 sinfo -h -o %t 2>/dev/null | grep -q idle; do
    [ $t -ge 300 ] && skip "the node never became idle: $(tail -n 3 "$tmp/slurmd.log")"
    sleep 0.1
    t=$((t + 1))
done

# ---- the tests -----------------------------------------------------------------

common=(-n 20 --log-every 5 --eval-every 0 --sample 0 --check-replicas --seed 7)
# shellcheck source=../tap_report.sh
. "$here/../tap_report.sh"

echo "1..4"
(cd "$tmp" && timeout 300 "$launch" -n 4 "$minigpt" "${common[@]}") >"$tmp/launch.out" 2>&1
want=$(hash_of "$tmp/launch.out")
echo "# dtrain-launch -n 4: parameters' hash ${want:-none}"

ok=0
(cd "$tmp" && DT_INIT_URL="file://$tmp/srun.store" timeout 300 srun -n 4 "$minigpt" \
    "${common[@]}") >"$tmp/srun.out" 2>&1 &&
    [ -n "$want" ] && [ "$(hash_of "$tmp/srun.out")" = "$want" ] && ok=1
report $ok "srun -n 4 minigpt: ranks from Slurm, parameters bitwise equal to dtrain-launch -n 4's" \
    "$tmp/srun.out" "$tmp/launch.out"

ok=0
(cd "$tmp" && MINIGPT="$minigpt" MINIGPT_ARGS="${common[*]}" timeout 300 sbatch --wait \
    -o "$tmp/sbatch.out" "$sbatch_example") >"$tmp/sbatch.submit" 2>&1 &&
    [ -n "$want" ] && [ "$(hash_of "$tmp/sbatch.out")" = "$want" ] && ok=1
report $ok "the docs' sbatch script runs as written: parameters bitwise equal to dtrain-launch's" \
    "$tmp/sbatch.submit" "$tmp/sbatch.out"

ok=0
(cd "$tmp" && MINIGPT="$minigpt" MINIGPT_ARGS="${common[*]}" timeout 300 sbatch --wait \
    -o "$tmp/sbatch_env.out" "$sbatch_env_example") >"$tmp/sbatch_env.submit" 2>&1 &&
    [ -n "$want" ] && [ "$(hash_of "$tmp/sbatch_env.out")" = "$want" ] &&
    grep -q "rank 0 hosts the rendezvous store" "$tmp/sbatch_env.out" && ok=1
report $ok "the docs' env:// sbatch script (rank 0 hosts the TCP store) runs as written: same parameters" \
    "$tmp/sbatch_env.submit" "$tmp/sbatch_env.out"

# Two jobs, one rendezvous file, no DT_JOB_ID, different seeds: each job's
# own id keeps them apart. Crossed, a job's ranks would hold different
# parameters (the replica check fails) or another job's (the hash differs).
ok=0
for seed in 7 8; do
    (cd "$tmp" && timeout 300 "$launch" -n 2 "$minigpt" "${common[@]}" --seed $seed) \
        >"$tmp/ref$seed.out" 2>&1
done
(cd "$tmp" && DT_INIT_URL="file://$tmp/shared.store" timeout 300 srun --oversubscribe -n 2 "$minigpt" \
    "${common[@]}" --seed 7) >"$tmp/job7.out" 2>&1 &
p1=$!
(cd "$tmp" && DT_INIT_URL="file://$tmp/shared.store" timeout 300 srun --oversubscribe -n 2 "$minigpt" \
    "${common[@]}" --seed 8) >"$tmp/job8.out" 2>&1 &
p2=$!
rc1=0 rc2=0
wait $p1 || rc1=$?
wait $p2 || rc2=$?
r7=$(hash_of "$tmp/ref7.out") r8=$(hash_of "$tmp/ref8.out")
[ $rc1 = 0 ] && [ $rc2 = 0 ] && [ -n "$r7" ] && [ "$r7" != "$r8" ] &&
    [ "$(hash_of "$tmp/job7.out")" = "$r7" ] && [ "$(hash_of "$tmp/job8.out")" = "$r8" ] && ok=1
report $ok "two jobs sharing DT_INIT_URL without DT_JOB_ID keep apart (job id from SLURM_JOB_ID.SLURM_STEP_ID)" \
    "$tmp/job7.out" "$tmp/job8.out"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
