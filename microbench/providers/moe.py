"""moe: a mixture-of-experts MLP: softmax top-k routing, per-expert gate-up GEMM, SiLU-and-mul, down GEMM.

Router logits are random (near-uniform routing, the cost model's assumption);
top-k weights are renormalised (Mixtral, Qwen3). w1 [experts, 2I, hidden] holds
gate then up rows, w2 [experts, hidden, I]; weights are scaled so activations
stay O(1).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import FamilyBench, Provider, randn


def make_inputs(shape, device, gen):
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    return {"x": randn((shape.tokens, h), shape.dtype, device, gen),
            "logits": randn((shape.tokens, e), "fp32", device, gen),
            "w1": randn((e, 2 * i, h), shape.dtype, device, gen, scale=1.0 / math.sqrt(h)),
            "w2": randn((e, h, i), shape.dtype, device, gen, scale=1.0 / math.sqrt(i))}


def route(logits: torch.Tensor, top_k: int):
    """Top-k experts per token and their renormalised softmax weights."""
    weights, experts = logits.float().softmax(-1).topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), experts


def moe_forward(x, logits, w1, w2, top_k: int, compute_dtype=None):
    """Loop over the experts that received tokens: gather, gate-up, SiLU-and-mul, down, weighted scatter-add."""
    dtype = compute_dtype or x.dtype
    weights, experts = route(logits, top_k)
    inter = w2.shape[-1]
    out = torch.zeros(x.shape, dtype=dtype, device=x.device)
    flat = experts.reshape(-1)
    order = flat.argsort()
    counts = torch.bincount(flat, minlength=w1.shape[0]).tolist()  # host sync: not graph-capturable
    start = 0
    for e, count in enumerate(counts):
        if count:
            pairs = order[start:start + count]
            tokens = pairs // top_k
            h = F.linear(x[tokens].to(dtype), w1[e].to(dtype))
            y = F.linear(F.silu(h[:, :inter]) * h[:, inter:], w2[e].to(dtype))
            out.index_add_(0, tokens, y * weights.reshape(-1)[pairs, None].to(dtype))
            start += count
    return out


def reference(shape, inputs, options):
    return moe_forward(inputs["x"], inputs["logits"], inputs["w1"], inputs["w2"], shape.top_k, torch.float32)


def _torch_build(shape, inputs):
    x, logits, w1, w2 = (inputs[n] for n in ("x", "logits", "w1", "w2"))
    return lambda: moe_forward(x, logits, w1, w2, shape.top_k)


def _dense_dtype(shape, device):
    return None if shape.dtype in ("bf16", "fp16", "fp32") else f"the MoE providers run bf16/fp16/fp32, not {shape.dtype}"


def _vllm_build(shape, inputs):
    from vllm.model_executor.layers.fused_moe import fused_moe

    x, logits, w1, w2 = (inputs[n] for n in ("x", "logits", "w1", "w2"))
    return lambda: fused_moe(x, w1, w2, logits, shape.top_k, renormalize=True)


BENCH = FamilyBench(
    family="moe", make_inputs=make_inputs, reference=reference,
    providers=(Provider("torch.moe_loop", _torch_build, supports=_dense_dtype, graphable=False),
               Provider("vllm.fused_moe", _vllm_build, supports=_dense_dtype, requires="vllm", cuda_only=True)))
