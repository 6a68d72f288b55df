#!/usr/bin/env python3
"""make_figures.py — draws the docs' figures from the runs make_figures.sh made.

    python3 docs/figures/make_figures.py RUNS OUTDIR

RUNS holds dtrain's own outputs (see make_figures.sh); every number drawn
is read from them, none is typed in here except the closed forms the
figures compare against. Writes OUTDIR/{curves,precision,busbw,bubble,memory,
gantt,reshard}.png and prints the measured all-reduce crossover.
"""
import glob
import json
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Polygon  # noqa: E402

MADE_BY = "made by ./dev.sh figures (docs/figures/make_figures.sh)"
COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868", "params": "#4c72b0",
          "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52"}


def footer(fig, note=""):
    fig.text(0.01, 0.005, MADE_BY + (f"; {note}" if note else ""), fontsize=7, color="gray")


# Smallest type a reader of the docs is asked to read, in points, and the most
# entries one legend may hold before it crowds the data it sits on.
MIN_FONT_PT = 8
MAX_LEGEND_ENTRIES = 4


def numeric(labels):
    texts = [t.get_text().replace("\u2212", "-") for t in labels if t.get_text()]
    return bool(texts) and all(re.fullmatch(r"-?[0-9.]+", t) for t in texts)


def legibility_problems(fig):
    """What a reader cannot read in fig: a numeric axis with no label, tick
    labels under MIN_FONT_PT, a legend with more than MAX_LEGEND_ENTRIES
    entries or smaller type. make_figures refuses to write such a figure."""
    found = []
    for k, ax in enumerate(fig.axes):
        where = f"panel {k + 1} ({ax.get_title(loc='left') or ax.get_title()[:40]!r})"
        for axis, label in ((ax.yaxis, ax.get_ylabel()), (ax.xaxis, ax.get_xlabel())):
            ticks = axis.get_ticklabels()
            if axis is ax.yaxis and axis.get_visible() and numeric(ticks) and not label:
                found.append(f"{where}: its numeric y axis has no label")
            small = [t.get_fontsize() for t in ticks if t.get_text() and t.get_visible()]
            if small and min(small) < MIN_FONT_PT:
                found.append(f"{where}: tick labels of {min(small):g} pt, under {MIN_FONT_PT}")
    for leg in [ax.get_legend() for ax in fig.axes] + list(fig.legends):
        if leg is None:
            continue
        texts = leg.get_texts()
        if len(texts) > MAX_LEGEND_ENTRIES:
            found.append(f"a legend of {len(texts)} entries (at most {MAX_LEGEND_ENTRIES})")
        if texts and min(t.get_fontsize() for t in texts) < MIN_FONT_PT:
            found.append(f"a legend in type under {MIN_FONT_PT} pt")
    return found


def save(fig, outdir, name):
    fig.canvas.draw()  # tick labels exist only once drawn
    problems = legibility_problems(fig)
    if problems:
        sys.exit(f"make_figures: {name} would be hard to read: " + "; ".join(problems))
    path = os.path.join(outdir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"figures: wrote {path}")


def rank0_lines(path):
    """Rank 0's lines of a launched run, without the '[0] ' prefix."""
    return [l[4:].rstrip("\n") for l in open(path) if l.startswith("[0] ")]


def run_events(runs, name):
    return [json.loads(l) for l in open(os.path.join(runs, name))]


def curves(runs, outdir):
    events = run_events(runs, "curves.jsonl")
    cfg = next(e for e in events if e["event"] == "config")
    steps = [e for e in events if e["event"] == "step"]
    evals = [e for e in events if e["event"] == "eval"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([e["step"] for e in steps], [e["loss"] for e in steps], lw=0.8, label="train loss")
    ax.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o-", ms=3,
            label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    acc = ax.twinx()
    acc.plot([e["step"] for e in evals], [100 * e["accuracy"] for e in evals], "s-", ms=3,
             color="#55a868", label="exact-match accuracy")
    acc.set_ylabel("held-out exact-match accuracy (%)")
    acc.set_ylim(-2, 102)
    lines = ax.get_legend_handles_labels()
    more = acc.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="center right", fontsize=9)
    ax.set_title(f"MiniGPT ({cfg['params']:,} parameters), {cfg['world_size']} ranks, "
                 f"{cfg['parallel'].upper()}, digit reversal")
    footer(fig, "minigpt --metrics")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, outdir, "curves.png")


