"""Varlen causal prefill flash attention with a cached prefix, GQA and an optional sliding window.

Sequences are packed: q [total_q, heads, head_dim], k/v [total_kv, kv_heads,
head_dim], with cumulative lengths cu_seqlens_q / cu_seqlens_k (batch + 1,
int32) as in FlashAttention's varlen API. Sequence b has q_len new tokens after
a prefix of k_len - q_len cached ones; causal alignment is bottom-right: query i
sees keys j <= i + prefix (and j > i + prefix - window with a window). One
program per BLOCK_M query rows per head and sequence, the tile of predictor's
attn_prefill cost model (128 rows), with an online softmax over key blocks.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelsight.predictor.families.attention import Q_TILE

from . import next_pow2

NEG = tl.constexpr(-1.0e30)


@triton.jit
def _prefill_kernel(Q, K, V, O, CU_Q, CU_K, scale, window, heads, kv_heads, GROUP: tl.constexpr,
                    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr):
    mb = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // GROUP
    q_start = tl.load(CU_Q + b).to(tl.int64)
    q_len = tl.load(CU_Q + b + 1) - tl.load(CU_Q + b)
    k_start = tl.load(CU_K + b).to(tl.int64)
    k_len = tl.load(CU_K + b + 1) - tl.load(CU_K + b)
    if mb * BLOCK_M >= q_len:
        return
    prefix = k_len - q_len
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < q_len
    d = tl.arange(0, DIM_PAD)
    dim_mask = d < HEAD_DIM
    q = tl.load(Q + ((q_start + rows) * heads + h)[:, None] * HEAD_DIM + d[None, :],
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0)

    hi = k_len
    if CAUSAL:
        hi = tl.minimum(k_len, (mb + 1) * BLOCK_M + prefix)
    lo = tl.where(window > 0, tl.maximum(mb * BLOCK_M + prefix - window + 1, 0), 0)
    m_i = tl.full([BLOCK_M], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < k_len
        kv_off = ((k_start + cols) * kv_heads + kvh)[:, None] * HEAD_DIM + d[None, :]
        kv_mask = col_mask[:, None] & dim_mask[None, :]
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale
        keep = col_mask[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + prefix)
        keep = keep & ((window == 0) | (cols[None, :] > rows[:, None] + prefix - window))
        qk = tl.where(keep, qk, NEG)
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.where(keep, tl.exp(qk - m_new[:, None]), 0.0)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(row_mask, l_i, 1.0)[:, None]
    tl.store(O + ((q_start + rows) * heads + h)[:, None] * HEAD_DIM + d[None, :], out.to(O.dtype.element_ty),
             mask=row_mask[:, None] & dim_mask[None, :])


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, causal: bool = True, window: int = 0,
                      scale: float | None = None) -> torch.Tensor:
    """Packed varlen attention; returns o shaped like q. max_seqlen_q is a host int (no device sync)."""
    total_q, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    o = torch.empty_like(q)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    grid = (triton.cdiv(max_seqlen_q, Q_TILE), batch, heads)
    _prefill_kernel[grid](q, k, v, o, cu_seqlens_q, cu_seqlens_k, scale, window, heads, kv_heads,
                          GROUP=heads // kv_heads, HEAD_DIM=head_dim, DIM_PAD=max(16, next_pow2(head_dim)),
                          BLOCK_M=Q_TILE, BLOCK_N=64 if head_dim <= 128 else 32, CAUSAL=causal,
                          num_warps=8 if head_dim >= 128 else 4, num_stages=2)
    return o
