"""Fused rotary embedding of Q and K in place, neox (rotate halves) or gpt-j (interleaved pairs).

One program per token, the tile of predictor's rope cost model. The cos/sin
cache has vLLM's layout: [max_position, head_dim], cos in the first half, sin
in the second; the full head_dim is rotated.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import next_pow2


@triton.jit
def _rotate(X, n_heads, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, x1_off, x2_off, dim_mask, cos, sin):
    h = tl.arange(0, HEADS_PAD)
    mask = (h < n_heads)[:, None] & dim_mask[None, :]
    p1 = X + h[:, None] * HEAD_DIM + x1_off[None, :]
    p2 = X + h[:, None] * HEAD_DIM + x2_off[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos[None, :] - x2 * sin[None, :]).to(X.dtype.element_ty), mask=mask)
    tl.store(p2, (x2 * cos[None, :] + x1 * sin[None, :]).to(X.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(POS, Q, K, COS_SIN, heads, kv_heads, HEADS_PAD: tl.constexpr, KV_PAD: tl.constexpr,
                 HEAD_DIM: tl.constexpr, HALF_PAD: tl.constexpr, NEOX: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(POS + t).to(tl.int64)
    half = HEAD_DIM // 2
    i = tl.arange(0, HALF_PAD)
    dim_mask = i < half
    cos = tl.load(COS_SIN + pos * HEAD_DIM + i, mask=dim_mask, other=0.0).to(tl.float32)
    sin = tl.load(COS_SIN + pos * HEAD_DIM + half + i, mask=dim_mask, other=0.0).to(tl.float32)
    if NEOX:
        x1_off = i
        x2_off = i + half
    else:
        x1_off = 2 * i
        x2_off = 2 * i + 1
    _rotate(Q + t * heads * HEAD_DIM, heads, HEADS_PAD, HEAD_DIM, x1_off, x2_off, dim_mask, cos, sin)
    _rotate(K + t * kv_heads * HEAD_DIM, kv_heads, KV_PAD, HEAD_DIM, x1_off, x2_off, dim_mask, cos, sin)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
                     neox: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] in place; returns them."""
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    _rope_kernel[(tokens,)](positions, q, k, cos_sin, heads, kv_heads, HEADS_PAD=next_pow2(heads),
                            KV_PAD=next_pow2(kv_heads), HEAD_DIM=head_dim, HALF_PAD=next_pow2(head_dim // 2),
                            NEOX=neox, num_warps=4)
    return q, k
