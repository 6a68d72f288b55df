#!/usr/bin/python3
"""torch_backend_bench.py — torch.distributed on "dtrain" against "gloo", same run.

    bench/torch_backend_bench.py BUILD/torch_backend [--ranks 4] [--repeats 3]
        [--ddp-steps 20]

Times, through torch.distributed's own all_reduce (float32, sum) on P ranks
(processes, file:// rendezvous, one thread each):
  - bus bandwidth at 64 MiB: 2(P-1)/P · bytes / time per op, the median of
    5 timed ops after 2 warm-up ones;
  - latency at 4 bytes (one float): time per op over 500 ops back to back
    after 50 warm-up ones, each rank's, the slowest rank reported.
The backends alternate (gloo, dtrain, gloo, dtrain, ...) for --repeats
pairs, each in fresh processes, so that a busy machine slows both alike;
the medians of the repeats are printed as one Markdown table, with the
ratios. Then the torch DDP step of the 865k MiniGPT on both
(tests/torch_ddp.py --time: the median step of each run, AdamW and
ZeroRedundancyOptimizer).
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
    worst = torch.tensor([statistics.median(times), lat], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        t, lat = worst.tolist()
        print(json.dumps({"busbw": 2 * (size - 1) / size * BIG / t / 1e9, "lat_us": lat * 1e6}))
    dist.destroy_process_group()


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module_dir")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ddp-steps", type=int, default=20)
    a = ap.parse_args()
    module_dir = os.path.abspath(a.module_dir)
    got = {"gloo": [], "dtrain": []}
    for _ in range(a.repeats):
        for backend in ("gloo", "dtrain"):
            got[backend].append(one_run(backend, a.ranks, module_dir))
    med = {b: {k: statistics.median(r[k] for r in runs) for k in ("busbw", "lat_us")}
           for b, runs in got.items()}
    print(f"torch.distributed all_reduce, float32 sum, {a.ranks} ranks, "
          f"medians of {a.repeats} interleaved runs\n")
    print("| | gloo | dtrain | dtrain / gloo |")
    print("|---|---|---|---|")
    g, d = med["gloo"], med["dtrain"]
    print(f"| busbw at 64 MiB (GB/s) | {g['busbw']:.2f} | {d['busbw']:.2f} | "
          f"{d['busbw'] / g['busbw']:.2f}x |")
    print(f"| latency at 4 B (us) | {g['lat_us']:.0f} | {d['lat_us']:.0f} | "
          f"{d['lat_us'] / g['lat_us']:.2f}x |")
    here = os.path.dirname(os.path.abspath(__file__))
    sys.stdout.flush()
    subprocess.run([sys.executable, os.path.join(here, "..", "tests", "torch_ddp.py"), module_dir,
                    "--time", "--steps", str(a.ddp_steps), "--ranks", str(a.ranks)], check=False)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
