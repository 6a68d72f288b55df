#!/usr/bin/env python3
"""step_limit.py - how close one MiniGPT training step comes to the machine's limit,
dtrain beside PyTorch, on 1 thread and on every core.

    bench/step_limit.py BUILD/bench/minigpt-bench [--configs seed,865k,v512,gpt2]
        [--threads 1,all] [--repeats 3] [--steps N]

For each config and thread count it runs, alternately in fresh processes,
--repeats times: minigpt-bench (which also times sgemm's peak on the same
threads, right after its steps) and the same model in PyTorch 1.13
(model/minigpt_torch.py). On more than one thread PyTorch runs twice each
repeat, once with N threads set and once with its defaults (no thread
variables, no set_num_threads), and its faster median counts. Every side
gets OPENBLAS_NUM_THREADS and OMP_NUM_THREADS equal to its thread count
(PyTorch otherwise quietly takes every core).

One row per (config, threads): medians with [min-max] over the repeats of
each side's ms/step, dtrain's GFLOP/s, each side's MFU (the step's model
FLOPs over the median sgemm peak measured in the same repeats), and
PyTorch's time over dtrain's (above 1: dtrain is faster). FLOPs are the
usual count (model/layout.c, dt_config_flops_per_step): 6 x matmul weights
(lm_head included, embeddings not) x tokens, plus full attention, 12 x L x
T x C per token forward and backward.

Needs python3-torch (Debian's) for the PyTorch side. The CPU's model name
is printed first: figures move between CPUs of the same machine kind.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH = os.path.join(HERE, "torch_compare.py")
CONFIGS = {  # name: V, C, H, L, T, B
    "seed": (64, 32, 4, 2, 16, 4),
    "865k": (256, 128, 4, 4, 64, 8),
    "v512": (512, 256, 8, 4, 128, 8),
    "gpt2": (50257, 768, 12, 2, 256, 4),
}


def flops_per_step(V, C, H, L, T, B):
    tokens = B * T
    weights = L * 12.0 * C * C + V * C
    return 6.0 * weights * tokens + L * tokens * 4.0 * T * C * 3.0


def cpu_name():
    """The model name, family and model (which tell Zen 3 from Zen 4 where the
    name does not), and the widest vector unit."""
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    except OSError:
        return "unknown CPU"
    flags = info.get("flags", "").split()
    vec = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} "
            f"model {info.get('model', '?')}, {vec})")


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"step_limit: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr}")
    return dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)


def thread_env(n):
    env = dict(os.environ)
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if n:
            env[k] = str(n)
        else:
            env.pop(k, None)
    return env


def spread(xs):
    d = 3 if statistics.median(xs) < 10 else 1
    return f"{statistics.median(xs):9.{d}f} [{min(xs):.{d}f}-{max(xs):.{d}f}]"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", help="path to minigpt-bench")
    p.add_argument("--configs", default="seed,865k,v512,gpt2")
    p.add_argument("--threads", default="1,all", help="comma list; 'all' = every core")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=0, help="timed steps (default: by size)")
    a = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"CPU: {cpu_name()}, {cores} cores; {a.repeats} interleaved repeats, "
          "medians [min-max]")
    print(f"{'config':7} {'thr':>3} {'dtrain ms/step':>24} {'GFLOP/s':>8} {'MFU':>5} "
          f"{'PyTorch ms/step':>24} {'MFU':>5} {'torch/dtrain':>12}  {'peak':>6}")
    for name in a.configs.split(","):
        V, C, H, L, T, B = CONFIGS[name]
        fl = flops_per_step(V, C, H, L, T, B)
        steps = a.steps or max(4, min(200, int(2e10 / fl)))
        warm = max(1, steps // 10)
        shape = ["-V", str(V), "-C", str(C), "-H", str(H), "-L", str(L), "-T", str(T),
                 "-B", str(B)]
        for tspec in a.threads.split(","):
            n = cores if tspec == "all" else int(tspec)
            c_ms, peaks, t_ms, d_ms = [], [], [], []
            for _ in range(a.repeats):
                c = run([a.bench] + shape + ["-n", str(steps), "-w", str(warm), "-t", str(n),
                                             "-p", "1"], thread_env(n))
                c_ms.append(float(c["ms_per_step"]))
                peaks.append(float(c["peak_gflops"]))
                tw = [sys.executable, TORCH, "--torch-worker"] + shape + \
                    ["--steps", str(steps), "--warmup", str(warm)]
                t_ms.append(float(run(tw + ["--threads", str(n)], thread_env(n))["ms_per_step"]))
                if n > 1:  # PyTorch left to its defaults
                    d_ms.append(float(run(tw + ["--threads", "0"], thread_env(0))["ms_per_step"]))
            peak = statistics.median(peaks)
            best = t_ms
            if d_ms and statistics.median(d_ms) < statistics.median(t_ms):
                best = d_ms
            cm, tm = statistics.median(c_ms), statistics.median(best)
            mfu = lambda ms: fl / (ms * 1e-3) * 1e-9 / peak
            tag = " (defaults)" if best is d_ms else ""
            print(f"{name:7} {n:>3} {spread(c_ms):>24} {fl / cm * 1e-6:8.1f} {mfu(cm):5.0%} "
                  f"{spread(best):>24} {mfu(tm):5.0%} {tm / cm:11.2f}x  {peak:6.1f}{tag}",
                  flush=True)


if __name__ == "__main__":
    main()
