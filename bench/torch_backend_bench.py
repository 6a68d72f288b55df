#!/usr/bin/python3
"""torch_backend_bench.py — torch.distributed on "dtrain" against "gloo", same run.

    bench/torch_backend_bench.py BUILD/torch_backend [--ranks 4] [--repeats 3]
        [--ddp-steps 20]

Times, through torch.distributed's own ops on P ranks (processes, file://
rendezvous, one thread each):
  - all_reduce (float32, sum) bus bandwidth at 64 MiB: 2(P-1)/P · bytes /
    time per op, the median of 5 timed ops after 2 warm-up ones;
  - all_reduce latency at 4 bytes (one float): time per op over 500 ops
    back to back after 50 warm-up ones;
  - ZeroRedundancyOptimizer's parameter broadcasts: what its step sends
    after the local update on the 865k MiniGPT, one async broadcast per
    parameter (45, 512 B to 256 KiB, 2.6 MB in all) from its owner, then
    a wait on each; the median of 30 rounds after 5 warm-up ones;
  - the torch DDP step of the 865k MiniGPT with AdamW and with
    ZeroRedundancyOptimizer(AdamW) (tests/torch_ddp.py's ranks, --ddp-steps
    steps): each rank's median step after 2 warm-up steps.
Every figure is the slowest rank's. The backends alternate (gloo, dtrain,
gloo, dtrain, ...) for --repeats pairs, each in fresh processes, so that a
busy machine slows both alike; the medians of the repeats are printed as
one Markdown table, with the ratios, and the load average over the run.
"""
import argparse, datetime, json, os, statistics, subprocess, sys, tempfile, time

BIG = 64 << 20


def rank_main(backend, url, rank, size):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if backend == "dtrain":
        import dtrain_torch  # noqa: F401
    dist.init_process_group(backend, init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=300))
    big = torch.ones(BIG // 4)
    times = []
    for i in range(7):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(big)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    small = torch.ones(1)
    for _ in range(50):
        dist.all_reduce(small)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(500):
        dist.all_reduce(small)
    lat = (time.perf_counter() - t0) / 500
    bcast = zero_broadcasts(torch, dist, size)
    worst = torch.tensor([statistics.median(times), lat, bcast], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        t, lat, bcast = worst.tolist()
        print(json.dumps({"busbw": 2 * (size - 1) / size * BIG / t / 1e9, "lat_us": lat * 1e6,
                          "bcast_ms": bcast * 1e3}))
    dist.destroy_process_group()


def zero_broadcasts(torch, dist, size):
    """ZeroRedundancyOptimizer._sync_params on the 865k MiniGPT, seconds a round."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
    from minigpt_torch import MiniGPT
    params = [p.data for p in MiniGPT(256, 64, 4, 4, 128).parameters()]
    times = []
    for i in range(35):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.broadcast(p, src=j % size, async_op=True) for j, p in enumerate(params)]
        for w in works:
            w.wait()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def one_run(backend, size, module_dir):
    d = tempfile.mkdtemp(prefix="torch_backend_bench_")
    url = "file://" + os.path.join(d, "store")
    env = dict(os.environ, PYTHONPATH=module_dir, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", backend, url,
                               str(r), str(size)], env=env, stdout=subprocess.PIPE, text=True)
             for r in range(size)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"{backend}: a rank failed: {outs}")
    return json.loads(outs[0].strip().splitlines()[-1])


def ddp_step(backend, optimizer, size, steps, module_dir):
    """The slowest rank's median DDP step (ms), tests/torch_ddp.py's ranks."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests"))
    import torch_ddp
    runs = torch_ddp.run(backend, optimizer, size, steps, module_dir)
    return max(statistics.median(s["ms"] for s in r[2:]) for r in runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module_dir")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ddp-steps", type=int, default=20)
    a = ap.parse_args()
    module_dir = os.path.abspath(a.module_dir)
    got = {"gloo": [], "dtrain": []}
    loads = [os.getloadavg()[0]]
    for _ in range(a.repeats):
        for backend in ("gloo", "dtrain"):
            r = one_run(backend, a.ranks, module_dir)
            for opt in ("adamw", "zero"):
                r["ddp_" + opt] = ddp_step(backend, opt, a.ranks, a.ddp_steps, module_dir)
            got[backend].append(r)
            loads.append(os.getloadavg()[0])
    keys = ("busbw", "lat_us", "bcast_ms", "ddp_adamw", "ddp_zero")
    med = {b: {k: statistics.median(r[k] for r in runs) for k in keys} for b, runs in got.items()}
    print(f"torch.distributed on {a.ranks} ranks, medians of {a.repeats} interleaved runs, "
          f"the slowest rank's; 1-minute load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| | gloo | dtrain | dtrain / gloo |")
    print("|---|---|---|---|")
    rows = [("all_reduce busbw at 64 MiB (GB/s)", "busbw", "{:.2f}"),
            ("all_reduce at 4 B (µs)", "lat_us", "{:.0f}"),
            ("ZeroRedundancyOptimizer's 45 broadcasts, 865k (ms)", "bcast_ms", "{:.1f}"),
            ("DDP step, 865k, AdamW (ms)", "ddp_adamw", "{:.1f}"),
            ("DDP step, 865k, ZeroRedundancyOptimizer (ms)", "ddp_zero", "{:.1f}")]
    g, d = med["gloo"], med["dtrain"]
    for title, k, f in rows:
        print(f"| {title} | {f.format(g[k])} | {f.format(d[k])} | {d[k] / g[k]:.2f}x |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
