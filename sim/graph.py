"""One engine step -> the kernels a vLLM-style engine launches on one GPU.

Per layer, for the mixed batch of a step (T scheduled tokens, S sampled rows), the model's graph
(sim/graphs, one small registered builder per architecture family) lists the token-wise kernels: for a
dense GQA decoder qkv_proj GEMM (T x (heads + 2 kv_heads) * head_dim / tp), Qwen3's per-head q/k norm,
RoPE, kv_write of the new K/V rows, o_proj GEMM, TP all-reduce, then the MLP (gate_up_proj GEMM, gated
activation, down_proj GEMM, TP all-reduce) or the MoE (router GEMM, top-k, the fused experts over the
(token, expert) pairs routed to this GPU's experts, the attention-DP dispatch and combine, TP
all-reduce). Around them, the same for every model: RMSNorms fused with the residual add (the first
layer's input norm has no residual yet; Gemma-2 adds plain post-attention / post-feed-forward norms);
once per step the embedding gather (+ all-reduce of the vocab-parallel lookup), final norm, PP
send/recv between stages, LM head on the S sampled rows only, logits gather across TP, Gemma-2's final
soft-capping, and the sampler's softmax over the vocabulary in fp32.

Layers that run the same kernel are one KernelCall whose count is the number of such layers (dense
and MoE layers, RoPE and NoPE layers each count their own); attention differs between layer kinds
(sliding-window, chunked and full layers: model.attention_kinds()), so each kind gets its own
attention calls, from the model graph (GQA's paged decode and varlen prefill, or MLA's modules).

Attention aggregation. Decode attention is memory bound and its cost model is linear in each
sequence's KV length, so a step's n decodes become ONE decode shape with batch = n and
seq_kv = round(mean KV length) (after clipping each length to the layer's window, or to its
position within its attention chunk): flops and KV bytes equal the sum over sequences up to that
rounding (< 0.5 token per sequence). Prefill cost is not linear (causal pairs grow with
new * (prefix + new / 2)), so no single shape carries the sum; the varlen prefill launch is one
KernelCall whose columns hold one row per chunk, and its cost is the sum over rows. Chunked
attention runs each chunk-aligned piece of a prefill as its own row (vLLM's virtual batches), its
prefix the tokens of its chunk before it.

Everything token-wise is written with numpy arithmetic, so `token_kernels` and
`sampled_kernels` also accept an array of token counts: the pricer builds its per-T tables
with the same code that builds a step.
"""
from __future__ import annotations

from itertools import repeat

import numpy as np

from kernelsight.predictor.errors import KernelsightError

from .batch import StepBatch
from .engine_profile import EngineProfile
from .graphs import graph_for
from .graphs.common import KernelCall, allreduce, gemm, nbytes, norm_kernels
from .model import AttentionKind, ModelConfig
from .parallel import ParallelConfig, Shard, shard

__all__ = ["KernelCall", "step_kernels", "token_kernels", "sampled_kernels", "attention_kernels", "decode_call",
           "prefill_call", "chunk_rows", "decode_mean_kv", "flat_attention_kernels", "flat_kv_tokens"]


# Token-wise families whose kernels take the tokens of every attention data-parallel rank (the fused experts,
# and with attention_dp > 1 their dispatch all-gather and combine reduce-scatter): graphs/common.moe_kernels.
GATHERED_FAMILIES = ("moe", "allgather", "reducescatter")


