"""One engine step -> the kernels a vLLM-style engine launches on one GPU.

Per layer, for the mixed batch of a step (T scheduled tokens, S sampled rows):
  [norm]  RMSNorm, fused with the residual add (the first layer's input norm has no residual yet;
          Gemma-2 adds plain post-attention / post-feed-forward norms)
  qkv_proj GEMM (T x (heads + 2 kv_heads) * head_dim / tp), Qwen3's per-head q/k norm, RoPE,
  kv_write of the new K/V rows, attention (prefill chunks and decodes, below), o_proj GEMM,
  TP all-reduce, norm, then the MLP: gate_up_proj GEMM, gated activation, down_proj GEMM, TP
  all-reduce; or for MoE: router GEMM, top-k softmax, the fused experts over the (token, expert)
  pairs routed to this GPU's experts, the attention-DP dispatch and combine, TP all-reduce.
Once per step: embedding gather (+ all-reduce of the vocab-parallel lookup), final norm, PP
send/recv between stages, LM head on the S sampled rows only, logits gather across TP, Gemma-2's
final soft-capping, and the sampler's softmax over the vocabulary in fp32.

Identical layers are one KernelCall with count = layers; only attention differs between layer
kinds (Gemma-2's sliding and global layers), so each kind gets its own attention calls.

Attention aggregation. Decode attention is memory bound and its cost model is linear in each
sequence's KV length, so a step's n decodes become ONE attn_decode shape with batch = n and
seq_kv = round(mean KV length) (after clipping each length to the layer's window): flops and
KV bytes equal the sum over sequences up to that rounding (< 0.5 token per sequence). Prefill
cost is not linear (causal pairs grow with new * (prefix + new / 2)), so no single shape carries
the sum; the varlen prefill launch is one KernelCall whose columns hold one row per chunk, and
its cost is the sum over rows.

Everything token-wise is written with numpy arithmetic, so `token_kernels` and
`sampled_kernels` also accept an array of token counts: the pricer builds its per-T tables
with the same code that builds a step.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

import numpy as np

from kernelsight.predictor.dtypes import dtype_bytes

from .batch import StepBatch
from .engine_profile import EngineProfile
from .model import ModelConfig
from .parallel import ParallelConfig, Shard, shard

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


def step_kernels(model: ModelConfig, batch: StepBatch, par: ParallelConfig, engine: EngineProfile,
                 padded_tokens: int | None = None) -> list[KernelCall]:
    """Every kernel of one step; padded_tokens: the CUDA-graph size token-wise kernels run at."""
    s = shard(model, par)
    tokens = padded_tokens or batch.num_tokens
    if batch.num_prefill_tokens and batch.num_decode_tokens:
        phase = "mixed"
    else:
        phase = "prefill" if batch.num_prefill_tokens else "decode"
    calls = [_with_phase(c, phase) for c in token_kernels(model, par, engine, tokens, s)]
    calls += attention_kernels(model, par, engine, batch, s)
    if batch.num_sampled:
        sphase = "mixed" if batch.prefill_sampled and batch.decode_ctx else (
            "prefill" if batch.prefill_sampled else "decode")
        calls += [_with_phase(c, sphase) for c in sampled_kernels(model, par, batch.num_sampled, s)]
    return calls


def _with_phase(call: KernelCall, phase: str) -> KernelCall:
    return KernelCall(call.name, call.family, call.cols, call.count, phase)


# -- token-wise kernels ---------------------------------------------------------------

def token_kernels(model: ModelConfig, par: ParallelConfig, engine: EngineProfile, tokens,
                  s: Shard | None = None) -> list[KernelCall]:
    """Kernels whose shapes depend only on the step's token count (an int or an array of them)."""
    s = s or shard(model, par)
    t = np.asarray(tokens) if np.ndim(tokens) else int(tokens)
    h, hd, n_layers = model.hidden, model.head_dim, model.layers
    ab, wd = model.act_dtype, model.weight_dtype
    k = engine.kernels
    calls = [KernelCall("embedding", "elementwise", {"numel": t * h, "op": "embedding", "dtype": ab}, 1)]
    if par.tp > 1:
        calls.append(_allreduce("embedding_allreduce", t * h, model, par, 1))
    fused_ar = engine.allreduce.fused_norm_max_bytes(par.tp) if par.tp > 1 else 0.0
    calls += _norm_kernels(model, t, k.fused_add_rms_norm, fused_ar)

    q, kv = s.heads * hd, s.kv_heads * hd
    if k.qkv_fused:
        calls.append(_gemm("qkv_proj", t, q + 2 * kv, h, wd, n_layers))
    else:
        calls += [_gemm("q_proj", t, q, h, wd, n_layers), _gemm("k_proj", t, kv, h, wd, n_layers),
                  _gemm("v_proj", t, kv, h, wd, n_layers)]
    if model.qk_norm:
        calls.append(KernelCall("qk_norm", "norm", {"tokens": t * (s.heads + s.kv_heads), "hidden": hd,
                                                    "op": model.norm, "fused_residual": False, "dtype": ab},
                                n_layers))
    calls.append(KernelCall("rope", "rope", {"tokens": t, "heads": s.heads, "kv_heads": s.kv_heads,
                                             "head_dim": hd, "dtype": ab}, n_layers))
    if not k.rope_in_place:
        calls.append(KernelCall("rope_copy", "elementwise", {"numel": t * (q + kv), "op": "copy", "dtype": ab},
                                n_layers))
    calls.append(KernelCall("kv_write", "kv_write", {"tokens": t, "kv_heads": s.kv_heads, "head_dim": hd,
                                                     "block_size": engine.scheduler.block_size, "dtype": ab,
                                                     "kv_dtype": model.kv_dtype}, n_layers))
    calls.append(_gemm("o_proj", t, h, q, wd, n_layers))
    if par.tp > 1:
        calls.append(_allreduce("attn_allreduce", t * h, model, par, n_layers))

    if model.moe:
        calls += _moe_kernels(model, par, engine, t, s)
    else:
        calls += _mlp_kernels("", s.intermediate, model, engine, t, n_layers)
    if par.tp > 1:
        calls.append(_allreduce("mlp_allreduce", t * h, model, par, n_layers))
    if par.pp > 1:  # hidden states and residual cross each stage boundary
        calls.append(KernelCall("pp_sendrecv", "sendrecv", {"msg_bytes": 2 * t * h * _bytes(ab), "world_size": 2,
                                                            "link": par.pp_link, "dtype": ab}, par.pp - 1))
    return calls


