"""rope: rotary embedding of Q and K in place, neox (rotate halves) and gpt-j (interleaved) layouts.

The cos/sin cache is vLLM's [max_position, head_dim] (cos | sin halves, base
10000) in the activation dtype; positions are random. Each provider is one
layout, named in its tag; the reference rotates the same layout in float32.
inductor.rope_* is what vLLM V1 runs: RotaryEmbedding.forward_native compiled
by Inductor (out of place: it returns new Q and K).
"""
from __future__ import annotations

import torch

from .base import FamilyBench, Provider, TORCH_DTYPES, inductor_provider, randn

MAX_POSITION = 32768
BASE = 10000.0


def make_inputs(shape, device, gen):
    half = shape.head_dim // 2
    inv_freq = BASE ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(MAX_POSITION, device=device, dtype=torch.float32), inv_freq)
    return {"positions": torch.randint(0, MAX_POSITION, (shape.tokens,), generator=gen, device=device),
            "q": randn((shape.tokens, shape.heads, shape.head_dim), shape.dtype, device, gen),
            "k": randn((shape.tokens, shape.kv_heads, shape.head_dim), shape.dtype, device, gen),
            "cos_sin": torch.cat([angles.cos(), angles.sin()], -1).to(TORCH_DTYPES[shape.dtype])}


def _halves(x: torch.Tensor, neox: bool):
    return (x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]) if neox else (x[..., 0::2], x[..., 1::2])


def _rotated(x, cos, sin, neox: bool):
    x1, x2 = _halves(x, neox)
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return torch.cat([o1, o2], -1) if neox else torch.stack([o1, o2], -1).flatten(-2)


def _cos_sin(inputs):
    cs = inputs["cos_sin"][inputs["positions"]].unsqueeze(1)
    half = cs.shape[-1] // 2
    return cs[..., :half], cs[..., half:]


def reference(shape, inputs, options):
    cos, sin = (c.float() for c in _cos_sin(inputs))
    return tuple(_rotated(inputs[n].float(), cos, sin, options["neox"]) for n in ("q", "k"))


def _torch_build(neox):
    def build(shape, inputs):
        """Unfused torch in the activation dtype (vLLM's forward_native): gather cos/sin, rotate, copy back."""
        q, k = inputs["q"], inputs["k"]

        def run():
            cos, sin = _cos_sin(inputs)
            for x in (q, k):
                x.copy_(_rotated(x, cos, sin, neox))
            return q, k
        return run
    return build


def _triton_build(neox):
    def build(shape, inputs):
        from kernelsight.microbench.triton_kernels.rope import rotary_embedding

        args = [inputs[n] for n in ("positions", "q", "k", "cos_sin")]
        return lambda: rotary_embedding(*args, neox=neox)
    return build


def _vllm_build(neox):
    def build(shape, inputs):
        from vllm import _custom_ops as ops

        pos, q, k, cs = (inputs[n] for n in ("positions", "q", "k", "cos_sin"))
        q2, k2 = q.view(shape.tokens, -1), k.view(shape.tokens, -1)

        def run():
            ops.rotary_embedding(pos, q2, k2, shape.head_dim, cs, neox)
            return q, k
        return run
    return build


def _native(neox):
    def native(shape, inputs):
        """vLLM's RotaryEmbedding.forward_native with rotary_dim = head_dim (its pass-through part is empty)."""
        positions = inputs["positions"].flatten()
        num_tokens = positions.shape[0]
        cos, sin = inputs["cos_sin"].index_select(0, positions).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # apply_rotary_emb_torch, then .to(x.dtype)
        out = []
        for x in (inputs["q"], inputs["k"]):
            x_shape = x.shape
            x = x.view(num_tokens, -1, shape.head_dim)
            rot = _rotated(x[..., :shape.head_dim], cos.to(x.dtype), sin.to(x.dtype), neox)
            out.append(torch.cat((rot, x[..., shape.head_dim:]), dim=-1).reshape(x_shape))
        return tuple(out)
    return native


def _even_dim(shape, device):
    return None if shape.head_dim % 2 == 0 else "rotary embedding needs an even head_dim"


def _providers():
    for style, neox in (("neox", True), ("gptj", False)):
        opts = {"neox": neox}
        yield Provider(f"torch.rope_{style}", _torch_build(neox), supports=_even_dim, options=opts)
        yield Provider(f"triton.rope_{style}", _triton_build(neox), supports=_even_dim, options=opts)
        yield inductor_provider(f"inductor.rope_{style}", _native(neox), supports=_even_dim, options=opts)
        yield Provider(f"vllm.rotary_embedding_{style}", _vllm_build(neox),
                       supports=_even_dim, options=opts, requires="vllm", cuda_only=True)


BENCH = FamilyBench(family="rope", make_inputs=make_inputs, reference=reference, providers=tuple(_providers()))