def precision(runs, outdir):
    """The training run of curves.png beside the same run in bf16."""
    runs_by = {"fp32": run_events(runs, "curves.jsonl"),
               "bf16": run_events(runs, "curves_bf16.jsonl")}
    cfg = next(e for e in runs_by["fp32"] if e["event"] == "config")
    fig, (loss, diff, acc) = plt.subplots(1, 3, figsize=(13, 4))
    for (name, events), color in zip(runs_by.items(), ("#4c72b0", "#dd8452")):
        steps = [e for e in events if e["event"] == "step"]
        evals = [e for e in events if e["event"] == "eval"]
        loss.plot([e["step"] for e in steps], [e["loss"] for e in steps], lw=0.6, alpha=0.6,
                  color=color, label=f"{name} train")
        loss.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o-", ms=2.5,
                  color=color, label=f"{name} validation")
        acc.plot([e["step"] for e in evals], [100 * e["accuracy"] for e in evals], "s-", ms=2.5,
                 color=color, label=f"--precision {name}")
    loss.set_xlabel("step")
    loss.set_ylabel("cross-entropy loss")
    loss.legend(fontsize=9)
    loss.set_title("loss", loc="left")
    train = {name: {e["step"]: e["loss"] for e in events if e["event"] == "step"}
             for name, events in runs_by.items()}
    common = sorted(set(train["fp32"]) & set(train["bf16"]))
    diff.plot(common, [train["bf16"][k] - train["fp32"][k] for k in common], lw=0.6,
              color="#c44e52")
    diff.axhline(0, color="gray", lw=0.5)
    diff.set_xlabel("step")
    diff.set_ylabel("bf16 loss \u2212 fp32 loss")
    diff.set_title("training loss, bf16 minus fp32", loc="left")
    acc.set_xlabel("step")
    acc.set_ylabel("held-out exact-match accuracy (%)")
    acc.set_ylim(-2, 102)
    acc.legend(fontsize=9, loc="lower right")
    acc.set_title("accuracy", loc="left")
    fig.suptitle(f"fp32 against bf16 compute: MiniGPT ({cfg['params']:,} parameters), "
                 f"{cfg['world_size']} ranks, {cfg['parallel'].upper()}, digit reversal")
    footer(fig, "minigpt --metrics, --precision fp32 and bf16")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, outdir, "precision.png")


def bench_rows(path):
    """{bytes: busbw GB/s} from dtrain-bench's table."""
    rows = {}
    for line in open(path):
        f = line.split()
        if f and not line.startswith("#") and len(f) >= 7:
            rows[int(f[0])] = float(f[6])
    return rows


def human(n):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}iB"
    return f"{n} B"


def busbw(runs, outdir):
    med = {}
    for algo in ("ring", "rd"):
        tables = [bench_rows(p) for p in sorted(glob.glob(os.path.join(runs, f"busbw_{algo}_*.txt")))]
        med[algo] = {s: statistics.median(t[s] for t in tables) for s in tables[0]}
    sizes = sorted(med["ring"])
    # the measured crossover: the smallest size from which the ring is never slower
    cross = next((s for i, s in enumerate(sizes)
                  if all(med["ring"][t] >= med["rd"][t] for t in sizes[i:])), None)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(sizes, [med["ring"][s] for s in sizes], "o-", ms=3, label="ring (forced)")
    ax.plot(sizes, [med["rd"][s] for s in sizes], "s-", ms=3, label="recursive doubling (forced)")
    ax.axvline(64 * 1024, color="gray", ls="--", lw=1)
    ax.text(64 * 1024, ax.get_ylim()[1] * 0.95, " selector: RD up to 64 KiB", fontsize=8,
            color="gray", va="top")
    if cross:
        ax.axvline(cross, color="#c44e52", ls=":", lw=1.2)
        ax.text(cross, ax.get_ylim()[1] * 0.82, f" measured crossover {human(cross)}",
                fontsize=8, color="#c44e52", va="top")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes[::2], [human(s) for s in sizes[::2]], fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("busbw (GB/s), median of 3 runs")
    ax.set_title("all-reduce on 4 local ranks (loopback TCP)")
    ax.legend(loc="upper left", fontsize=9)
    footer(fig, "dtrain-bench --ranks 4 --algo ring|rd; a shared 2-core VM, noisy")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, outdir, "busbw.png")
    print(f"figures: measured all-reduce crossover (ring never slower from): "
          f"{cross if cross else 'none in range'} bytes")