def _norm_kernels(model: ModelConfig, t, fused: bool, fused_ar_bytes: float = 0.0) -> list[KernelCall]:
    """Residual-carrying norms: every input / pre-MLP norm but layer 0's input, plus the final norm;
    plain norms: layer 0's input norm and Gemma-2's post-attention / post-feed-forward norms.

    Each residual norm follows a tensor-parallel all-reduce; up to fused_ar_bytes of message the
    all-reduce kernel does the residual add and RMSNorm itself (vLLM's FlashInfer all-reduce fusion),
    so none runs on its own: a count of 0 for those token counts (per row when t is an array)."""
    n_layers = model.layers
    with_residual = 2 * n_layers
    plain = 1 + (2 * n_layers if model.sandwich_norms else 0)
    ab = model.act_dtype
    if fused_ar_bytes and model.norm == "rms" and not model.sandwich_norms:
        absorbed = np.asarray(t) * model.hidden * _bytes(ab) <= fused_ar_bytes
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


def _mlp_kernels(prefix: str, width: int, model: ModelConfig, engine: EngineProfile, t, count: int):
    h, ab, wd = model.hidden, model.act_dtype, model.weight_dtype
    k = engine.kernels
    calls = ([_gemm(f"{prefix}gate_up_proj", t, 2 * width, h, wd, count)] if k.gate_up_fused else
             [_gemm(f"{prefix}gate_proj", t, width, h, wd, count), _gemm(f"{prefix}up_proj", t, width, h, wd, count)])
    if k.silu_and_mul:
        calls.append(KernelCall(f"{prefix}act", "act", {"tokens": t, "intermediate": width,
                                                        "op": model.activation, "dtype": ab}, count))
    else:
        calls += [KernelCall(f"{prefix}act", "elementwise", {"numel": t * width, "op": _UNFUSED_ACT[model.activation],
                                                             "dtype": ab}, count),
                  KernelCall(f"{prefix}act_mul", "elementwise", {"numel": t * width, "op": "mul", "dtype": ab}, count)]
    calls.append(_gemm(f"{prefix}down_proj", t, h, width, wd, count))
    return calls


