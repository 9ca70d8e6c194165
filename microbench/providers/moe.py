"""moe: one GPU's share of a mixture-of-experts MLP, timed as fused grouped kernels.

Inputs follow predictor/families/moe.py: `tokens` rows enter, router logits cover all `experts`, this GPU
holds experts / moe_ep of them (the router's experts 0..local-1, as vLLM's expert_map keeps one EP rank's),
each cut to intermediate / moe_tp. Pairs routed to other ranks' experts are dropped. w1 [local, 2I, hidden]
holds gate then up rows, w2 [local, hidden, I]; weights are scaled so activations stay O(1); top-k weights
are the renormalised softmax (Mixtral, Qwen3).

The routing follows shape.distribution, deterministically from the harness seed, and is encoded in the
logits so every provider routes on the device inside the timed call:
- uniform: random logits (every token draws top_k experts at random);
- balanced: aiconfigurator's round-robin assignment;
- power_law_<alpha>: per-expert loads drawn as predictor.families.moe.local_routing draws them, the most
  loaded EP rank's experts made the local ones (aiconfigurator swaps that rank to rank 0 too); an expert
  takes at most `tokens` pairs (a token picks an expert once), the excess going to the next loaded experts.

Providers: torch.grouped_mm (route, sort, one grouped GEMM per projection; no host sync, CUDA-graph
capturable), torch.scaled_grouped_mm (fp8 weights, rowwise scales, activations quantised per row in the
call), triton.fused_moe (this project's kernel, microbench/triton_kernels/fused_moe.py), vllm.fused_moe
when installed. The per-expert Python loop is only the float32 reference.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from kernelsight.predictor.families.moe import power_law_loads

from .base import FP8_MAX, TORCH_DTYPES, FamilyBench, Provider, cuda_capability_at_least, randn

CHOSEN_LOGIT = 4.0  # a routed expert's logit lead over the others (noise is uniform in [0, 1))


# -- routing -------------------------------------------------------------------------

def balanced_ids(tokens: int, experts: int, top_k: int) -> np.ndarray:
    """aiconfigurator's balanced routing: token t takes experts t + i * ceil(E / k) (spread when t < stride)."""
    stride = math.ceil(experts / top_k)
    t = np.arange(tokens, dtype=np.float64)[:, None]
    i = np.arange(top_k, dtype=np.float64)[None, :]
    first = t if tokens >= stride else t * stride / tokens
    return np.floor((first + i * stride) % experts).astype(np.int64)


def ids_from_loads(loads: np.ndarray, tokens: int, top_k: int) -> np.ndarray:
    """[tokens, top_k] expert ids with these per-expert loads: the pairs listed expert by expert (most loaded
    first) fill the columns, so no token meets an expert twice while every load is <= tokens."""
    order = np.argsort(-loads, kind="stable")
    return np.repeat(order, loads[order]).reshape(top_k, tokens).T


