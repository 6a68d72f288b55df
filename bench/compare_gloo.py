#!/usr/bin/env python3
"""compare_gloo.py — dtrain's collectives against Gloo's, side by side.

    python3 bench/compare_gloo.py --build build -c allreduce --pairs 3
    python3 bench/compare_gloo.py --build build -c allgather,broadcast -b 1K -e 64M -f 16
    python3 bench/compare_gloo.py --build build -c allreduce --dtrain-wire gloo

Runs dtrain-bench and gloo-bench alternately (A B A B ..., --pairs times)
with the same ranks, sizes, dtype and iteration counts, so slow drift of a
shared machine hits both alike, then prints per size the median time and
busbw of each and the ratios dtrain/Gloo:

    lat_ratio    dtrain time / Gloo time     (< 1: dtrain faster)
    busbw_ratio  dtrain busbw / Gloo busbw   (> 1: dtrain faster)

After each pair it also runs loopback-streams (one TCP stream per rank to
its ring neighbour, all at once) and prints the median per-stream GB/s: the
ceiling for a ring collective's busbw on this machine.

Standard library only. The binaries are found under BUILD/bench/ (or given
with --dtrain, --gloo, --streams).
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="meson build directory (default build)")
    ap.add_argument("--dtrain", help="dtrain-bench binary (default BUILD/bench/dtrain-bench)")
    ap.add_argument("--gloo", help="gloo-bench binary (default BUILD/bench/gloo-bench)")
    ap.add_argument("--streams", help="loopback-streams binary "
                    "(default BUILD/bench/loopback-streams)")
    ap.add_argument("-c", "--collectives", default="allreduce",
                    help="comma-separated: allreduce,reduce_scatter,allgather,broadcast,"
                    "barrier,alltoall (default allreduce)")
    ap.add_argument("-b", "--minbytes", default="4", help="smallest size (default 4)")
    ap.add_argument("-e", "--maxbytes", default="64M", help="largest size (default 64M)")
    ap.add_argument("-f", "--stepfactor", default="4", help="size factor (default 4)")
    ap.add_argument("-d", "--datatype", default="f32", help="f32 or f64 (default f32)")
    ap.add_argument("-n", "--iters", default="20", help="timed ops per size (default 20)")
    ap.add_argument("-w", "--warmup", default="5", help="warm-up ops per size (default 5)")
    ap.add_argument("--ranks", type=int, default=4, help="local ranks (default 4)")
    ap.add_argument("--pairs", type=int, default=3, help="A B pairs, at least 3 (default 3)")
    ap.add_argument("--dtrain-algo", default=None, help="force dtrain's --algo")
    ap.add_argument("--dtrain-wire", default=None, choices=["dtrain", "gloo"],
                    help="dtrain-bench --wire: dtrain's own (default) or gloo's")
    ap.add_argument("--gloo-algo", default=None, help="gloo-bench --algo (ring or bcube)")
    ap.add_argument("--stream-mib", default="256", help="MiB per loopback stream (default 256)")
    ap.add_argument("--no-streams", action="store_true", help="skip the loopback reference")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    a = ap.parse_args()
    if a.pairs < 3:
        ap.error("--pairs %d: at least 3 pairs are needed for a median worth reading" % a.pairs)
    bench_dir = os.path.join(a.build, "bench")
    a.dtrain = a.dtrain or os.path.join(bench_dir, "dtrain-bench")
    a.gloo = a.gloo or os.path.join(bench_dir, "gloo-bench")
    a.streams = a.streams or os.path.join(bench_dir, "loopback-streams")
    for path in [a.dtrain, a.gloo] + ([] if a.no_streams else [a.streams]):
        if not os.access(path, os.X_OK):
            ap.error("%s is not an executable; build first (gloo-bench needs libgloo-dev)"
                     % path)
    return a


def run(cmd, timeout):
    """stdout of cmd; exits with its stderr when it fails."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        sys.exit("compare_gloo: %s failed (exit %d):\n%s%s" % (
            shlex.join(cmd), p.returncode, p.stdout[-2000:], p.stderr[-2000:]))
    return p.stdout


