#!/usr/bin/env bash
# multihost.sh — dtrain across several hosts, each host a network namespace.
#
# Two "hosts" (network namespaces), each with one interface, eth0, on a
# subnet of its own (10.213.0.0/24 and 10.213.1.0/24), joined by a router:
# a third namespace that forwards between them and, for the fault tests,
# hands every connection from one host to the other to a relay
# (tests/netns/relay.py) through a netfilter redirect. Nothing is added to
# the machine's own network: the subnets exist only inside these
# namespaces, and everything created is removed on exit, also after a
# failure or an interrupt. Node 0 (10.213.0.1) hosts the TCP store; the
# workers publish their eth0 address (the one their route to the store
# leaves through, or DT_IFNAME=eth0), so every connection between ranks
# leaves its namespace, even between two ranks of one host.
# Loopback cannot cross a namespace: a rank that published 127.0.0.1 would
# never be reached from the other host.
#
# What it checks (TAP):
#   - 2 hosts x 2 ranks train to bitwise the same parameters as 4 ranks on
#     one host (minigpt --check-replicas prints the parameters' hash);
#   - the same through links limited to 100 Mbit/s (tc tbf);
#   - the same with netem's delay, jitter and loss, where the kernel has
#     netem (this machine's kernels often lack sch_netem: then a comment
#     says so and the test is not counted);
#   - the same through the relay adding 2-8 ms latency with jitter, cutting
#     every write of a connection's first 64 KiB into 1-byte pieces, and
#     stalling each direction for 2 s;
#   - a connection reset by the relay mid-training fails the job with the
#     reset named, and --max-restarts 1 brings it to the end;
#   - a host whose link is cut mid-training (ip link set eth0 down): the
#     ranks of the other host fail within the op timeout, each that reports
#     (the launcher stops the rest) naming a rank of the cut host and its
#     address (the kernel's keepalive and
#     TCP_USER_TIMEOUT notice the silent host before any op times out
#     waiting on a healthy neighbour), and node 0's launcher, with
#     --max-restarts 2, gives up instead of restarting forever.
#
# Needs root (ip netns), nft (nftables) for the relay tests, python3. Without
# root, or where namespaces cannot be created, it says why and skips.
#
# usage: multihost.sh BUILD_DIR
set -u
build=${1:?usage: multihost.sh BUILD_DIR}
launch=$(realpath "$build/launcher/dtrain-launch")
minigpt=$(realpath "$build/train/minigpt")
tag="dt$$"
rt="${tag}rt" h0="${tag}h0" h1="${tag}h1"
tmp=$(mktemp -d /tmp/dtrain-netns-XXXXXX)
unset RANK WORLD_SIZE LOCAL_RANK DT_INIT_URL DT_SECRET DT_JOB_ID DT_HOST DT_IFNAME
export DT_SECRET
DT_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

cleanup() {
    for ns in "$h0" "$h1" "$rt"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    [ -n "${KEEP:-}" ] && echo "# kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the hosts ----------------------------------------------------------------

make_hosts() {
    ip netns add "$rt" || return 1
    ip netns exec "$rt" sysctl -qw net.ipv4.ip_forward=1 || return 1
    local i=0
    for ns in "$h0" "$h1"; do
        ip netns add "$ns" &&
            ip -n "$rt" link add "port$i" type veth peer name eth0 netns "$ns" &&
            ip -n "$rt" addr add "10.213.$i.254/24" dev "port$i" &&
            ip -n "$rt" link set "port$i" up &&
            ip -n "$ns" addr add "10.213.$i.1/24" dev eth0 &&
            ip -n "$ns" link set eth0 up &&
            ip -n "$ns" link set lo up &&
            ip -n "$ns" route add default via "10.213.$i.254" || return 1
        i=$((i + 1))
    done
}

if [ "$(id -u)" != 0 ]; then
    echo "1..0 # SKIP needs root to create network namespaces (ip netns)"
    echo "0 passed, 0 failed"
    exit 0
fi
# Until both ends of each link are up and running (a veth's carrier comes
# up a moment after `ip link set up`): workers list only running interfaces.
links_running() {
    local t=0
    for ns in "$h0" "$h1"; do
        until ip -n "$ns" link show eth0 | grep -q 'LOWER_UP'; do
            [ $t -ge 100 ] && return 1
            sleep 0.1
            t=$((t + 1))
        done
    done
}

if ! why=$(make_hosts 2>&1 && links_running 2>&1); then
    echo "1..0 # SKIP cannot create network namespaces here: $why"
    echo "0 passed, 0 failed"
    exit 0
fi

# ---- running a job --------------------------------------------------------------

common=(-n 20 --log-every 5 --eval-every 0 --sample 0 --check-replicas --seed 7)
port=29400

# on_host NS NODE OUT [launcher flags...] -- [minigpt flags...]: start node
# NODE's launcher in namespace NS (in the background; its pid in $!).
on_host() {
    local ns=$1 node=$2 out=$3
    shift 3
    ip netns exec "$ns" env ${ifname:+DT_IFNAME=$ifname} timeout 300 "$launch" --nnodes 2 \
        --node-rank "$node" --nproc-per-node 2 --master-addr 10.213.0.1 \
        --master-port "$port" "$@" >"$out" 2>&1 &
}

# two_hosts NAME [minigpt flags...]: both nodes, waited for; 0 if both exit 0.
two_hosts() {
    local name=$1
    shift
    port=$((port + 1))
    on_host "$h0" 0 "$tmp/$name.0" "$minigpt" "${common[@]}" "$@"
    local p0=$!
    on_host "$h1" 1 "$tmp/$name.1" "$minigpt" "${common[@]}" "$@"
    local p1=$! rc0=0 rc1=0
    wait "$p0" || rc0=$?
    wait "$p1" || rc1=$?
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ]
}

