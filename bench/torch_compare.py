#!/usr/bin/env python3
"""torch_compare.py - MiniGPT training-step speed: dtrain's C model vs PyTorch.

    bench/torch_compare.py BUILD/bench/minigpt-bench [-V 64 -C 32 -H 4 -L 2
        -T 16 -B 4] [--pairs 3] [--steps N] [--warmup N] [--precision bf16]

Runs the same configuration alternately - C, PyTorch, C, PyTorch, ... for
--pairs pairs, each in a fresh process - so that a busy or throttled
machine slows both sides alike, then prints the median ms/step of each
side and the ratio (PyTorch / C: above 1 means the C model is faster).

One step is forward with loss, zeroing gradients, backward and an AdamW
update (lr 1e-3, PyTorch's defaults) on a fixed random batch, single
threaded on both sides (OPENBLAS_NUM_THREADS=1 and -t 1 for C;
torch.set_num_threads(1) and OMP_NUM_THREADS=1 for PyTorch). Each run
reports the median of its step times after a warm-up.

--precision bf16 times dtrain's `minigpt-bench --precision bf16` against
PyTorch's forward and loss under torch.cpu.amp.autocast(dtype=torch.bfloat16)
(fp32 parameters, gradients and AdamW state on both sides; backward and
the update outside autocast, as PyTorch's recipe has them).

Needs python3-torch (Debian's) for the PyTorch side; the C side is the
minigpt-bench executable built by meson.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

CONFIG = [("V", 64), ("C", 32), ("H", 4), ("L", 2), ("T", 16), ("B", 4)]


def torch_worker(a):
    """Times the PyTorch model in this process; prints minigpt-bench's line."""
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "model"))
    from minigpt_torch import MiniGPT
    if a.threads > 0:  # 0: PyTorch's own defaults
        torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    model = MiniGPT(a.V, a.T, a.L, a.H, a.C)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, a.V, (a.B, a.T))
    y = torch.randint(0, a.V, (a.B, a.T))
    times = []
    bf16 = a.precision == "bf16"
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with torch.cpu.amp.autocast(enabled=bf16, dtype=torch.bfloat16):
            _, loss = model(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"ms_per_step={med * 1e3:.4f} tok_per_s={a.B * a.T / med:.0f} "
          f"backend=torch-{torch.__version__} threads={torch.get_num_threads()} "
          f"precision={'bf16-autocast' if bf16 else 'fp32'} "
          f"loss={loss.item():.4f}")


def run(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True,
                         text=True).stdout
    m = re.search(r"ms_per_step=([0-9.]+)", out)
    if not m:
        sys.exit(f"no ms_per_step in the output of {cmd[0]}: {out!r}")
    return float(m.group(1)), out.strip()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", nargs="?", help="path to minigpt-bench")
    for k, v in CONFIG:
        p.add_argument("-" + k, type=int, default=v)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=0,
                   help="timed steps per run (default: ~2 s of C steps)")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args()
    tokens = a.B * a.T
    if a.steps == 0:  # enough steps for a stable median, bounded in time
        a.steps = max(20, min(2000, 400000 // max(1, tokens * a.L)))
    if a.warmup == 0:
        a.warmup = max(3, a.steps // 10)
    if a.torch_worker:
        return torch_worker(a)
    if not a.bench:
        p.error("the path to minigpt-bench is required")

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    cfg = [f"-{k}" for k, _ in CONFIG]
    vals = [str(getattr(a, k)) for k, _ in CONFIG]
    flags = [x for pair in zip(cfg, vals) for x in pair]
    c_cmd = [a.bench] + flags + ["-n", str(a.steps), "-w", str(a.warmup),
                                 "-t", "1", "--precision", a.precision]
    t_cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker"] + \
        flags + ["--steps", str(a.steps), "--warmup", str(a.warmup),
                 "--precision", a.precision]
    print("config: " + " ".join(flags) + f"  steps={a.steps} "
          f"warmup={a.warmup} pairs={a.pairs} precision={a.precision} (1 thread each)")
    c_ms, t_ms = [], []
    for i in range(a.pairs):
        ms, line = run(c_cmd, env)
        c_ms.append(ms)
        print(f"  C     {i + 1}: {line}")
        ms, line = run(t_cmd, env)
        t_ms.append(ms)
        print(f"  torch {i + 1}: {line}")
    c_med, t_med = statistics.median(c_ms), statistics.median(t_ms)
    print(f"median ms/step: C {c_med:.4f}  PyTorch {t_med:.4f}  "
          f"ratio PyTorch/C {t_med / c_med:.2f}x")


if __name__ == "__main__":
    main()
