"""attn_prefill and attn_decode: FlashAttention varlen prefill and paged decode.

Prefill counts only the (query, key) pairs the mask keeps: a causal chunk of
seq_q new tokens after a cached prefix of seq_kv - seq_q tokens, optionally
within a sliding window (window = 0: none). FLOPs: 4 * head_dim per pair and
head (QK^T and PV). Bytes: Q and O once, K and V once per kv head.

Tile assumptions: prefill, one block per 128 query rows per head; decode, one
block per (sequence, kv head, 512-token KV split), the split-KV scheme of
paged decode kernels.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, cdiv, elem_bytes

Q_TILE = 128
KV_SPLIT = 512


@dataclass(frozen=True)
class AttnPrefillShape(Shape):
    batch: int
    seq_q: int
    seq_kv: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool = True
    window: int = 0
    dtype: str = "bf16"
    kv_dtype: str = "bf16"


@dataclass(frozen=True)
class AttnDecodeShape(Shape):
    batch: int
    seq_kv: int
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int = 16
    window: int = 0
    dtype: str = "bf16"
    kv_dtype: str = "bf16"


def _causal_pairs_upto(n, w):
    """Sum over positions 1..n of the keys each attends to: min(pos, w), w = 0 meaning all."""
    full = n * (n + 1) / 2
    capped = w * (w + 1) / 2 + (n - w) * w
    return np.where((w == 0) | (n <= w), full, capped)


def attended_pairs(seq_q, seq_kv, causal, window):
    prefix = seq_kv - seq_q
    causal_pairs = _causal_pairs_upto(seq_kv, window) - _causal_pairs_upto(prefix, window)
    dense = seq_q * np.where(window > 0, np.minimum(seq_kv, window), seq_kv)
    return np.where(causal, causal_pairs, dense)


def _prefill_cost(c):
    pairs = attended_pairs(c["seq_q"], c["seq_kv"], c["causal"], c["window"])
    kv_read = np.where(c["window"] > 0, np.minimum(c["seq_kv"], c["seq_q"] + c["window"]), c["seq_kv"])
    b, bkv = elem_bytes(c["dtype"]), elem_bytes(c["kv_dtype"])
    hd = c["head_dim"]
    return Cost(
        flops=4.0 * c["batch"] * c["heads"] * hd * pairs,
        bytes=c["batch"] * (2 * c["seq_q"] * c["heads"] * hd * b + 2 * kv_read * c["kv_heads"] * hd * bkv),
        blocks=c["batch"] * c["heads"] * cdiv(c["seq_q"], Q_TILE))


def _decode_cost(c):
    ctx = np.where(c["window"] > 0, np.minimum(c["seq_kv"], c["window"]), c["seq_kv"])
    b, bkv = elem_bytes(c["dtype"]), elem_bytes(c["kv_dtype"])
    hd = c["head_dim"]
    block_table = 4.0 * cdiv(ctx, c["block_size"])
    return Cost(
        flops=4.0 * c["batch"] * c["heads"] * hd * ctx,
        bytes=c["batch"] * (2 * ctx * c["kv_heads"] * hd * bkv + 2 * c["heads"] * hd * b + block_table),
        blocks=c["batch"] * c["kv_heads"] * cdiv(ctx, KV_SPLIT))


def _gqa_check():
    return (lambda c: np.asarray(c["heads"]) % np.asarray(c["kv_heads"]) != 0,
            "heads must be a multiple of kv_heads (GQA groups)")


_HEADS = (Field("heads", "pos", doc="query heads"), Field("kv_heads", "pos"), Field("head_dim", "pos"))

FAMILIES = [
    Family(
        name="attn_prefill",
        fields=(Field("batch", "pos"), Field("seq_q", "pos", doc="new tokens per sequence"),
                Field("seq_kv", "pos", doc="keys per sequence: cached prefix + seq_q"),
                *_HEADS, Field("causal", "bool"), Field("window", "nonneg", doc="sliding window, 0 = none"),
                Field("dtype", "dtype"), Field("kv_dtype", "dtype")),
        unit="tensor", dominant="seq_q", tile=f"{Q_TILE} query rows per block per head",
        cost_fn=_prefill_cost, shape=AttnPrefillShape,
        checks=(_gqa_check(),
                (lambda c: np.asarray(c["seq_kv"]) < np.asarray(c["seq_q"]),
                 "seq_kv (prefix + new tokens) must be >= seq_q"))),
    Family(
        name="attn_decode",
        fields=(Field("batch", "pos"), Field("seq_kv", "pos", doc="KV length per sequence"), *_HEADS,
                Field("block_size", "pos", doc="KV-cache page size in tokens"),
                Field("window", "nonneg"), Field("dtype", "dtype"), Field("kv_dtype", "dtype")),
        unit="tensor", dominant="seq_kv", tile=f"one block per sequence, kv head and {KV_SPLIT}-token split",
        cost_fn=_decode_cost, shape=AttnDecodeShape, checks=(_gqa_check(),)),
]
