"""kv_write: reshape_and_cache, scattering new K and V rows into paged cache slots.

Reads K and V in the activation dtype, writes them in the cache dtype, plus an
8-byte slot index per token. Tile assumption: one block per token.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, elem_bytes


@dataclass(frozen=True)
class KvWriteShape(Shape):
    tokens: int
    kv_heads: int
    head_dim: int
    block_size: int = 16
    dtype: str = "bf16"
    kv_dtype: str = "bf16"


def _cost(c):
    elems = 2.0 * c["tokens"] * c["kv_heads"] * c["head_dim"]
    b, bkv = elem_bytes(c["dtype"]), elem_bytes(c["kv_dtype"])
    return Cost(flops=np.where(b != bkv, elems, 0.0),  # a scale per element when quantising
                bytes=elems * (b + bkv) + 8.0 * c["tokens"],
                blocks=c["tokens"])


FAMILIES = [Family(
    name="kv_write",
    fields=(Field("tokens", "pos"), Field("kv_heads", "pos"), Field("head_dim", "pos"),
            Field("block_size", "pos"), Field("dtype", "dtype"), Field("kv_dtype", "dtype")),
    unit="vector", dominant="tokens", tile="one block per token", cost_fn=_cost, shape=KvWriteShape)]
