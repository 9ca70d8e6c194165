"""gemm: y[m, n] = x[m, k] @ w[n, k]^T, the projection GEMMs behind F.linear.

bf16/fp16/fp32 through F.linear (cuBLAS(Lt) on a GPU); fp8 through
torch._scaled_mm with per-tensor scales, output bf16, as vLLM's fp8 linear does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import FamilyBench, Provider, fp8_support, quantize_fp8, randn


def make_inputs(shape, device, gen):
    if shape.dtype == "fp8":
        x, x_scale = quantize_fp8(randn((shape.m, shape.k), "fp32", device, gen))
        w, w_scale = quantize_fp8(randn((shape.n, shape.k), "fp32", device, gen))
        return {"x": x, "w": w, "x_scale": x_scale, "w_scale": w_scale}
    return {"x": randn((shape.m, shape.k), shape.dtype, device, gen),
            "w": randn((shape.n, shape.k), shape.dtype, device, gen)}


def reference(shape, inputs, options):
    x, w = inputs["x"].float(), inputs["w"].float()
    if shape.dtype == "fp8":
        x, w = x * inputs["x_scale"], w * inputs["w_scale"]
    return x @ w.T


def _linear(shape, inputs):
    x, w = inputs["x"], inputs["w"]
    return lambda: F.linear(x, w)


def _scaled_mm(shape, inputs):
    x, w, sx, sw = inputs["x"], inputs["w"], inputs["x_scale"], inputs["w_scale"]
    return lambda: torch._scaled_mm(x, w.T, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)


def _linear_supports(shape, device):
    return None if shape.dtype in ("bf16", "fp16", "fp32") else f"F.linear runs bf16/fp16/fp32, not {shape.dtype}"


def _scaled_mm_supports(shape, device):
    if shape.dtype != "fp8":
        return "torch._scaled_mm is the fp8 path"
    if device.type == "cuda" and (shape.k % 16 or shape.n % 16):
        return "torch._scaled_mm needs k and n divisible by 16"
    return fp8_support(device)


BENCH = FamilyBench(
    family="gemm", make_inputs=make_inputs, reference=reference,
    providers=(Provider("torch.F.linear", _linear, supports=_linear_supports),
               Provider("torch._scaled_mm", _scaled_mm, supports=_scaled_mm_supports)))
