#!/usr/bin/python3
"""torch_seed_export.py — dtrain-ckpt export --names seed into the curriculum's MiniGPT.

Usage: torch_seed_export.py MINIGPT DTRAIN_CKPT CKPT_LOGITS
(the built train/minigpt, checkpoint/dtrain-ckpt and tests/ckpt_logits).

The seed curriculum's capstone trains a small PyTorch MiniGPT; dtrain trains
the same network. This checks that a dtrain checkpoint, exported with
`--names seed`, is a file that module takes as it is:

  1. minigpt trains the seed model (its defaults: V=64 C=32 H=4 L=2 T=16)
     for a few steps and saves a checkpoint;
  2. dtrain-ckpt export --names seed writes it as safetensors (read here by
     hand: the format is a length, a JSON header and the raw floats);
  3. the module below, written from the curriculum's description (token and
     position embeddings, pre-norm blocks with a bias-free qkv / proj
     attention and an nn.Sequential MLP, final LayerNorm, bias-free head),
     loads it with load_state_dict(strict=True);
  4. its logits on held-out prompts (random tokens of a seed the training
     never drew) match dtrain's own forward on the checkpoint (ckpt_logits)
     within 1e-5.

Each check prints "ok ..." (./dev.sh test-torch counts them); any failure
exits 1 naming what differed. Needs Debian's python3-torch (1.13).
"""
import json, math, os, shutil, struct, subprocess, sys, tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

minigpt, dtrain_ckpt, ckpt_logits = sys.argv[1:4]
V, C, H, L, T = 64, 32, 4, 2, 16
TOLERANCE = 1e-5


def check(what, ok, detail=""):
    if not ok:
        sys.exit(f"FAIL {what}{': ' + detail if detail else ''}")
    print(f"ok {what}")


def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"FAIL {' '.join(argv)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stdout


# ---- the curriculum's module -------------------------------------------------

class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C, bias=False)
        self.proj = nn.Linear(C, C, bias=False)

    def forward(self, x):
        B, Tx, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, Tx, 3, H, C // H).unbind(2)  # each (B, T, H, hs)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
        att = q @ k.transpose(-2, -1) / math.sqrt(C // H)
        causal = torch.ones(Tx, Tx, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, Tx, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(C)
        self.attn = SelfAttention()
        self.ln2 = nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MiniGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embed = nn.Embedding(V, C)
        self.pos_embed = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)

    def forward(self, idx):
        x = self.tok_embed(idx) + self.pos_embed(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# ---- safetensors, by hand ------------------------------------------------------

def read_safetensors(path, dtype="F32"):
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    header.pop("__metadata__", None)
    data = bytearray(blob[8 + hlen:])
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != dtype:
            sys.exit(f"FAIL {name}: dtype {t['dtype']}, expected {dtype}")
        begin, end = t["data_offsets"]
        flat = torch.frombuffer(data[begin:end],
                                dtype=torch.bfloat16 if dtype == "BF16" else torch.float32)
        tensors[name] = flat.reshape(t["shape"]).clone()
    order = sorted(header, key=lambda n: header[n]["data_offsets"][0])
    return tensors, order


tmp = tempfile.mkdtemp(prefix="dtrain-seed-export-")
try:
    root = os.path.join(tmp, "ckpt")
    run(minigpt, "--steps", "20", "--ckpt-dir", root, "--ckpt-every", "20", "--eval-every", "0",
        "--sample", "0", "--threads", "1")
    out = os.path.join(tmp, "seed.safetensors")
    run(dtrain_ckpt, "export", root, out, "--names", "seed")
    tensors, order = read_safetensors(out)

    model = MiniGPT()
    want = model.state_dict()
    check("export --names seed has the module's keys in its registration order",
          order == list(want), f"got {order}, want {list(want)}")
    check("every tensor has the module's shape",
          all(tuple(tensors[k].shape) == tuple(want[k].shape) for k in want))
    result = model.load_state_dict(tensors, strict=True)
    check("load_state_dict(strict=True) takes the file",
          not result.missing_keys and not result.unexpected_keys, str(result))

    gen = torch.Generator().manual_seed(20261204)  # not a seed minigpt's data uses
    prompts = torch.randint(0, V, (4, T), generator=gen)
    with torch.no_grad():
        theirs = model(prompts)
    text = "\n".join(" ".join(str(int(t)) for t in p) for p in prompts) + "\n"
    p = subprocess.run([ckpt_logits, root], input=text, capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        sys.exit(f"FAIL ckpt_logits exited {p.returncode}: {p.stderr}")
    ours = torch.tensor([[float(x) for x in line.split()] for line in p.stdout.splitlines()])
    ours = ours.reshape(4, T, V)
    diff = (ours - theirs).abs().max().item()
    check(f"the module's logits on 4 held-out prompts match dtrain's within {TOLERANCE:g} "
          f"(max difference {diff:.2e})", diff <= TOLERANCE)

    # --dtype bf16: each value is torch's own rounding of the fp32 export
    half = os.path.join(tmp, "seed-bf16.safetensors")
    run(dtrain_ckpt, "export", root, half, "--dtype", "bf16", "--names", "seed")
    rounded, order16 = read_safetensors(half, "BF16")
    check("export --dtype bf16 has the same keys in the same order", order16 == order)
    check("every bf16 value is torch's .to(torch.bfloat16) of the fp32 export, bit for bit",
          all(torch.equal(rounded[k].view(torch.int16), tensors[k].to(torch.bfloat16)
                          .view(torch.int16)) for k in want))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
