"""The simulator's own error on real serving runs, as the 80 % range an engine profile ships (serving_error).

A kernel's interval covers the kernel's error only; a served figure also carries the host terms', the frontend's
and the scheduling model's. Their sum shows in the validation rows' held-out residuals r = log(measured /
simulated) (host terms and frontend delay fitted without the row's model). Like the kernels' cross path, the
error is mostly a bias per model, and there are few models, so the range is the random-effects quantiles of
calibrate/intervals.py with the model (the CSV's model_path) as the unit: per tier and metric over every row
that is not queueing for KV capacity (report.queueing).

Held out, a model's rows are scored against the range fitted on the other models' rows: alone, and as simulate
uses it, the wider of it and the row's kernel range (validate with intervals).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kernelsight.calibrate.intervals import quantiles
from kernelsight.sim.engine_profile import SERVING_METRICS, ServingError

from . import report as rep


def _residuals(frame: pd.DataFrame, metric: str) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(frame[metric].to_numpy(dtype=float) / frame[f"{metric}_heldout"].to_numpy(dtype=float))


def _usable(frame: pd.DataFrame, metric: str) -> np.ndarray:
    """Rows whose residual informs the range: finite, and not queueing for KV capacity."""
    labels = (frame["model_path"] + " " + frame["precision"]).to_numpy()
    return np.isfinite(_residuals(frame, metric)) & ~rep.queueing(frame["ttft"], labels)


def fit(frame: pd.DataFrame) -> ServingError:
    """The (p10, p90) per metric of one tier's rows (None for a metric with fewer than two models)."""
    out = {}
    for metric in SERVING_METRICS:
        use = _usable(frame, metric)
        units = frame["model_path"].to_numpy()[use]
        out[metric] = (quantiles(_residuals(frame, metric)[use], units)
                       if len(set(units.tolist())) >= 2 else None)
    return ServingError(**out)


def add_heldout_ranges(df: pd.DataFrame) -> pd.DataFrame:
    """Per row, <metric>_serving_lo / _hi: its held-out prediction's range under the serving error fitted on the
    other models' rows of its tier; with kernel ranges (<metric>_lo / _hi), <metric>_both_lo / _hi: the wider
    of the two."""
    df = df.copy()
    ends = {(metric, end): np.full(len(df), np.nan) for metric in SERVING_METRICS for end in ("lo", "hi")}
    for _, g in df.groupby("tier", sort=False):
        for model in g["model_path"].unique():
            rows = (g["model_path"] == model).to_numpy()
            error, at = fit(g[~rows]), df.index.get_indexer(g.index[rows])
            for metric in SERVING_METRICS:
                q = getattr(error, metric)
                if q is not None:
                    center = g[f"{metric}_heldout"].to_numpy(dtype=float)[rows]
                    ends[metric, "lo"][at], ends[metric, "hi"][at] = center * np.exp(q[0]), center * np.exp(q[1])
    for metric in SERVING_METRICS:
        lo, hi = ends[metric, "lo"], ends[metric, "hi"]
        df[f"{metric}_serving_lo"], df[f"{metric}_serving_hi"] = lo, hi
        if f"{metric}_lo" in df:
            df[f"{metric}_both_lo"] = np.fmin(lo, df[f"{metric}_lo"].to_numpy(dtype=float))
            df[f"{metric}_both_hi"] = np.fmax(hi, df[f"{metric}_hi"].to_numpy(dtype=float))
    return df


def coverage(df: pd.DataFrame, by: tuple = ("tier",)) -> pd.DataFrame:
    """Per `by` group (tier; e.g. tier and set) and metric, the share of rows (%) whose measured value fell
    inside each range that exists for them: the kernels' (intervals), the held-out serving error's, and the
    wider of the two (what simulate prints)."""
    ranges = (("kernels", ""), ("serving error", "_serving"), ("both", "_both"))
    rows = []
    for key, g in df.groupby(list(by), sort=False):
        for metric in (m for m in SERVING_METRICS if m in g):
            entry = {**dict(zip(by, key)), "metric": rep.METRIC_NAMES.get(metric, metric)}
            measured = g[metric].to_numpy(dtype=float)
            for name, suffix in ranges:
                if f"{metric}{suffix}_lo" not in g:
                    continue
                lo, hi = (g[f"{metric}{suffix}_{end}"].to_numpy(dtype=float) for end in ("lo", "hi"))
                ok = np.isfinite(measured) & np.isfinite(lo)
                if ok.any():
                    entry["rows"] = int(ok.sum())
                    entry[f"{name} %"] = 100.0 * float(((measured >= lo) & (measured <= hi))[ok].mean())
            if "rows" in entry:
                rows.append(entry)
    columns = [*by, "metric", "rows"] + [f"{name} %" for name, _ in ranges]
    return pd.DataFrame(rows).reindex(columns=columns)


def describe(error: ServingError) -> str:
    """'TTFT -0.243 / +0.265, ...' (p10 / p90 of log(measured / simulated))."""
    parts = [f"{rep.METRIC_NAMES.get(m, m)} {q[0]:+.3f} / {q[1]:+.3f}"
             for m in SERVING_METRICS if (q := getattr(error, m)) is not None]
    return ", ".join(parts) if parts else "none"
