"""Roofline latency of kernels on a hardware entry, with wave quantization.

t_roof = max(flops * u / peak(dtype), bytes / mem_bw),  u = ceil(B / n_sm) * n_sm / B
for B thread blocks (u = 1 when B = 0). Collectives use the latency-bandwidth
form of families/collectives.py instead. Works on one shape or whole frames.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from .dtypes import canonical_dtype
from .errors import KernelsightError
from .families import Shape, get_family
from .families.collectives import link_time

if TYPE_CHECKING:  # pandas is imported where a frame is built: pricing columns needs none
    import pandas as pd


def wave_factor(blocks, num_sms: int) -> np.ndarray:
    """Quantization of B blocks onto num_sms SMs: >= 1, == 1 for whole waves."""
    b = np.asarray(blocks, dtype=np.float64)
    safe = np.where(b > 0, b, 1.0)
    return np.where(b > 0, np.ceil(safe / num_sms) * num_sms / safe, 1.0)


def _peaks(dtypes, unit: str, hw) -> np.ndarray:
    if unit == "vector":
        return np.full(len(dtypes), hw.peak_flops("fp32"))
    cache = {d: hw.peak_flops(d) for d in set(dtypes)}
    return np.asarray([cache[d] for d in dtypes], dtype=np.float64)


def roofline_columns(family: str, cols: Mapping, hw, index=None) -> dict:
    """flops, bytes, blocks (launched on this GPU), wave_factor, t_compute, t_memory, t_roof (s), bound."""
    fam = get_family(family)
    cost = fam.cost(cols, index=index)
    n = len(cost.flops)
    if fam.unit == "link":
        t = link_time(fam.name, fam.with_defaults(cols), cost, hw)
        return {"flops": cost.flops, "bytes": cost.bytes, "blocks": cost.blocks,
                "wave_factor": np.ones(n), "t_compute": np.zeros(n), "t_memory": t,
                "t_roof": t, "bound": np.full(n, "link", dtype=object)}
    raw = np.asarray(cols["dtype"]).reshape(-1).tolist()
    names = {d: canonical_dtype(d) for d in set(raw)}
    dtypes = [names[d] for d in raw]
    blocks = fam.blocks_on(cols, cost.blocks, hw.num_sms)
    u = wave_factor(blocks, hw.num_sms)
    t_c = cost.flops * u / _peaks(dtypes, fam.unit, hw)
    t_m = cost.bytes / hw.mem_bw
    return {"flops": cost.flops, "bytes": cost.bytes, "blocks": blocks, "wave_factor": u,
            "t_compute": t_c, "t_memory": t_m, "t_roof": np.maximum(t_c, t_m),
            "bound": np.where(t_c >= t_m, "compute", "memory").astype(object)}


def roofline_shape(shape: Shape, hw) -> dict:
    """Roofline of one shape as plain floats/strings."""
    out = roofline_columns(shape.family.name, shape.as_columns(), hw)
    return {k: (v[0].item() if hasattr(v[0], "item") else v[0]) for k, v in out.items()}


def roofline_frame(df: pd.DataFrame, hw) -> pd.DataFrame:
    """Roofline of every row of a sweep-like frame (any mix of families), same index.

    An empty frame gives an empty result (with or without its columns); a row without a family is
    refused by row, since grouping would silently leave it unpriced."""
    import pandas as pd

    out = pd.DataFrame(index=df.index, columns=["flops", "bytes", "blocks", "wave_factor",
                                                "t_compute", "t_memory", "t_roof", "bound"])
    out = out.astype({c: "float64" for c in out.columns if c != "bound"})
    if df.empty:
        return out
    if "family" not in df.columns:
        raise KernelsightError("frame has no 'family' column")
    missing = df["family"].isna().to_numpy()
    if missing.any():
        raise KernelsightError(f"row {df.index[np.flatnonzero(missing)[0]]}: family is empty")
    for family, part in df.groupby("family", sort=False):
        fam = get_family(family)
        cols = {c: part[c].to_numpy() for c in fam.columns if c in part.columns}
        res = roofline_columns(family, cols, hw, index=part.index.to_numpy())
        for k, v in res.items():
            out.loc[part.index, k] = v
    return out
