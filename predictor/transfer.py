"""Die-sibling transfer: price a GPU with no data of its own from a measured GPU built on the same die.

Why: the cross-device LightGBM model has to learn every architecture's kernel
efficiency from hardware features, which for an unseen GPU is far less
accurate than a model of the GPU itself. GPUs that share the compute die (H100
SXM / H200 / GH200, B200 / GB200, the A100 variants) run the same kernels;
what differs is clocks, SM count and memory. The calibration report scores
the transfer (cross tier, leave-one-GPU-out, "no sibling" beside it);
docs/validation.md quotes the current figures.

How a sibling's measurement moves to the new GPU: a kernel's time on the
sibling S is t_S = t_roof_S * eta_S; its roofline part moves with the roofline
and the gap above it (launch, latency, tail and pipeline effects of the same
kernel on the same SM design) carries over:

    t_D = t_roof_D + (t_S - t_roof_S),  i.e.  eta_D = 1 + (eta_S - 1) * t_roof_S / t_roof_D.

Alternatives, all worse on the same folds (figures in docs/experiments.md):
carrying eta over unchanged (the whole time scales with the roofline), because
H200's extra bandwidth barely speeds up kernels far from their roofline;
carrying the time over unchanged, which misprices bandwidth-bound kernels;
scaling the gap by the ratio of bf16 peaks.

Siblings: same vendor and architecture, SM counts within 5 %, nearest first
(memory bandwidth, then peak). A sibling prices only the rows its model covers
(no unseen category, every feature inside its training range); the others go
to the cross-device model.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .families.collectives import cluster_link_rows
from .features import feature_matrix
from .hardware import Hardware, load_hardware
from .roofline import roofline_columns

SM_TOLERANCE = 0.05
ROOFLINE = "roofline"  # model label (and tier) of kernels priced at η = 1


def take(columns: Mapping, idx) -> dict:
    """Rows `idx` (indices or a mask) of every column: kernel columns or roofline columns alike."""
    return {k: np.asarray(v).reshape(-1)[idx] for k, v in columns.items()}


def _peak(hw: Hardware) -> float | None:
    for dtype in ("bf16", "fp16", "fp32"):
        if hw.peak_tflops.get(dtype):
            return float(hw.peak_tflops[dtype])
    return None


def die_siblings(hw: Hardware | str, candidates) -> list[str]:
    """Catalog keys among `candidates` built on hw's compute die, nearest first (hw itself excluded)."""
    hw = load_hardware(hw) if isinstance(hw, str) else hw
    peak = _peak(hw)
    out = []
    for key in candidates:
        other = load_hardware(key)
        if other.key == hw.key or other.vendor != hw.vendor or other.arch != hw.arch:
            continue
        if abs(other.num_sms / hw.num_sms - 1.0) > SM_TOLERANCE or peak is None or _peak(other) is None:
            continue
        distance = (abs(math.log(other.mem_bw_gbs / hw.mem_bw_gbs)), abs(math.log(_peak(other) / peak)), other.key)
        out.append((distance, other.key))
    return [key for _, key in sorted(out)]


def sibling_eta(family: str, cols: Mapping, roof: Mapping, siblings, floor: bool = True) -> tuple:
    """η on the GPU whose roofline columns are `roof`, from die siblings' target models, for the rows a
    sibling covers.

    siblings: [(Hardware, EtaModel)] nearest first. Returns (eta, covered, source): η per row
    (1 where not covered), the covered mask and the sibling key that priced each row ('' if none).
    floor=False skips the siblings' η floor (evaluation only: what the floor costs).
    """
    n = len(roof["t_roof"])
    eta = np.ones(n)
    source = np.full(n, "", dtype=object)
    covered = np.zeros(n, dtype=bool)
    t_roof = np.asarray(roof["t_roof"], dtype=np.float64)
    for sib_hw, model in siblings:
        rows = np.flatnonzero(~covered)
        if rows.size == 0:
            break
        sub = take(cols, rows) if rows.size < n else cols
        sib_roof = roofline_columns(family, sub, sib_hw)
        x = feature_matrix(family, model.tier, sub, sib_hw, sib_roof)
        ok = ~model.out_of_range(x)
        if not ok.any():
            continue
        eta_sib, _ = model.eta(x[ok], floor=floor)
        t_sib_roof = np.asarray(sib_roof["t_roof"], dtype=np.float64)[ok]
        idx = rows[ok]
        t = t_roof[idx] + (eta_sib - 1.0) * t_sib_roof
        with np.errstate(divide="ignore", invalid="ignore"):
            eta[idx] = np.where(t_roof[idx] > 0, t / t_roof[idx], 1.0)
        covered[idx] = True
        source[idx] = sib_hw.key
    return eta, covered, source


def cross_eta(family: str, cols: Mapping, hw: Hardware, roof: Mapping, cross, siblings, floor: bool = True) -> dict:
    """The cross-device path for kernels of a GPU without its own data: die siblings where they cover the
    kernel, the cross-device model (or η = 1 without one) for the rest; collectives over a cluster link
    (families.collectives.CLUSTER_LINKS: the scale-out network, which the catalog cannot describe per GPU)
    at η = 1, since other GPUs' rows over it measured other clusters' networks.

    Returns {eta, extrapolated, model, sibling} per row: model is the label of what priced the row, sibling
    whether a die sibling did.
    """
    n = len(roof["t_roof"])
    eta, covered, source = sibling_eta(family, cols, roof, siblings, floor)
    model = np.full(n, ROOFLINE, dtype=object)
    model[covered] = [f"target/{d}/{family} (die sibling)" for d in source[covered]]
    extrapolated = ~covered
    left = np.flatnonzero(~covered)
    if left.size and cross is not None:
        cols_left, roof_left = (take(cols, left), take(roof, left)) if left.size < n else (cols, roof)
        eta[left], extrapolated[left] = cross.eta(feature_matrix(family, "cross", cols_left, hw, roof_left),
                                                  floor=floor)
        model[left] = cross.label
    net = cluster_link_rows(cols, n)
    eta[net], extrapolated[net], covered[net], model[net] = 1.0, False, False, ROOFLINE
    return {"eta": eta, "extrapolated": extrapolated, "model": model, "sibling": covered}
