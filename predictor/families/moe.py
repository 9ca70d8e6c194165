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
    return power_law_draws(np.asarray(u)[None, :], np.asarray([tokens]), top_k, ep, alpha)[0]


def power_law_draws(u: np.ndarray, tokens: np.ndarray, top_k: int, ep: int, alpha: float) -> np.ndarray:
    """power_law_loads of each row of u [rows, experts] with that row's tokens [rows], at once."""
    rows, experts = u.shape
    cap = np.asarray(tokens, dtype=np.int64)[:, None]
    pairs = cap * top_k
    few = pairs <= experts
    lo, hi = np.where(few, 0.01, 1.0), np.where(few, 2.0, cap * 0.8)
    x = ((hi ** (1 - alpha) - lo ** (1 - alpha)) * u + lo ** (1 - alpha)) ** (1 / (1 - alpha))
    loads = np.round(x / x.sum(axis=1, keepdims=True) * pairs)
    index = np.arange(rows)
    loads[index, np.argmax(loads, axis=1)] += pairs[:, 0] - loads.sum(axis=1)
    loads = np.clip(loads, 0, cap).astype(np.int64)
    short = pairs - loads.sum(axis=1, keepdims=True)
    fix = np.flatnonzero(short[:, 0])
    if fix.size:  # the cap's excess (or a rounding gap) goes to the most loaded experts with room, in turn,
        # ties broken by the drawn x, not by expert id (which would always pick the lowest-numbered experts)
        part, short, cap_part = loads[fix], short[fix], cap[fix]
        order = np.lexsort((-x[fix], -part), axis=-1)
        ordered = np.take_along_axis(part, order, axis=1)
        room = np.where(short > 0, cap_part - ordered, ordered)  # what each can take or give, in that order
        before = np.cumsum(room, axis=1) - room
        np.put_along_axis(part, order, ordered + np.clip(np.abs(short) - before, 0, room) * np.sign(short), axis=1)
        loads[fix] = part
    per_rank = loads.reshape(rows, ep, experts // ep)
    top = np.argmax(per_rank.sum(axis=2), axis=1)
    first = per_rank[:, 0].copy()
    per_rank[:, 0] = per_rank[index, top]
    per_rank[index, top] = first
    return per_rank.reshape(rows, experts)


_ROUTES: dict = {}  # (tokens, experts, top_k, ep, distribution) -> local_routing's answer
_MAX_ROUTES = 1_000_000
_CHUNK = 1 << 21       # elements of one power-law batch (rows x experts)


def local_routing(tokens: int, experts: int, top_k: int, ep: int, distribution: str) -> tuple[float, float, float]:
    """(pairs, hit experts, 128-row tiles) on the measured GPU's experts / ep experts, expected values."""
    return tuple(routing_table([tokens], experts, top_k, ep, distribution)[0].tolist())


def routing_table(tokens, experts: int, top_k: int, ep: int, distribution: str) -> np.ndarray:
    """local_routing of many token counts [n] at once, [n, 3]; memoised per token count."""
    tokens = [int(t) for t in tokens]
    missing = sorted({t for t in tokens if (t, experts, top_k, ep, distribution) not in _ROUTES})
    if missing:
        if len(_ROUTES) + len(missing) > _MAX_ROUTES:
            _ROUTES.clear()
        rows = _routing(np.asarray(missing, dtype=np.int64), experts, top_k, ep, distribution)
        _ROUTES.update(((t, experts, top_k, ep, distribution), row) for t, row in zip(missing, rows.tolist()))
    return np.asarray([_ROUTES[(t, experts, top_k, ep, distribution)] for t in tokens], dtype=np.float64)


def _routing(tokens: np.ndarray, experts: int, top_k: int, ep: int, distribution: str) -> np.ndarray:
    local = experts // ep
    if distribution in ("balanced", "uniform"):
        pairs = tokens * top_k / ep
        if distribution == "balanced":
            hit = np.minimum(local, pairs)
        else:
            hit = local * (1.0 - (1.0 - top_k / experts) ** tokens)
        tiles = np.where(hit > 0, hit * np.ceil(pairs / np.maximum(hit, 1.0 if distribution == "balanced" else 1e-9)
                                                / TILE), 0.0)
        return np.stack([pairs, hit, tiles], axis=1)
    alpha = float(distribution.removeprefix("power_law_"))
    u = np.random.default_rng(0).random((DRAWS, experts))  # the draws, in the order single draws would come
    out = []
    step = max(1, _CHUNK // (DRAWS * experts))
    for start in range(0, len(tokens), step):
        chunk = tokens[start:start + step]
        loads = power_law_draws(np.tile(u, (len(chunk), 1)), np.repeat(chunk, DRAWS), top_k, ep, alpha)
        rank = loads[:, :local].reshape(len(chunk), DRAWS, local)  # the most loaded rank of each draw
        out.append(np.stack([rank.sum(axis=2).mean(axis=1), np.count_nonzero(rank, axis=2).mean(axis=1),
                             np.ceil(rank / TILE).sum(axis=2).mean(axis=1)], axis=1))
    return np.concatenate(out)


def routing_columns(c) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: expected pairs, hit experts and row tiles on the measured GPU (see local_routing)."""
    cols = [np.asarray(c[k]).tolist() for k in ("tokens", "experts", "top_k", "moe_ep", "distribution")]
    groups: dict = {}
    for i, (t, e, k, ep, d) in enumerate(zip(*cols)):
        groups.setdefault((int(e), int(k), int(ep), d), []).append(i)
    arr = np.zeros((len(cols[0]), 3))
    for (e, k, ep, d), rows in groups.items():
        arr[rows] = routing_table([cols[0][i] for i in rows], e, k, ep, d)
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
