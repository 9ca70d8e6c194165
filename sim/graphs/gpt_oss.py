"""gpt-oss: GQA attention with biases and attention sinks, alternating 128-token sliding-window and full
layers (attention kinds, sim/graph.py), a MoE in every layer (router with bias, softmax top-k, MXFP4
experts with biases).

Attention sinks: one learned logit per head joins each query row's softmax denominator. The attention
kernel (FlashAttention / vLLM's Triton attention with sinks) does one exp and one add more per (query
row, head) and reads one fp32 per head: for a decode of 64 sequences over 1,024 keys and 8 heads per GPU
that is 1,024 operations against QK^T + PV's 134 million, so the sink is priced inside the plain
attention kernel, at no extra cost.

The experts' activation is swiglu with clamp (gate * sigmoid(1.702 gate) * (up + 1), both clamped to
+-7), run inside the fused MoE kernel: the moe family prices the activation's bytes as part of the
experts, and no act kernel is launched. The model's `activation` (silu_mul, the act family's op nearest
to that swish) would price a separate activation; gpt-oss has none (no dense or shared MLP)."""
from __future__ import annotations

from .registry import register
from .moe import MoeDecoder


@register("GptOssForCausalLM")
class GptOss(MoeDecoder):
    pass