def bubble(runs, outdir):
    lines = rank0_lines(os.path.join(runs, "bubble.txt"))
    head = next(i for i, l in enumerate(lines) if l.strip().startswith("m |"))
    p = int(re.search(r"p = (\d+)", lines[head - 1]).group(1))
    rows = []
    for l in lines[head + 1:]:
        if "|" not in l:
            break
        parts = [c.split() for c in l.split("|")]
        rows.append((int(parts[0][0]), parts[1:]))
    fig, ax = plt.subplots(figsize=(7, 4))
    ms = [m for m, _ in rows]
    for k, (name, color) in enumerate((("GPipe", "#4c72b0"), ("1F1B", "#dd8452"),
                                       ("ZB-H1", "#55a868"))):
        closed = [(m, float(c[0].rstrip("%"))) for m, c in ((m, r[k]) for m, r in rows)
                  if c[0] != "-"]
        measured = [statistics.mean(float(x.rstrip("%")) for x in r[k][1:]) for _, r in rows]
        ax.plot([m for m, _ in closed], [v for _, v in closed], "-", color=color,
                lw=4 if name == "GPipe" else 1.5, alpha=0.45 if name == "GPipe" else 1,
                label=name + (" (its closed form is 1F1B's)" if name == "GPipe" else ""))
        ax.plot(ms, measured, "o--", ms=4, color=color, alpha=0.7)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches per step (m)")
    ax.set_ylabel("bubble: idle share of the step (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"pipeline bubble, {p} stages: closed form (p-1)/(m+p-1) for GPipe and 1F1B, "
                 "and measured", fontsize=10)
    # colour says which schedule, line style which curve: two legends of few
    # entries, in the top of the plot, which the bubbles of 2 stages leave empty
    schedules = ax.legend(loc="upper right", fontsize=9, title="schedule", title_fontsize=9)
    ax.add_artist(schedules)
    styles = [plt.Line2D([], [], color="gray", ls="-", lw=1.5),
              plt.Line2D([], [], color="gray", ls="--", marker="o", ms=4)]
    ax.legend(styles, ["closed form", "measured (mean of stages)"], loc="upper left", fontsize=9)
    footer(fig, "minigpt --pp 2 --bubble-table, V=256 C=128 L=4 T=64 B=8; a shared 2-core VM")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, outdir, "bubble.png")


def memory_table(path):
    """[(rank, {params, grads, optimizer, activations})] from minigpt's memory table."""
    lines = rank0_lines(path)
    i = next(i for i, l in enumerate(lines) if l.startswith("memory per rank"))
    names = lines[i + 1].split("|")[0].split()  # rank params grads optimizer ... by name
    out = []
    for l in lines[i + 2:]:
        f = l.split("|")[0].split()
        if len(f) != len(names) or not f[0].isdigit():
            break
        out.append((int(f[0]), dict(zip(names[1:], map(int, f[1:])))))
    return out


def stacked(ax, x, tables, parts, width):
    bottom = [0] * len(x)
    for part in parts:
        vals = [t[part] / 1e6 for t in tables]
        ax.bar(x, vals, width, bottom=bottom, color=COLORS[part], label=part,
               edgecolor="white", linewidth=0.5)
        bottom = [b + v for b, v in zip(bottom, vals)]


def group_labels(ax, x, groups, per_group):
    """Each group's name centred under its bars, below the tick labels."""
    for k, name in enumerate(groups):
        centre = sum(x[k * per_group:(k + 1) * per_group]) / per_group
        ax.text(centre, -0.08, name, transform=ax.get_xaxis_transform(), ha="center",
                va="top", fontsize=9)


