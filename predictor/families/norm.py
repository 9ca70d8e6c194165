"""norm: RMSNorm or LayerNorm over the hidden dimension, optionally fused with the residual add.

FLOPs per element: rms 4 (square, accumulate, scale, weight), layer 7 (mean
and variance passes, shift, scale, weight, bias); +1 with the fused residual
add. Bytes: x read, y written, the weight (and bias) once; the fused residual
also reads and writes the residual stream. Tile assumption: one block per row.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, elem_bytes

KINDS = ("rms", "layer")


@dataclass(frozen=True)
class NormShape(Shape):
    tokens: int
    hidden: int
    op: str = "rms"
    fused_residual: bool = False
    dtype: str = "bf16"


def _cost(c):
    layer = np.asarray([x == "layer" for x in c["op"].tolist()])
    fused = c["fused_residual"].astype(np.float64)
    elems = c["tokens"] * c["hidden"]
    b = elem_bytes(c["dtype"])
    return Cost(flops=elems * (np.where(layer, 7.0, 4.0) + fused),
                bytes=elems * b * (2.0 + 2.0 * fused) + c["hidden"] * b * np.where(layer, 2.0, 1.0),
                blocks=c["tokens"])


FAMILIES = [Family(
    name="norm",
    fields=(Field("tokens", "pos"), Field("hidden", "pos"),
            Field("op", "choice", choices=KINDS, doc="norm kind"),
            Field("fused_residual", "bool"), Field("dtype", "dtype")),
    unit="vector", dominant="tokens", tile="one block per row", cost_fn=_cost, shape=NormShape)]
