"""Sweep grids as data: expand conf/sweep/<name>.yaml into validated shapes, and price them.

A family's `grid` is a mapping, or a list of mappings whose expansions are
concatenated. In a mapping, a key that is a shape field takes a value or a
list of values; any other key names a group of correlated fields and takes a
list of mappings (e.g. `models: [{n: 6144, k: 4096}, ...]`). The expansion is
the Cartesian product over the keys, each shape built with make_shape (so a
bad value fails with one line naming the grid entry), duplicates dropped in
order. Shapes whose cost-model bytes exceed `max_shape_bytes` are dropped and
counted: no serving step on one GPU moves that much in one kernel.

The time estimate prices every planned measurement from the roofline of a
hardware entry, with the assumptions stated below, so a grid's budget claim
("quick <= 3 minutes on an H100") is computed, not guessed.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.families import COLLECTIVES, Shape, get_family, make_shape
from kernelsight.predictor.families.collectives import link_time
from kernelsight.predictor.roofline import roofline_shape

FLUSH_L2_MULTIPLE = 4          # the cold-L2 flush writes this many times the L2 ...
FLUSH_MIN_BYTES = 256 << 20    # ... and at least this much


@dataclass(frozen=True)
class TimingConfig:
    """How every kernel is timed (a sweep's timing: section), checked when built; here, beside the grid, so a
    command checks it before torch is imported (timing.Clock applies it)."""

    l2: str = "cold"              # 'cold' (flush before every timed call) or 'hot'
    warmup: int = 3               # untimed calls before timing
    min_reps: int = 10
    max_reps: int = 200
    budget_ms: float = 100.0      # stop after this much timed kernel time (once min_reps are done)
    cuda_graph: str = "auto"      # 'auto' (replay calls < graph_below_us), 'on', 'off'
    graph_below_us: float = 50.0
    cpu_flush_mb: int = 64

    def __post_init__(self):
        if isinstance(self.cuda_graph, bool):  # YAML reads on/off as booleans
            object.__setattr__(self, "cuda_graph", "on" if self.cuda_graph else "off")
        if self.l2 not in ("cold", "hot"):
            raise KernelsightError(f"timing.l2 = {self.l2!r}: must be 'cold' or 'hot'")
        if self.cuda_graph not in ("auto", "on", "off"):
            raise KernelsightError(f"timing.cuda_graph = {self.cuda_graph!r}: must be 'auto', 'on' or 'off'")
        for name in ("warmup", "min_reps", "max_reps", "budget_ms", "graph_below_us", "cpu_flush_mb"):
            if getattr(self, name) < (0 if name == "warmup" else 1):
                raise KernelsightError(f"timing.{name} = {getattr(self, name)!r}: must be positive")
        if self.min_reps > self.max_reps:
            raise KernelsightError(f"timing.min_reps ({self.min_reps}) > timing.max_reps ({self.max_reps})")


# -- estimate assumptions ---------------------------------------------------------
ASSUMED_ETA = 2.0           # kernels take this multiple of their roofline time
LAUNCH_FLOOR_S = 5e-6       # no call is faster than a launch
HOST_PER_CALL_S = 15e-6     # host time per timed call (flush, events, launch): the floor of a repetition
SETUP_S = 0.08              # per measurement: inputs, float32 reference, check, syncs, row write


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def expand_grid(family: str, grid: Any, where: str) -> list[Shape]:
    """All shapes of one family's grid, in order, without duplicates."""
    fam = get_family(family)
    if family in COLLECTIVES:
        raise KernelsightError(f"{where}: {family} is a collective; list it under sweep.collectives.ops")
    blocks = grid if isinstance(grid, (list, tuple)) else [grid]
    shapes: dict[Shape, None] = {}
    for bi, block in enumerate(blocks):
        here = f"{where}[{bi}]" if len(blocks) > 1 else where
        if not isinstance(block, Mapping) or not block:
            raise KernelsightError(f"{here}: expected a non-empty mapping of shape fields, got {block!r}")
        axes = []
        for key, value in block.items():
            if key in fam.columns:
                values = _as_list(value)
                if not values:
                    raise KernelsightError(f"{here}.{key}: empty list")
                axes.append([{key: v} for v in values])
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Mapping) for v in value):
                for v in value:
                    bad = [f for f in v if f not in fam.columns]
                    if bad:
                        raise KernelsightError(f"{here}.{key}: {bad[0]!r} is not a {family} shape field"
                                               f"{did_you_mean(bad[0], fam.columns)}; fields: {', '.join(fam.columns)}")
                axes.append([dict(v) for v in value])
            else:
                raise KernelsightError(f"{here}: {key!r} is not a {family} shape field{did_you_mean(key, fam.columns)} "
                                       f"(a group of correlated fields takes a list of mappings); "
                                       f"fields: {', '.join(fam.columns)}")
        for combo in itertools.product(*axes):
            params: dict = {}
            for part in combo:
                twice = set(params) & set(part)
                if twice:
                    raise KernelsightError(f"{here}: field {sorted(twice)[0]!r} is set by two keys")
                params.update(part)
            try:
                shapes[make_shape(family, **params)] = None
            except KernelsightError as e:
                raise KernelsightError(f"{here}: {e}") from None
    return list(shapes)


