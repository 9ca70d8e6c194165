"""act: gated activation (silu_and_mul and friends): out[t, i] = f(x[t, i]) * x[t, I + i].

Reads 2*intermediate elements per token, writes intermediate. FLOPs per
output element: silu 5 + the gating multiply; gelu (erf or tanh) 9 + 1.
Tile assumption: one block per token.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, elem_bytes

FLOPS_PER_OUTPUT = {"silu_mul": 6.0, "gelu_mul": 10.0, "gelu_tanh_mul": 10.0}


@dataclass(frozen=True)
class ActShape(Shape):
    tokens: int
    intermediate: int
    op: str = "silu_mul"
    dtype: str = "bf16"


def _cost(c):
    out = c["tokens"] * c["intermediate"]
    per = np.asarray([FLOPS_PER_OUTPUT[x] for x in c["op"].tolist()])
    return Cost(flops=out * per, bytes=3.0 * out * elem_bytes(c["dtype"]), blocks=c["tokens"])


FAMILIES = [Family(
    name="act",
    fields=(Field("tokens", "pos"), Field("intermediate", "pos", doc="output width (half the input)"),
            Field("op", "choice", choices=tuple(FLOPS_PER_OUTPUT), doc="activation kind"),
            Field("dtype", "dtype")),
    unit="vector", dominant="tokens", tile="one block per token", cost_fn=_cost, shape=ActShape)]
