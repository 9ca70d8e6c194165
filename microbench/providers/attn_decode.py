"""attn_decode: one query token per sequence against a paged KV cache (vLLM's page table).

Caches are [num_blocks, block_size, kv_heads, head_dim] with the blocks of all
sequences shuffled, so pages are scattered as in a running engine. An fp8
cache holds values exactly representable in e4m3 times a per-tensor scale, so
the float32 reference sees precisely what the kernels read.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .attn_prefill import attention_reference
from .base import FamilyBench, Provider, fp8_support, randn, triton_dot_dtype

KV_SCALE = 0.02  # fp8 cache scale: randn / 0.02 spans most of e4m3's range


def make_inputs(shape, device, gen):
    b, bs = shape.batch, shape.block_size
    pages = math.ceil(shape.seq_kv / bs)
    cache = (b * pages, bs, shape.kv_heads, shape.head_dim)
    scale = KV_SCALE if shape.kv_dtype == "fp8" else 1.0
    return {"q": randn((b, shape.heads, shape.head_dim), shape.dtype, device, gen),
            "k_cache": randn(cache, shape.kv_dtype, device, gen, scale=1.0 / scale),
            "v_cache": randn(cache, shape.kv_dtype, device, gen, scale=1.0 / scale),
            "block_table": torch.randperm(b * pages, generator=gen, device=device).view(b, pages).to(torch.int32),
            "seq_lens": torch.full((b,), shape.seq_kv, dtype=torch.int32, device=device),
            "k_scale": scale, "v_scale": scale}


def _sequence_kv(shape, inputs, b):
    """Sequence b's keys and values in order, dequantised to float32."""
    bs = shape.block_size
    slots = (inputs["block_table"][b].long()[:, None] * bs + torch.arange(bs, device=inputs["q"].device))
    slots = slots.reshape(-1)[:shape.seq_kv]
    k = inputs["k_cache"].view(-1, shape.kv_heads, shape.head_dim)[slots].float() * inputs["k_scale"]
    v = inputs["v_cache"].view(-1, shape.kv_heads, shape.head_dim)[slots].float() * inputs["v_scale"]
    return k, v


def reference(shape, inputs, options):
    out = []
    for b in range(shape.batch):
        k, v = _sequence_kv(shape, inputs, b)
        out.append(attention_reference(inputs["q"][b:b + 1], k, v, shape.seq_kv - 1, True, shape.window))
    return torch.cat(out)


def _kv_supports(shape, device):
    if shape.kv_dtype not in (shape.dtype, "fp8"):
        return f"KV cache in {shape.kv_dtype} with {shape.dtype} activations"
    return fp8_support(device) if shape.kv_dtype == "fp8" else None


def _triton_build(shape, inputs):
    from kernelsight.microbench.triton_kernels.paged_decode import paged_decode_attention

    q, kc, vc, bt, lens = (inputs[n] for n in ("q", "k_cache", "v_cache", "block_table", "seq_lens"))
    ks, vs = inputs["k_scale"], inputs["v_scale"]
    return lambda: paged_decode_attention(q, kc, vc, bt, lens, shape.seq_kv, window=shape.window,
                                          k_scale=ks, v_scale=vs)


def _triton_supports(shape, device):
    return triton_dot_dtype(shape.dtype, device) or _kv_supports(shape, device)


def _torch_build(shape, inputs):
    """Unfused torch: gather the pages into dense K/V, dequantise, then SDPA (GQA)."""
    q4 = inputs["q"].unsqueeze(2)  # [b, heads, 1, dim]
    bt, kc, vc = inputs["block_table"], inputs["k_cache"], inputs["v_cache"]
    b, dim = shape.batch, shape.head_dim
    ctx = min(shape.seq_kv, shape.window) if shape.window else shape.seq_kv
    lo, hi = shape.seq_kv - ctx, shape.seq_kv
    dtype = q4.dtype
    ks, vs = inputs["k_scale"], inputs["v_scale"]

    def dense(cache, scale):
        x = cache[bt].view(b, -1, shape.kv_heads, dim)[:, lo:hi].transpose(1, 2)
        return x.to(dtype) * scale if cache.dtype != dtype else x

    return lambda: F.scaled_dot_product_attention(q4, dense(kc, ks), dense(vc, vs), enable_gqa=True)


def _flashinfer_build(shape, inputs):
    import flashinfer

    q, kc, vc, bt = (inputs[n] for n in ("q", "k_cache", "v_cache", "block_table"))
    b, pages = bt.shape
    device = q.device
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device=device), "NHD")
    last = shape.seq_kv - (pages - 1) * shape.block_size
    wrapper.plan(torch.arange(0, (b + 1) * pages, pages, dtype=torch.int32, device=device),
                 bt.reshape(-1), torch.full((b,), last, dtype=torch.int32, device=device),
                 shape.heads, shape.kv_heads, shape.head_dim, shape.block_size,
                 window_left=shape.window - 1 if shape.window else -1, q_data_type=q.dtype, kv_data_type=kc.dtype)
    return lambda: wrapper.run(q, (kc, vc))


def _flashinfer_supports(shape, device):
    if shape.kv_dtype != shape.dtype or shape.dtype not in ("fp16", "bf16"):
        return "flashinfer provider covers fp16/bf16 caches"
    return None


BENCH = FamilyBench(
    family="attn_decode", make_inputs=make_inputs, reference=reference,
    providers=(Provider("triton.paged_decode", _triton_build, supports=_triton_supports),
               Provider("torch.gather_sdpa", _torch_build, supports=_kv_supports,
                        unpack=lambda shape, inputs, out: out.squeeze(2)),
               Provider("flashinfer.decode", _flashinfer_build, supports=_flashinfer_supports,
                        requires="flashinfer", cuda_only=True)))
