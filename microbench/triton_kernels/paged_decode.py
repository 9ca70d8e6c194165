"""Paged decode attention: one new query token per sequence against its paged KV cache.

vLLM's page table: block_table[b, j] is the cache block holding tokens
j*block_size .. (j+1)*block_size-1 of sequence b; caches are laid out
[num_blocks, block_size, kv_heads, head_dim]. GQA: the G = heads / kv_heads
query heads of one kv head are computed together, so each K/V row is read once.
Split-KV (flash-decoding): stage 1 runs one program per (sequence, kv head,
KV_SPLIT-token split), the tile of predictor's attn_decode cost model, and
writes an un-normalised partial output with its running max and sum; stage 2
merges the splits. A sliding window keeps the last `window` keys. An fp8 cache
is dequantised with per-tensor k_scale / v_scale.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelsight.predictor.families.attention import KV_SPLIT

from . import next_pow2

NEG = tl.constexpr(-1.0e30)  # finite "-inf": keeps exp(m_old - m_new) free of inf - inf


@triton.jit
def _decode_split_kernel(Q, K_CACHE, V_CACHE, BLOCK_TABLE, SEQ_LENS, ACC, M, L, scale, k_scale, v_scale, window,
                         bt_stride, n_splits, heads, kv_heads, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                         HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                         BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, IS_FP8: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SEQ_LENS + b)
    ctx_start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    lo = ctx_start + split * SPLIT
    hi = tl.minimum(lo + SPLIT, seq_len)

    g = tl.arange(0, GROUP_PAD)
    head = kvh * GROUP + g
    head_mask = g < GROUP
    d = tl.arange(0, DIM_PAD)
    dim_mask = d < HEAD_DIM
    q = tl.load(Q + (b * heads + head)[:, None] * HEAD_DIM + d[None, :],
                mask=head_mask[:, None] & dim_mask[None, :], other=0.0)

    m_i = tl.full([GROUP_PAD], NEG, tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        t_mask = t < hi
        page = tl.load(BLOCK_TABLE + b * bt_stride + t // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        slot = page * BLOCK_SIZE + t % BLOCK_SIZE
        kv_off = (slot * kv_heads + kvh)[:, None] * HEAD_DIM + d[None, :]
        kv_mask = t_mask[:, None] & dim_mask[None, :]
        k = tl.load(K_CACHE + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(V_CACHE + kv_off, mask=kv_mask, other=0.0)
        if IS_FP8:
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        qk = tl.dot(q, tl.trans(k)) * scale
        qk = tl.where(t_mask[None, :], qk, NEG)
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.where(t_mask[None, :], tl.exp(qk - m_new[:, None]), 0.0)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    part = (b * heads + head) * n_splits + split
    tl.store(ACC + part[:, None] * DIM_PAD + d[None, :], acc, mask=head_mask[:, None])
    tl.store(M + part, m_i, mask=head_mask)
    tl.store(L + part, l_i, mask=head_mask)


@triton.jit
def _decode_merge_kernel(ACC, M, L, OUT, n_splits, heads, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
                         SPLITS_BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    base = (b * heads + h) * n_splits
    s = tl.arange(0, SPLITS_BLOCK)
    d = tl.arange(0, DIM_PAD)
    m_max = tl.full([SPLITS_BLOCK], NEG, tl.float32)
    for s0 in range(0, n_splits, SPLITS_BLOCK):
        m_max = tl.maximum(m_max, tl.load(M + base + s0 + s, mask=s0 + s < n_splits, other=NEG))
    m_all = tl.max(m_max, axis=0)
    den = tl.zeros([SPLITS_BLOCK], tl.float32)
    num = tl.zeros([DIM_PAD], tl.float32)
    for s0 in range(0, n_splits, SPLITS_BLOCK):
        s_mask = s0 + s < n_splits
        w = tl.exp(tl.load(M + base + s0 + s, mask=s_mask, other=NEG) - m_all)
        w = tl.where(s_mask, w, 0.0)
        den += w * tl.load(L + base + s0 + s, mask=s_mask, other=0.0)
        acc = tl.load(ACC + (base + s0 + s)[:, None] * DIM_PAD + d[None, :], mask=s_mask[:, None], other=0.0)
        num += tl.sum(acc * w[:, None], axis=0)
    out = num / tl.sum(den, axis=0)
    tl.store(OUT + (b * heads + h) * HEAD_DIM + d, out.to(OUT.dtype.element_ty), mask=d < HEAD_DIM)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int,
                           scale: float | None = None, window: int = 0,
                           k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """q [batch, heads, head_dim] -> out [batch, heads, head_dim].

    max_seq_len (a host int, no device sync) sizes the split grid; seq_lens
    [batch] int32 holds each sequence's KV length.
    """
    batch, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    ctx = min(max_seq_len, window) if window > 0 else max_seq_len
    n_splits = max(1, triton.cdiv(ctx, KV_SPLIT))
    dim_pad = max(16, next_pow2(head_dim))
    acc = torch.empty((batch, heads, n_splits, dim_pad), dtype=torch.float32, device=q.device)
    m = torch.empty((batch, heads, n_splits), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    _decode_split_kernel[(batch, kv_heads, n_splits)](
        q, k_cache, v_cache, block_table, seq_lens, acc, m, l, scale, k_scale, v_scale, window,
        block_table.stride(0), n_splits, heads, kv_heads, GROUP=group, GROUP_PAD=max(16, next_pow2(group)),
        HEAD_DIM=head_dim, DIM_PAD=dim_pad, BLOCK_SIZE=block_size, BLOCK_N=32 if head_dim > 128 else 64,
        SPLIT=KV_SPLIT, IS_FP8=k_cache.element_size() == 1, num_warps=4)
    out = torch.empty_like(q)
    _decode_merge_kernel[(batch, heads)](acc, m, l, out, n_splits, heads, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
                                         SPLITS_BLOCK=16, num_warps=4)
    return out
