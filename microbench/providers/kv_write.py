"""kv_write: scatter the new tokens' K and V rows into paged cache slots (reshape_and_cache).

The cache has twice the blocks the tokens need and the slots are a random
subset, as in a running engine. For an fp8 cache the inputs are values exactly
representable in e4m3 times the scale, so a correct kernel reproduces them
bit for bit whatever its rounding mode.
"""
from __future__ import annotations

import math

import torch

from .base import FP8_MAX, FamilyBench, Provider, TORCH_DTYPES, fp8_support, randn

KV_SCALE = 0.02


def make_inputs(shape, device, gen):
    t, kvh, dim = shape.tokens, shape.kv_heads, shape.head_dim
    blocks = 2 * math.ceil(t / shape.block_size)
    scale = KV_SCALE if shape.kv_dtype == "fp8" else 1.0

    def activation():
        x = randn((t, kvh, dim), shape.kv_dtype, device, gen, scale=1.0 / scale)
        return (x.float() * scale).to(TORCH_DTYPES[shape.dtype])

    cache = (blocks, shape.block_size, kvh, dim)
    return {"key": activation(), "value": activation(),
            "key_cache": randn(cache, shape.kv_dtype, device, gen, scale=1.0 / scale),
            "value_cache": randn(cache, shape.kv_dtype, device, gen, scale=1.0 / scale),
            "slot_mapping": torch.randperm(blocks * shape.block_size, generator=gen, device=device)[:t],
            "k_scale": scale, "v_scale": scale}


def reference(shape, inputs, options):
    return inputs["key"].float(), inputs["value"].float()


def observe(shape, inputs, out):
    """The cache rows at the written slots, dequantised."""
    slots = inputs["slot_mapping"]
    rows = (shape.kv_heads, shape.head_dim)
    return (inputs["key_cache"].view(-1, *rows)[slots].float() * inputs["k_scale"],
            inputs["value_cache"].view(-1, *rows)[slots].float() * inputs["v_scale"])


def _supports(shape, device):
    if shape.kv_dtype == shape.dtype:
        return None
    if shape.kv_dtype != "fp8":
        return f"a {shape.kv_dtype} cache for {shape.dtype} activations"
    return fp8_support(device)


def _triton_build(shape, inputs):
    from kernelsight.microbench.triton_kernels.kv_write import reshape_and_cache

    args = [inputs[n] for n in ("key", "value", "key_cache", "value_cache", "slot_mapping", "k_scale", "v_scale")]
    return lambda: reshape_and_cache(*args)


def _torch_build(shape, inputs):
    """Unfused torch: quantise (fp8) then index_copy_ the rows; fp8 caches are written as raw bytes."""
    slots = inputs["slot_mapping"]
    rows = (shape.kv_heads, shape.head_dim)
    fp8 = shape.kv_dtype == "fp8"
    targets = [(inputs[x], (inputs[c].view(torch.uint8) if fp8 else inputs[c]).view(-1, *rows), inputs[s])
               for x, c, s in (("key", "key_cache", "k_scale"), ("value", "value_cache", "v_scale"))]

    def run():
        for x, cache, scale in targets:
            if fp8:
                x = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(TORCH_DTYPES["fp8"]).view(torch.uint8)
            cache.index_copy_(0, slots, x)
    return run


def _vllm_build(shape, inputs):
    from vllm import _custom_ops as ops

    device = inputs["key"].device
    ks = torch.tensor(inputs["k_scale"], dtype=torch.float32, device=device)
    vs = torch.tensor(inputs["v_scale"], dtype=torch.float32, device=device)
    args = [inputs[n] for n in ("key", "value", "key_cache", "value_cache", "slot_mapping")]
    kind = "fp8" if shape.kv_dtype == "fp8" else "auto"
    return lambda: ops.reshape_and_cache_flash(*args, kind, ks, vs)


BENCH = FamilyBench(
    family="kv_write", make_inputs=make_inputs, reference=reference, observe=observe,
    providers=(Provider("triton.reshape_and_cache", _triton_build, supports=_supports),
               Provider("torch.index_copy", _torch_build, supports=_supports),
               Provider("vllm.reshape_and_cache_flash", _vllm_build, supports=_supports, requires="vllm",
                        cuda_only=True)))