def gathered_rank_tokens(batch: StepBatch, par: ParallelConfig) -> int:
    """The per-rank token count at which the token-wise kernels of GATHERED_FAMILIES price batch.moe_tokens
    (moe_kernels takes a rank's tokens times the ranks); 0 when the batch has none."""
    return -(-batch.moe_tokens // par.attention_dp) if batch.moe_tokens and par.attention_dp > 1 else 0


def step_kernels(model: ModelConfig, batch: StepBatch, par: ParallelConfig, engine: EngineProfile,
                 padded_tokens: int | None = None) -> list[KernelCall]:
    """Every kernel of one step; padded_tokens: the CUDA-graph size token-wise kernels run at."""
    s = shard(model, par)
    tokens = padded_tokens or batch.forward_tokens
    if batch.num_prefill_tokens and batch.num_decode_tokens:
        phase = "mixed"
    else:
        phase = "prefill" if batch.num_prefill_tokens else "decode"
    token_calls = token_kernels(model, par, engine, tokens, s)
    gathered = gathered_rank_tokens(batch, par)
    if gathered:   # the MoE layers at every rank's tokens
        token_calls = [c for c in token_calls if c.family not in GATHERED_FAMILIES] + [
            c for c in token_kernels(model, par, engine, gathered, s) if c.family in GATHERED_FAMILIES]
    calls = [_with_phase(c, phase) for c in token_calls]
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
    h, ab = model.hidden, model.act_dtype
    calls = [KernelCall("embedding", "elementwise", {"numel": t * h, "op": "embedding", "dtype": ab}, 1)]
    if par.tp > 1:
        calls.append(allreduce("embedding_allreduce", t * h, model, par, 1))
    fused_ar = engine.allreduce.fused_norm_max_bytes(par.tp) if par.tp > 1 else 0.0
    calls += norm_kernels(model, t, engine.kernels.fused_add_rms_norm, fused_ar)
    calls += graph_for(model).layers(model, par, engine, t, s)
    if par.pp > 1:  # hidden states and residual cross each stage boundary
        calls.append(KernelCall("pp_sendrecv", "sendrecv", {"msg_bytes": 2 * t * h * nbytes(ab), "world_size": 2,
                                                            "link": par.pp_link, "dtype": ab}, par.pp - 1))
    return calls


# -- per-sampled-row kernels ------------------------------------------------------------

def sampled_kernels(model: ModelConfig, par: ParallelConfig, sampled, s: Shard | None = None) -> list[KernelCall]:
    """LM head and sampling on the rows that sample a token (an int >= 1 or an array of them)."""
    s = s or shard(model, par)
    n = np.asarray(sampled) if np.ndim(sampled) else int(sampled)
    ab = model.act_dtype
    vocab_padded = s.vocab * par.tp
    calls = [gemm("lm_head", n, s.vocab, model.hidden, ab, 1)]
    if par.tp > 1:
        calls.append(KernelCall("logits_gather", "allgather", {"msg_bytes": n * vocab_padded * nbytes(ab),
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
    if not batch.num_tokens:   # a data-parallel rank's dummy batch
        return []
    if engine.attention.layout == "flat_masked":
        return flat_attention_kernels(model, s, batch.num_tokens, flat_kv_tokens(batch),
                                      engine.attention.flat_slowdown)
    graph = graph_for(model)
    calls = []
    kinds = model.attention_kinds()
    for kind in kinds:
        suffix = f"[{kind.name}]" if len(kinds) > 1 else ""
        if batch.prefill_new:
            new, cached = chunk_rows(batch.prefill_new, batch.prefill_ctx, kind.chunk)
            calls.append(graph.prefill_call(model, s, new, cached, kind, suffix))
        if batch.decode_ctx:
            calls.append(graph.decode_call(model, s, engine, len(batch.decode_ctx),
                                           decode_mean_kv(batch.decode_ctx, kind), kind, suffix))
    return calls


def decode_call(model: ModelConfig, s: Shard, engine: EngineProfile, batch, seq_kv, kind: AttentionKind) -> KernelCall:
    """One decode attention launch of a layer kind, as the model's graph runs it (seq_kv may be an array)."""
    return graph_for(model).decode_call(model, s, engine, batch, seq_kv, kind)


def prefill_call(model: ModelConfig, s: Shard, new, cached, kind: AttentionKind) -> KernelCall:
    """One prefill attention launch of rows (new, cached) of a layer kind, already split at its chunks."""
    return graph_for(model).prefill_call(model, s, new, cached, kind)


def chunk_rows(new, cached, chunk: int) -> tuple[list[int], list[int]]:
    """Prefill rows (new tokens, cached tokens before them) as chunked attention runs them: a row crossing a
    multiple of `chunk` is cut there, and each piece's prefix is the tokens of its own chunk before it
    (0: no chunking, rows as given)."""
    if not chunk:
        return list(new), list(cached)
    rows_new, rows_cached = [], []
    for n, start in zip(new, cached):
        while n > 0:
            offset = start % chunk
            piece = min(n, chunk - offset)
            rows_new.append(piece)
            rows_cached.append(offset)
            n, start = n - piece, start + piece
    return rows_new, rows_cached


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
    kv_tokens may be an array (the pricer's tables). MLA models are refused: this layout caches K and V."""
    if model.mla:
        raise KernelsightError(f"model {model.name}: the flat_masked attention layout (transformers) is not "
                               f"modelled for multi-head latent attention; use a vLLM engine profile")
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


def decode_mean_kv(decode_ctx, kind: AttentionKind) -> int:
    """Mean KV length the decodes attend over in layers of this kind (each clipped to the window, or to its
    position within its attention chunk, first), rounded."""
    if kind.chunk:
        total = sum((n - 1) % kind.chunk + 1 for n in decode_ctx)
    elif kind.window:
        total = sum(map(min, decode_ctx, repeat(kind.window)))
    else:
        total = sum(decode_ctx)
    return max(1, round(total / len(decode_ctx)))
