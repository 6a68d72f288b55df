#!/usr/bin/env python3
"""tp_volume.py — bytes per step of data, tensor and pipeline parallelism:
measured by the transport, beside the closed form.

    python3 bench/tp_volume.py --build build
    python3 bench/tp_volume.py --build build --shapes tp2,tp4 --steps 6 -- --layers 4
    python3 bench/tp_volume.py --build build --world 8 --shapes tp2xpp2,dp2xtp2xpp2
    python3 bench/tp_volume.py --build build --shapes pp2,pp3,pp4 -- --layers 4

For each shape (dp2, tp2, tp4, dp2xtp2, pp2xdp2 by default: those that fit
--world ranks) it runs `dtrain-launch -n W minigpt ...` for a few steps with
--metrics, and reads from the JSONL what every rank's communicators sent in
the last step (the summary's "last_step_bytes_sent_by_rank": payload bytes
as dt_comm_traffic counts them, frame headers not included) and rank 0's
median tokens/s over the steps after the first. Beside each it prints the
closed form, computed here from the model's shape alone, term by term:

  dp (DDP)     one all-reduce of the Ψ gradients per step (one bucket:
               the models here are far below 25 MB) and one of the loss
  tp (Megatron) per micro-step 2L + 1 all-reduces of B·T·C floats
               forward (g after each row-parallel matmul, the vocabulary-
               split embedding) and 2L + 1 backward (f before each
               column-parallel matmul, the head's); the parallel
               cross-entropy's all-reduces of B·T row maxima and 2·B·T
               sums and target logits; per step the all-gather of the
               shares (the trainer assembles the whole model for
               evaluation); with dp, the all-reduce of the share's
               gradients and of the loss over the replicas
  pp           per micro-batch B·T·C floats of activations forward and as
               many gradients backward across each stage boundary; the
               stage's gradient all-reduce over its replicas; the loss:
               an all-reduce over the last stage's replicas, then its
               broadcast from the last stage down the pipeline (a binomial
               tree: from 4 stages on, inner stages pass it on too)
  3-D          tp inside each stage: per micro-batch 2 all-reduces of
               B·T·C per block of the stage forward and 2 backward, the
               embedding's on the first stage, the head's and the
               cross-entropy's on the last; pp between the stages, each tp
               rank sending its own copy of the activations to its
               counterpart; the all-reduce of the stage's part of the
               share over the replicas, and the loss; no all-gather of the
               shares in a step (the trainer assembles the model only for
               evaluation)

An all-reduce's bytes per rank are the algorithm's that dtrain really runs
(collectives/algorithms/algo_select.c): at most 64 KiB, recursive doubling,
log2 p times the buffer; above, the ring, 2 (p-1)/p of it. The textbook
(Megatron's, every all-reduce a ring) is the last column: at p = 4 small
activations cost 2 n by recursive doubling instead of the ring's 1.5 n, the
price of 2 messages instead of 6.

Measured equals closed form when the ratio reads 1.0000. Timings depend on
the machine; bytes do not. Standard library only; needs a build (BUILD/
launcher/dtrain-launch, BUILD/train/minigpt). Arguments after -- go to
minigpt (a bigger model, say).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

F32 = 4
RD_MAX_BYTES = 64 * 1024  # algo_select.c: ALLREDUCE_RECURSIVE_DOUBLING_MAX_BYTES

SHAPES = {  # name: (dp, tp, pp)
    "dp2": (2, 1, 1),
    "dp4": (4, 1, 1),
    "tp2": (1, 2, 1),
    "tp4": (1, 4, 1),
    "dp2xtp2": (2, 2, 1),
    "pp2": (1, 1, 2),
    "pp3": (1, 1, 3),
    "pp4": (1, 1, 4),
    "pp2xdp2": (2, 1, 2),
    "tp2xpp2": (1, 2, 2),
    "tp4xpp2": (1, 4, 2),
    "tp2xpp3": (1, 2, 3),
    "tp2xpp4": (1, 2, 4),
    "dp2xtp2xpp2": (2, 2, 2),
}


# ---- what one collective sends per rank (bytes), as dtrain runs it --------------


def chunk(count, p, i):
    return count // p + (1 if i < count % p else 0)


def allreduce_sent(count, p, rank, ring_only=False):
    """Payload bytes rank sends in an all-reduce of count floats over p ranks."""
    if p == 1:
        return 0
    n = count * F32
    if not ring_only and (n <= RD_MAX_BYTES or count < p):  # recursive doubling
        q = 1 << (p.bit_length() - 1)
        e = p - q
        if rank < 2 * e:  # the fold: even ranks hand over and sit out
            return n if rank % 2 == 0 else (int(math.log2(q)) + 1) * n
        return int(math.log2(q)) * n
    # ring: reduce-scatter sends every chunk but its own, all-gather every
    # chunk but its right neighbour's
    return (2 * count - chunk(count, p, rank) - chunk(count, p, (rank + 1) % p)) * F32


def allgather_sent(count, p):
    return (p - 1) * count * F32  # ring: p-1 blocks of its own size


def broadcast_sent(count, p, rank, root):
    """Binomial tree (broadcast_tree.c; small buffers): one whole buffer per child."""
    if p == 1:
        return 0
    v = (rank - root) % p
    top = (1 << ((p - 1).bit_length() - 1)) if v == 0 else (v & -v) // 2
    children, m = 0, max(top, 0)
    while m >= 1:
        if v + m < p:
            children += 1
        m //= 2
    return children * count * F32


# ---- the model's sizes -------------------------------------------------------------


def block_params(C):
    return 12 * C * C + 9 * C  # ln1, qkv, proj, ln2, fc (+bias), fc proj (+bias)


def num_params(cfg):
    V, C, T, L = cfg["V"], cfg["C"], cfg["T"], cfg["L"]
    return V * C + T * C + L * block_params(C) + 2 * C + V * C


def tp_share(cfg, tp):
    """model/tp_layout.c: wte, lm_head, qkv, attn proj, fc (+bias), fc proj
    split tp ways; wpe, the LayerNorms and fc proj's bias replicated."""
    V, C, T, L = cfg["V"], cfg["C"], cfg["T"], cfg["L"]
    split = 2 * V * C + L * (12 * C * C + 4 * C)
    return split // tp + T * C + L * (4 * C + C) + 2 * C


