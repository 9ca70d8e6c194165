"""attn_prefill: causal prefill attention of seq_q new tokens per sequence after a cached prefix.

Inputs are packed varlen tensors (q [batch*seq_q, heads, head_dim], k/v
[batch*seq_kv, kv_heads, head_dim]) with cumulative lengths, as FlashAttention's
varlen API and the triton kernel take them; SDPA gets [batch, heads, seq, dim]
views of the same memory. Causal alignment is bottom-right (the new tokens are
the last seq_q positions), which SDPA expresses with causal_lower_right.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import FamilyBench, Provider, randn, triton_dot_dtype

REFERENCE_SCORES_BYTES = 1 << 28  # the float32 reference works on query chunks of this many score bytes


def make_inputs(shape, device, gen):
    b, sq, skv = shape.batch, shape.seq_q, shape.seq_kv
    return {"q": randn((b * sq, shape.heads, shape.head_dim), shape.dtype, device, gen),
            "k": randn((b * skv, shape.kv_heads, shape.head_dim), shape.kv_dtype, device, gen),
            "v": randn((b * skv, shape.kv_heads, shape.head_dim), shape.kv_dtype, device, gen),
            "cu_seqlens_q": torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=device),
            "cu_seqlens_k": torch.arange(0, (b + 1) * skv, skv, dtype=torch.int32, device=device)}


def attention_reference(q, k, v, prefix: int, causal: bool, window: int) -> torch.Tensor:
    """float32 attention of one sequence: q [Lq, H, D] at positions prefix.., k/v [Lk, KVH, D]."""
    lq, heads, dim = q.shape
    lk, kv_heads, _ = k.shape
    group = heads // kv_heads
    k, v = k.float(), v.float()
    out = torch.empty((lq, heads, dim), dtype=torch.float32, device=q.device)
    chunk = max(1, REFERENCE_SCORES_BYTES // (4 * heads * lk))
    keys = torch.arange(lk, device=q.device)
    for start in range(0, lq, chunk):
        qc = q[start:start + chunk].float().view(-1, kv_heads, group, dim)
        scores = torch.einsum("qhgd,khd->hgqk", qc, k) / math.sqrt(dim)
        pos = prefix + start + torch.arange(qc.shape[0], device=q.device)
        keep = torch.ones((qc.shape[0], lk), dtype=torch.bool, device=q.device)
        if causal:
            keep &= keys[None, :] <= pos[:, None]
        if window:
            keep &= keys[None, :] > pos[:, None] - window
        probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
        out[start:start + chunk] = torch.einsum("hgqk,khd->qhgd", probs, v).reshape(-1, heads, dim)
    return out


def reference(shape, inputs, options):
    sq, skv = shape.seq_q, shape.seq_kv
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    return torch.cat([attention_reference(q[b * sq:(b + 1) * sq], k[b * skv:(b + 1) * skv],
                                          v[b * skv:(b + 1) * skv], skv - sq, shape.causal, shape.window)
                      for b in range(shape.batch)])


def _supports_common(shape):
    if shape.kv_dtype != shape.dtype:
        return "prefill attention reads K/V in the activation dtype"
    if shape.window and not shape.causal:
        return "a sliding window is defined for causal attention only"
    return None


# -- torch SDPA, one provider per backend -------------------------------------------

def _sdpa_backend(backend: str):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]


def _sdpa_call(q4, k4, v4, causal: bool, backend: str):
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    lq, lk = q4.shape[2], k4.shape[2]
    mask = causal_lower_right(lq, lk) if causal and lk > lq else None
    gqa = q4.shape[1] != k4.shape[1]
    kind = _sdpa_backend(backend)

    def run():
        with sdpa_kernel(kind):
            return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, is_causal=causal and mask is None,
                                                  enable_gqa=gqa)
    return run


def _sdpa_build(backend):
    def build(shape, inputs):
        b, sq, skv = shape.batch, shape.seq_q, shape.seq_kv
        q4 = inputs["q"].view(b, sq, shape.heads, shape.head_dim).transpose(1, 2)
        k4 = inputs["k"].view(b, skv, shape.kv_heads, shape.head_dim).transpose(1, 2)
        v4 = inputs["v"].view(b, skv, shape.kv_heads, shape.head_dim).transpose(1, 2)
        return _sdpa_call(q4, k4, v4, shape.causal, backend)
    return build


def _sdpa_unpack(shape, inputs, out):
    return out.transpose(1, 2).reshape(-1, shape.heads, shape.head_dim)


def _sdpa_supports(shape, device):
    if shape.window:
        return "SDPA has no sliding-window mask"
    return _supports_common(shape)


def _sdpa_available(backend):
    def probe(device):
        """Run a tiny causal call on the backend: SDPA says itself what it cannot do here. Equal query and KV
        heads, so a backend without GQA (torch documents enable_gqa for flash and math) still times the MHA
        shapes and its GQA shapes fail as rows with the reason. The H100 sweep of 2026-11-22, probed with a
        GQA call, has no efficient-backend row at all, MHA shapes included."""
        dtype = torch.float16 if device.type == "cuda" else torch.float32
        q = torch.ones((1, 2, 4, 64), dtype=dtype, device=device)
        kv = torch.ones((1, 2, 8, 64), dtype=dtype, device=device)
        try:
            _sdpa_call(q, kv, kv, True, backend)()
        except RuntimeError as e:
            return f"SDPA backend {backend!r} not usable here: {str(e).splitlines()[0][:120]}"
        return None
    return probe


def _sdpa(backend):
    return Provider(f"torch.sdpa.{backend}", _sdpa_build(backend), supports=_sdpa_supports,
                    available=_sdpa_available(backend), unpack=_sdpa_unpack)


# -- triton kernel of this project and FlashAttention varlen ---------------------------

def _triton_build(shape, inputs):
    from kernelsight.microbench.triton_kernels.prefill import prefill_attention

    q, k, v, cq, ck = (inputs[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
    return lambda: prefill_attention(q, k, v, cq, ck, shape.seq_q, causal=shape.causal, window=shape.window)


def _triton_supports(shape, device):
    return _supports_common(shape) or triton_dot_dtype(shape.dtype, device)


def _flash_attn_build(shape, inputs):
    from flash_attn import flash_attn_varlen_func

    q, k, v, cq, ck = (inputs[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
    window = (shape.window - 1, 0) if shape.window else (-1, -1)
    return lambda: flash_attn_varlen_func(q, k, v, cq, ck, shape.seq_q, shape.seq_kv, causal=shape.causal,
                                          window_size=window)


def _flash_attn_supports(shape, device):
    if shape.dtype not in ("fp16", "bf16"):
        return "flash_attn takes fp16/bf16"
    return _supports_common(shape)


BENCH = FamilyBench(
    family="attn_prefill", make_inputs=make_inputs, reference=reference,
    providers=(*(_sdpa(b) for b in ("flash", "efficient", "cudnn", "math")),
               Provider("triton.prefill_attention", _triton_build, supports=_triton_supports),
               Provider("flash_attn.varlen", _flash_attn_build, supports=_flash_attn_supports,
                        requires="flash_attn", cuda_only=True)))
