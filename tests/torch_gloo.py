#!/usr/bin/python3
"""torch_gloo.py — dtrain ranks in PyTorch 1.13 gloo process groups, bit for bit.

Usage: torch_gloo.py GLOO_PEER
Starts groups of 2-5 ranks on 127.0.0.1 in which some ranks are torch
(this script, run as a rank) and some are dtrain (GLOO_PEER, a C program
linked with dtrain's collectives), over file:// and tcp:// stores. Every rank
runs the same plan (one collective a line) on inputs derived from (rank,
line) and prints the SHA-256 of each result; each mixed group must print,
rank by rank, what an all-torch group of that size prints. Then the
failures: a killed torch rank, a rank that leaves early, a mismatched
collective must end in a clear error naming the peer or the slot, never a
hang. Prints TAP-style "ok"/"not ok" lines, one per case; exits 1 if any
failed.

Inputs: a_i = (i·2654435761 + rank·1000003 + line·7919) mod 2^32,
m = a mod 2001 - 1000; floats m·2^((a>>11) mod 40 - 20) (f16: mod 8 - 6),
i32 m, i64 (a - 2^31)·4099, u8 a mod 256, i8 a mod 256 - 128: every value
exact in its dtype, so the sums' rounding depends only on the order.
"""
import datetime, hashlib, os, signal, socket, subprocess, sys, tempfile, time

TIMEOUT_S = 20


def plan_for(n):
    """The workload of an n-rank group, one collective a line: f32 sums at
    every size that crosses a boundary of gloo's segment geometry, every
    dtype and reduction, then every other collective."""
    lines = [f"allreduce f32 sum {k}" for k in (1, 3, 7, 64, 1000, 262145, 600001, 2000003)]
    lines += ["allreduce f64 sum 7", "allreduce f64 sum 262145", "allreduce f16 sum 7",
              "allreduce f16 sum 262145", "allreduce i32 sum 1000", "allreduce i64 sum 3",
              "allreduce u8 sum 1000", "allreduce i8 sum 7", "allreduce f32 prod 1000",
              "allreduce f32 min 1000", "allreduce f32 max 1000", "allreduce f16 min 64",
              "allreduce i64 prod 64", "allreduce i32 band 64", "async4 f32 1000"]
    lines += ["broadcast f32 1000 0", f"broadcast f16 3 {n - 1}", "allgather f32 1",
              "allgather f32 3", "allgather u8 1001", "barrier", "reduce f32 sum 1000 0",
              f"reduce f32 sum 600001 {n - 1}", f"gather f32 100 {n - 1}", "scatter f32 100 0",
              "alltoall f32 64", "p2p f32 100 5", "allreduce f32 sum 1000"]
    return lines


# ---- a torch rank -----------------------------------------------------------

