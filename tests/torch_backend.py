#!/usr/bin/python3
"""torch_backend.py — torch.distributed's "dtrain" backend gives what "gloo" gives.

Usage: torch_backend.py MODULE_DIR DTRAIN_LAUNCH
MODULE_DIR holds the built dtrain_torch module (build/torch_backend).
Each world (2-5 ranks on 127.0.0.1, processes of this script) runs the same
list of cases twice, once on backend "gloo" and once on "dtrain", over
file://, tcp:// and env:// under dtrain-launch (torch 1.13's torchrun
fails on Python 3.11 before it starts a worker). Every rank prints one line per case:
the SHA-256 of its results, or the error it raised. The dtrain world must
print, rank by rank, what the gloo world prints; where gloo refuses an op
(reduce_scatter, alltoall of lists, ReduceOp.AVG, bfloat16 in torch 1.13)
it must print what a plain computation of the same result gives instead.
So it must for non-contiguous tensors: gloo 1.13 reduces or overwrites the
first numel elements of the storage as if the tensor were contiguous
(seen on this torch: all_reduce of base.t()[::2]), where dtrain works on
the view itself.

Inputs are small integers in every dtype (exact in f16 and bf16 too), so
every sum is exact whatever the order: the bound on float sums is 0, every
comparison is bitwise. One case ("allreduce_random") sums random floats;
its bound is stated there.

Then the failures: an unsupported call and a bad argument raise
RuntimeError naming the op; a killed rank and a wrong DT_SECRET give every
survivor a RuntimeError naming the cause within 10 s.
Prints TAP-style "ok"/"not ok" lines, one per op and world; exits 1 if any
failed.
"""
import datetime, hashlib, json, os, signal, socket, subprocess, sys, tempfile, time

WORLD_TIMEOUT_S = 240
FAIL_WITHIN_S = 10.0

# dtypes torch 1.13's gloo reduces; bool and int16 are moved but not reduced
REDUCE_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
MOVE_DTYPES = REDUCE_DTYPES + ["bool", "int16", "complex64"]
GLOO_REFUSES = ["bfloat16", "bool", "int16", "complex64"]  # "Invalid scalar type" in torch 1.13's gloo
INT_DTYPES = ["int8", "uint8", "int32", "int64"]


# ---- a rank --------------------------------------------------------------------

def rank_main(backend, url, rank, size, out_dir):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if backend == "dtrain":
        import dtrain_torch  # noqa: F401  registers the backend
    kw = {} if url == "env://" else {"rank": rank, "world_size": size}
    dist.init_process_group(backend, init_method=url, timeout=datetime.timedelta(seconds=60),
                            **kw)
    rank, size = dist.get_rank(), dist.get_world_size()
    results = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "w")
    for name, fn in cases(torch, dist, rank, size, backend):
        try:
            out = fn()
            if name.startswith("allreduce_random"):
                res = {"values": out[0].tolist()}
            else:
                res = {"sha": digest(torch, out)}
        except RuntimeError as e:
            res = {"error": str(e).splitlines()[0]}
        print(json.dumps(dict(res, case=name)), file=results, flush=True)
    dist.barrier()
    dist.destroy_process_group()


def digest(torch, tensors):
    h = hashlib.sha256()
    for t in tensors:
        t = torch.view_as_real(t) if t.is_complex() else t
        wide = t.double() if t.is_floating_point() else t.long()
        h.update(f"{t.dtype} {list(t.shape)}".encode())
        h.update(wide.contiguous().numpy().tobytes())
    return h.hexdigest()


def gen(torch, dtype, n, rank, seed, prod=False):
    """Small integers: -5..5 (0..10 unsigned, 1..2 for products, 0/1 bool)."""
    i = torch.arange(n, dtype=torch.int64) * 7 + rank * 13 + seed * 3
    if prod:
        v = i % 2 + 1
    elif dtype in ("uint8",):
        v = i % 11
    elif dtype == "bool":
        v = i % 2
    else:
        v = i % 11 - 5
    if dtype == "complex64":
        return torch.complex(v.float(), (v * 3 % 7).float())
    return v.to(getattr(torch, dtype))


