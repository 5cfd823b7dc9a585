#!/usr/bin/python3
"""Reference fixtures from PyTorch for nerve's embedding layers (issue #36).

Writes, beside scripts/torch_reference.py's, with its helpers (run from anywhere):

    /usr/bin/python3 scripts/torch_reference_embed.py

- `torch_embedding.safetensors`: `nn.Embedding(7, 5)` on ids `x` `[3, 6]` (stored as
  float32, as nerve carries them; some ids repeat, so rows of the weight's gradient sum
  several tokens), `weight`, `grad_out`, `out`, `grad_weight`.
- `torch_patch_embedding.safetensors`: `nn.Conv2d(1, 4, 7, stride=7)` then
  `.flatten(2).transpose(1, 2)` on images `[2, 1, 14, 21]`: `weight` `[4, 1, 7, 7]`
  (nerve's `[4, 49]` is the same values), `bias`, `out`, `grad_x`, `grad_weight`, `grad_bias`.
- `torch_class_token_pos.safetensors`: `torch.cat([cls.expand(B, -1, -1), x], 1) + pos`
  on `x` `[2, 3, 4]`, with `cls` `[1, 1, 4]` and `pos` `[1, 4, 4]`: `out`, `grad_x`,
  `grad_cls`, `grad_pos`.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import OUT, layer_case, write_safetensors  # noqa: E402


class PatchEmbedding(torch.nn.Conv2d):
    """A ViT's patch embedding: the patch-strided convolution, each patch a token."""

    def __init__(self, patch, dim, channels=1):
        super().__init__(channels, dim, patch, stride=patch)

    def forward(self, x):
        return super().forward(x).flatten(2).transpose(1, 2)


class ClassTokenPos(torch.nn.Module):
    """A ViT's class token, then its learned position embedding."""

    def __init__(self, tokens, dim):
        super().__init__()
        self.cls = torch.nn.Parameter(torch.randn(1, 1, dim))
        self.pos = torch.nn.Parameter(torch.randn(1, tokens + 1, dim))

    def forward(self, x):
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(36)
    torch.set_num_threads(1)

    emb = torch.nn.Embedding(7, 5)
    ids = torch.tensor([[3, 0, 6, 3, 3, 1], [6, 2, 2, 0, 5, 3], [4, 4, 1, 6, 0, 3]], dtype=torch.int64)
    weight = emb.weight.detach().clone()
    out = emb(ids)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    write_safetensors(os.path.join(OUT, "torch_embedding.safetensors"),
                      {"x": ids.to(torch.float32), "weight": weight, "grad_out": grad_out, "out": out.detach(),
                       "grad_weight": emb.weight.grad},
                      {"torch_version": torch.__version__, "case": "embedding", "vocab": 7, "dim": 5})

    layer_case("patch_embedding", PatchEmbedding(7, 4), torch.randn(2, 1, 14, 21), {"patch": 7, "dim": 4})

    layer_case("class_token_pos", ClassTokenPos(3, 4), torch.randn(2, 3, 4), {"tokens": 3, "dim": 4})
    print(f"wrote fixtures to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
