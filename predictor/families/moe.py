"""moe: one GPU's share of a fused mixture-of-experts layer (gate-up grouped GEMM, activation, down grouped GEMM).

Shape, as vLLM's fused-MoE collections state it: `tokens` enter the layer (with expert parallelism, every
token of the EP group: dispatch happens before the kernel), each picks `top_k` of `experts` routed experts
of width `intermediate`; this GPU holds experts / moe_ep of them, each cut to intermediate / moe_tp.
`dtype` is the weight format (predictor.dtypes): its bytes per weight include the scales, its activation
bytes the quantised inputs.

Routing sets how many (token, expert) pairs land on this GPU's experts and how many of them are hit:
- balanced: pairs spread evenly over the experts (aiconfigurator's `balanced`);
- uniform: every token draws top_k experts at random (softmax of random logits; our harness);
- power_law_<alpha>: per-expert loads drawn from a power law, as aiconfigurator's collector does
  (loads x^-alpha on [1, 0.8 tokens], or [0.01, 2] when tokens * top_k <= experts, scaled to
  tokens * top_k and rounded; an expert takes at most `tokens` pairs, since a token picks an expert once,
  the excess going to the most loaded experts with room), and the GPU measured is the most loaded one of
  the EP group: the slowest rank sets the layer's time. Expectations over 16 fixed-seed draws.

Work on this GPU: 6 * pairs * hidden * intermediate_local FLOPs; weights read once per hit local expert;
activations per pair (the quantised input row, the 16-bit gate-up output and activation, the 16-bit
output row). Tile assumption: 128-row tiles per expert (each expert's rows are padded to the tile, as
the fused kernel aligns them) times 128-column tiles of gate-up and down.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dtypes import FORMATS
from .base import Cost, Family, Field, Shape, cdiv

TILE = 128
DISTRIBUTIONS = ("balanced", "uniform", "power_law_1.01", "power_law_1.2")
DRAWS = 16


@dataclass(frozen=True)
class MoeShape(Shape):
    tokens: int
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    dtype: str = "bf16"
    moe_tp: int = 1
    moe_ep: int = 1
    distribution: str = "uniform"


def power_law_loads(u: np.ndarray, tokens: int, top_k: int, ep: int, alpha: float) -> np.ndarray:
    """Pairs per expert from one uniform draw u [experts], as aiconfigurator's collector draws them, each at most `tokens`,
    with the most loaded EP rank's experts first."""
    experts = u.size
    pairs = tokens * top_k
    lo, hi = (1.0, tokens * 0.8) if pairs > experts else (0.01, 2.0)
    x = ((hi ** (1 - alpha) - lo ** (1 - alpha)) * u + lo ** (1 - alpha)) ** (1 / (1 - alpha))
    loads = np.round(x / x.sum() * pairs)
    loads[np.argmax(loads)] += pairs - loads.sum()
    loads = np.clip(loads, 0, tokens).astype(np.int64)
    short = pairs - int(loads.sum())
    # the cap's excess (or a rounding gap) goes to the most loaded experts with room, ties broken by the
    # drawn x, not by expert id (which would always pick the lowest-numbered experts)
    for e in np.lexsort((-x, -loads)):
        if short == 0:
            break
        step = min(tokens - loads[e], short) if short > 0 else -min(loads[e], -short)
        loads[e] += step
        short -= step
    per_rank = loads.reshape(ep, experts // ep)
    rank = int(np.argmax(per_rank.sum(axis=1)))
    per_rank[[0, rank]] = per_rank[[rank, 0]]
    return per_rank.reshape(-1)



@lru_cache(maxsize=65536)
def local_routing(tokens: int, experts: int, top_k: int, ep: int, distribution: str) -> tuple[float, float, float]:
    """(pairs, hit experts, 128-row tiles) on the measured GPU's experts / ep experts, expected values."""
    local = experts // ep
    pairs_total = tokens * top_k
    if distribution == "balanced":
        pairs = pairs_total / ep
        hit = min(local, pairs)
        return pairs, hit, hit * np.ceil(pairs / max(hit, 1.0) / TILE)
    if distribution == "uniform":
        p = top_k / experts
        hit = local * (1.0 - (1.0 - p) ** tokens)
        pairs = pairs_total / ep
        return pairs, hit, hit * np.ceil(pairs / max(hit, 1e-9) / TILE) if hit else 0.0
    alpha = float(distribution.removeprefix("power_law_"))
    rng = np.random.default_rng(0)
    out = np.zeros(3)
    for _ in range(DRAWS):
        rank = power_law_loads(rng.random(experts), tokens, top_k, ep, alpha)[:local]  # the most loaded rank
        out += (rank.sum(), np.count_nonzero(rank), np.ceil(rank / TILE).sum())
    return tuple(out / DRAWS)


def routing_columns(c) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: expected pairs, hit experts and row tiles on the measured GPU (see local_routing)."""
    keys = zip(*(np.asarray(c[k]).tolist() for k in ("tokens", "experts", "top_k", "moe_ep", "distribution")))
    rows = [local_routing(int(t), int(e), int(k), int(ep), d) for t, e, k, ep, d in keys]
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def _cost(c):
    h = c["hidden"]
    i = c["intermediate"] / c["moe_tp"]
    pairs, hit, row_tiles = routing_columns(c)
    fmt = [FORMATS[d] for d in c["dtype"].tolist()]
    wb = np.asarray([f.bytes for f in fmt])
    ab = np.asarray([f.act_bytes for f in fmt])
    return Cost(flops=6.0 * pairs * h * i,
                bytes=hit * 3.0 * h * i * wb + pairs * (h * ab + 2.0 * (h + 3.0 * i)),
                blocks=row_tiles * (cdiv(2 * i, TILE) + cdiv(h, TILE)))


def _bad_split(c):
    return (np.asarray(c["experts"]) % np.asarray(c["moe_ep"]) != 0) | \
           (np.asarray(c["intermediate"]) % np.asarray(c["moe_tp"]) != 0)


FAMILIES = [Family(
    name="moe",
    fields=(Field("tokens", "pos", doc="tokens entering the layer (all of the EP group's)"),
            Field("experts", "pos", doc="routed experts of the layer"), Field("top_k", "pos"),
            Field("hidden", "pos"), Field("intermediate", "pos", doc="per-expert intermediate size, unsharded"),
            Field("dtype", "dtype", doc="weight format"),
            Field("moe_tp", "pos", doc="tensor-parallel cut of each expert", default=1),
            Field("moe_ep", "pos", doc="expert-parallel ranks the experts are spread over", default=1),
            Field("distribution", "choice", choices=DISTRIBUTIONS, doc="routing of tokens to experts",
                  default="uniform")),
    unit="tensor", dominant="tokens", tile=f"{TILE}-row tiles per hit expert x {TILE}-column tiles",
    cost_fn=_cost, shape=MoeShape,
    checks=((lambda c: np.asarray(c["top_k"]) > np.asarray(c["experts"]), "top_k must be <= experts"),
            (_bad_split, "experts must divide by moe_ep and intermediate by moe_tp")))]
