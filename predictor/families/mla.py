"""mla_prefill, mla_decode, mla_bmm: DeepSeek-style multi-head latent attention as vLLM runs it.

mla_prefill and mla_decode price ONE GPU's whole attention block of an MLA layer: what vLLM's
DeepseekV2MLAAttention.forward runs from the normed hidden state to o_proj's output, because that
module is what is measured (aiconfigurator's mla_context_module / mla_generation_module) and its
parts overlap in time and share quantisation kernels. Inside the module:
- the down-projection fused_qkv_a_proj (hidden -> q_lora_rank + kv_lora_rank + qk_rope_head_dim;
  with q_lora_rank = 0 the kv_a projection plus a q_proj straight from the hidden state), the q_a and
  kv_a RMSNorms, the query up-projection q_b_proj (q_lora_rank -> heads x (nope + rope)), RoPE of the
  query's and the key's rope parts, the write of each new latent row (kv_lora_rank + rope) into the
  paged KV cache, the attention, and o_proj (heads x v_head_dim -> hidden);
- prefill (vLLM's compute-friendly path): kv_b_proj expands the latent row of every key (cached prefix
  included) into per-head nope keys and values (kv_lora_rank -> heads x (nope + v)), then FlashAttention
  varlen attends causally with qk dim nope + rope and v dim v_head_dim;
- decode (weights absorbed): a batched GEMM maps the query's nope part into the latent space (W_UK:
  heads x nope x kv_lora_rank), the MLA decode kernel attends over the cached latent rows (qk dim
  kv_lora_rank + rope, v dim kv_lora_rank, one KV head), and a second batched GEMM maps the output to
  v_head_dim per head (W_UV). Both batched GEMMs run in bf16 whatever the weight format (vLLM keeps
  W_UK and W_UV dequantised).
NOT inside: the layer's input RMSNorm and residual add, and the tensor-parallel all-reduce after o_proj.
`heads` are the heads on this GPU; the down-projection is replicated on every GPU, as vLLM does.

mla_bmm is one of the decode path's two batched GEMMs alone (op 'pre': the W_UK absorption,
[heads, tokens, head_dim] x [heads, head_dim, kv_lora_rank]; 'post': the W_UV up-projection,
[heads, tokens, kv_lora_rank] x [heads, kv_lora_rank, head_dim]). Both run inside mla_decode: a
model graph that prices mla_decode must not add mla_bmm.

Cost model (T new tokens = batch x seq_q, decode batch; C keys = batch x seq_kv; H heads; D hidden;
Lq, Lkv, P, R, V the ranks and head dims):
- FLOPs: 2 m n k of every GEMM, attention 2 x pairs x H x (qk dim + v dim) over the causal (query, key)
  pairs (prefill) or batch x seq_kv pairs (decode). Norms, RoPE and quantisation kernels are left out
  (< 0.1 % of the module's FLOPs at DeepSeek-V3's sizes).
- Bytes: every weight read once in its format's bytes (W_UK and W_UV in bf16), every activation passed
  between kernels written once and read once in 16 bits, the hidden state read and o_proj's output
  written once, and the KV cache in kv_dtype: prefill writes T latent rows and reads the C - T cached
  ones, decode reads C rows and writes one row per sequence.
- Blocks: the 128 x 128 output tiles of every GEMM plus the attention kernel's blocks (prefill: one per
  128 query rows per head per sequence; decode: one per sequence, 64-head group and 512-key split),
  summed: the module is priced as one launch, the tails of its kernels are left to η.
dtype is the projections' weight format and its math prices all the module's FLOPs (the fastest math
the module runs, except with fp8 attention behind 16-bit projections); attn_dtype is the prefill
attention's query math (fp8 only on Blackwell with an fp8 KV cache); kv_dtype is the KV cache's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import FORMATS
from .attention import attended_pairs
from .base import Cost, Family, Field, Shape, cdiv, elem_bytes

TILE = 128
Q_TILE = 128
HEAD_GROUP = 64
KV_SPLIT = 512
ACT_BYTES = 2.0  # activations between the module's kernels are bf16
BMM_OPS = ("pre", "post")


@dataclass(frozen=True)
class MlaPrefillShape(Shape):
    batch: int
    seq_q: int
    seq_kv: int
    heads: int
    hidden: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    dtype: str = "bf16"
    attn_dtype: str = "bf16"
    kv_dtype: str = "bf16"


@dataclass(frozen=True)
class MlaDecodeShape(Shape):
    batch: int
    seq_kv: int
    heads: int
    hidden: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    dtype: str = "bf16"
    kv_dtype: str = "bf16"


@dataclass(frozen=True)
class MlaBmmShape(Shape):
    tokens: int
    heads: int
    head_dim: int
    kv_lora_rank: int
    op: str = "pre"
    dtype: str = "bf16"


def _tiles(m, n):
    return cdiv(m, TILE) * cdiv(n, TILE)


def _weight_bytes(dtypes) -> np.ndarray:
    return np.asarray([FORMATS[d].bytes for d in dtypes.tolist()], dtype=np.float64)


def _projections(c, tokens):
    """FLOPs, weight elements, activation elements and tiles of the down, q-up and o projections."""
    d, h = c["hidden"], c["heads"]
    lq, lkv, r = c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    qdim = c["qk_nope_head_dim"] + r
    down = lq + lkv + r                   # fused_qkv_a_proj (lq = 0: kv_a_proj_with_mqa alone)
    q_in = np.where(lq > 0, lq, d)        # q_b_proj from the q latent, or q_proj from the hidden state
    o_in = h * c["v_head_dim"]
    weights = d * down + q_in * h * qdim + o_in * d
    flops = 2.0 * tokens * weights
    acts = 2.0 * tokens * (down + h * qdim) + 2.0 * tokens * d   # written + read; hidden in, output out
    tiles = _tiles(tokens, down) + _tiles(tokens, h * qdim) + _tiles(tokens, d)
    return flops, weights, acts, tiles


def _prefill_cost(c):
    t, kv = c["batch"] * c["seq_q"], c["batch"] * c["seq_kv"]
    h, lkv, r, v = c["heads"], c["kv_lora_rank"], c["qk_rope_head_dim"], c["v_head_dim"]
    nope = c["qk_nope_head_dim"]
    flops, weights, acts, tiles = _projections(c, t)
    kv_b = lkv * h * (nope + v)          # kv_b_proj expands every key's latent row
    pairs = c["batch"] * attended_pairs(c["seq_q"], c["seq_kv"], True, 0)
    flops = flops + 2.0 * kv * kv_b + 2.0 * pairs * h * (nope + r + v)
    acts = acts + 2.0 * kv * h * (nope + v) + 2.0 * t * h * v
    return Cost(
        flops=flops,
        bytes=(weights + kv_b) * _weight_bytes(c["dtype"]) + ACT_BYTES * acts
        + kv * (lkv + r) * elem_bytes(c["kv_dtype"]),
        blocks=tiles + _tiles(kv, h * (nope + v)) + c["batch"] * h * cdiv(c["seq_q"], Q_TILE))


def _decode_cost(c):
    t, kv = c["batch"], c["batch"] * c["seq_kv"]
    h, lkv, r, v = c["heads"], c["kv_lora_rank"], c["qk_rope_head_dim"], c["v_head_dim"]
    nope = c["qk_nope_head_dim"]
    flops, weights, acts, tiles = _projections(c, t)
    absorbed = h * lkv * (nope + v)       # W_UK and W_UV, bf16
    flops = flops + 2.0 * t * absorbed + 2.0 * kv * h * (2.0 * lkv + r)
    acts = acts + 2.0 * t * h * (2.0 * lkv + v)
    return Cost(
        flops=flops,
        bytes=weights * _weight_bytes(c["dtype"]) + ACT_BYTES * (absorbed + acts)
        + (kv + t) * (lkv + r) * elem_bytes(c["kv_dtype"]),
        blocks=tiles + h * (_tiles(t, lkv) + _tiles(t, v))
        + t * cdiv(h, HEAD_GROUP) * cdiv(c["seq_kv"], KV_SPLIT))


def _bmm_cost(c):
    t, h, hd, lkv = c["tokens"], c["heads"], c["head_dim"], c["kv_lora_rank"]
    out = np.where(np.asarray([o == "pre" for o in c["op"].tolist()]), lkv, hd)
    return Cost(flops=2.0 * h * t * hd * lkv,
                bytes=(h * t * (hd + lkv) + h * hd * lkv) * elem_bytes(c["dtype"]),
                blocks=h * _tiles(t, out))


def _odd_rope(c):
    return np.asarray(c["qk_rope_head_dim"]) % 2 != 0


_DIMS = (Field("heads", "pos", doc="attention heads on this GPU"),
         Field("hidden", "pos", doc="model hidden size (o_proj output, down-projection input)"),
         Field("q_lora_rank", "nonneg", doc="query latent rank; 0: q_proj straight from the hidden state"),
         Field("kv_lora_rank", "pos", doc="cached latent rank"),
         Field("qk_nope_head_dim", "pos", doc="per-head query/key dims without RoPE"),
         Field("qk_rope_head_dim", "pos", doc="per-head query/key dims with RoPE (the key part shared)"),
         Field("v_head_dim", "pos", doc="per-head value dims"))
_ROPE_CHECK = (_odd_rope, "qk_rope_head_dim must be even (RoPE rotates pairs)")

FAMILIES = [
    Family(
        name="mla_prefill",
        fields=(Field("batch", "pos"), Field("seq_q", "pos", doc="new tokens per sequence"),
                Field("seq_kv", "pos", doc="keys per sequence: cached prefix + seq_q"), *_DIMS,
                Field("dtype", "dtype", doc="weight format of the projections"),
                Field("attn_dtype", "dtype", doc="math of the attention's query", default="bf16"),
                Field("kv_dtype", "dtype")),
        unit="tensor", dominant="seq_q",
        tile=f"{TILE}x{TILE} tiles of every projection + {Q_TILE} query rows per head per sequence",
        cost_fn=_prefill_cost, shape=MlaPrefillShape,
        checks=((lambda c: np.asarray(c["seq_kv"]) < np.asarray(c["seq_q"]),
                 "seq_kv (prefix + new tokens) must be >= seq_q"), _ROPE_CHECK)),
    Family(
        name="mla_decode",
        fields=(Field("batch", "pos", doc="sequences, one new token each"),
                Field("seq_kv", "pos", doc="KV length per sequence, the new token included"), *_DIMS,
                Field("dtype", "dtype", doc="weight format of the projections"), Field("kv_dtype", "dtype")),
        unit="tensor", dominant="seq_kv",
        tile=f"{TILE}x{TILE} tiles of every (batched) GEMM + one block per sequence, {HEAD_GROUP}-head group "
             f"and {KV_SPLIT}-key split",
        cost_fn=_decode_cost, shape=MlaDecodeShape, checks=(_ROPE_CHECK,)),
    Family(
        name="mla_bmm",
        fields=(Field("tokens", "pos"), Field("heads", "pos", doc="heads on this GPU"),
                Field("head_dim", "pos", doc="qk_nope_head_dim (pre) or v_head_dim (post)"),
                Field("kv_lora_rank", "pos"),
                Field("op", "choice", choices=BMM_OPS, doc="pre: W_UK absorption; post: W_UV up-projection"),
                Field("dtype", "dtype")),
        unit="tensor", dominant="tokens", tile=f"{TILE}x{TILE} output tile per head",
        cost_fn=_bmm_cost, shape=MlaBmmShape),
]