def _moe_kernels(model: ModelConfig, par: ParallelConfig, engine: EngineProfile, t, s: Shard):
    """Router and top-k on this GPU's tokens, then the fused experts over the tokens of the whole MoE group.

    Without attention data parallelism every GPU of the TP group already holds all T tokens: each runs its
    experts (1/ep of them, cut moe_tp ways) over them and the TP all-reduce after the MLP combines the
    results. With attention_dp groups, vLLM's default all-to-all backend (allgather_reducescatter)
    all-gathers the groups' tokens over the data-parallel group before the experts (dispatch) and
    reduce-scatters the outputs after them (combine), so the kernel sees T x attention_dp tokens (the
    groups run in lockstep; equal batches assumed)."""
    moe, h, n_layers = model.moe, model.hidden, model.layers
    ab = model.act_dtype
    group_tokens = t * par.attention_dp
    calls = [_gemm("router", t, moe.experts, h, ab, n_layers),
             KernelCall("topk", "elementwise", {"numel": t * moe.experts, "op": "softmax", "dtype": ab}, n_layers),
             KernelCall("experts", "moe", {"tokens": group_tokens, "experts": moe.experts, "top_k": moe.top_k,
                                           "hidden": h, "intermediate": moe.intermediate,
                                           "dtype": model.weight_dtype, "moe_tp": par.moe_tp, "moe_ep": par.ep,
                                           "distribution": engine.kernels.moe_routing}, n_layers)]
    if par.attention_dp > 1:
        size = par.attention_dp
        msg = group_tokens * h * _bytes(ab)  # the gathered hidden states, every group's tokens
        msg = msg.astype(np.int64) if np.ndim(msg) else int(msg)
        for name, op in (("moe_dispatch", "allgather"), ("moe_combine", "reducescatter")):
            calls.append(KernelCall(name, op, {"msg_bytes": msg, "world_size": size, "link": par.moe_link,
                                               "dtype": ab}, n_layers))
    if moe.shared_intermediate:
        calls += _mlp_kernels("shared_", moe.shared_intermediate // par.tp, model, engine, t, n_layers)
    return calls


# -- per-sampled-row kernels ------------------------------------------------------------

def sampled_kernels(model: ModelConfig, par: ParallelConfig, sampled, s: Shard | None = None) -> list[KernelCall]:
    """LM head and sampling on the rows that sample a token (an int >= 1 or an array of them)."""
    s = s or shard(model, par)
    n = np.asarray(sampled) if np.ndim(sampled) else int(sampled)
    ab = model.act_dtype
    vocab_padded = s.vocab * par.tp
    calls = [_gemm("lm_head", n, s.vocab, model.hidden, ab, 1)]
    if par.tp > 1:
        calls.append(KernelCall("logits_gather", "allgather", {"msg_bytes": n * vocab_padded * _bytes(ab),
                                                               "world_size": par.tp, "link": par.link,
                                                               "dtype": ab}, 1))
    if model.logit_softcap:
        calls.append(KernelCall("logit_softcap", "elementwise", {"numel": n * model.vocab, "op": "tanh",
                                                                 "dtype": ab}, 1))
    calls.append(KernelCall("sampling", "elementwise", {"numel": n * model.vocab, "op": "softmax", "dtype": "fp32"}, 1))
    return calls


# -- attention ----------------------------------------------------------------------------

def attention_kernels(model: ModelConfig, par: ParallelConfig, engine: EngineProfile, batch: StepBatch,
                      s: Shard | None = None) -> list[KernelCall]:
    """Prefill and decode attention of each layer kind (see the module docstring for the aggregation)."""
    s = s or shard(model, par)
    if engine.attention.layout == "flat_masked":
        return flat_attention_kernels(model, s, batch.num_tokens, flat_kv_tokens(batch),
                                      engine.attention.flat_slowdown)
    calls = []
    kinds = model.layer_kinds()
    for kind in kinds:
        suffix = f"[{kind.name}]" if len(kinds) > 1 else ""
        if batch.prefill_new:
            calls.append(KernelCall(f"attn_prefill{suffix}", "attn_prefill",
                                    prefill_columns(model, s, batch.prefill_new, batch.prefill_ctx, kind.window),
                                    kind.count, "prefill"))
        if batch.decode_ctx:
            calls.append(KernelCall(f"attn_decode{suffix}", "attn_decode",
                                    decode_columns(model, s, engine, len(batch.decode_ctx),
                                                   decode_mean_kv(batch.decode_ctx, kind.window), kind.window),
                                    kind.count, "decode"))
    return calls


def flat_kv_tokens(batch: StepBatch) -> int:
    """KV tokens a flat masked attention gathers in a step: every scheduled request's whole context."""
    return sum(batch.prefill_ctx) + batch.num_prefill_tokens + sum(batch.decode_ctx)


def flat_attention_kernels(model: ModelConfig, s: Shard, q_tokens, kv_tokens,
                           slowdown: float = 1.0) -> list[KernelCall]:
    """transformers' paged|sdpa attention (engine attention.layout flat_masked), per layer: index_select of
    the step's K and V out of the cache, repeat_kv to the query heads, one non-causal SDPA of all q_tokens
    against all kv_tokens (`slowdown` times the priced prefill kernel: engine attention.flat_slowdown); once
    per step, the block-diagonal mask (q_tokens x kv_tokens) written for it.
    Windows are not applied (the mask would carry them; the gather is the whole history either way).
    kv_tokens may be an array (the pricer's tables)."""
    ab, hd, n = model.act_dtype, model.head_dim, model.layers
    calls = [KernelCall("kv_gather", "elementwise", {"numel": 2 * kv_tokens * s.kv_heads * hd, "op": "copy",
                                                     "dtype": ab}, n)]
    if s.heads != s.kv_heads:
        calls.append(KernelCall("repeat_kv", "elementwise", {"numel": 2 * kv_tokens * s.heads * hd, "op": "copy",
                                                             "dtype": ab}, n))
    calls.append(KernelCall("attn_mask", "elementwise", {"numel": q_tokens * kv_tokens, "op": "copy", "dtype": ab},
                            1))
    calls.append(KernelCall("attn_flat", "attn_prefill", {"batch": 1, "seq_q": q_tokens, "seq_kv": kv_tokens,
                                                         "heads": s.heads, "kv_heads": s.heads, "head_dim": hd,
                                                         "causal": False, "window": 0, "dtype": ab,
                                                         "kv_dtype": ab}, n, scale=slowdown))
    return calls


def decode_mean_kv(decode_ctx, window: int) -> int:
    """Mean KV length the decodes attend over in a layer with this window (each clipped first), rounded."""
    total = sum(map(min, decode_ctx, repeat(window))) if window else sum(decode_ctx)
    return max(1, round(total / len(decode_ctx)))


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


# -- helpers ------------------------------------------------------------------------------

def _gemm(name: str, m, n: int, k: int, dtype: str, count: int) -> KernelCall:
    return KernelCall(name, "gemm", {"m": m, "n": n, "k": k, "dtype": dtype}, count)


def _allreduce(name: str, elements, model: ModelConfig, par: ParallelConfig, count: int) -> KernelCall:
    ab = model.act_dtype
    return KernelCall(name, "allreduce", {"msg_bytes": elements * _bytes(ab), "world_size": par.tp,
                                          "link": par.link, "dtype": ab}, count)


def _bytes(dtype: str) -> int:
    return int(dtype_bytes(dtype))
