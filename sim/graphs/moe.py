"""MoE decoders with GQA attention (Mixtral, Qwen2-MoE, Qwen3-MoE, MiniMax-M2, GLM-4.5, ERNIE-4.5, OLMoE,
Granite-MoE): the dense decoder's
attention, then router, top-k and the fused experts (common.moe_kernels) in every MoE layer, the dense MLP
in the others (common.ffn_kernels).

Qwen2-MoE adds a shared expert whose output a per-token sigmoid gate scales; GLM-4.5 has DeepSeek-V3's MoE
block (first dense layers, sigmoid-scored routed experts, shared experts) behind GQA attention with a q/k/v
bias, per-head q/k norms (use_qk_norm) and RoPE on half of each head.

ERNIE-4.5's MoE layers start at moe_layer_start_index (dense MLP before) and carry moe_num_shared_experts
shared experts as one MLP; its RoPE is GPT-J style (the same work per token as NeoX's).

MiniMax-M2 differs in what its config sets, not in its graph: q and k are RMS-normed over the whole
projection with a TP all-reduce of their sums of squares (qk_norm 'projection'), RoPE rotates rotary_dim of
head_dim, the router runs in fp32 and scores by sigmoid."""
from __future__ import annotations

from .registry import register
from .common import ModelGraph, ffn_kernels, gqa_attention_kernels


@register("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MiniMaxM2ForCausalLM",
          "Glm4MoeForCausalLM", "Ernie4_5_MoeForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM",
          "OlmoeForCausalLM")
class MoeDecoder(ModelGraph):
    def layers(self, model, par, engine, t, s):
        return gqa_attention_kernels(model, par, engine, t, s) + ffn_kernels(model, par, engine, t, s)
