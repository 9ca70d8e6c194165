"""What every kernel family provides: shape fields, validation, and ONE cost model.

A family's cost model works on columns (dict of numpy arrays, or a DataFrame),
so the harness, the importers, calibration and the simulator price a single
shape and a million rows with the same code. A shape object is one row of
those columns and validates itself through the same checks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..dtypes import BYTES, canonical_dtype
from ..errors import KernelsightError


@dataclass(frozen=True)
class Field:
    """One shape parameter: its sweep column and what values are legal.

    kind: 'pos' (integer >= 1), 'nonneg' (integer >= 0), 'bool', 'dtype', or
    'choice' (one of `choices`).
    """

    name: str
    kind: str
    choices: tuple = ()
    doc: str = ""
    default: object = None  # value of rows that leave the column out or null (None: the field is required)


@dataclass(frozen=True)
class Cost:
    """Work of a batch of kernels: FLOPs, bytes moved to/from DRAM, thread blocks."""

    flops: np.ndarray
    bytes: np.ndarray
    blocks: np.ndarray


Columns = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Family:
    """A kernel family: the unit of calibration.

    unit: 'tensor' (peak of the dtype's tensor cores), 'vector' (FP32 CUDA-core
    peak: element-wise kernels compute in fp32 whatever they store) or 'link'
    (collectives: latency-bandwidth form instead of the roofline).
    dominant: the shape parameter η is plotted against.
    checks: cross-field rules, each (bad-row mask function, message).
    cost: the one definition of flops, bytes and blocks.
    launch_blocks: how the kernel re-splits its work for a given SM count
    (GEMM split-K); None when the tile count is what launches.
    """

    name: str
    fields: tuple
    unit: str
    dominant: str
    tile: str
    cost_fn: Callable[[Columns], Cost]
    checks: tuple = ()
    shape: type | None = None
    launch_blocks: Callable | None = None  # (cols, blocks, num_sms) -> blocks launched on that GPU

    def blocks_on(self, cols: Columns, blocks: np.ndarray, num_sms: int) -> np.ndarray:
        """Blocks actually launched on a GPU with num_sms SMs (default: the tile count)."""
        return blocks if self.launch_blocks is None else self.launch_blocks(cols, blocks, num_sms)

    @property
    def columns(self) -> tuple:
        return tuple(f.name for f in self.fields)

    # -- validation -----------------------------------------------------
    def violations(self, cols: Columns, with_values: bool = False) -> np.ndarray:
        """Per row, why its shape is invalid (the first rule it breaks), or None when valid.

        Without values the reasons group well (import reports count rows per reason).
        """
        cols = self.with_defaults(cols)
        n = _length(cols)
        reasons = np.full(n, None, dtype=object)
        for f in self.fields:
            if f.name not in cols:
                reasons[:] = f"{self.name}: missing shape field {f.name!r}"
                return reasons
            v = np.asarray(cols[f.name]).reshape(-1)
            bad, why = _field_violation(f, v)
            for i in np.flatnonzero(bad & (reasons == None)):  # noqa: E711 (element-wise)
                shown = f" = {_item(v, i)!r}:" if with_values else ""
                reasons[i] = f"{self.name}.{f.name}{shown} {why}"
        ok = reasons == None  # noqa: E711
        if ok.any() and self.checks:
            arrays = as_arrays({c: np.asarray(cols[c]).reshape(-1)[ok] for c in self.columns}, self.fields)
            positions = np.flatnonzero(ok)
            for mask_fn, message in self.checks:
                hit = positions[np.asarray(mask_fn(arrays), dtype=bool)]
                reasons[hit[reasons[hit] == None]] = f"{self.name}: {message}"  # noqa: E711
        return reasons

    def validate(self, cols: Columns, where: str = "", index=None) -> dict:
        """Validated columns as arrays; else one KernelsightError line naming the first bad row and field.

        index: row labels to report (a frame's index); default: positions.
        """
        cols = self.with_defaults(cols)
        reasons = self.violations(cols, with_values=True)
        bad = np.flatnonzero(reasons != None)  # noqa: E711
        if len(bad):
            i = int(bad[0])
            row = f"row {index[i]}: " if index is not None else (f"row {i}: " if len(reasons) > 1 else "")
            raise KernelsightError(f"{where}{row}{reasons[i]}")
        return as_arrays(cols, self.fields)

    def with_defaults(self, cols: Columns) -> Columns:
        """cols with every defaulted field present: a missing column, or null entries, take the default."""
        out = None
        for f in self.fields:
            if f.default is None:
                continue
            v = cols.get(f.name)
            if v is None:
                out = dict(cols) if out is None else out
                out[f.name] = np.full(_length(cols), f.default, dtype=object if isinstance(f.default, str) else None)
                continue
            v = np.asarray(v)
            if v.dtype == object or v.dtype.kind == "f":
                null = pd_isna(v)
                if null.any():
                    out = dict(cols) if out is None else out
                    filled = v.astype(object) if v.dtype == object or isinstance(f.default, str) else v.copy()
                    filled[null] = f.default
                    out[f.name] = filled
        return cols if out is None else out

    # -- cost -------------------------------------------------------------
    def cost(self, cols: Columns, index=None) -> Cost:
        """Vectorised flops/bytes/blocks; inputs are validated first."""
        arrays = self.validate(cols, index=index)
        out = self.cost_fn(arrays)
        return Cost(*(np.broadcast_to(np.asarray(a, dtype=np.float64), (_length(arrays),)).copy()
                      for a in (out.flops, out.bytes, out.blocks)))


class Shape:
    """Mixin for a family's frozen dataclass: validates itself on construction."""

    family: Family  # set by register()

    def __post_init__(self):
        self.family.validate(self.as_columns())

    def as_columns(self) -> dict:
        return {f.name: np.asarray([getattr(self, f.name)]) for f in dataclasses.fields(self)}

    def cost(self) -> Cost:
        return self.family.cost(self.as_columns())

    @property
    def flops(self) -> float:
        return float(self.cost().flops[0])

    @property
    def bytes(self) -> float:
        return float(self.cost().bytes[0])

    @property
    def blocks(self) -> float:
        return float(self.cost().blocks[0])

    def row(self) -> dict:
        """The shape as a sweep row: family plus its shape columns."""
        return {"family": self.family.name, **{k: v[0].item() if hasattr(v[0], "item") else v[0]
                                                for k, v in self.as_columns().items()}}


# -- helpers shared by the family modules ---------------------------------------

def as_arrays(cols: Columns, fields) -> dict:
    """Columns as numpy arrays: numbers as float64, dtypes canonical, the rest as given."""
    out = {}
    for f in fields:
        if f.name not in cols:
            raise KernelsightError(f"missing shape field {f.name!r}")
        v = np.asarray(cols[f.name])
        if v.ndim == 0:
            v = v.reshape(1)
        if f.kind == "dtype":
            uniq = {u: canonical_dtype(u) for u in set(v.tolist())}
            v = np.asarray([uniq[x] for x in v.tolist()], dtype=object)
        elif f.kind in ("pos", "nonneg"):
            v = _numeric(v, f.name)
        elif f.kind == "bool":
            v = v.astype(bool)
        out[f.name] = v
    return out


def pd_isna(v: np.ndarray) -> np.ndarray:
    """Null mask of an array: None or NaN."""
    if v.dtype.kind == "f":
        return np.isnan(v)
    return np.asarray([x is None or (isinstance(x, float) and x != x) for x in v.reshape(-1).tolist()],
                      dtype=bool).reshape(v.shape)


def elem_bytes(dtypes: np.ndarray) -> np.ndarray:
    """Bytes per element for an array of canonical dtype names."""
    return np.asarray([BYTES[d] for d in dtypes.tolist()], dtype=np.float64)


def cdiv(a, b):
    return np.ceil(np.asarray(a, dtype=np.float64) / b)


def _numeric(v: np.ndarray, name: str) -> np.ndarray:
    try:
        return v.astype(np.float64)
    except (TypeError, ValueError):
        raise KernelsightError(f"shape field {name!r} must be numeric, got {v.tolist()[:3]!r}") from None


def _not_a_number(v: np.ndarray) -> np.ndarray:
    """Per element: a bool or a string, which numpy would silently turn into 1.0 or parse ('32')."""
    if v.dtype.kind in "bUS":
        return np.ones(v.shape, dtype=bool)
    if v.dtype == object:
        return np.asarray([isinstance(x, (bool, np.bool_, str, bytes)) for x in v.tolist()], dtype=bool)
    return np.zeros(v.shape, dtype=bool)


def _field_violation(f: Field, v: np.ndarray):
    v = np.asarray(v)
    if f.kind in ("pos", "nonneg"):
        lo = 1 if f.kind == "pos" else 0
        if v.dtype.kind in "iuf":  # the simulator's arrays: numbers already, no per-element check needed
            x = v.astype(np.float64, copy=False)
            return ~np.isfinite(x) | (x < lo) | (x != np.floor(x)), f"must be an integer >= {lo}"
        wrong = _not_a_number(v)
        x = np.full(v.shape, np.nan)
        if not wrong.all():
            x[~wrong] = _numeric(v[~wrong], f.name)
        bad = wrong | ~np.isfinite(x) | (x < lo) | (x != np.floor(x))
        return bad, f"must be an integer >= {lo}"
    if f.kind == "choice":
        allowed = set(f.choices)
        return np.asarray([x not in allowed for x in v.tolist()]), f"must be one of {list(f.choices)}"
    if f.kind == "dtype":
        ok = {}
        for x in set(v.tolist()):
            try:
                canonical_dtype(x)
                ok[x] = True
            except KernelsightError:
                ok[x] = False
        return np.asarray([not ok[x] for x in v.tolist()]), f"must be one of {sorted(BYTES)}"
    if f.kind == "bool":
        return np.asarray([x not in (True, False, 0, 1) for x in v.tolist()]), "must be true or false"
    return None, ""


def _length(cols: Columns) -> int:
    for v in cols.values():
        return int(np.asarray(v).reshape(-1).shape[0])
    return 0


def _item(v, i):
    x = np.asarray(v).reshape(-1)[i]
    return x.item() if hasattr(x, "item") else x