def torch_rank(url, rank, size, plan, timeout, mode):
    import numpy as np
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))
    if mode == "die":
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    dtypes = {"f32": (np.float32, 40, 20), "f64": (np.float64, 40, 20),
              "f16": (np.float16, 8, 6), "i32": (np.int32,), "i64": (np.int64,),
              "u8": (np.uint8,), "i8": (np.int8,)}
    ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND}

    def gen(t, n, seed):
        a = (np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(seed)) \
            & np.uint64(0xffffffff)
        m = (a % np.uint64(2001)).astype(np.int64) - 1000
        kind = dtypes[t]
        if t in ("f32", "f64", "f16"):
            e = ((a >> np.uint64(11)) % np.uint64(kind[1])).astype(np.int64) - kind[2]
            v = np.ldexp(m.astype(np.float64), e).astype(kind[0])
        elif t == "i32":
            v = m.astype(np.int32)
        elif t == "i64":
            v = (a.astype(np.int64) - 2 ** 31) * 4099
        elif t == "u8":
            v = (a & np.uint64(0xff)).astype(np.uint8)
        else:
            v = ((a & np.uint64(0xff)).astype(np.int64) - 128).astype(np.int8)
        return torch.from_numpy(np.ascontiguousarray(v))

    def say(line, *tensors):
        h = hashlib.sha256()
        for t in tensors:
            h.update(t.numpy().tobytes())
        print(f"{line} {h.hexdigest()}", flush=True)

    if plan.startswith("split:"):
        return torch_split(dist, rank, size, [int(c) for c in plan[6:].split(",")], gen, say)
    if plan == "sendrecv":
        return torch_sendrecv(dist, rank, size, gen, say)
    if plan == "abort":  # gloo_peer's rank 0 aborts; this receive must fail at once
        dist.recv(torch.zeros(4), src=0, tag=5)
        return
    for line, text in enumerate(open(plan).read().splitlines(), 1):
        w = text.split()
        op, seed = w[0], rank * 1000003 + line * 7919
        if op in ("allreduce", "reduce"):
            t = gen(w[1], int(w[3]), seed)
            if op == "allreduce":
                dist.all_reduce(t, op=ops[w[2]])
            else:
                dist.reduce(t, dst=int(w[4]), op=ops[w[2]])
            say(line, t)
        elif op == "async4":
            ts = [gen(w[1], int(w[2]), seed + j) for j in range(4)]
            works = [dist.all_reduce(t, async_op=True) for t in ts]
            for j, (t, work) in enumerate(zip(ts, works)):
                work.wait()
                say(line * 10 + j, t)
        elif op == "barrier":
            dist.barrier()
            say(line)
        else:
            n = int(w[2])
            t = gen(w[1], n, seed)
            if op == "broadcast":
                dist.broadcast(t, src=int(w[3]))
                say(line, t)
            elif op == "allgather":
                outs = [torch.empty_like(t) for _ in range(size)]
                dist.all_gather(outs, t)
                say(line, *outs)
            elif op == "gather":
                root = int(w[3])
                outs = [torch.zeros_like(t) for _ in range(size)] if rank == root else None
                dist.gather(t, outs, dst=root)
                say(line, *(outs or []))
            elif op == "scatter":
                root, out = int(w[3]), torch.zeros_like(t)
                src = list(gen(w[1], n * size, seed).chunk(size)) if rank == root else None
                dist.scatter(out, src, src=root)
                say(line, out)
            elif op == "alltoall":
                inp = gen(w[1], n * size, seed)
                out = torch.empty_like(inp)
                dist.all_to_all_single(out, inp)
                say(line, out)
            elif op == "p2p":
                tag = int(w[3])
                if rank == 0:
                    for q in range(1, size):
                        dist.send(t, dst=q, tag=tag)
                    out = [torch.zeros_like(t) for _ in range(size)]
                    for _ in range(1, size):
                        tmp = torch.zeros_like(t)
                        src = dist.recv(tmp, src=None, tag=tag + 1)
                        out[src] = tmp
                    say(line, *out)
                else:
                    out = torch.zeros_like(t)
                    dist.recv(out, src=0, tag=tag)
                    dist.send(gen(w[1], n, seed + 13), dst=0, tag=tag + 1)
                    say(line, out)
    dist.destroy_process_group()


def torch_split(dist, rank, size, colours, gen, say):
    """gloo_peer's "split:" program in torch: dt_comm_split(colour, key = rank)
    is an all_gather of (colour, key) as int32, then new_group per colour,
    ascending, which every rank calls."""
    import torch
    me = torch.tensor([colours[rank], rank], dtype=torch.int32)
    got = [torch.empty_like(me) for _ in range(size)]
    dist.all_gather(got, me)
    colour_of = [int(t[0]) for t in got]
    mine = None
    for c in sorted(set(c for c in colour_of if c >= 0)):
        g = dist.new_group([r for r in range(size) if colour_of[r] == c])
        mine = g if c == colour_of[rank] else mine
    if mine is not None:
        t = gen("f32", 1000, rank * 1000003 + 1 * 7919)
        dist.all_reduce(t, group=mine)
        say(1, t)
    t = gen("f32", 1000, rank * 1000003 + 2 * 7919)
    dist.all_reduce(t)
    say(2, t)
    dist.destroy_process_group()


def torch_sendrecv(dist, rank, size, gen, say):
    """gloo_peer's "sendrecv" program in torch: isend/irecv around a ring,
    an irecv in flight across an all_reduce, recv(src=None)."""
    import torch
    seed = lambda line: rank * 1000003 + line * 7919
    last = size - 1
    inp = torch.zeros(262145, dtype=torch.float32)
    s = dist.isend(gen("f32", 262145, seed(1)), dst=(rank + 1) % size, tag=5)
    v = dist.irecv(inp, src=(rank - 1) % size, tag=5)
    v.wait()
    s.wait()
    say(1, inp)
    late = torch.zeros(1000, dtype=torch.int64)
    v = dist.irecv(late, src=last, tag=11) if rank == 0 else None
    t = gen("f32", 1000, seed(2))
    dist.all_reduce(t)
    say(2, t)
    if rank == last:
        dist.send(gen("i64", 1000, seed(3)), dst=0, tag=11)
    if v is not None:
        v.wait()
        say(3, late)
    if rank == 0:
        blocks = [torch.zeros(1000, dtype=torch.int32) for _ in range(size)]
        for _ in range(1, size):
            got = torch.zeros(1000, dtype=torch.int32)
            blocks[dist.recv(got, src=None, tag=9)] = got
        say(4, *blocks)
    else:
        dist.send(gen("i32", 1000, seed(4)), dst=0, tag=9)
    t = gen("f32", 1000, seed(5))
    dist.all_reduce(t)
    say(5, t)
    dist.destroy_process_group()


