"""The pieces every model graph shares: kernel calls, GEMMs, collectives, norms, GQA attention, MLP and MoE.

Everything token-wise is written with numpy arithmetic, so `t` may be an int or an array of token counts
(the pricer builds its per-T tables with the same code that builds a step).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernelsight.predictor.dtypes import dtype_bytes

from ..engine_profile import EngineProfile
from ..model import AttentionKind, ModelConfig
from ..parallel import ParallelConfig, Shard

_UNFUSED_ACT = {"silu_mul": "silu", "gelu_mul": "gelu", "gelu_tanh_mul": "gelu"}


@dataclass(frozen=True)
class KernelCall:
    """A kernel launched `count` times per step (layers x calls per layer).

    cols: the family's shape columns. Scalars describe one kernel; arrays describe rows whose
    costs add up (the chunks of one varlen prefill launch) or, inside the pricer's tables,
    alternative token counts.
    """

    name: str
    family: str
    cols: dict
    count: int
    phase: str = "mixed"
    scale: float = 1.0  # time multiplier: the kernel runs on a slower backend than the one the predictor prices

    @property
    def num_rows(self) -> int:
        return max((np.size(v) for v in self.cols.values() if np.ndim(v)), default=1)

    def columns(self) -> dict:
        """Every column as an array of num_rows entries (the form the cost model and predictor take)."""
        n = self.num_rows
        return {k: (np.asarray(v) if np.ndim(v) else np.full(n, v, dtype=object if isinstance(v, str) else None))
                for k, v in self.cols.items()}


def nbytes(dtype: str) -> int:
    return int(dtype_bytes(dtype))


def gemm(name: str, m, n: int, k: int, dtype: str, count: int) -> KernelCall:
    return KernelCall(name, "gemm", {"m": m, "n": n, "k": k, "dtype": dtype}, count)


def allreduce(name: str, elements, model: ModelConfig, par: ParallelConfig, count: int,
              dtype: str | None = None) -> KernelCall:
    """TP all-reduce of `elements` per rank (activation dtype unless `dtype`)."""
    dtype = dtype or model.act_dtype
    return KernelCall(name, "allreduce", {"msg_bytes": elements * nbytes(dtype), "world_size": par.tp,
                                          "link": par.link, "dtype": dtype}, count)


# -- norms ------------------------------------------------------------------------------------

def norm_kernels(model: ModelConfig, t, fused: bool, fused_ar_bytes: float = 0.0) -> list[KernelCall]:
    """Residual-carrying norms: every input / pre-MLP norm but layer 0's input, plus the final norm;
    plain norms: layer 0's input norm and Gemma-2's post-attention / post-feed-forward norms.

    Each residual norm follows a tensor-parallel all-reduce; up to fused_ar_bytes of message the
    all-reduce kernel does the residual add and RMSNorm itself (vLLM's FlashInfer all-reduce fusion),
    so none runs on its own: a count of 0 for those token counts (per row when t is an array)."""
    n_layers = model.layers
    with_residual = (1 if model.parallel_block else 2) * n_layers
    plain = 1 + (2 * n_layers if model.sandwich_norms else 0)
    ab = model.act_dtype
    if fused_ar_bytes and model.norm == "rms" and not model.sandwich_norms:
        absorbed = np.asarray(t) * model.hidden * nbytes(ab) <= fused_ar_bytes
        with_residual = np.where(absorbed, 0, with_residual) if np.ndim(t) else 0 if absorbed else with_residual
    cols = {"tokens": t, "hidden": model.hidden, "op": model.norm, "dtype": ab}
    name = f"{model.norm}norm"
    if not fused:
        calls = [KernelCall("residual_add", "elementwise", {"numel": t * model.hidden, "op": "add", "dtype": ab},
                            with_residual),
                 KernelCall(name, "norm", {**cols, "fused_residual": False}, with_residual + plain)]
    else:
        calls = [KernelCall(f"add_{name}", "norm", {**cols, "fused_residual": True}, with_residual),
                 KernelCall(name, "norm", {**cols, "fused_residual": False}, plain)]
    return [c for c in calls if np.any(c.count)]


def qk_norm_kernels(model: ModelConfig, par: ParallelConfig, t, s: Shard, count: int,
                    dtype: str | None = None) -> list[KernelCall]:
    """RMSNorm of the new q and k rows: per head (Qwen3: each of the heads + kv_heads rows of head_dim), or
    over the whole projection (MiniMax-M2's MiniMaxText01RMSNormTP: q and k normed over all their heads,
    the per-rank sums of squares of both all-reduced in one fp32 message of 2 values per token under TP), or
    'gathered' (OLMo-2's: under TP, q and k each all-gathered from every rank, normed over the whole
    width on every rank, then split back)."""
    dtype = dtype or model.act_dtype
    hd = model.head_dim
    if model.qk_norm == "head":
        return [KernelCall("qk_norm", "norm", {"tokens": t * (s.heads + s.kv_heads), "hidden": hd, "op": model.norm,
                                               "fused_residual": False, "dtype": dtype}, count)]
    if model.qk_norm not in ("projection", "gathered"):
        return []
    gathered = model.qk_norm == "gathered" and par.tp > 1
    widths = (("q", model.heads), ("k", model.kv_heads)) if gathered else (("q", s.heads), ("k", s.kv_heads))
    calls = [KernelCall(f"{x}_norm", "norm", {"tokens": t, "hidden": width * hd, "op": model.norm,
                                              "fused_residual": False, "dtype": dtype}, count)
             for x, width in widths]
    if gathered:   # nccl-tests' all-gather size: the gathered buffer, every rank's heads
        calls += [KernelCall(f"{x}_norm_allgather", "allgather",
                             {"msg_bytes": t * par.tp * rank_heads * hd * nbytes(dtype), "world_size": par.tp,
                              "link": par.link, "dtype": dtype}, count)
                  for x, rank_heads in (("q", s.heads), ("k", s.kv_heads))]
    elif par.tp > 1:
        calls.append(allreduce("qk_norm_allreduce", t * 2, model, par, count, dtype="fp32"))
    return calls


# -- attention ----------------------------------------------------------------------------------

def qkv_kernels(model: ModelConfig, engine: EngineProfile, t, s: Shard) -> list[KernelCall]:
    """The q, k, v projections of every layer (one fused GEMM, or three)."""
    h, hd, n_layers = model.hidden, model.head_dim, model.layers
    fmt = model.weight_format("attention")
    q, kv = s.heads * hd, s.kv_heads * hd
    if engine.kernels.qkv_fused:
        return [gemm("qkv_proj", t, q + 2 * kv, h, fmt, n_layers)]
    return [gemm("q_proj", t, q, h, fmt, n_layers), gemm("k_proj", t, kv, h, fmt, n_layers),
            gemm("v_proj", t, kv, h, fmt, n_layers)]


def rope_kernels(model: ModelConfig, engine: EngineProfile, t, heads: int, kv_heads: int,
                 count: int) -> list[KernelCall]:
    """Rotary embedding of the rope_dim rotated dims of q and k (in place, or rotated copies of q and k)."""
    ab, rd = model.act_dtype, model.rope_dim
    calls = [KernelCall("rope", "rope", {"tokens": t, "heads": heads, "kv_heads": kv_heads, "head_dim": rd,
                                         "dtype": ab}, count)]
    if not engine.kernels.rope_in_place:
        calls.append(KernelCall("rope_copy", "elementwise", {"numel": t * (heads + kv_heads) * model.head_dim,
                                                             "op": "copy", "dtype": ab}, count))
    return calls


def kv_write_kernel(model: ModelConfig, engine: EngineProfile, t, kv_heads: int, head_dim: int) -> KernelCall:
    return KernelCall("kv_write", "kv_write", {"tokens": t, "kv_heads": kv_heads, "head_dim": head_dim,
                                               "block_size": engine.scheduler.block_size, "dtype": model.act_dtype,
                                               "kv_dtype": model.kv_dtype}, model.layers)


def o_proj_kernels(model: ModelConfig, par: ParallelConfig, t, width: int) -> list[KernelCall]:
    """Attention output projection of `width` per-rank inputs, then the TP all-reduce."""
    calls = [gemm("o_proj", t, model.hidden, width, model.weight_format("attention_out"), model.layers)]
    if par.tp > 1:
        calls.append(allreduce("attn_allreduce", t * model.hidden, model, par, model.layers))
    return calls


def gqa_attention_kernels(model: ModelConfig, par: ParallelConfig, engine: EngineProfile, t, s: Shard,
                          qk_norm_dtype: str | None = None) -> list[KernelCall]:
    """The token-wise attention kernels of a GQA layer, all layers: qkv GEMM, q/k norm, RoPE (on the layers
    that have it), KV write, o_proj and its all-reduce (attention itself depends on the batch's KV:
    decode_call / prefill_call)."""
    n_layers = model.layers
    calls = qkv_kernels(model, engine, t, s)
    calls += qk_norm_kernels(model, par, t, s, n_layers, qk_norm_dtype)
    calls += rope_kernels(model, engine, t, s.heads, s.kv_heads, model.rope_layers)
    calls.append(kv_write_kernel(model, engine, t, s.kv_heads, model.head_dim))
    return calls + o_proj_kernels(model, par, t, s.heads * model.head_dim)


def decode_columns(model: ModelConfig, s: Shard, engine: EngineProfile, batch, seq_kv, window: int) -> dict:
    return {"batch": batch, "seq_kv": seq_kv, "heads": s.heads, "kv_heads": s.kv_heads, "head_dim": model.head_dim,
            "block_size": engine.scheduler.block_size, "window": window, "dtype": model.act_dtype,
            "kv_dtype": model.kv_dtype}


def prefill_columns(model: ModelConfig, s: Shard, new, cached, window: int) -> dict:
    """Rows of causal prefill chunks: `new` tokens after `cached` tokens already in the KV cache."""
    new = np.asarray(new, dtype=np.int64)
    return {"batch": np.ones_like(new), "seq_q": new, "seq_kv": new + np.asarray(cached, dtype=np.int64),
            "heads": s.heads, "kv_heads": s.kv_heads, "head_dim": model.head_dim, "causal": True,
            "window": window, "dtype": model.act_dtype, "kv_dtype": model.kv_dtype}


# -- MLP and MoE ----------------------------------------------------------------------------------

def mlp_kernels(prefix: str, width: int, model: ModelConfig, engine: EngineProfile, t, count: int,
                fmt: str) -> list[KernelCall]:
    """A gated MLP of `width` per rank in `count` layers: gate-up GEMM(s), activation, down GEMM."""
    h, ab = model.hidden, model.act_dtype
    k = engine.kernels
    calls = ([gemm(f"{prefix}gate_up_proj", t, 2 * width, h, fmt, count)] if k.gate_up_fused else
             [gemm(f"{prefix}gate_proj", t, width, h, fmt, count), gemm(f"{prefix}up_proj", t, width, h, fmt, count)])
    if k.silu_and_mul:
        calls.append(KernelCall(f"{prefix}act", "act", {"tokens": t, "intermediate": width,
                                                        "op": model.activation, "dtype": ab}, count))
    else:
        calls += [KernelCall(f"{prefix}act", "elementwise", {"numel": t * width, "op": _UNFUSED_ACT[model.activation],
                                                             "dtype": ab}, count),
                  KernelCall(f"{prefix}act_mul", "elementwise", {"numel": t * width, "op": "mul", "dtype": ab}, count)]
    calls.append(gemm(f"{prefix}down_proj", t, h, width, fmt, count))
    return calls


def moe_kernels(model: ModelConfig, par: ParallelConfig, engine: EngineProfile, t, s: Shard) -> list[KernelCall]:
    """Router and top-k on this GPU's tokens, then the fused experts over the tokens of the whole MoE group,
    in every MoE layer.

    Without attention data parallelism every GPU of the TP group already holds all T tokens: each runs its
    experts (1/ep of them, cut moe_tp ways) over them and the TP all-reduce after the MLP combines the
    results. With attention_dp groups, vLLM's default all-to-all backend (allgather_reducescatter)
    all-gathers the groups' tokens over the data-parallel group before the experts (dispatch) and
    reduce-scatters the outputs after them (combine), so the kernel sees T x attention_dp tokens (the
    groups run in lockstep, padded to the largest group's T where CUDA graphs run: engine.LockstepGroup). The router runs in model.router_dtype, the top-k
    scoring is the model's softmax or sigmoid over every expert, the experts run in their own format
    and the shared expert, where there is one, as a TP-sharded MLP in its own."""
    moe, h, count = model.moe, model.hidden, model.moe_layers
    ab = model.act_dtype
    group_tokens = t * par.attention_dp
    calls = [gemm("router", t, moe.experts, h, model.router_dtype, count),
             KernelCall("topk", "elementwise", {"numel": t * moe.experts, "op": moe.scoring, "dtype": ab}, count),
             KernelCall("experts", "moe", {"tokens": group_tokens, "experts": moe.experts, "top_k": moe.top_k,
                                           "hidden": h, "intermediate": moe.intermediate,
                                           "dtype": model.weight_format("experts"), "moe_tp": par.moe_tp,
                                           "moe_ep": par.ep, "distribution": engine.kernels.moe_routing}, count)]
    if par.attention_dp > 1:
        size = par.attention_dp
        msg = group_tokens * h * nbytes(ab)  # the gathered hidden states, every group's tokens
        msg = msg.astype(np.int64) if np.ndim(msg) else int(msg)
        for name, op in (("moe_dispatch", "allgather"), ("moe_combine", "reducescatter")):
            calls.append(KernelCall(name, op, {"msg_bytes": msg, "world_size": size, "link": par.moe_link,
                                               "dtype": ab}, count))
    if moe.shared_intermediate:
        calls += mlp_kernels("shared_", moe.shared_intermediate // par.tp, model, engine, t, count,
                             model.weight_format("shared_experts"))
    if moe.shared_gate:  # sigmoid(hidden @ w_gate) scales the shared expert's output (a 16-bit GEMV per token)
        calls += [gemm("shared_expert_gate", t, 1, h, ab, count),
                  KernelCall("shared_gate_mul", "elementwise", {"numel": t * h, "op": "mul", "dtype": ab}, count)]
    return calls


def ffn_kernels(model: ModelConfig, par: ParallelConfig, engine: EngineProfile, t, s: Shard) -> list[KernelCall]:
    """The feed-forward half of every layer: the dense MLP on dense layers, the MoE on MoE layers, then
    the TP all-reduce of each layer's output."""
    calls = []
    if model.dense_layers:
        calls += mlp_kernels("", s.intermediate, model, engine, t, model.dense_layers, model.weight_format("mlp"))
    if model.moe:
        calls += moe_kernels(model, par, engine, t, s)
    if par.tp > 1:
        calls.append(allreduce("mlp_allreduce", t * model.hidden, model, par, model.layers))
    return calls


class ModelGraph:
    """What one architecture family runs per layer.

    layers: the token-wise kernels of every layer for T tokens (an int or an array), each call counted
    over the layers that run it; decode_call / prefill_call: one attention launch of a layer kind, GQA's
    paged decode and FlashAttention varlen prefill unless the family overrides them."""

    def layers(self, model: ModelConfig, par: ParallelConfig, engine: EngineProfile, t, s: Shard) -> list[KernelCall]:
        raise NotImplementedError

    def decode_call(self, model: ModelConfig, s: Shard, engine: EngineProfile, batch, seq_kv,
                    kind: AttentionKind, suffix: str = "") -> KernelCall:
        """Decode attention of `batch` sequences at mean KV length seq_kv (after the kind's window or chunk)."""
        return KernelCall(f"attn_decode{suffix}", "attn_decode",
                          decode_columns(model, s, engine, batch, seq_kv, kind.window), kind.count, "decode")

    def prefill_call(self, model: ModelConfig, s: Shard, new, cached, kind: AttentionKind,
                     suffix: str = "") -> KernelCall:
        """Causal prefill rows of `new` tokens after `cached` (chunked kinds: rows already split at chunks)."""
        return KernelCall(f"attn_prefill{suffix}", "attn_prefill",
                          prefill_columns(model, s, new, cached, kind.window), kind.count, "prefill")
