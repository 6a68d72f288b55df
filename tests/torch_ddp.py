#!/usr/bin/python3
"""torch_ddp.py — torch DDP trains the PyTorch MiniGPT on backend "dtrain".

Usage: torch_ddp.py MODULE_DIR [--steps N] [--ranks P] [--time]
MODULE_DIR holds the built dtrain_torch module (build/torch_backend).
Trains the 865k configuration (V=256 C=128 H=4 L=4 T=64, 8 sequences a
rank) of model/minigpt_torch.py for 50 steps on 4 ranks (processes,
file:// rendezvous), wrapped in DistributedDataParallel, with AdamW, and
again with torch.distributed.optim.ZeroRedundancyOptimizer around AdamW;
each run once on backend "gloo" and once on "dtrain". Checks, for both
optimizers:
  - on "dtrain", every rank's parameters are bitwise identical after
    every step (each rank hashes its parameters after each step);
  - every rank's loss at every step is within 1e-4 relative of the same
    rank's loss at that step on "gloo".
Prints one TAP-style "ok"/"not ok" line per check; exits 1 if any failed.
With --time, also prints each run's median step time (ms) and exits 0:
what bench/torch_backend_bench.py reports.
"""
import argparse, datetime, hashlib, json, os, statistics, subprocess, sys, tempfile, time

LOSS_RTOL = 1e-4
V, C, H, L, T, B = 256, 128, 4, 4, 64, 8


def rank_main(backend, optimizer, url, rank, size, steps, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "model"))
    from minigpt_torch import MiniGPT
    if backend == "dtrain":
        import dtrain_torch  # noqa: F401
    dist.init_process_group(backend, init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(1337 + rank)  # DDP must make every replica rank 0's
    model = DDP(MiniGPT(V, T, L, H, C))
    if optimizer == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(7 + rank)  # each rank its own batches
    log = open(out, "w")
    for step in range(steps):
        x = torch.randint(0, V, (B, T), generator=data)
        y = torch.randint(0, V, (B, T), generator=data)
        t0 = time.perf_counter()
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        h = hashlib.sha256()
        for p in model.parameters():
            h.update(p.detach().numpy().tobytes())
        print(json.dumps({"step": step, "loss": loss.item(), "params": h.hexdigest(), "ms": ms}),
              file=log, flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run(backend, optimizer, size, steps, module_dir):
    out_dir = tempfile.mkdtemp(prefix=f"torch_ddp_{backend}_{optimizer}_")
    url = "file://" + os.path.join(out_dir, "store")
    env = dict(os.environ, PYTHONPATH=module_dir, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", backend,
                               optimizer, url, str(r), str(size), str(steps),
                               os.path.join(out_dir, f"rank{r}.jsonl")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(size)]
    logs = [p.communicate(timeout=1200)[0].decode(errors="replace") for p in procs]
    runs = []
    for r in range(size):
        path = os.path.join(out_dir, f"rank{r}.jsonl")
        lines = [json.loads(x) for x in open(path)] if os.path.exists(path) else []
        if len(lines) != steps:
            raise RuntimeError(f"{backend}/{optimizer} rank {r} ran {len(lines)} of {steps} "
                               f"steps: {logs[r][-1500:]}")
        runs.append(lines)
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module_dir")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--time", action="store_true")
    a = ap.parse_args()
    module_dir = os.path.abspath(a.module_dir)
    failed = 0

    def tap(ok, text):
        nonlocal failed
        failed += not ok
        print(("ok - " if ok else "not ok - ") + text, flush=True)

    for optimizer in ("adamw", "zero"):
        what = "DDP + " + ("ZeroRedundancyOptimizer(AdamW)" if optimizer == "zero" else "AdamW")
        try:
            gloo = run("gloo", optimizer, a.ranks, a.steps, module_dir)
            dtrain = run("dtrain", optimizer, a.ranks, a.steps, module_dir)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            tap(False, f"{what}: {e}")
            continue
        if a.time:
            for name, r in (("gloo", gloo), ("dtrain", dtrain)):
                ms = statistics.median(s["ms"] for s in r[0][2:])
                print(f"{what} on {name}: median step {ms:.1f} ms ({a.ranks} ranks)")
        diverged = [(s, r) for s in range(a.steps) for r in range(1, a.ranks)
                    if dtrain[r][s]["params"] != dtrain[0][s]["params"]]
        tap(not diverged, f"{what} on dtrain: every rank's parameters bitwise identical "
                          f"after each of {a.steps} steps" +
            (f": rank {diverged[0][1]} differs after step {diverged[0][0]}" if diverged else ""))
        worst = max(abs(d["loss"] - g["loss"]) / abs(g["loss"])
                    for dr, gr in zip(dtrain, gloo) for d, g in zip(dr, gr))
        tap(worst <= LOSS_RTOL, f"{what}: losses on dtrain within {LOSS_RTOL:g} relative of "
                                f"gloo's at every step and rank (worst {worst:.2g})")
    return 0 if a.time else (1 if failed else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        backend, optimizer, url, rank, size, steps, out = sys.argv[2:9]
        rank_main(backend, optimizer, url, int(rank), int(size), int(steps), out)
    else:
        sys.exit(main())
