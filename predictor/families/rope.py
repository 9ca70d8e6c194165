"""rope: rotary embedding applied in place to Q and K (full head_dim rotated).

Per rotated element: 2 multiplies and 1 add. Bytes: Q and K read and written,
the cos/sin row of each token (head_dim elements) and an 8-byte position.
Tile assumption: one block per token.
"""
from dataclasses import dataclass

from .base import Cost, Family, Field, Shape, elem_bytes


@dataclass(frozen=True)
class RopeShape(Shape):
    tokens: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"


def _cost(c):
    elems = c["tokens"] * (c["heads"] + c["kv_heads"]) * c["head_dim"]
    b = elem_bytes(c["dtype"])
    return Cost(flops=3.0 * elems,
                bytes=2.0 * elems * b + c["tokens"] * (c["head_dim"] * b + 8.0),
                blocks=c["tokens"])


FAMILIES = [Family(
    name="rope",
    fields=(Field("tokens", "pos"), Field("heads", "pos"), Field("kv_heads", "pos"),
            Field("head_dim", "pos"), Field("dtype", "dtype")),
    unit="vector", dominant="tokens", tile="one block per token", cost_fn=_cost, shape=RopeShape)]
