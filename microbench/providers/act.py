"""act: gated activation out = act(x[:, :I]) * x[:, I:] (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul).

inductor.act_and_mul is what vLLM V1 runs: SiluAndMul / GeluAndMul.forward_native compiled by Inductor.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import FamilyBench, Provider, inductor_provider, randn

ACTIVATIONS = {"silu_mul": F.silu, "gelu_mul": F.gelu, "gelu_tanh_mul": lambda a: F.gelu(a, approximate="tanh")}


def make_inputs(shape, device, gen):
    return {"x": randn((shape.tokens, 2 * shape.intermediate), shape.dtype, device, gen)}


def reference(shape, inputs, options):
    x = inputs["x"].float()
    return ACTIVATIONS[shape.op](x[:, :shape.intermediate]) * x[:, shape.intermediate:]


def _torch_build(shape, inputs):
    """Unfused torch: activation kernel, then the multiply (two kernels, as without a fused op)."""
    x, act, inter = inputs["x"], ACTIVATIONS[shape.op], shape.intermediate
    return lambda: act(x[:, :inter]) * x[:, inter:]


def _triton_build(shape, inputs):
    from kernelsight.microbench.triton_kernels.act import act_and_mul

    x = inputs["x"]
    return lambda: act_and_mul(x, shape.op)


def _vllm_build(shape, inputs):
    from vllm import _custom_ops as ops

    x = inputs["x"]
    out = torch.empty((shape.tokens, shape.intermediate), dtype=x.dtype, device=x.device)
    kernel = {"silu_mul": ops.silu_and_mul, "gelu_mul": ops.gelu_and_mul,
              "gelu_tanh_mul": ops.gelu_tanh_and_mul}[shape.op]

    def run():
        kernel(out, x)
        return out
    return run


def _native(shape, inputs):
    """vLLM's SiluAndMul / GeluAndMul.forward_native."""
    x = inputs["x"]
    d = x.shape[-1] // 2
    return ACTIVATIONS[shape.op](x[..., :d]) * x[..., d:]


BENCH = FamilyBench(
    family="act", make_inputs=make_inputs, reference=reference,
    providers=(Provider("torch.act", _torch_build),
               Provider("triton.act_and_mul", _triton_build),
               inductor_provider("inductor.act_and_mul", _native),
               Provider("vllm.act_and_mul", _vllm_build, requires="vllm", cuda_only=True)))
