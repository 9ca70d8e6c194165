"""norm: RMSNorm / LayerNorm per row, optionally fused with the residual add.

With fused_residual the semantics are vLLM's fused_add_rms_norm: residual <-
x + residual, output = norm(residual) * w; the check compares both the output
and the updated residual. inductor.rms_norm is what vLLM V1 runs: its
RMSNorm.forward_static compiled by Inductor (out of place: it returns the new
residual rather than updating it).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import FamilyBench, Provider, TORCH_DTYPES, inductor_provider, randn

EPS = 1e-6


def make_inputs(shape, device, gen):
    inputs = {"x": randn((shape.tokens, shape.hidden), shape.dtype, device, gen),
              "weight": (1.0 + randn((shape.hidden,), "fp32", device, gen, scale=0.1)).to(TORCH_DTYPES[shape.dtype])}
    if shape.op == "layer":
        inputs["bias"] = randn((shape.hidden,), shape.dtype, device, gen, scale=0.1)
    if shape.fused_residual:
        inputs["residual"] = randn((shape.tokens, shape.hidden), shape.dtype, device, gen)
    return inputs


def reference(shape, inputs, options):
    x = inputs["x"].float()
    if shape.fused_residual:
        x = x + inputs["residual"].float()
    w = inputs["weight"].float()
    if shape.op == "rms":
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
    else:
        out = F.layer_norm(x, (shape.hidden,), w, inputs["bias"].float(), EPS)
    return (out, x) if shape.fused_residual else out


def _torch_build(shape, inputs):
    """Unfused torch: residual.add_(x), then F.rms_norm / F.layer_norm."""
    x, w, res = inputs["x"], inputs["weight"], inputs.get("residual")
    bias = inputs.get("bias")
    norm = (lambda y: F.rms_norm(y, (shape.hidden,), w, EPS)) if shape.op == "rms" else \
        (lambda y: F.layer_norm(y, (shape.hidden,), w, bias, EPS))
    if res is None:
        return lambda: norm(x)

    def run():
        res.add_(x)
        return norm(res), res
    return run


def _rms_only(shape, device):
    return None if shape.op == "rms" else "the fused kernel is RMSNorm"


def _triton_build(shape, inputs):
    from kernelsight.microbench.triton_kernels.rms_norm import rms_norm

    x, w, res = inputs["x"], inputs["weight"], inputs.get("residual")
    if res is None:
        return lambda: rms_norm(x, w, EPS)
    return lambda: (rms_norm(x, w, EPS, residual=res), res)


def _vllm_build(shape, inputs):
    from vllm import _custom_ops as ops

    x, w, res = inputs["x"], inputs["weight"], inputs.get("residual")
    if res is None:
        out = torch.empty_like(x)

        def run():
            ops.rms_norm(out, x, w, EPS)
            return out
        return run

    def run_fused():
        ops.fused_add_rms_norm(x, res, w, EPS)
        return x, res
    return run_fused


def _native(shape, inputs):
    """vLLM's RMSNorm.forward_static: float32 math (the residual added in float32, stored in the input dtype),
    normalised, cast back to the input dtype, times the weight."""
    x, residual, weight = inputs["x"], inputs.get("residual"), inputs["weight"]
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    if residual is not None:
        x = x + residual
        residual = x.to(orig_dtype)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + EPS)
    x = x.to(orig_dtype) * weight
    return x if residual is None else (x, residual)


BENCH = FamilyBench(
    family="norm", make_inputs=make_inputs, reference=reference,
    providers=(Provider("torch.norm", _torch_build),
               Provider("triton.rms_norm", _triton_build, supports=_rms_only),
               inductor_provider("inductor.rms_norm", _native, supports=_rms_only),
               Provider("vllm.rms_norm", _vllm_build, supports=_rms_only, requires="vllm", cuda_only=True)))