def cases(torch, dist, rank, size, backend):
    """(name, fn) pairs; fn returns the tensors whose bits are compared.
    Names are "op/detail": the op names the TAP line."""
    R = dist.ReduceOp
    ops = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX,
           "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}
    g = lambda dt, n, seed=0, prod=False, r=rank: gen(torch, dt, n, r, seed, prod)  # noqa: E731
    everyone = lambda dt, n, seed=0, prod=False: [g(dt, n, seed, prod, r)  # noqa: E731
                                                   for r in range(size)]

    def allreduce(dt, op, n):
        def fn():
            t = g(dt, n, 1, op == "prod")
            if backend == "gloo" and dt == "bfloat16":  # gloo 1.13 refuses bf16
                return [plain_reduce(torch, everyone(dt, n, 1, op == "prod"), op)]
            dist.all_reduce(t, op=ops[op])
            return [t]
        return fn

    for dt in REDUCE_DTYPES:
        for op in ["sum", "prod", "min", "max"] + (["band", "bor", "bxor"] if dt in INT_DTYPES
                                                    else []):
            yield f"allreduce/{dt} {op}", allreduce(dt, op, 1000)
    yield "allreduce/f32 sum 0 elements", allreduce("float32", "sum", 0)
    yield "allreduce/f32 sum 300001", allreduce("float32", "sum", 300001)

    def allreduce_avg():
        t = g("float32", 999, 2)
        if backend == "gloo":  # gloo 1.13 refuses AVG: the sum over the size
            dist.all_reduce(t)
            return [t / size]
        dist.all_reduce(t, op=R.AVG)
        return [t]
    yield "allreduce/f32 avg", allreduce_avg

    def allreduce_noncontiguous():
        base = g("float32", 200, 3).reshape(10, 20)
        view = base.t()[::2]  # a strided view: every other column
        if backend == "gloo":  # gloo reduces the storage's prefix instead
            view.copy_(plain_reduce(torch, [b.reshape(10, 20).t()[::2]
                                            for b in everyone("float32", 200, 3)], "sum"))
            return [base]
        dist.all_reduce(view)
        return [base]
    yield "allreduce/non-contiguous", allreduce_noncontiguous

    def allreduce_random():
        # random floats: the sum's order may differ from gloo's, so the
        # bound is stated: each element within 4·size ulp of float32, below.
        gen_ = torch.Generator().manual_seed(rank)
        t = torch.randn(4096, generator=gen_)
        dist.all_reduce(t)
        return [t]
    yield "allreduce_random/f32 sum", allreduce_random

    def async_works():
        ts = [g("float32", 1000, 10 + j) for j in range(4)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in works:
            w.wait()
        return ts
    yield "async/4 all_reduce then wait", async_works

    def coalesced():
        ts = [g("float32", n, 20 + n) for n in (5, 100, 1)]
        dist.all_reduce_coalesced(ts)
        return ts
    yield "allreduce_coalesced/f32 sum", coalesced

    for dt in MOVE_DTYPES:
        def bcast(dt=dt):
            out = []
            for root in range(size):
                t = g(dt, 77, 30 + root)
                if backend == "gloo" and dt in GLOO_REFUSES:
                    t = g(dt, 77, 30 + root, r=root)
                else:
                    dist.broadcast(t, src=root)
                out.append(t)
            return out
        yield f"broadcast/{dt} from every root", bcast

    def bcast_noncontiguous():
        base = g("int64", 60, 31).reshape(6, 10)
        if backend == "gloo":  # gloo overwrites the storage's prefix instead
            base[:, 1::3] = g("int64", 60, 31, r=size - 1).reshape(6, 10)[:, 1::3]
            return [base]
        dist.broadcast(base[:, 1::3], src=size - 1)
        return [base]
    yield "broadcast/non-contiguous", bcast_noncontiguous

    for dt in ["float32", "int64", "bool", "float16"]:
        def allgather(dt=dt):
            if backend == "gloo" and dt in GLOO_REFUSES:
                return everyone(dt, 33, 40)
            outs = [torch.zeros(33, dtype=getattr(torch, dt)) for _ in range(size)]
            dist.all_gather(outs, g(dt, 33, 40))
            return outs
        yield f"allgather/{dt}", allgather

    def allgather_base():
        out = torch.zeros(size * 50, dtype=torch.int32)
        if backend == "gloo":  # gloo 1.13 has no _allgather_base
            return [torch.cat(everyone("int32", 50, 41))]
        dist._all_gather_base(out, g("int32", 50, 41))
        return [out]
    yield "_allgather_base/i32", allgather_base

    def allgather_coalesced():
        ins = [g("float64", n, 42 + n) for n in (3, 17)]
        outs = [[torch.zeros_like(t) for t in ins] for _ in range(size)]
        dist.all_gather_coalesced(outs, ins)
        return [t for lst in outs for t in lst]
    yield "allgather_coalesced/f64", allgather_coalesced

    def barrier():
        dist.barrier()
        return []
    yield "barrier/", barrier

    def reduce():
        out = []
        for root in range(size):
            t = g("int32", 500, 50 + root)
            dist.reduce(t, dst=root, op=R.MAX)
            if rank == root:  # elsewhere torch leaves the tensor unspecified
                out.append(t)
        return out
    yield "reduce/i32 max to every root", reduce

    def reduce_f16():
        t = g("float16", 500, 51)
        dist.reduce(t, dst=0)
        return [t] if rank == 0 else []
    yield "reduce/f16 sum", reduce_f16

    def gather():
        root = size - 1
        outs = [torch.zeros(21, dtype=torch.float64) for _ in range(size)] if rank == root \
            else None
        dist.gather(g("float64", 21, 60), outs, dst=root)
        return outs or []
    yield "gather/f64", gather

    def scatter():
        out = torch.zeros(19, dtype=torch.int64)
        ins = [g("int64", 19, 70, r=r) for r in range(size)] if rank == 0 else None
        dist.scatter(out, ins, src=0)
        return [out]
    yield "scatter/i64", scatter

    def reduce_scatter():
        ins = [g("float32", 40, 80 + j) for j in range(size)]
        out = torch.zeros(40)
        if backend == "gloo":  # gloo 1.13 has no reduce_scatter
            return [plain_reduce(torch, [gen(torch, "float32", 40, r, 80 + rank)
                                         for r in range(size)], "sum")]
        dist.reduce_scatter(out, ins)
        return [out]
    yield "reduce_scatter/f32 sum", reduce_scatter

    def reduce_scatter_base():
        inp = g("int64", 40 * size, 90)
        out = torch.zeros(40, dtype=torch.int64)
        if backend == "gloo":
            full = plain_reduce(torch, everyone("int64", 40 * size, 90), "max")
            return [full[40 * rank:40 * (rank + 1)]]
        dist._reduce_scatter_base(out, inp, op=R.MAX)
        return [out]
    yield "_reduce_scatter_base/i64 max", reduce_scatter_base

    def alltoall_equal():
        inp = g("float32", 8 * size, 100)
        out = torch.zeros(8 * size)
        dist.all_to_all_single(out, inp)
        return [out]
    yield "alltoall_base/equal", alltoall_equal

    def alltoall_splits():
        # rank r sends j+r+1 rows to rank j; each row 3 wide
        ins = [j + rank + 1 for j in range(size)]
        outs = [rank + j + 1 for j in range(size)]
        inp = g("int32", sum(ins) * 3, 101).reshape(-1, 3)
        out = torch.zeros(sum(outs), 3, dtype=torch.int32)
        dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins)
        return [out]
    yield "alltoall_base/split sizes", alltoall_splits

    def alltoall_list():
        ins = [g("float64", j + 2, 110 + j) for j in range(size)]
        outs = [torch.zeros(rank + 2, dtype=torch.float64) for _ in range(size)]
        if backend == "gloo":  # gloo 1.13 has no alltoall of lists
            return [gen(torch, "float64", rank + 2, j, 110 + rank) for j in range(size)]
        dist.all_to_all(outs, ins)
        return outs
    yield "alltoall/lists", alltoall_list

    def sendrecv():
        if rank == 0:
            for q in range(1, size):
                dist.send(g("float32", 64, 120 + q), dst=q, tag=7)
            return []
        t = torch.zeros(64)
        dist.recv(t, src=0, tag=7)
        return [t]
    yield "send_recv/rank 0 to each", sendrecv

    def recv_any():
        if rank == 0:
            got = []
            for _ in range(1, size):
                t = torch.zeros(16, dtype=torch.int64)
                src = dist.recv(t, tag=9)
                got.append((src, t))
            return [t for _, t in sorted(got, key=lambda p: p[0])] + \
                [torch.tensor([s for s, _ in sorted(got, key=lambda p: p[0])])]
        dist.send(g("int64", 16, 130), dst=0, tag=9)
        return []
    yield "recvAnysource/each to rank 0", recv_any

    def isend_irecv():
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        t = torch.zeros(32)
        reqs = [dist.isend(g("float32", 32, 140), dst=nxt), dist.irecv(t, src=prv)]
        for r in reqs:
            r.wait()
        return [t]
    yield "send_recv/ring of isend and irecv", isend_irecv

    def subgroup():
        evens = list(range(0, size, 2))
        grp = dist.new_group(evens)
        t = g("int64", 100, 150)
        if rank in evens:
            dist.all_reduce(t, group=grp)
        return [t]
    yield "new_group/even ranks all_reduce", subgroup

    def unsupported():  # past torch's Python check, which names gloo
        pg = dist.distributed_c10d._get_default_group()
        pg.monitored_barrier(datetime.timedelta(seconds=30))
        return []
    if backend == "dtrain":  # gloo supports it; dtrain names it
        yield "errors/unsupported op", unsupported

    def bad_dtype():
        t = torch.zeros(4, dtype=torch.bool)
        dist.all_reduce(t)
        return [t]
    if backend == "dtrain":
        yield "errors/reduce a bool", bad_dtype


