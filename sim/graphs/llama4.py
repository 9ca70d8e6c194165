"""Llama-4 (Scout, Maverick): the language model of Llama4ForConditionalGeneration.

Every nope_every-th layer (every 4th) runs without RoPE and attends globally, scaling its queries by
the attention temperature (one multiply over q); the other layers rotate q and k, RMS-normalise them per
head without a weight in fp32 (use_qk_norm) and attend within aligned attention_chunk-token chunks
(vLLM's chunked local attention: each chunk is its own sequence; sim/graph.py splits prefill rows at chunk
boundaries and clips decode KV to the position in the chunk). The feed-forward is a MoE (top-1 of
sigmoid-scored experts plus one shared expert as wide as a routed one) every interleave_moe_layer_step-th
layer (Scout: all, Maverick: every second) and a dense MLP of intermediate_size_mlp elsewhere."""
from __future__ import annotations

from .registry import register
from .common import (KernelCall, ModelGraph, ffn_kernels, kv_write_kernel, o_proj_kernels, qk_norm_kernels,
                     qkv_kernels, rope_kernels)


@register("Llama4ForConditionalGeneration")
class Llama4(ModelGraph):
    def layers(self, model, par, engine, t, s):
        rope, nope = model.rope_layers, model.layers - model.rope_layers
        calls = qkv_kernels(model, engine, t, s)
        calls += qk_norm_kernels(model, par, t, s, rope, dtype="fp32")
        calls += rope_kernels(model, engine, t, s.heads, s.kv_heads, rope)
        if nope:
            calls.append(KernelCall("attn_temperature", "elementwise", {"numel": t * s.heads * model.head_dim,
                                                                        "op": "mulu", "dtype": model.act_dtype},
                                    nope))
        calls.append(kv_write_kernel(model, engine, t, s.kv_heads, model.head_dim))
        calls += o_proj_kernels(model, par, t, s.heads * model.head_dim)
        return calls + ffn_kernels(model, par, engine, t, s)