def collective_sizes(sizes: Mapping, where: str = "sweep.collectives.sizes") -> list[int]:
    """nccl-tests -b/-e/-f: begin, begin*factor, ... <= end (bytes)."""
    try:
        begin, end, factor = int(sizes["begin"]), int(sizes["end"]), int(sizes["factor"])
    except (KeyError, TypeError, ValueError):
        raise KernelsightError(f"{where}: expected begin, end and factor (integers), got {dict(sizes)!r}") from None
    if begin < 1 or end < begin or factor < 2:
        raise KernelsightError(f"{where}: need 1 <= begin <= end and factor >= 2, got {begin}, {end}, {factor}")
    out, size = [], begin
    while size <= end:
        out.append(size)
        size *= factor
    return out


@dataclass(frozen=True)
class Plan:
    """What one grid measures: (shape, provider) pairs, collectives, and what was left out and why."""

    items: list                     # WorkItem
    collectives: list               # shape rows (dicts) of collective families
    dropped_large: dict             # family -> shapes over max_shape_bytes
    unsupported: dict               # (provider, reason) -> count
    unavailable: dict               # provider -> reason


# -- time estimate ------------------------------------------------------------------

def kernel_seconds(shape: Shape, hw) -> float:
    """Assumed kernel time: ASSUMED_ETA x roofline, at least a launch."""
    return max(ASSUMED_ETA * roofline_shape(shape, hw)["t_roof"], LAUNCH_FLOOR_S)


def measurement_seconds(shape: Shape, hw, timing, energy_seconds: float = 0.0, flush: bool = True) -> float:
    """Wall time of one measurement as runner.measure runs it: setup, the float32 reference
    (ASSUMED_ETA x its FLOPs at the fp32 peak), warm-up and timed calls, energy loop."""
    t = kernel_seconds(shape, hw)
    reference_s = ASSUMED_ETA * shape.flops / hw.peak_flops("fp32")
    flush_s = max(FLUSH_L2_MULTIPLE * hw.l2_bytes if hw.l2_mb else 0, FLUSH_MIN_BYTES) / hw.mem_bw if flush else 0.0
    rep = max(t + flush_s, HOST_PER_CALL_S)
    reps = min(timing.max_reps, max(timing.min_reps, math.ceil(timing.budget_ms / 1e3 / t)))
    return SETUP_S + reference_s + (timing.warmup + reps) * rep + (max(energy_seconds, t) if energy_seconds else 0.0)


def collective_seconds(shape: Shape, hw, reps: int, warmup: int) -> float:
    cols = shape.as_columns()
    t = float(link_time(shape.family.name, cols, shape.cost(), hw)[0]) * ASSUMED_ETA
    return SETUP_S + (reps + warmup) * max(t, HOST_PER_CALL_S)


def estimate(items: Iterable, collectives: Iterable[Shape], hw, timing, energy_seconds: Callable[[str], float],
             coll_reps: int, coll_warmup: int) -> dict:
    """Estimated seconds per family and in total on hardware entry `hw`.

    energy_seconds(family): length of the energy loop of that family's shapes (0: none). A provider's own
    set-up per shape (Provider.build_s: compiling) counts too.
    """
    per_family: dict[str, float] = {}
    for item in items:
        s = measurement_seconds(item.shape, hw, timing, energy_seconds(item.family), flush=timing.l2 == "cold") + \
            item.provider.build_s
        per_family[item.shape.family.name] = per_family.get(item.shape.family.name, 0.0) + s
    for shape in collectives:
        per_family[shape.family.name] = per_family.get(shape.family.name, 0.0) + \
            collective_seconds(shape, hw, coll_reps, coll_warmup)
    return {"per_family": per_family, "total": sum(per_family.values())}
