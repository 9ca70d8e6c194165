"""Paged KV-cache write (vLLM's reshape_and_cache_flash): token t's K and V rows go to cache slot slot_mapping[t].

Cache layout [num_blocks, block_size, kv_heads, head_dim], so slot s = block *
block_size + offset is row s of the flattened cache. A negative slot is a
padding token and is skipped. An fp8 (e4m3) cache stores x / scale, clamped to
the format's range. One program per token, the tile of predictor's kv_write cost model.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import next_pow2

FP8_MAX = tl.constexpr(torch.finfo(torch.float8_e4m3fn).max)  # 448


@triton.jit
def _store_row(SRC, DST, t, slot, row, offs, mask, scale, IS_FP8: tl.constexpr):
    x = tl.load(SRC + t * row + offs, mask=mask, other=0.0)
    if IS_FP8:
        y = tl.minimum(tl.maximum(x.to(tl.float32) / scale, -FP8_MAX), FP8_MAX)
        x = y.to(DST.dtype.element_ty)
    tl.store(DST + slot * row + offs, x, mask=mask)


@triton.jit
def _kv_write_kernel(K, V, K_CACHE, V_CACHE, SLOTS, k_scale, v_scale, row, ROW_PAD: tl.constexpr,
                     IS_FP8: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOTS + t).to(tl.int64)
    if slot < 0:
        return
    offs = tl.arange(0, ROW_PAD)
    mask = offs < row
    _store_row(K, K_CACHE, t, slot, row, offs, mask, k_scale, IS_FP8)
    _store_row(V, V_CACHE, t, slot, row, offs, mask, v_scale, IS_FP8)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter key/value [tokens, kv_heads, head_dim] into the paged caches at slot_mapping."""
    tokens, kv_heads, head_dim = key.shape
    row = kv_heads * head_dim
    is_fp8 = key_cache.element_size() == 1
    _kv_write_kernel[(tokens,)](key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, row,
                                ROW_PAD=next_pow2(row), IS_FP8=is_fp8, num_warps=4)
