"""minigpt_torch.py - MiniGPT in PyTorch: the reference the C model must match.

The same architecture as model/minigpt.c (and the seed curriculum's MiniGPT):
token + learned position embedding, pre-LayerNorm blocks with causal
self-attention (qkv and proj without bias) and an MLP (C -> 4C -> C, bias,
erf-GELU), final LayerNorm, untied head without bias. Attribute names give
the state_dict names the C layout table uses ("blocks.0.attn.qkv.weight"),
and parameters are declared in the C flat buffer's order.

Used by tests/make_golden.py (the committed fixture) and by
bench/torch_compare.py (the speed comparison). Needs python3-torch; the C
build and its tests do not.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.qkv = nn.Linear(C, 3 * C, bias=False)
        self.proj = nn.Linear(C, C, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        hs = C // self.H
        q = q.view(B, T, self.H, hs).transpose(1, 2)  # (B, H, T, hs)
        k = k.view(B, T, self.H, hs).transpose(1, 2)
        v = v.view(B, T, self.H, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU()  # approximate='none': the erf form
        self.proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln1 = nn.LayerNorm(C)
        self.attn = Attention(C, H)
        self.ln2 = nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MiniGPT(nn.Module):
    def __init__(self, V, T, L, H, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)),
                                   targets.view(-1))
        return logits, loss