# shellcheck source=../tap_report.sh
. "$(dirname "$0")/../tap_report.sh"

# The reference: 4 ranks on one host (loopback, in host 0's namespace).
ip netns exec "$h0" timeout 300 "$launch" -n 4 "$minigpt" "${common[@]}" \
    >"$tmp/one_host" 2>&1
want=$(hash_of "$tmp/one_host")
if [ -z "$want" ]; then
    echo "1..1"
    report 0 "4 ranks on one host train and print their parameters' hash" "$tmp/one_host"
    echo "$passed passed, $failed failed"
    exit 1
fi
echo "# one host, 4 ranks: parameters' hash $want"

netem=0
if ip -n "$h0" link add probe type dummy 2>/dev/null; then
    tc -n "$h0" qdisc add dev probe root netem delay 1ms 2>/dev/null && netem=1
    ip -n "$h0" link del probe
fi
echo "1..$((7 + netem))"

# same_as_one_host NAME: both nodes exit 0 and node 0 prints the reference hash.
same_as_one_host() {
    local name=$1 ok=0
    shift
    if two_hosts "$name" "$@" && [ "$(hash_of "$tmp/$name.0")" = "$want" ]; then ok=1; fi
    # through the relay: it carried the store's connection and the mesh's
    # four between the hosts (2 ranks x 2 ranks)
    if [ -f "$tmp/relay.$name" ] && [ "$(grep -c '^relay: to ' "$tmp/relay.$name")" -lt 5 ]; then
        ok=0
    fi
    report "$ok" "$(describe "$name")" "$tmp/$name.0" "$tmp/$name.1" $([ -f "$tmp/relay.$name" ] && echo "$tmp/relay.$name")
}
describe() {
    case $1 in
    plain) echo "2 hosts x 2 ranks through a router, no interface named (the route to the store picks it): parameters bitwise equal to 4 ranks on one host" ;;
    latency) echo "through a relay adding 2-8 ms latency with jitter: parameters bitwise equal to one host's" ;;
    pieces) echo "through a relay writing each connection's first 64 KiB 1 byte at a time: parameters bitwise equal to one host's" ;;
    stall) echo "through a relay stalling each direction for 2 s: parameters bitwise equal to one host's" ;;
    tbf) echo "links limited to 100 Mbit/s (tbf): parameters bitwise equal to one host's" ;;
    netem) echo "links with netem delay 2 ms ± 1 ms and 1% loss: parameters bitwise equal to one host's" ;;
    esac
}

# The first run names no interface: each rank publishes the address its
# route to the store leaves through. The others name eth0 (DT_IFNAME).
ifname=
same_as_one_host plain
ifname=eth0

for ns in "$h0" "$h1"; do
    tc -n "$ns" qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 100ms
done
same_as_one_host tbf
for ns in "$h0" "$h1"; do tc -n "$ns" qdisc del dev eth0 root; done

if [ "$netem" = 1 ]; then
    for ns in "$h0" "$h1"; do
        tc -n "$ns" qdisc add dev eth0 root netem delay 2ms 1ms loss 1%
    done
    same_as_one_host netem
    for ns in "$h0" "$h1"; do tc -n "$ns" qdisc del dev eth0 root; done
else
    echo "# netem: this kernel has no sch_netem (tc: qdisc kind is unknown); delay and loss not tried"
fi

# ---- through the relay ------------------------------------------------------------