def plain_reduce(torch, ts, op):
    out = ts[0].clone()
    for t in ts[1:]:
        if op == "sum":
            out = out + t
        elif op == "prod":
            out = out * t
        elif op == "min":
            out = torch.minimum(out, t)
        elif op == "max":
            out = torch.maximum(out, t)
        elif op == "band":
            out = out & t
        elif op == "bor":
            out = out | t
        else:
            out = out ^ t
    return out.to(ts[0].dtype)


# ---- failures ----------------------------------------------------------------------

def failure_rank(mode, url, rank, size, out_dir):
    """mode "kill": the last rank dies after one all_reduce, the others'
    next all_reduce must fail. mode "secret": the last rank has another
    DT_SECRET, and init must fail on every rank."""
    import torch
    import torch.distributed as dist
    import dtrain_torch  # noqa: F401
    report = {"rank": rank}
    t0 = time.time()
    try:
        dist.init_process_group("dtrain", init_method=url, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=60))
        t = torch.ones(1000)
        dist.all_reduce(t)
        if rank == size - 1 and mode == "kill":
            with open(os.path.join(out_dir, "died"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.time()
        for _ in range(3):
            dist.all_reduce(t)
            time.sleep(0.5)
        report["error"] = None
    except RuntimeError as e:
        report["error"] = str(e).splitlines()[0]
    report["at"], report["took"] = time.time(), time.time() - t0
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


# ---- the driver ------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_world(module_dir, size, kind, argv_tail, env_for=None, launcher=None):
    """Starts `size` ranks of this script; returns their Popen objects."""
    env = dict(os.environ, PYTHONPATH=module_dir, OMP_NUM_THREADS="1")
    me = os.path.abspath(__file__)
    if kind == "env":
        cmd = [launcher, "-n", str(size), sys.executable, me] + argv_tail("env://", -1)
        return [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)]
    if kind == "file":
        url = "file://" + tempfile.mktemp(prefix="torch_backend_store_")
    else:
        url = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for r in range(size):
        e = dict(env, **(env_for(r) if env_for else {}))
        procs.append(subprocess.Popen([sys.executable, me] + argv_tail(url, r), env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def finish(procs, timeout):
    logs, deadline = [], time.time() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out = out + b"\n(timed out)"
        logs.append(out.decode(errors="replace"))
    return logs


def run_world(module_dir, launcher, backend, size, kind):
    """Each rank's {case: result}, or a string saying why there is none."""
    out_dir = tempfile.mkdtemp(prefix=f"torch_backend_{backend}_")
    procs = spawn_world(module_dir, size, kind,
                        lambda url, r: ["--rank", backend, url, str(r), str(size), out_dir],
                        launcher=launcher)
    logs = finish(procs, WORLD_TIMEOUT_S)
    per_rank = []
    for r in range(size):
        path = os.path.join(out_dir, f"rank{r}.jsonl")
        if not os.path.exists(path):
            return f"{backend} rank {r} wrote nothing: " + " | ".join(logs)[-2000:]
        per_rank.append({(j := json.loads(line))["case"]: j for line in open(path)})
    return per_rank


def compare_case(name, g, d, size):
    """None if dtrain's result d agrees with gloo's g, else why not."""
    if name.startswith("errors/"):
        want = "monitoredBarrier" if "unsupported" in name else "allreduce"
        if d and d.get("error") and want in d["error"]:
            return None
        return f"wanted a RuntimeError naming {want}, got {d}"
    if g is None or d is None:
        return f"missing: gloo {g}, dtrain {d}"
    if "error" in g or "error" in d:
        return f"gloo {g.get('error', 'ok')}; dtrain {d.get('error', 'ok')}"
    if "values" in g:
        # float32 sums of `size` N(0,1) values in another order: within
        # 4·size ulp of the larger magnitude (2^-23 relative each).
        worst = max(abs(a - b) / max(abs(a), abs(b), 1.0) for a, b in zip(g["values"], d["values"]))
        return None if worst <= 4 * size * 2 ** -23 else f"relative difference {worst:.3g}"
    return None if g["sha"] == d["sha"] else "results differ"


def check_world(module_dir, launcher, size, kind, tap):
    gloo = run_world(module_dir, launcher, "gloo", size, kind)
    dtrain = run_world(module_dir, launcher, "dtrain", size, kind)
    where = f"{size} ranks, {kind}://"
    if isinstance(gloo, str) or isinstance(dtrain, str):
        tap(False, f"world of {where}: " + (gloo if isinstance(gloo, str) else dtrain))
        return
    ops = {}
    for name in dtrain[0]:
        op = name.split("/")[0]
        for r in range(size):
            why = compare_case(name, gloo[r].get(name), dtrain[r].get(name), size)
            if why:
                ops.setdefault(op, []).append(f"{name} on rank {r}: {why}")
        ops.setdefault(op, [])
    for op, bad in ops.items():
        tap(not bad, f"{op} on {where} gives what gloo gives" + ("" if not bad else
                                                                 ": " + "; ".join(bad[:3])))


def check_failure(module_dir, mode, tap):
    size = 3
    out_dir = tempfile.mkdtemp(prefix=f"torch_backend_{mode}_")
    secret = lambda r: {"DT_SECRET": "ab" * 16 if r < size - 1 else "cd" * 16}  # noqa: E731
    procs = spawn_world(module_dir, size, "file",
                        lambda url, r: ["--fail", mode, url, str(r), str(size), out_dir],
                        env_for=secret if mode == "secret" else None)
    logs = finish(procs, 120)
    survivors = range(size - 1) if mode == "kill" else range(size)
    died = float(open(os.path.join(out_dir, "died")).read()) if mode == "kill" and \
        os.path.exists(os.path.join(out_dir, "died")) else None
    bad = []
    for r in survivors:
        path = os.path.join(out_dir, f"rank{r}.json")
        if not os.path.exists(path):
            bad.append(f"rank {r} reported nothing: {logs[r][-600:]}")
            continue
        rep = json.load(open(path))
        took = rep["at"] - died if died else rep["took"]
        cause = f"rank {size - 1}" if mode == "kill" else "secret"
        if not rep["error"] or cause not in rep["error"].lower().replace("dt_secret", "secret"):
            bad.append(f"rank {r}: wanted a RuntimeError naming {cause}, got {rep['error']}")
        elif took > FAIL_WITHIN_S:
            bad.append(f"rank {r}: the error came after {took:.1f} s")
    what = "a killed rank" if mode == "kill" else "a wrong DT_SECRET"
    tap(not bad, f"{what} gives every survivor a RuntimeError naming the cause within "
                 f"{FAIL_WITHIN_S:.0f} s" + ("" if not bad else ": " + "; ".join(bad)))
    if bad:
        print("\n".join("# " + line for line in "\n".join(logs).splitlines()[-40:]))


def main():
    module_dir, launcher = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    failed = []

    def tap(ok, text):
        print(("ok - " if ok else "not ok - ") + text, flush=True)
        if not ok:
            failed.append(text)

    only = os.environ.get("TORCH_BACKEND_WORLDS")  # e.g. "2:file" while developing
    worlds = [(2, "file"), (3, "tcp"), (4, "env"), (5, "file")]
    if only:
        worlds = [(int(w.split(":")[0]), w.split(":")[1]) for w in only.split(",")]
    for size, kind in worlds:
        check_world(module_dir, launcher, size, kind, tap)
    for mode in ("kill", "secret"):
        check_failure(module_dir, mode, tap)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        backend, url, rank, size, out_dir = sys.argv[2:7]
        if rank == "-1":
            rank = os.environ["RANK"]
        rank_main(backend, url, int(rank), int(size), out_dir)
    elif len(sys.argv) > 1 and sys.argv[1] == "--fail":
        mode, url, rank, size, out_dir = sys.argv[2:7]
        failure_rank(mode, url, int(rank), int(size), out_dir)
    else:
        sys.exit(main())