def parse_rows(text):
    """{size: (time_us, busbw_GBps)} from a bench table."""
    rows = {}
    for line in text.splitlines():
        cols = line.split()
        if not cols or cols[0].startswith("#") or len(cols) != 8:
            continue
        rows[int(cols[0])] = (float(cols[4]), float(cols[6]))
    return rows


def stream_gbps(a):
    out = run([a.streams, "-n", str(a.ranks), "-s", a.stream_mib], a.timeout)
    for line in out.splitlines():
        if line.startswith("per_stream_GBps"):
            cols = line.split()
            return float(cols[cols.index("mean") + 1])
    sys.exit("compare_gloo: no per_stream_GBps line from loopback-streams:\n" + out)


def commands(a, collective):
    common = ["--ranks", str(a.ranks), "-c", collective, "-b", a.minbytes, "-e", a.maxbytes,
              "-f", a.stepfactor, "-d", a.datatype, "-n", a.iters, "-w", a.warmup]
    dtrain = [a.dtrain] + common + (["--algo", a.dtrain_algo] if a.dtrain_algo else [])
    dtrain += ["--wire", a.dtrain_wire] if a.dtrain_wire else []
    gloo = [a.gloo] + common + (["--algo", a.gloo_algo] if a.gloo_algo else [])
    return dtrain, gloo


def ratio(x, y):
    return "%.2f" % (x / y) if y > 0 else "-"


def compare(a, collective):
    dtrain_cmd, gloo_cmd = commands(a, collective)
    print("# %s: %d pairs, A = %s" % (collective, a.pairs, shlex.join(dtrain_cmd)))
    print("#   B = %s" % shlex.join(gloo_cmd))
    samples = {"dtrain": {}, "gloo": {}}
    streams = []
    for i in range(a.pairs):
        for name, cmd in (("dtrain", dtrain_cmd), ("gloo", gloo_cmd)):
            for size, row in parse_rows(run(cmd, a.timeout)).items():
                samples[name].setdefault(size, []).append(row)
        if not a.no_streams:
            streams.append(stream_gbps(a))
        print("#   pair %d of %d done" % (i + 1, a.pairs), file=sys.stderr, flush=True)
    print("# %10s %11s %11s %9s %12s %12s %11s" % ("size", "dtrain_us", "gloo_us", "lat_ratio",
          "dtrain_busbw", "gloo_busbw", "busbw_ratio"))
    for size in sorted(set(samples["dtrain"]) & set(samples["gloo"])):
        med = {}
        for name in samples:
            rows = samples[name][size]
            med[name] = (statistics.median(r[0] for r in rows),
                         statistics.median(r[1] for r in rows))
        (dt_us, dt_bw), (gl_us, gl_bw) = med["dtrain"], med["gloo"]
        # busbw is factor * size / time with one factor per collective, so
        # the ratio of median busbws is the inverse ratio of median times
        # (exact for an odd count of pairs), unrounded even where the
        # printed busbw is 0.000. A barrier moves no bytes: no busbw ratio.
        bw_ratio = ratio(gl_us, dt_us) if collective != "barrier" else "-"
        print("%12d %11.1f %11.1f %9s %12.3f %12.3f %11s" % (
            size, dt_us, gl_us, ratio(dt_us, gl_us), dt_bw, gl_bw, bw_ratio))
    if streams:
        print("# loopback reference: %d concurrent TCP streams (rank r -> r+1), per-stream "
              "GB/s median %.3f (runs: %s)" % (a.ranks, statistics.median(streams),
                                               " ".join("%.3f" % s for s in streams)))
    print(flush=True)


def main():
    a = parse_args()
    for collective in a.collectives.split(","):
        compare(a, collective.strip())


if __name__ == "__main__":
    main()