def memory(runs, outdir):
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 4.6), gridspec_kw={"width_ratios": [2, 1.4]})
    states = ("params", "grads", "optimizer")
    x, tables, ticks = [], [], []
    titles = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
    for k, mode in enumerate(titles):
        rows = memory_table(os.path.join(runs, f"memory_{mode}.txt"))
        for r, t in rows:
            x.append(k * (len(rows) + 1) + r)
            tables.append(t)
            ticks.append(str(r))
    stacked(a, x, tables, states, 0.8)
    a.set_xticks(x, ticks, fontsize=8)
    group_labels(a, x, titles.values(), len(x) // len(titles))
    a.set_xlabel("rank, by mode", fontsize=8, labelpad=18)
    a.set_ylabel("MB per rank")
    a.set_title("model states, 4 ranks: ZeRO-1 shards the optimizer, ZeRO-2 the gradients\n"
                "too, ZeRO-3 the parameters too (activations alike, left out)", fontsize=9)
    a.legend(fontsize=8)
    x, tables, ticks = [], [], []
    schedules = {"gpipe": "GPipe", "1f1b": "1F1B", "zb": "ZB-H1"}
    for k, s in enumerate(schedules):
        rows = memory_table(os.path.join(runs, f"pipeline_{s}.txt"))
        for r, t in rows:
            x.append(k * (len(rows) + 1) + r)
            tables.append(t)
            ticks.append(str(r))
    stacked(b, x, tables, states + ("activations",), 0.8)
    b.set_xticks(x, ticks, fontsize=8)
    group_labels(b, x, schedules.values(), len(x) // len(schedules))
    b.set_xlabel("stage, by schedule", fontsize=8, labelpad=18)
    b.set_ylabel("MB per stage's rank")
    b.set_title("per stage, 4 stages x 8 micro-batches:\nactivations alive at the peak",
                fontsize=9)
    b.legend(fontsize=8)
    footer(fig, "minigpt's memory table (accounted from buffer sizes)")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, outdir, "memory.png")


def trace_events(path):
    data = json.load(open(path))
    return data["traceEvents"] if isinstance(data, dict) else data


def gantt(runs, outdir):
    fig, axes = plt.subplots(3, 1, figsize=(10, 6.5))
    for ax, (s, title) in zip(axes, (("gpipe", "GPipe"), ("1f1b", "1F1B"), ("zb", "ZB-H1"))):
        allev = trace_events(os.path.join(runs, f"trace_{s}.json"))
        names = {e["tid"]: e["args"]["name"].split(" (")[1].split(",")[0]
                 for e in allev if e.get("ph") == "M"}
        ev = [e for e in allev if e.get("ph") == "X" and e.get("cat") == "compute"]
        last = max(e["args"]["step"] for e in ev)
        ev = [e for e in ev if e["args"]["step"] == last]
        t0 = min(e["ts"] for e in ev)
        t1 = max(e["ts"] + e["dur"] for e in ev)
        for e in ev:
            ax.barh(e["tid"], e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.8,
                    color=COLORS[e["name"]], edgecolor="white", linewidth=0.4)
            if e["dur"] / (t1 - t0) > 0.012:
                ax.text((e["ts"] - t0 + e["dur"] / 2) / 1e3, e["tid"], str(e["args"]["mb"] % 10),
                        ha="center", va="center", fontsize=6, color="white")
        ranks = sorted({e["tid"] for e in ev})
        ax.set_yticks(ranks, [names.get(r, f"rank {r}") for r in ranks], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, (t1 - t0) / 1e3)
        ax.set_title(f"{title}: step {last + 1}, {(t1 - t0) / 1e3:.1f} ms", fontsize=9, loc="left")
    axes[-1].set_xlabel("ms since the step's first forward")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in "FBW"]
    fig.legend(handles, ["F forward", "B backward (input grad)", "W weight grad"],
               fontsize=8, ncol=3, loc="upper right")
    footer(fig, "minigpt --pp 4 --microbatches 8 --trace; numbers are micro-batches; "
                "4 ranks on a shared 2-core VM")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save(fig, outdir, "gantt.png")


def shards(root):
    step = sorted(glob.glob(os.path.join(root, "step_*")))[-1]
    man = json.load(open(os.path.join(step, "manifest.json")))
    return man, [(s["rank"], *s["ranges"]["master"]) for s in man["shards"]]


def reshard(runs, outdir):
    src_man, src = shards(os.path.join(runs, "ckpt4"))
    dst_man, dst = shards(os.path.join(runs, "ckpt3"))
    total = src_man["num_params"]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    for y, ranges, label in ((1, src, "N"), (0, dst, "M")):
        for r, off, cnt in ranges:
            ax.add_patch(plt.Rectangle((off, y - 0.15), cnt, 0.3, color=palette[r % 6],
                                       alpha=0.85 if y else 0.55, ec="black", lw=0.6))
            ax.text(off + cnt / 2, y, f"rank {r}\n[{off}, {off + cnt})", ha="center",
                    va="center", fontsize=7)
    for r, off, cnt in dst:  # who reads what: each overlap of old and new shards
        for q, o2, c2 in src:
            lo, hi = max(off, o2), min(off + cnt, o2 + c2)
            if lo < hi:
                ax.add_patch(Polygon([(lo, 0.85), (hi, 0.85), (hi, 0.15), (lo, 0.15)],
                                     closed=True, color=palette[q % 6], alpha=0.25))
    ax.set_xlim(0, total)
    ax.set_ylim(-0.4, 1.4)
    ax.set_yticks([1, 0], [f"{src_man['world_size']} ranks (saved)",
                           f"{dst_man['world_size']} ranks (resharded)"])
    ax.set_xlabel(f"parameter index (Ψ = {total:,}); each shard holds the same range of "
                  "params, master, m and v")
    ax.set_title(f"resharding a ZeRO-1 checkpoint, N = {src_man['world_size']} → "
                 f"M = {dst_man['world_size']}: bands show which old shards feed each new one",
                 fontsize=9)
    footer(fig, "dtrain-ckpt reshard ROOT OUT 3, read from both manifest.json")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save(fig, outdir, "reshard.png")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make_figures.py RUNS OUTDIR")
    runs, outdir = sys.argv[1], sys.argv[2]
    for draw in (curves, precision, busbw, bubble, memory, gantt, reshard):
        draw(runs, outdir)


if __name__ == "__main__":
    main()