# ---- the driver ------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(peer, tmp, size, dtrain, kind, plans, timeout=TIMEOUT_S, modes=None):
    """Starts the ranks; dtrain: the set of ranks that are gloo_peer."""
    if kind == "file":
        url = f"file://{tempfile.mkstemp(dir=tmp, prefix='store-')[1]}"
        os.unlink(url[7:])
    else:
        url = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    procs = []
    for r in range(size):
        plan = plans[r] if isinstance(plans, list) else plans
        t = timeout[r] if isinstance(timeout, list) else timeout
        if r in dtrain:
            cmd = [peer, url, str(r), str(size), plan, str(t)]
        else:
            mode = (modes or {}).get(r, "run")
            cmd = [sys.executable, __file__, "--torch-rank", url, str(r), str(size), plan,
                   str(t), mode]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    return procs


def finish(procs, limit):
    """(returncode, stdout, stderr) of each rank; a rank past limit is killed."""
    out, deadline = [], time.time() + limit
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(0.1, deadline - time.time()))
            out.append((p.returncode, o, e))
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            out.append(("hung", o, e))
    return out


def digests(stdout):
    return [line for line in stdout.splitlines() if line and line[0].isdigit()]


results = {"ok": 0, "not ok": 0}


def report(good, what, detail=""):
    results["ok" if good else "not ok"] += 1
    print(f"{'ok' if good else 'not ok'} - {what}")
    if not good and detail:
        print("#   " + detail.strip().replace("\n", "\n#   ")[:3000])


def main():
    peer = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="torch_gloo-") as tmp:
        plans = {}
        for n in range(2, 6):
            plans[n] = os.path.join(tmp, f"plan{n}")
            with open(plans[n], "w") as f:
                f.write("\n".join(plan_for(n)) + "\n")
        reference = {}
        for n in range(2, 6):
            outs = finish(start_group(peer, tmp, n, set(), "file", plans[n]), 120)
            good = all(rc == 0 for rc, _, _ in outs)
            reference[n] = [digests(o) for _, o, _ in outs]
            report(good and len(reference[n][0]) > 0,
                   f"all-torch group of {n}: {len(reference[n][0])} results per rank",
                   "\n".join(e for _, _, e in outs))
        for n, kind, dtrain in ((2, "file", {0}), (2, "tcp", {1}), (3, "file", {0, 2}),
                                (3, "tcp", {0}), (4, "file", {1, 3}), (4, "tcp", {0, 2}),
                                (5, "file", {0, 1, 2, 4})):
            t0 = time.time()
            outs = finish(start_group(peer, tmp, n, dtrain, kind, plans[n]), 120)
            bad = [f"rank {r} ({'dtrain' if r in dtrain else 'torch'}): exit {rc}, "
                   f"{sum(a != b for a, b in zip(digests(o), reference[n][r]))} of "
                   f"{len(reference[n][r])} differ, {len(digests(o))} printed\n{e}"
                   for r, (rc, o, e) in enumerate(outs) if rc != 0 or digests(o) != reference[n][r]]
            report(not bad, f"{n} ranks over {kind}:// with dtrain at {sorted(dtrain)}: every "
                   f"rank's {len(reference[n][0])} results equal the all-torch group's "
                   f"({time.time() - t0:.1f} s)", "\n".join(bad))
        split(peer, tmp)
        sendrecv(peer, tmp)
        failures(peer, tmp)
        example(peer)
    print(f"# torch_gloo: {results['ok']} passed, {results['not ok']} failed")
    sys.exit(1 if results["not ok"] else 0)


def split(peer, tmp):
    """dt_comm_split as torch's new_group: two mixed groups and a rank in
    none (colour -1), each group's sum and then the world's equal to an
    all-torch job's."""
    plan = "split:0,1,0,1,-1"
    ref = [digests(o) for _, o, _ in finish(start_group(peer, tmp, 5, set(), "file", plan), 120)]
    outs = finish(start_group(peer, tmp, 5, {1, 2, 4}, "file", plan), 120)
    bad = [f"rank {r}: exit {rc}, printed {digests(o)}, torch's {ref[r]}\n{e}"
           for r, (rc, o, e) in enumerate(outs) if rc != 0 or digests(o) != ref[r]]
    report(not bad and len(ref[0]) == 2 and len(ref[4]) == 1,
           "dt_comm_split as new_group: dtrain at [1, 2, 4] in groups [0, 2] and [1, 3] and in "
           "none; the groups' and the world's sums equal the all-torch job's", "\n".join(bad))


