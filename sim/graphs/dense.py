"""Dense GQA decoders (Llama, Mistral, Qwen2/3, Gemma-2/3, Phi-3, Granite, OLMo-2/3, Seed-OSS, GLM-4, Command-R):
per layer qkv GEMM, Qwen3's and Gemma-3's per-head q/k norm (OLMo's over the gathered projection), RoPE on the
layers that have it, KV write, attention, o_proj, TP all-reduce, then the gated MLP and its all-reduce.
Gemma's and GLM-4's sandwich norms, Command-R's one norm per layer and Gemma-2's final soft-capping are step-level
(sim/graph.py); Gemma-3's, OLMo-3's and Cohere2's global layers among their sliding ones are an attention kind of
their own (ModelConfig.full_every)."""
from __future__ import annotations

from ..model import DENSE_ARCHS
from .registry import register
from .common import ModelGraph, ffn_kernels, gqa_attention_kernels


@register(*DENSE_ARCHS)
class DenseDecoder(ModelGraph):
    def layers(self, model, par, engine, t, s):
        return gqa_attention_kernels(model, par, engine, t, s) + ffn_kernels(model, par, engine, t, s)
