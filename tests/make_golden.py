#!/usr/bin/env python3
"""make_golden.py - writes tests/data/minigpt_golden.bin, the PyTorch fixture
that tests/test_model.c checks the C MiniGPT against.

    python3 tests/make_golden.py [OUT]      (needs python3-torch)

What it holds: the seed config (V=64 C=32 H=4 L=2 T=16) with B=4, weights
from PyTorch's default initialisation (seed 1234) rounded to float32, one
batch of inputs and targets, and - computed in float64 from those float32
weights, so the fixture is the exact mathematics and the test measures the
C float32 error alone - the logits, the loss, every parameter's gradient,
and the losses of 10 AdamW steps on that batch (losses[i] is the loss
before update i+1; lr 1e-2, betas (0.9, 0.999), eps 1e-8, wd 0.1).

Format: magic b"DTGOLD1\\n", then records until end of file:
    u32 name_len, name (utf-8), u8 dtype (0 = f32, 1 = i32), u32 count,
    count little-endian values.
Names: "config" (i32: V T L H C B), "inputs", "targets" (i32, B*T),
"logits" (B*T*V), "loss" (1), "adamw" (f32: lr b1 b2 eps wd),
"losses" (10), "param:<name>" and "grad:<name>" per state_dict tensor.
"""
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "model"))
from minigpt_torch import MiniGPT  # noqa: E402

V, T, L, H, C, B = 64, 16, 2, 4, 32, 4
LR, B1, B2, EPS, WD = 1e-2, 0.9, 0.999, 1e-8, 0.1
STEPS = 10


def record(f, name, arr, dtype):
    arr = np.ascontiguousarray(arr, dtype="<f4" if dtype == 0 else "<i4")
    name = name.encode()
    f.write(struct.pack("<I", len(name)) + name)
    f.write(struct.pack("<BI", dtype, arr.size))
    f.write(arr.tobytes())


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "data",
        "minigpt_golden.bin")
    torch.manual_seed(1234)
    model = MiniGPT(V, T, L, H, C)  # float32 init, PyTorch's defaults
    inputs = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    model = model.double()  # float32 values, now computed in float64
    params32 = {k: v.detach().float().numpy().copy()
                for k, v in model.state_dict().items()}

    logits, loss = model(inputs, targets)
    loss.backward()
    grads = {k: p.grad.detach().numpy().copy()
             for k, p in model.named_parameters()}

    model.zero_grad()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(B1, B2),
                            eps=EPS, weight_decay=WD)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, l = model(inputs, targets)
        losses.append(l.item())
        l.backward()
        opt.step()

    with open(out, "wb") as f:
        f.write(b"DTGOLD1\n")
        record(f, "config", [V, T, L, H, C, B], 1)
        record(f, "inputs", inputs.numpy().ravel(), 1)
        record(f, "targets", targets.numpy().ravel(), 1)
        record(f, "logits", logits.detach().numpy().ravel(), 0)
        record(f, "loss", [loss.item()], 0)
        record(f, "adamw", [LR, B1, B2, EPS, WD], 0)
        record(f, "losses", losses, 0)
        for k, v in params32.items():
            record(f, "param:" + k, v.ravel(), 0)
        for k, g in grads.items():
            record(f, "grad:" + k, g.ravel(), 0)
    print(f"wrote {out}: loss {loss.item():.6f}, "
          f"{sum(v.size for v in params32.values())} parameters, "
          f"losses {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
