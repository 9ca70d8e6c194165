"""DeepSeek-V3 / R1 / V3.1, Kimi-K2 (DeepseekV3ForCausalLM) and DeepSeek-V2 / V2-Lite (DeepseekV2ForCausalLM):
multi-head latent attention, first_dense dense layers, then MoE layers of routed experts (V3 sigmoid-scored,
V2 softmax) plus shared experts. V2-Lite has no query latent (q_lora_rank 0: q_proj from the hidden state).

The attention block of a layer is ONE priced module, predictor/families/mla.py's mla_prefill (prefill
rows) and mla_decode (the step's decodes): from the normed hidden state to o_proj's output it holds
the replicated down-projection, the q_a / kv_a norms, q_b_proj, RoPE, the latent KV-cache write, the
attention (prefill: kv_b_proj expansion and FlashAttention; decode: the absorbed W_UK / W_UV batched
GEMMs and the MLA decode kernel) and o_proj. So this graph launches no qkv / o_proj GEMM, RoPE, KV
write or mla_bmm of its own: per layer only the all-reduce after o_proj, the norms around the block
(sim/graph.py) and the feed-forward (dense MLP or MoE, common.ffn_kernels).

Approximations: the module takes one weight format, the attention input projections' (weight_format
'attention'); DeepSeek-V3.1-NVFP4 keeps those 16-bit but o_proj in NVFP4, so o_proj's bytes are priced
16-bit there. vLLM runs the projections once over all of a step's tokens; here each prefill row and the
decodes carry their own, so a mixed step reads the attention weights once per prefill chunk more."""
from __future__ import annotations

import numpy as np

from .registry import register
from .common import KernelCall, ModelGraph, allreduce, ffn_kernels


def _mla_columns(model, s) -> dict:
    a = model.mla
    return {"heads": s.heads, "hidden": model.hidden, "q_lora_rank": a.q_lora_rank, "kv_lora_rank": a.kv_lora_rank,
            "qk_nope_head_dim": a.qk_nope_head_dim, "qk_rope_head_dim": a.qk_rope_head_dim,
            "v_head_dim": a.v_head_dim, "dtype": model.weight_format("attention"), "kv_dtype": model.kv_dtype}


@register("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
class DeepseekMla(ModelGraph):
    def layers(self, model, par, engine, t, s):
        calls = [allreduce("attn_allreduce", t * model.hidden, model, par, model.layers)] if par.tp > 1 else []
        return calls + ffn_kernels(model, par, engine, t, s)

    def decode_call(self, model, s, engine, batch, seq_kv, kind, suffix=""):
        return KernelCall(f"mla_decode{suffix}", "mla_decode", {"batch": batch, "seq_kv": seq_kv,
                                                                **_mla_columns(model, s)}, kind.count, "decode")

    def prefill_call(self, model, s, new, cached, kind, suffix=""):
        new = np.asarray(new, dtype=np.int64)
        return KernelCall(f"mla_prefill{suffix}", "mla_prefill",
                          {"batch": np.ones_like(new), "seq_q": new, "seq_kv": new + np.asarray(cached, dtype=np.int64),
                           **_mla_columns(model, s)}, kind.count, "prefill")
