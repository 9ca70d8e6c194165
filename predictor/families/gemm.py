"""gemm: C[m,n] = A[m,k] @ B[k,n], what cuBLAS(Lt) runs behind F.linear.

Tile assumption: one thread block per 128x128 output tile. fp8/int8 GEMMs read
1-byte operands and write bf16.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, cdiv, elem_bytes

TILE = 128


@dataclass(frozen=True)
class GemmShape(Shape):
    m: int
    n: int
    k: int
    dtype: str = "bf16"


def _cost(c):
    m, n, k = c["m"], c["n"], c["k"]
    b = elem_bytes(c["dtype"])
    out_b = np.maximum(b, 2.0)
    return Cost(flops=2.0 * m * n * k,
                bytes=(m * k + k * n) * b + m * n * out_b,
                blocks=cdiv(m, TILE) * cdiv(n, TILE))


FAMILIES = [Family(
    name="gemm",
    fields=(Field("m", "pos", doc="rows of the activation (tokens)"),
            Field("n", "pos", doc="output features"),
            Field("k", "pos", doc="input features"),
            Field("dtype", "dtype")),
    unit="tensor", dominant="m", tile=f"{TILE}x{TILE} output tile per block",
    cost_fn=_cost, shape=GemmShape)]
