"""gemm: C[m,n] = A[m,k] @ B[k,n], what cuBLAS(Lt) runs behind F.linear.

Tile assumption: one thread block per 128x128 output tile. With fewer tiles
than SMs, cuBLAS-style split-K cuts the K loop into slices (at least 256 deep)
so the launch fills the SMs: blocks launched = tiles * min(SMs // tiles, K/256).
fp8/int8 GEMMs read 1-byte operands and write bf16.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, cdiv, elem_bytes

TILE = 128
MIN_SPLIT_K = 256


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


def _split_k(c, tiles, num_sms):
    split = np.clip(np.floor(num_sms / tiles), 1, np.ceil(np.asarray(c["k"], dtype=np.float64) / MIN_SPLIT_K))
    return tiles * split


FAMILIES = [Family(
    name="gemm",
    fields=(Field("m", "pos", doc="rows of the activation (tokens)"),
            Field("n", "pos", doc="output features"),
            Field("k", "pos", doc="input features"),
            Field("dtype", "dtype")),
    unit="tensor", dominant="m", tile=f"{TILE}x{TILE} output tile per block, split-K to fill the SMs",
    cost_fn=_cost, shape=GemmShape, launch_blocks=_split_k)]