def stage_blocks(cfg, pp, stage):
    L = cfg["L"]
    return L // pp + (1 if stage < L % pp else 0)


def tp_stage_share(cfg, tp, pp, stage):
    """tensor/tp_stage.c: the stage's range of the share (uniform partition)."""
    V, C, T = cfg["V"], cfg["C"], cfg["T"]
    n = stage_blocks(cfg, pp, stage) * ((12 * C * C + 4 * C) // tp + 5 * C)
    if stage == 0:
        n += V * C // tp + T * C
    if stage == pp - 1:
        n += 2 * C + V * C // tp
    return n


def three_d_form(cfg, shape, rank, ring_only):
    dp, tp, pp = shape
    B, T, C, M = cfg["batch_per_rank"], cfg["T"], cfg["C"], cfg["microbatches"]
    N = B * T
    stage, replica, t = rank // (dp * tp), rank // tp % dp, rank % tp
    first, last = int(stage == 0), int(stage == pp - 1)
    n_ar = 4 * stage_blocks(cfg, pp, stage) + first + last
    terms = [("f and g", M * n_ar * allreduce_sent(N * C, tp, t, ring_only))]
    if last:
        terms.append(("cross-entropy statistics",
                      M * (allreduce_sent(N, tp, t, ring_only) +
                           allreduce_sent(2 * N, tp, t, ring_only))))
    terms.append(("activations and their gradients",
                  (int(stage < pp - 1) + int(stage > 0)) * M * N * C * F32))
    terms.append(("stage share gradients over dp",
                  allreduce_sent(tp_stage_share(cfg, tp, pp, stage), dp, replica, ring_only)))
    terms.append(("loss", (allreduce_sent(1, dp, replica, ring_only) if last else 0) +
                  broadcast_sent(1, pp, stage, pp - 1)))
    return sum(b for _, b in terms), terms


def stage_params(cfg, pp, stage):
    """--pp-partition uniform: L/p blocks each, the remainder to the first."""
    V, C, T, L = cfg["V"], cfg["C"], cfg["T"], cfg["L"]
    blocks = L // pp + (1 if stage < L % pp else 0)
    n = blocks * block_params(C)
    if stage == 0:
        n += V * C + T * C
    if stage == pp - 1:
        n += 2 * C + V * C
    return n


# ---- the closed form per rank ------------------------------------------------------


def closed_form(cfg, shape, rank, ring_only=False):
    """(bytes this rank sends per step, [(term, bytes)])."""
    dp, tp, pp = shape
    B, T, C, L, A = cfg["batch_per_rank"], cfg["T"], cfg["C"], cfg["L"], cfg["grad_accum"]
    N = B * T
    terms = []
    if pp > 1 and tp > 1:
        return three_d_form(cfg, shape, rank, ring_only)
    if pp > 1:
        stage, replica = rank // dp, rank % dp
        M = cfg["microbatches"]
        acts = (int(stage < pp - 1) + int(stage > 0)) * M * N * C * F32
        terms.append(("activations and their gradients", acts))
        terms.append(("stage gradients over dp",
                      allreduce_sent(stage_params(cfg, pp, stage), dp, replica, ring_only)))
        # share_loss (train/pipelined.c): the last stage all-reduces the
        # loss over its replicas, then broadcasts it down the pipeline from
        # there; from 4 stages on the binomial tree has inner stages that
        # pass it on, so the broadcast is counted on every stage
        terms.append(("loss", (allreduce_sent(1, dp, replica, ring_only) if stage == pp - 1
                               else 0) + broadcast_sent(1, pp, stage, pp - 1)))
        return sum(b for _, b in terms), terms
    if tp > 1:
        r = rank % tp
        fg = A * 2 * (2 * L + 1) * allreduce_sent(N * C, tp, r, ring_only)
        ce = A * (allreduce_sent(N, tp, r, ring_only) + allreduce_sent(2 * N, tp, r, ring_only))
        share = tp_share(cfg, tp)
        terms += [("f and g", fg), ("cross-entropy statistics", ce),
                  ("all-gather of the shares", allgather_sent(share, tp))]
        if dp > 1:
            terms.append(("share gradients over dp",
                          allreduce_sent(share, dp, rank // tp, ring_only)))
            terms.append(("loss", allreduce_sent(1, dp, rank // tp, ring_only)))
        return sum(b for _, b in terms), terms
    terms.append(("gradients", allreduce_sent(num_params(cfg), dp, rank, ring_only)))
    terms.append(("loss", allreduce_sent(1, dp, rank, ring_only)))
    return sum(b for _, b in terms), terms


# ---- running minigpt ---------------------------------------------------------------


def flags(shape):
    dp, tp, pp = shape
    if pp > 1 and tp > 1:
        return ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--pp-partition", "uniform"]
    if pp > 1:
        return ["--pp", str(pp), "--dp", str(dp), "--pp-partition", "uniform"]
    if tp > 1:
        return ["--tp", str(tp), "--dp", str(dp)]
    return []


def run(a, name, shape, tmp):
    world = shape[0] * shape[1] * shape[2]
    metrics = os.path.join(tmp, name + ".jsonl")
    cmd = [a.launch, "-n", str(world), a.minigpt, "--steps", str(a.steps), "--threads", "1",
           "--log-every", "1000", "--sample", "0", "--metrics", metrics] + flags(shape) + a.rest
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=a.timeout)
    if p.returncode != 0:
        sys.exit("tp_volume: %s failed (%d):\n%s\n%s" % (name, p.returncode, " ".join(cmd),
                                                           p.stdout[-3000:]))
    lines = [json.loads(x) for x in open(metrics) if x.strip()]
    cfg = next(x for x in lines if x["event"] == "config")
    steps = [x for x in lines if x["event"] == "step"]
    summary = next(x for x in lines if x["event"] == "summary")
    later = [s["bytes_sent"] for s in steps[1:]]
    if len(set(later)) > 1:  # rank 0 must send the same every step after the first
        sys.exit("tp_volume: %s: rank 0's bytes vary from step to step: %s" % (name, later))
    # pipelined.c's mg_microbatches: --microbatches, else --grad-accum when it
    # asks for more than one, else 4 per stage
    cfg["microbatches"] = a.microbatches or (cfg["grad_accum"] if cfg["grad_accum"] > 1
                                             else 4 * shape[2])
    tps = statistics.median(s["tokens_per_s"] for s in steps[1:])
    return cfg, summary["last_step_bytes_sent_by_rank"], tps


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="meson build directory (default build)")
    ap.add_argument("--world", type=int, default=4, help="largest world size (default 4)")
    ap.add_argument("--shapes", default="dp2,tp2,tp4,dp2xtp2,pp2xdp2",
                    help="comma-separated, of: " + ",".join(SHAPES))
    ap.add_argument("--steps", type=int, default=4, help="steps per run, at least 2 (default 4)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    ap.add_argument("rest", nargs="*", help="after --: more minigpt arguments")
    a = ap.parse_args()
    if a.steps < 2:
        ap.error("--steps: at least 2 (the first step is not counted)")
    a.launch = os.path.join(a.build, "launcher", "dtrain-launch")
    a.minigpt = os.path.join(a.build, "train", "minigpt")
    a.microbatches = 0
    for i, x in enumerate(a.rest):
        if x == "--microbatches" and i + 1 < len(a.rest):
            a.microbatches = int(a.rest[i + 1])
    for name in a.shapes.split(","):
        if name not in SHAPES:
            ap.error("unknown shape %s (known: %s)" % (name, ",".join(SHAPES)))
    return a


def main():
    a = parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dtrain-tp-volume-") as tmp:
        for name in a.shapes.split(","):
            shape = SHAPES[name]
            if shape[0] * shape[1] * shape[2] > a.world:
                print("%s: needs %d ranks, --world is %d: skipped" %
                      (name, shape[0] * shape[1] * shape[2], a.world))
                continue
            cfg, measured, tps = run(a, name, shape, tmp)
            groups = {}  # ranks with the same closed form share a row
            for rank, m in enumerate(measured):
                want, terms = closed_form(cfg, shape, rank)
                ring, _ = closed_form(cfg, shape, rank, ring_only=True)
                key = (want, ring, tuple(terms))
                groups.setdefault(key, []).append((rank, m))
            for (want, ring, terms), members in groups.items():
                ranks = ",".join(str(r) for r, _ in members)
                for r, m in members:
                    if m != want:
                        print("%s rank %d: measured %d B, closed form %d B" % (name, r, m, want))
                worst = max((m for _, m in members), key=lambda m: abs(m - want))
                rows.append((name, ranks, worst, want, worst / want if want else 1.0, ring, tps,
                             terms))
    w = max([8] + [len(r[0]) for r in rows])  # the shape column
    print("%-*s %-7s %12s %12s %7s %12s %10s" % (w, "shape", "ranks", "measured", "closed",
                                                  "ratio", "all-ring", "tokens/s"))
    for name, ranks, m, want, ratio, ring, tps, _ in rows:
        print("%-*s %-7s %12d %12d %7.4f %12d %10.0f" % (w, name, ranks, m, want, ratio, ring, tps))
    print("\nbytes sent per rank per step (payload); the closed form's terms:")
    for name, ranks, _, _, _, _, _, terms in rows:
        print("  %-*s ranks %-7s %s" % (w, name, ranks,
                                         " + ".join("%d %s" % (b, t) for t, b in terms if b)))
    return 1 if any(abs(r[4] - 1.0) > 0 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