relay_port=9999
# with_relay MODE: start the relay and the redirect; stop them with no_relay.
with_relay() {
    ip netns exec "$rt" python3 "$(dirname "$0")/relay.py" "$relay_port" "$1" "$((port + 1))" \
        >"$tmp/relay.$1" 2>&1 &
    relay_pid=$!
    local t=0
    until grep -q "^relay: $1" "$tmp/relay.$1" 2>/dev/null || [ $t -ge 100 ]; do
        sleep 0.1
        t=$((t + 1))
    done
    ip netns exec "$rt" nft -f - <<NFT
table ip relay {
    chain pre {
        type nat hook prerouting priority dstnat;
        iifname { "port0", "port1" } ip daddr { 10.213.0.1, 10.213.1.1 } tcp dport != $relay_port redirect to :$relay_port
    }
}
NFT
}
no_relay() {
    ip netns exec "$rt" nft delete table ip relay
    kill "$relay_pid" 2>/dev/null
    wait "$relay_pid" 2>/dev/null
}

for mode in latency pieces stall; do
    with_relay "$mode"
    same_as_one_host "$mode"
    no_relay
done

# A reset mid-training: the first attempt fails naming the lost connection
# (the ranks cannot tell a reset from a crash), the restart runs to the end.
reset_test() {
    with_relay reset
    port=$((port + 1))
    on_host "$h0" 0 "$tmp/reset.0" --max-restarts 1 "$minigpt" "${common[@]}" -n 200
    local p0=$!
    on_host "$h1" 1 "$tmp/reset.1" --max-restarts 1 "$minigpt" "${common[@]}" -n 200
    local p1=$! rc0=0 rc1=0
    wait "$p0" || rc0=$?
    wait "$p1" || rc1=$?
    no_relay
    local ok=0
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ] && grep -q "^relay: reset" "$tmp/relay.reset" &&
        grep -q "restart 1 of 1" "$tmp/reset.0" &&
        cat "$tmp/reset.0" "$tmp/reset.1" | grep -q "lost: connection reset by peer" &&
        [ -n "$(hash_of "$tmp/reset.0")" ] && ok=1
    report "$ok" "a connection reset mid-training fails the job naming the lost connection, and --max-restarts 1 runs it to the end" "$tmp/reset.0" "$tmp/reset.1" "$tmp/relay.reset"
}
reset_test

# ---- a link cut mid-training ---------------------------------------------------------

# Many steps, so the cut lands mid-run; an 8 s op timeout and a 10 s start-up
# deadline bound how long the survivors may take to notice and to give up.
cut_test() {
    port=$((port + 1))
    local out0="$tmp/cut.0" out1="$tmp/cut.1"
    ip netns exec "$h0" env DT_IFNAME=eth0 DT_TIMEOUT=8 timeout 300 "$launch" --nnodes 2 \
        --node-rank 0 --nproc-per-node 2 --master-addr 10.213.0.1 --master-port "$port" \
        --max-restarts 2 --init-timeout 10 "$minigpt" -n 100000 --log-every 50 \
        --eval-every 0 --sample 0 >"$out0" 2>&1 &
    local p0=$!
    ip netns exec "$h1" env DT_IFNAME=eth0 DT_TIMEOUT=8 timeout 300 "$launch" --nnodes 2 \
        --node-rank 1 --nproc-per-node 2 --master-addr 10.213.0.1 --master-port "$port" \
        --init-timeout 10 "$minigpt" -n 100000 --log-every 50 --eval-every 0 \
        --sample 0 >"$out1" 2>&1 &
    local p1=$!
    local t=0
    until grep -q '^\[0\] *[0-9]\+ \+[0-9.]\+' "$out0" 2>/dev/null || [ $t -ge 600 ]; do
        sleep 0.1
        t=$((t + 1))
    done
    ip -n "$h1" link set eth0 down
    local cut=$SECONDS rc0=0
    wait "$p0" || rc0=$?
    local took=$((SECONDS - cut))
    kill "$p1" 2>/dev/null
    wait "$p1" 2>/dev/null
    echo "# link cut: node 0's launcher exited $rc0 after $took s"
    # 3 attempts of at most an 8 s op timeout or a 10 s start-up each, plus
    # grace: well under 90 s unless the launcher spins.
    # The first attempt's failures on node 0 (one or both ranks: the
    # launcher stops the other once one has failed, sometimes before it
    # prints): every one names a rank of the cut host and its address.
    sed -n '1,/restart 1 of 2/p' "$out0" | grep '^\[[01]\] minigpt: rank [01]: ' >"$tmp/cut.first"
    local named lines
    named=$(grep -cE 'rank [23] \(10\.213\.1\.1:[0-9]+\) lost: its host (stopped answering|cannot be reached)' \
        "$tmp/cut.first")
    lines=$(wc -l <"$tmp/cut.first")
    local ok=0
    [ "$rc0" != 0 ] && [ "$rc0" != 124 ] && [ $took -lt 90 ] && [ "$lines" -ge 1 ] &&
        [ "$named" = "$lines" ] && grep -q 'giving up after 2 restarts' "$out0" && ok=1
    report "$ok" "a host's link cut mid-training: the other host's ranks fail naming an unreachable rank and its host, and its launcher gives up after --max-restarts" "$out0"
}
cut_test

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