def sendrecv(peer, tmp):
    """Tagged send/recv through dtrain's communicator API against torch's
    isend/irecv/recv(src=None): every rank's results equal an all-torch
    job's, with dtrain as the any-source receiver and as senders."""
    for n, kind, dtrain in ((2, "file", {0}), (3, "tcp", {1, 2}), (4, "file", {0, 3})):
        ref = [digests(o) for _, o, _ in
               finish(start_group(peer, tmp, n, set(), kind, "sendrecv"), 120)]
        outs = finish(start_group(peer, tmp, n, dtrain, kind, "sendrecv"), 120)
        bad = [f"rank {r}: exit {rc}, printed {digests(o)}, torch's {ref[r]}\n{e}"
               for r, (rc, o, e) in enumerate(outs) if rc != 0 or digests(o) != ref[r]]
        report(not bad and len(ref[0]) == 5 and len(ref[n - 1]) == 3,
               f"send/recv through dt_comm, {n} ranks over {kind}:// with dtrain at "
               f"{sorted(dtrain)}: ring, a receive in flight across an all_reduce, receive "
               "from any source; every result equals the all-torch job's", "\n".join(bad))


def failures(peer, tmp):
    one = os.path.join(tmp, "one_allreduce")
    with open(one, "w") as f:
        f.write("allreduce f32 sum 1000\n")
    empty = os.path.join(tmp, "empty")
    open(empty, "w").close()
    bcast = os.path.join(tmp, "one_broadcast")
    with open(bcast, "w") as f:
        f.write("broadcast f32 1000 0\n")

    # A dead peer must fail the op at once (its connection closes), not at
    # the op timeout: the message names it ("lost peer N"), never "timed
    # out". (A rank names the peer it waited for, and the first peer whose
    # connection ended if that was another.)
    outs = finish(start_group(peer, tmp, 3, {0, 1}, "file", one, modes={2: "die"}), 60)
    ok = all(rc == 1 and "lost peer 2" in e and "timed out" not in e for rc, _, e in outs[:2])
    report(ok, "a killed torch rank 2: both dtrain ranks fail at once naming peer 2",
           "\n".join(f"{rc}: {e}" for rc, _, e in outs))

    outs = finish(start_group(peer, tmp, 3, {0, 1}, "tcp", [one, empty, one]), 60)
    ok = outs[0][0] == 1 and "lost peer 1" in outs[0][2] and "timed out" not in outs[0][2] \
        and outs[2][0] not in (0, "hung")
    report(ok, "dtrain rank 1 leaves after init: dtrain rank 0 fails at once naming peer 1, the "
           "torch rank fails too", "\n".join(f"{rc}: {e}" for rc, _, e in outs))

    # dt_comm_abort on a dtrain rank ends its running all-reduce and its
    # receive (DT_EABORTED) and closes the group's connections, so the torch
    # ranks' receives fail at once: all within the 40 s this case allows,
    # where the op timeout is 120 s.
    t0 = time.time()
    outs = finish(start_group(peer, tmp, 3, {0}, "tcp", "abort", timeout=120), 40)
    ok = outs[0][0] == 0 and all(rc not in (0, "hung") for rc, _, _ in outs[1:])
    report(ok, f"dt_comm_abort on dtrain rank 0: its running all-reduce and its receive end "
           f"DT_EABORTED, both torch ranks' receives fail at once ({time.time() - t0:.1f} s)",
           "\n".join(f"{rc}: {e}" for rc, _, e in outs))

    # dtrain's op limit is the shorter, so that it is dtrain's own timeout
    # that names the slot: with equal limits torch's could end first, close
    # its connection and have dtrain report the lost peer instead (a race
    # that load decided)
    outs = finish(start_group(peer, tmp, 2, {0}, "file", [one, bcast], timeout=[5, 20]), 40)
    want = "slot 0x0400000000000000 (allreduce, tag 0)"
    ok = outs[0][0] == 1 and want in outs[0][2] and outs[1][0] != "hung"
    report(ok, "a mismatched collective (allreduce vs broadcast): dtrain names the slot and "
           "tag", "\n".join(f"{rc}: {e}" for rc, _, e in outs))


def example(peer):
    """examples/torch_allreduce.py, as docs/13 runs it: 2 Python + 2 C ranks."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    program = os.path.join(os.path.dirname(os.path.dirname(peer)), "examples", "torch-allreduce")
    try:
        out = subprocess.run([sys.executable, os.path.join(root, "examples", "torch_allreduce.py"),
                              program, "4"], capture_output=True, text=True, timeout=120)
        got = sorted(line for line in out.stdout.splitlines() if "rank" in line)
        ok = out.returncode == 0 and len(got) == 4 and all(g.endswith(": 10 10 10 10")
                                                            for g in got)
        detail = out.stdout + out.stderr
    except subprocess.TimeoutExpired:
        ok, detail = False, "hung"
    report(ok, "examples/torch_allreduce.py: Python and C ranks print the same sum", detail)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-rank":
        a = sys.argv[2:]
        torch_rank(a[0], int(a[1]), int(a[2]), a[3], float(a[4]), a[5])
    else:
        main()
