"""moe: fused/grouped expert GEMMs (gate-up, activation, down) of a mixture-of-experts layer.

Each of tokens*top_k (token, expert) pairs runs a gated MLP of width
`intermediate` (the per-expert intermediate size): 6*hidden*intermediate FLOPs.
Weights are read once per expert that receives a token; under uniform routing
the expected number of such experts is E * (1 - (1 - top_k/E)^tokens).
Activations stay in 16 bits when the weights are fp8.
Tile assumption: 128x128 output tiles over each active expert's rows.
"""
from dataclasses import dataclass

import numpy as np

from .base import Cost, Family, Field, Shape, cdiv, elem_bytes

TILE = 128


@dataclass(frozen=True)
class MoeShape(Shape):
    tokens: int
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    dtype: str = "bf16"


def active_experts(tokens, experts, top_k):
    """Expected number of distinct experts hit by `tokens` tokens routed uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def _cost(c):
    pairs = c["tokens"] * c["top_k"]
    h, i = c["hidden"], c["intermediate"]
    active = active_experts(c["tokens"], c["experts"], c["top_k"])
    wb = elem_bytes(c["dtype"])
    ab = np.maximum(wb, 2.0)
    rows = cdiv(pairs / active, TILE)
    return Cost(flops=6.0 * pairs * h * i,
                bytes=active * 3.0 * h * i * wb + pairs * (2.0 * h + 3.0 * i) * ab,
                blocks=active * rows * (cdiv(2 * i, TILE) + cdiv(h, TILE)))


FAMILIES = [Family(
    name="moe",
    fields=(Field("tokens", "pos"), Field("experts", "pos"), Field("top_k", "pos"),
            Field("hidden", "pos"), Field("intermediate", "pos", doc="per-expert intermediate size"),
            Field("dtype", "dtype")),
    unit="tensor", dominant="tokens", tile=f"{TILE}x{TILE} tiles per active expert",
    cost_fn=_cost, shape=MoeShape,
    checks=((lambda c: np.asarray(c["top_k"]) > np.asarray(c["experts"]), "top_k must be <= experts"),))]