def routing_logits(shape, device, gen: torch.Generator) -> torch.Tensor:
    """Router logits [tokens, experts] whose softmax top-k realises shape.distribution."""
    t, e, k = shape.tokens, shape.experts, shape.top_k
    if shape.distribution == "uniform":
        return randn((t, e), "fp32", device, gen)
    if shape.distribution == "balanced":
        ids = balanced_ids(t, e, k)
    else:
        u = torch.rand(e, generator=gen, device=device, dtype=torch.float64).cpu().numpy()
        alpha = float(shape.distribution.removeprefix("power_law_"))
        ids = ids_from_loads(power_law_loads(u, t, k, shape.moe_ep, alpha), t, k)
    chosen = F.one_hot(torch.from_numpy(ids).to(device), e).sum(1).float()
    return torch.rand((t, e), generator=gen, device=device) + CHOSEN_LOGIT * chosen


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per token and their renormalised softmax weights."""
    weights, experts = logits.float().softmax(-1).topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), experts


# -- inputs and the float32 reference ----------------------------------------------------

def local_sizes(shape) -> tuple[int, int]:
    """(experts on this GPU, their intermediate width)."""
    return shape.experts // shape.moe_ep, shape.intermediate // shape.moe_tp


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 (e4m3) with one float32 scale per row (the last dimension): (x / scale, scale = amax / FP8_MAX)."""
    scale = (x.abs().amax(-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(TORCH_DTYPES["fp8"]), scale.squeeze(-1)


def make_inputs(shape, device, gen):
    local, inter = local_sizes(shape)
    h = shape.hidden
    act = "bf16" if shape.dtype == "fp8" else shape.dtype
    inputs = {"x": randn((shape.tokens, h), act, device, gen), "logits": routing_logits(shape, device, gen)}
    w1 = randn((local, 2 * inter, h), "fp32" if shape.dtype == "fp8" else shape.dtype, device, gen,
               scale=1.0 / math.sqrt(h))
    w2 = randn((local, h, inter), "fp32" if shape.dtype == "fp8" else shape.dtype, device, gen,
               scale=1.0 / math.sqrt(inter))
    if shape.dtype == "fp8":
        (w1, inputs["w1_scale"]), (w2, inputs["w2_scale"]) = quantize_rows(w1), quantize_rows(w2)
    return {**inputs, "w1": w1, "w2": w2}


def moe_loop(x, logits, w1, w2, top_k: int, dtype=torch.float32, w1_scale=None, w2_scale=None):
    """Loop over the local experts that received pairs: gather, gate-up, SiLU-and-mul, down, weighted
    scatter-add (host syncs: the reference, never timed)."""
    weights, experts = route(logits, top_k)
    inter = w2.shape[-1]
    out = torch.zeros(x.shape, dtype=dtype, device=x.device)
    flat = experts.reshape(-1)
    for e in flat.unique().tolist():
        if e >= w1.shape[0]:
            continue  # another EP rank's expert
        pairs = (flat == e).nonzero().squeeze(1)
        tokens = pairs // top_k
        g = w1[e].to(dtype) * (w1_scale[e, :, None] if w1_scale is not None else 1)
        d = w2[e].to(dtype) * (w2_scale[e, :, None] if w2_scale is not None else 1)
        h = F.linear(x[tokens].to(dtype), g)
        y = F.linear(F.silu(h[:, :inter]) * h[:, inter:], d)
        out.index_add_(0, tokens, y * weights.reshape(-1)[pairs, None].to(dtype))
    return out


def reference(shape, inputs, options):
    return moe_loop(inputs["x"], inputs["logits"], inputs["w1"], inputs["w2"], shape.top_k,
                    w1_scale=inputs.get("w1_scale"), w2_scale=inputs.get("w2_scale"))


# -- torch grouped GEMMs ---------------------------------------------------------------

def _grouped_mm():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_moe(x, logits, w1, w2, top_k: int, w1_scale=None, w2_scale=None):
    """Route, sort the pairs by expert, one grouped GEMM per projection, weighted sum per token.

    Device-side only (sort, searchsorted offsets, index_select, index_copy, bmm): no host sync, so it is
    CUDA-graph capturable. Pairs of other ranks' experts sort after the last offset: the grouped GEMMs skip
    them and their (unwritten) rows are zeroed before the sum. With scales, the weights are fp8 and each
    GEMM's input rows are quantised per row in the call (torch._scaled_grouped_mm, rowwise scales).
    """
    tokens, hidden = x.shape
    local, inter = w1.shape[0], w2.shape[-1]
    weights, experts = route(logits, top_k)
    flat = experts.reshape(-1)
    key = flat.clamp(max=local) if local < logits.shape[1] else flat
    sorted_key, order = torch.sort(key, stable=True)
    offs = torch.searchsorted(sorted_key, torch.arange(local, device=x.device, dtype=sorted_key.dtype),
                              right=True, out_int32=True)
    rows = x.index_select(0, order // top_k)
    if w1_scale is None:
        mm = _grouped_mm()
        h = mm(rows, w1.transpose(1, 2), offs=offs)
        y = mm(F.silu(h[:, :inter]) * h[:, inter:], w2.transpose(1, 2), offs=offs)
    else:
        q, s = quantize_rows(rows)
        h = torch._scaled_grouped_mm(q, w1.transpose(1, 2), s, w1_scale, offs=offs, out_dtype=torch.bfloat16,
                                     use_fast_accum=True)
        q, s = quantize_rows(F.silu(h[:, :inter]) * h[:, inter:])
        y = torch._scaled_grouped_mm(q, w2.transpose(1, 2), s, w2_scale, offs=offs, out_dtype=torch.bfloat16,
                                     use_fast_accum=True)
    per_pair = torch.empty_like(y).index_copy_(0, order, y)
    if local < logits.shape[1]:
        per_pair = torch.where((flat < local)[:, None], per_pair, 0)
    return torch.bmm(weights.to(y.dtype).view(tokens, 1, top_k), per_pair.view(tokens, top_k, hidden)).view(tokens,
                                                                                                            hidden)


def _grouped_build(shape, inputs):
    x, logits, w1, w2 = (inputs[n] for n in ("x", "logits", "w1", "w2"))
    s1, s2 = inputs.get("w1_scale"), inputs.get("w2_scale")
    return lambda: grouped_moe(x, logits, w1, w2, shape.top_k, s1, s2)


def _hopper(name: str, device) -> str | None:
    if device.type != "cuda":
        return f"{name} runs on CUDA GPUs only"
    if not cuda_capability_at_least(device, 9, 0):
        return f"{name} needs compute capability >= 9.0 (Hopper's grouped GEMM kernels)"
    return None


def _grouped_mm_supports(shape, device):
    if shape.dtype != "bf16":
        return f"torch._grouped_mm takes bf16 only, not {shape.dtype}"
    if _grouped_mm() is None:
        return f"torch {torch.__version__} has no grouped_mm"
    local, inter = local_sizes(shape)
    if shape.hidden % 8 or inter % 8:
        return "torch._grouped_mm needs hidden and intermediate / moe_tp divisible by 8 (16-byte rows)"
    return _hopper("torch._grouped_mm", device)


def _scaled_grouped_mm_supports(shape, device):
    if shape.dtype != "fp8":
        return "torch._scaled_grouped_mm is the fp8 path"
    if not hasattr(torch, "_scaled_grouped_mm"):
        return f"torch {torch.__version__} has no _scaled_grouped_mm: fp8 MoE weights are not timed"
    local, inter = local_sizes(shape)
    if shape.hidden % 16 or inter % 16:
        return "torch._scaled_grouped_mm needs hidden and intermediate / moe_tp divisible by 16"
    return _hopper("torch._scaled_grouped_mm", device)


# -- this project's Triton kernel and vLLM's --------------------------------------------------

def _triton_build(shape, inputs):
    from kernelsight.microbench.triton_kernels.fused_moe import fused_moe

    x, logits, w1, w2 = (inputs[n] for n in ("x", "logits", "w1", "w2"))
    return lambda: fused_moe(x, logits, w1, w2, shape.top_k)


INTERPRETER_WEIGHT_BYTES = 256 << 20


def _triton_supports(shape, device):
    from kernelsight.microbench.triton_kernels import interpreting

    if shape.dtype not in ("bf16", "fp16"):
        return f"triton.fused_moe takes bf16/fp16 weights, not {shape.dtype}"
    local, inter = local_sizes(shape)
    if device.type != "cuda" and interpreting() and 3 * local * inter * shape.hidden * 2 > INTERPRETER_WEIGHT_BYTES:
        return (f"the Triton interpreter copies every argument to the host at each launch: over "
                f"{INTERPRETER_WEIGHT_BYTES >> 20} MiB of expert weights takes minutes per call")
    if shape.experts > 1024:
        return "triton.fused_moe routes up to 1024 experts (one program holds a token's logits)"
    return None


def _vllm_build(shape, inputs):
    from vllm.model_executor.layers.fused_moe import fused_moe

    x, logits, w1, w2 = (inputs[n] for n in ("x", "logits", "w1", "w2"))
    return lambda: fused_moe(x, w1, w2, logits, shape.top_k, renormalize=True)


def _vllm_supports(shape, device):
    if shape.dtype not in ("bf16", "fp16", "fp32"):
        return f"vllm.fused_moe is timed with bf16/fp16/fp32 weights here, not {shape.dtype}"
    if shape.moe_ep > 1:
        return "vllm.fused_moe is called without an expert_map: moe_ep must be 1"
    return None


BENCH = FamilyBench(
    family="moe", make_inputs=make_inputs, reference=reference,
    providers=(Provider("torch.grouped_mm", _grouped_build, supports=_grouped_mm_supports),
               Provider("torch.scaled_grouped_mm", _grouped_build, supports=_scaled_grouped_mm_supports),
               Provider("triton.fused_moe", _triton_build, supports=_triton_supports),
               Provider("vllm.fused_moe", _vllm_build, supports=_vllm_supports, requires="vllm", cuda_only=True)))
