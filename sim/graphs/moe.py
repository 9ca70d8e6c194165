"""MoE decoders with GQA attention (Mixtral, Qwen3-MoE, MiniMax-M2): the dense decoder's attention, then
router, top-k and the fused experts (common.moe_kernels) in every layer.

MiniMax-M2 differs in what its config sets, not in its graph: q and k are RMS-normed over the whole
projection with a TP all-reduce of their sums of squares (qk_norm 'projection'), RoPE rotates rotary_dim of
head_dim, the router runs in fp32 and scores by sigmoid."""
from __future__ import annotations

from .registry import register
from .common import ModelGraph, ffn_kernels, gqa_attention_kernels


@register("MixtralForCausalLM", "Qwen3MoeForCausalLM", "MiniMaxM2ForCausalLM")
class MoeDecoder(ModelGraph):
    def layers(self, model, par, engine, t, s):
        return gqa_attention_kernels(model, par, engine, t, s) + ffn_kernels(model, par, engine, t, s)
