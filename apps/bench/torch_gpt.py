#!/usr/bin/python3
"""PyTorch side of the `gpt` speed figure (docs/performance.md, "the `gpt` preset"): the
preset's model in torch.nn (4 causal pre-LayerNorm blocks of width 128, 4 heads, MLP x4,
context 64, the head tied to the token embedding), AdamW lr 1e-3, betas (0.9, 0.99),
weight decay 0.1, batch 32 of random windows over 114 tokens; prints the median step time
of 7 repeats of 10 steps and the tokens a second. Run it as

    OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 /usr/bin/python3 apps/bench/torch_gpt.py 2

beside `nerve-train --model gpt --threads 2 --steps 60 --no-eval --json` in one session.
Needs Debian's python3-torch (1.13). `nerve-bench train` does not run it yet.
"""
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
torch.manual_seed(0)
V, C, T, H, B = 114, 128, 64, 4, 32
class Attn(nn.Module):
    def __init__(s):
        super().__init__(); s.qkv = nn.Linear(C, 3*C); s.proj = nn.Linear(C, C)
    def forward(s, x):
        b, t, c = x.shape
        q, k, v = s.qkv(x).split(C, 2)
        q, k, v = [z.view(b, t, H, C//H).transpose(1, 2) for z in (q, k, v)]
        a = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        a = a.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float('-inf')).softmax(-1)
        return s.proj((a @ v).transpose(1, 2).reshape(b, t, c))
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.ln1, s.attn, s.ln2 = nn.LayerNorm(C), Attn(), nn.LayerNorm(C)
        s.fc, s.proj = nn.Linear(C, 4*C), nn.Linear(4*C, C)
    def forward(s, x):
        x = x + s.attn(s.ln1(x)); return x + s.proj(F.gelu(s.fc(s.ln2(x))))
class GPT(nn.Module):
    def __init__(s):
        super().__init__(); s.wte = nn.Embedding(V, C); s.wpe = nn.Parameter(torch.zeros(1, T, C))
        s.blocks = nn.ModuleList(Block() for _ in range(4)); s.ln_f = nn.LayerNorm(C)
    def forward(s, ids):
        x = s.wte(ids) + s.wpe
        for b in s.blocks: x = b(x)
        return s.ln_f(x) @ s.wte.weight.T
m = GPT(); opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
ids = torch.randint(0, V, (B, T)); tgt = torch.randint(0, V, (B, T))
def step():
    opt.zero_grad(); loss = F.cross_entropy(m(ids).view(-1, V), tgt.view(-1)); loss.backward(); opt.step()
for _ in range(5): step()
rep = []
for r in range(7):
    t0 = time.perf_counter()
    for _ in range(10): step()
    rep.append((time.perf_counter() - t0) / 10)
s = statistics.median(rep)
print(f"torch {torch.__version__} threads {torch.get_num_threads()}: step {s*1000:.1f} ms, {B*T/s:.0f} tokens/s")
