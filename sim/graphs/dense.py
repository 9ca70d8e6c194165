"""Dense GQA decoders (Llama, Mistral, Qwen2/3, Gemma-2, Phi-3): per layer qkv GEMM, Qwen3's per-head
q/k norm, RoPE, KV write, attention, o_proj, TP all-reduce, then the gated MLP and its all-reduce.
Gemma-2's sandwich norms and final soft-capping are step-level (sim/graph.py)."""
from __future__ import annotations

from ..model import DENSE_ARCHS
from .registry import register
from .common import ModelGraph, ffn_kernels, gqa_attention_kernels


@register(*DENSE_ARCHS)
class DenseDecoder(ModelGraph):
    def layers(self, model, par, engine, t, s):
        return gqa_attention_kernels(model, par, engine, t, s) + ffn_kernels(model, par, engine, t, s)
