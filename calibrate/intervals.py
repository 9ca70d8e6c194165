"""80 % prediction intervals from held-out residuals, per pricing path, family and difficulty.

A held-out residual is r = log(measured / predicted latency) of a row the model never saw, made the way
the path makes its predictions:

  target    the GPU's own model: the target tier's grouped K-fold test rows;
  sibling   a die sibling's target model on a GPU it was not fitted on: the cross tier's leave-one-GPU-out
            rows that a sibling priced;
  cross     the cross-device LightGBM model on a GPU it was not fitted on: every leave-one-GPU-out row of
            the model alone (its 'no sibling' prediction), not only the rows no sibling covered, so its
            residuals come from every GPU of the family rather than the few without a die sibling;
            collectives over the scale-out network, priced at the roofline by rule, are left out.

A prediction's interval is [predicted * exp(q10), predicted * exp(q90)] with q10, q90 the quantiles of its
group's residuals. Why the cross and sibling paths are not plain pooled quantiles: their errors are mostly
a bias per GPU (a held-out GPU is predicted too slow or too fast as a whole), and a family has only 2-13
GPUs, so a new GPU's bias is one more draw from a few. Their quantiles are those of b + e (a random-effects
predictive distribution), one rule for every family:

  e         the residuals about their own GPU's median, every row counted once: the interval is for a kernel
            row of an unseen GPU, and coverage counts rows, so a GPU counts by its rows (GPUs weighted equally
            let a few hundred rows of a poorly predicted old card set the width for 40,000-row GPUs);
  b         the GPU medians, each weighted by its rows, their deviations from the weighted mean scaled by
            sqrt((K + 1) / (K - 1)) * t(0.9, K - 1) / z(0.9) for K GPUs: the Student-t predictive interval of
            one new draw at the 80 % level (the spread is estimated from K GPUs: the normal factor alone
            under-covers a new GPU when K is 2-4). On the cross path a die-sibling group is one draw (its
            GPUs' residuals come from models that saw each other: H100 and H200 agree because of that, not
            because GPUs agree), so K counts groups and b is a group's median; a family whose residuals
            come from one group takes the path's pooled quantiles;
  sibling   b is symmetric about zero instead: a die-sibling pair prices each other, so its residuals are
            mirror images and the path has no bias to estimate; the points are +-b, scaled by
            t(0.9, K) / z(0.9) (K draws about a known centre).

Target residuals are the GPU's own, pooled as they are.

Difficulty: a row whose features lie outside the model's training range (EtaModel.eta's extrapolated
flag: a feature beyond its range, an unseen category, an η outside the training η) has its own group,
'<path> extrapolated', fitted on the extrapolated residuals of that path. Family groups with fewer than
MIN_ROWS residuals (or cross / sibling groups with fewer than 2 GPUs) take the group's pooled quantiles
('*'); an extrapolated group that small is left out (its rows keep the wider of their own and the cross
path's interval). The predictor (predictor/predict.py) gives an extrapolated prediction the widest of its
path's interval, its path's extrapolated interval and the cross path's interval; the lower end never
below the roofline.

Coverage is measured on data the interval was not set on: a target row against the interval fitted on the
other folds' residuals, a cross or sibling row against the interval fitted on the residuals of the GPUs that
are neither it nor its die siblings (predictor/transfer.py: same die and SM count), with the same rules; the
share of rows inside is reported per path and family (calibration report). Die siblings are held out
together because their residuals carry the held-out GPU's own data: a sibling's sibling residuals were
priced by the held-out GPU's target model (the mirror image of its own), and a twin's cross residuals by a
cross model fitted with it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.predict import interval_quantiles
from kernelsight.predictor.transfer import die_siblings

LEVEL = (0.10, 0.90)
MIN_ROWS = 50
PATHS = ("target", "cross", "sibling")
EXTRAPOLATED = " extrapolated"
BY_GPU = ("cross", "sibling")  # paths whose quantiles treat the GPU as the unit (random effects)
SYMMETRIC = ("sibling",)  # paths whose GPU biases are symmetric about zero (die siblings price each other)
BY_SIBLING_GROUP = ("cross",)  # paths whose random-effect unit is the die-sibling group, not the GPU
_GRID = np.linspace(0.0005, 0.9995, 1000)  # quantile levels that represent the within-GPU distribution
COLUMNS = ["path", "family", "device", "unit", "extrapolated", "residual"]


def sibling_groups(devices) -> dict[str, str]:
    """{GPU: its die-sibling group}: the GPUs among `devices` linked by predictor.transfer.die_siblings, named
    by their keys joined with '+'; a GPU the hardware catalog does not know is a group of its own."""
    known = []
    for d in sorted(set(devices)):
        try:
            load_hardware(d)
            known.append(d)
        except KernelsightError:
            pass
    parent = {d: d for d in set(devices)}

    def root(d):
        while parent[d] != d:
            d = parent[d]
        return d

    for d in known:
        for other in die_siblings(d, known):
            parent[root(other)] = root(d)
    members: dict = {}
    for d in parent:
        members.setdefault(root(d), []).append(d)
    return {d: "+".join(sorted(members[root(d)])) for d in parent}


def residual_frame(scored: pd.DataFrame) -> pd.DataFrame:
    """The held-out rows that intervals are fitted on: path, family, GPU, the unit they are held out by (a
    target fold, else the GPU's die-sibling group), the extrapolated flag of the model that priced them,
    residual."""
    if scored.empty:
        return pd.DataFrame(columns=COLUMNS)
    groups = sibling_groups(scored["device"].unique())

    def part(rows, path, pred, flag):
        flags = rows[flag].to_numpy(bool) if flag in rows else np.zeros(len(rows), dtype=bool)
        unit = (rows["device"] + " fold " + rows["fold"].astype(str) if path == "target"
                else rows["device"].map(groups))
        return pd.DataFrame({"path": path, "family": rows["family"].to_numpy(), "device": rows["device"].to_numpy(),
                             "unit": np.asarray(unit), "extrapolated": flags,
                             "residual": np.log(rows["latency_ms"].to_numpy(float) / rows[pred].to_numpy(float))})

    lodo = scored[(scored["tier"] == "cross") & scored["split"].str.startswith("lodo ")]
    if "at_roofline" in lodo:
        lodo = lodo[~lodo["at_roofline"].astype(bool)]
    parts = [part(scored[scored["tier"] == "target"], "target", "pred_lightgbm", "extrapolated"),
             part(lodo[lodo["sibling"].astype(bool)], "sibling", "pred_lightgbm", "extrapolated"),
             part(lodo, "cross", "pred_lightgbm_no_sibling", "extrapolated_no_sibling")]
    return pd.concat(parts, ignore_index=True).replace([np.inf, -np.inf], np.nan).dropna()


def _weighted_quantiles(values: np.ndarray, weights: np.ndarray, levels) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = (np.cumsum(w) - w / 2) / w.sum()
    return np.interp(levels, cum, v)


def _bias_scale(k: int, centered: bool) -> float:
    """The factor on the GPU biases' deviations (module doc): Student-t predictive of one new draw at LEVEL."""
    from scipy import stats  # only when fitting: scipy.stats takes a while to import

    z = stats.norm.ppf(LEVEL[1])
    if centered:
        return float(stats.t.ppf(LEVEL[1], k) / z)
    return float(np.sqrt((k + 1) / (k - 1)) * stats.t.ppf(LEVEL[1], k - 1) / z) if k >= 2 else 1.0


def quantiles(residuals: np.ndarray, devices: np.ndarray | None = None,
              centered: bool = False) -> tuple[float, float]:
    """(q10, q90): plain quantiles, or with `devices` the random-effects quantiles (module doc), the GPU
    biases symmetric about zero when `centered` (sibling path)."""
    r = np.asarray(residuals, dtype=np.float64)
    if devices is None:
        lo, hi = np.quantile(r, LEVEL)
        return float(lo), float(hi)
    frame = pd.DataFrame({"device": np.asarray(devices), "r": r})
    by = frame.groupby("device", sort=True)["r"]
    within = np.quantile(r - by.transform("median").to_numpy(), _GRID)  # each row once: GPUs by their rows
    bias, rows = by.median().to_numpy(), by.size().to_numpy().astype(np.float64)
    k = len(bias)
    if centered:
        points = np.concatenate([bias, -bias]) * _bias_scale(k, True)
        weights = np.concatenate([rows, rows])
    else:
        center = np.average(bias, weights=rows)
        points, weights = center + (bias - center) * _bias_scale(k, False), rows
    total = (points[:, None] + within[None, :]).ravel()
    lo, hi = _weighted_quantiles(total, np.repeat(weights, len(within)), LEVEL)
    return float(lo), float(hi)


def _fit_group(part: pd.DataFrame, path: str, pooled: bool = False) -> tuple[float, float] | None:
    """A group's (q10, q90), or None when it is too small to stand alone; a path's pooled group always has
    one (plain quantiles where it holds a single GPU)."""
    units = part["unit" if path in BY_SIBLING_GROUP else "device"]
    by_gpu = path in BY_GPU and units.nunique() >= 2
    if part.empty or (not pooled and (len(part) < MIN_ROWS or (path in BY_GPU and not by_gpu))):
        return None
    return quantiles(part["residual"].to_numpy(), units.to_numpy() if by_gpu else None,
                     centered=path in SYMMETRIC)


def _entry(q: tuple[float, float], rows: int) -> dict:
    return {"p10": round(q[0], 6), "p90": round(q[1], 6), "rows": int(rows)}


def fit_intervals(residuals: pd.DataFrame) -> dict:
    """{group: {family or '*': {p10, p90, rows}}}, group a path or '<path> extrapolated': each group's
    quantiles per family and pooled over families ('*')."""
    out: dict = {}
    for path, rows in residuals.groupby("path", sort=True):
        for group, part in ((path, rows), (path + EXTRAPOLATED, rows[rows["extrapolated"].astype(bool)])):
            pooled = _fit_group(part, path, pooled=group == path)
            if pooled is None:
                continue
            table = {"*": _entry(pooled, len(part))}
            for family, fam in part.groupby("family", sort=True):
                q = _fit_group(fam, path)
                if q is not None:
                    table[family] = _entry(q, len(fam))
            out[group] = table
    return out


def coverage(residuals: pd.DataFrame) -> pd.DataFrame:
    """Held-out coverage per path and family: each unit's (target: fold's; cross, sibling: die-sibling group's)
    rows against the intervals fitted (fit_intervals) on the other units' residuals of the path; the share of
    extrapolated rows and the median interval width as p90 / p10."""
    rows = []
    for path, prows in residuals.groupby("path", sort=True):
        inside: dict = {}
        for unit in prows["unit"].unique():
            test = prows[prows["unit"] == unit]
            fitted = fit_intervals(prows[prows["unit"] != unit])
            for (family, extrapolated), part in test.groupby(["family", "extrapolated"], sort=True):
                q = interval_quantiles(fitted, path, family, bool(extrapolated))
                if q is None:
                    continue
                r = part["residual"].to_numpy()
                acc = inside.setdefault(family, [0, 0, 0, []])
                acc[0] += int(((r >= q[0]) & (r <= q[1])).sum())
                acc[1] += len(r)
                acc[2] += int(extrapolated) * len(r)
                acc[3] += [np.exp(q[1] - q[0])] * len(r)
        for family, (hit, n, extra, widths) in sorted(inside.items()):
            rows.append({"path": path, "family": family, "rows": n, "coverage_pct": 100.0 * hit / n,
                         "extrapolated_pct": 100.0 * extra / n, "width_p90_over_p10": float(np.median(widths))})
    return pd.DataFrame(rows, columns=["path", "family", "rows", "coverage_pct", "extrapolated_pct",
                                       "width_p90_over_p10"])
