"""Fused gated activation: out[t, i] = act(x[t, i]) * x[t, I + i] (vLLM's silu_and_mul and friends).

One program per token, the tile of predictor's act cost model, looping over
the intermediate dimension. tanh is written through the sigmoid (triton.language has none).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import next_pow2

ACTIVATIONS = {"silu_mul": 0, "gelu_mul": 1, "gelu_tanh_mul": 2}


@triton.jit
def _act_and_mul_kernel(X, OUT, inter, BLOCK: tl.constexpr, ACT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    for start in range(0, inter, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < inter
        a = tl.load(X + t * 2 * inter + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(X + t * 2 * inter + inter + offs, mask=mask, other=0.0).to(tl.float32)
        if ACT == 0:
            y = a * tl.sigmoid(a)
        elif ACT == 1:
            y = 0.5 * a * (1.0 + tl.math.erf(a * 0.7071067811865476))
        else:
            inner = 0.7978845608028654 * (a + 0.044715 * a * a * a)
            y = 0.5 * a * (2.0 * tl.sigmoid(2.0 * inner))  # 1 + tanh(z) = 2 * sigmoid(2z)
        tl.store(OUT + t * inter + offs, (y * g).to(OUT.dtype.element_ty), mask=mask)


def act_and_mul(x: torch.Tensor, op: str = "silu_mul") -> torch.Tensor:
    """x [tokens, 2 * I] -> [tokens, I]; op in ACTIVATIONS."""
    tokens, width = x.shape
    inter = width // 2
    out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    _act_and_mul_kernel[(tokens,)](x, out, inter, BLOCK=min(next_pow2(inter), 2048), ACT=ACTIVATIONS[op],
                                   num_warps=4)
    return out
