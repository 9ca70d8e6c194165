"""80 % prediction intervals from held-out residuals (split-conformal per tier, family and pricing path).

A held-out residual is r = log(measured / predicted latency) of a row the model never saw: the target
tier's grouped K-fold test rows, the cross tier's leave-one-GPU-out rows. A prediction's interval is
[predicted * exp(q10), predicted * exp(q90)] with q10, q90 the residual quantiles of its group:

  target               per family;
  cross                per family, rows the cross-device model priced;
  sibling              per family, cross-tier rows a die sibling's target model priced.

So the interval is as wide as the path that made the prediction has been wrong on data it never saw. A
group with fewer than MIN_ROWS residuals takes its path's quantiles pooled over families ('*'). The
predictor applies them (predictor/predict.py): the lower end never below the roofline (η >= 1), and an
extrapolated prediction gets the wider of its own path's and the cross path's interval.

Coverage is measured honestly, cross-fitted: a target-tier row's interval comes from the other folds'
residuals, a cross-tier row's from the other held-out GPUs' residuals; the share of rows inside is
reported per tier and family (calibration report).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

LEVEL = (0.10, 0.90)
MIN_ROWS = 50
PATHS = ("target", "cross", "sibling")


def residual_frame(scored: pd.DataFrame) -> pd.DataFrame:
    """The held-out rows that intervals are fitted on: path, family, the unit they are held out by, residual."""
    if scored.empty:
        return pd.DataFrame(columns=["path", "family", "unit", "residual"])
    target = scored["tier"] == "target"
    lodo = (scored["tier"] == "cross") & scored["split"].str.startswith("lodo ")
    keep = scored[target | lodo]
    path = np.where(keep["tier"] == "target", "target", np.where(keep["sibling"], "sibling", "cross"))
    unit = np.where(keep["tier"] == "target", keep["device"] + " fold " + keep["fold"].astype(str), keep["device"])
    residual = np.log(keep["latency_ms"].to_numpy(float) / keep["pred_lightgbm"].to_numpy(float))
    return pd.DataFrame({"path": path, "family": keep["family"].to_numpy(), "unit": unit,
                         "residual": residual}).replace([np.inf, -np.inf], np.nan).dropna()


def _quantiles(residuals: np.ndarray) -> dict:
    lo, hi = np.quantile(residuals, LEVEL)
    return {"p10": round(float(lo), 6), "p90": round(float(hi), 6), "rows": int(len(residuals))}


def fit_intervals(residuals: pd.DataFrame) -> dict:
    """{path: {family or '*': {p10, p90, rows}}}: each path's quantiles per family and pooled ('*')."""
    out: dict = {}
    for path, part in residuals.groupby("path", sort=True):
        table = {"*": _quantiles(part["residual"].to_numpy())}
        for family, fam in part.groupby("family", sort=True):
            if len(fam) >= MIN_ROWS:
                table[family] = _quantiles(fam["residual"].to_numpy())
        out[path] = table
    return out


def coverage(residuals: pd.DataFrame) -> pd.DataFrame:
    """Cross-fitted coverage per path and family: each unit's (fold's or GPU's) rows against the interval
    fitted on the other units' residuals of the same path; the median interval width as p90 / p10."""
    rows = []
    for (path, family), part in residuals.groupby(["path", "family"], sort=True):
        units = part["unit"].unique()
        if len(units) < 2:
            continue
        inside, widths = 0, []
        for unit in units:
            test = part["unit"] == unit
            other = residuals[(residuals["path"] == path) & (residuals["unit"] != unit)]
            same = other[other["family"] == family]
            fitted = same if len(same) >= MIN_ROWS else other
            if fitted.empty:
                continue
            lo, hi = np.quantile(fitted["residual"].to_numpy(), LEVEL)
            r = part.loc[test, "residual"].to_numpy()
            inside += int(((r >= lo) & (r <= hi)).sum())
            widths += [np.exp(hi - lo)] * len(r)
        if widths:
            rows.append({"path": path, "family": family, "rows": len(widths),
                         "coverage_pct": 100.0 * inside / len(widths), "width_p90_over_p10": float(np.median(widths))})
    return pd.DataFrame(rows, columns=["path", "family", "rows", "coverage_pct", "width_p90_over_p10"])
