#!/usr/bin/python3
"""PyTorch fixtures for nerve's transformer pieces (tests/layers/attention_test.cpp).

    /usr/bin/python3 scripts/torch_reference_attention.py

Writes `torch_attention.safetensors` and `torch_attention_causal.safetensors` under
tests/layers/fixtures/ with scripts/torch_reference.py's `layer_case`: the input `x`
([B, T, C]), the parameters `qkv.weight` ([3C, C]: q's rows, then k's, then v's, each's
heads contiguous), `qkv.bias`, `proj.weight`, `proj.bias`, an output gradient, and
PyTorch's output and gradients. The module is written with plain torch ops (a Linear
split into q, k and v, a softmax), so the layout is the one nerve's checkpoints use.
`torch_cross_entropy_tokens.safetensors` holds cross-entropy over every token of
[B, T, vocab] logits with [B, T] labels, as a GPT's loss: the logits, the labels, the
mean loss over all B·T tokens and the logits' gradient.
Fixed seeds, deterministic on the CPU.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import OUT, layer_case, write_safetensors  # noqa: E402


class SelfAttention(torch.nn.Module):
    def __init__(self, dim, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        D = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        if self.causal:
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf"))
        y = att.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(36)
    torch.set_num_threads(1)
    for name, causal in (("attention", False), ("attention_causal", True)):
        dim, heads, tokens = 12, 3, 5
        layer_case(name, SelfAttention(dim, heads, causal), torch.randn(2, tokens, dim),
                   {"dim": dim, "heads": heads, "tokens": tokens, "causal": int(causal)})

    # Every token a row: F.cross_entropy(logits.view(-1, V), y.view(-1)).
    logits = (torch.randn(2, 5, 7) * 3).requires_grad_(True)
    labels = torch.randint(0, 7, (2, 5), dtype=torch.int64)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 7), labels.view(-1))
    loss.backward()
    write_safetensors(os.path.join(OUT, "torch_cross_entropy_tokens.safetensors"),
                      {"logits": logits.detach(), "labels": labels, "loss": loss.detach().reshape(1),
                       "grad_logits": logits.grad},
                      {"torch_version": torch.__version__, "case": "cross_entropy_tokens"})
    print(f"wrote attention fixtures to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
