"""Predicted kernel latencies with their errors for every row of a sweep file (one kernel shape:
cli/predict.py's predict_kernel, through the predictor's columns path).

A sweep's rows holding measurements get per-row errors beside the constant-η
baseline of the bundle (the median η per family and GPU it was fitted on) and
the plain roofline, and an error table per family, GPU and provider.
"""
from __future__ import annotations

import pandas as pd

from kernelsight.predictor.bundle import load_bundle, shared_bundle
from kernelsight.predictor.families import SHAPE_COLUMNS
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.predict import Predictor
from kernelsight.predictor.sweep import read_sweep

from .models import ConstantEtaBaseline


def predict_sweep(path, tier: str, bundle, net_gbs_per_gpu: float) -> pd.DataFrame:
    """Every usable row of a sweep priced on its own GPU: shape, roofline, η, prediction; and where the row
    holds a measurement, latency_ms, ape_pct and the constant-η baseline's constant_ms."""
    df = read_sweep(path)
    loaded = load_bundle(bundle) if bundle else shared_bundle()
    usable = df[df["status"] == "ok"] if "status" in df.columns else df
    parts = []
    for device, part in usable.groupby("device", sort=True):
        hw = load_hardware(device).on_network(net_gbs_per_gpu)
        pred = Predictor(hw, tier=tier, bundle=loaded).predict(part)
        parts.append(pred.assign(device=device))
    pred = pd.concat(parts).loc[usable.index]
    shape_cols = [c for c in SHAPE_COLUMNS if c in usable.columns]
    out = usable[["device", "family", "provider", *shape_cols]].copy()
    out["t_roof_ms"] = pred["t_roof"].astype(float) * 1e3
    out[["eta", "tier", "model", "extrapolated"]] = pred[["eta", "tier", "model", "extrapolated"]]
    out["predicted_ms"] = pred["t_roof"].astype(float).to_numpy() * pred["eta"].to_numpy() * 1e3
    measured = pd.to_numeric(usable["latency_ms"], errors="coerce")
    if measured.notna().any():
        const = ConstantEtaBaseline.from_table(loaded.manifest.get("baselines", {}).get("constant_eta", {}))
        out["latency_ms"] = measured
        out["ape_pct"] = (out["predicted_ms"] - measured).abs() / measured * 100
        out["constant_ms"] = out["t_roof_ms"] * const.predict(out["device"], out["family"])
    return out


def error_table(out: pd.DataFrame) -> pd.DataFrame:
    """Errors per family, GPU and provider: a sweep may time several implementations of one kernel
    (CUTLASS and DeepGEMM fp8, FA2 and FA3), while an η model describes the one calibration chose."""
    rows = []
    for (family, device, provider), g in out.groupby(["family", "device", "provider"], sort=True):
        m = g["latency_ms"]
        ape = g["ape_pct"]
        rows.append({"family": family, "device": device, "provider": provider,
                     "tier": ",".join(sorted(g["tier"].unique())),
                     "rows": len(g), "MAPE": ape.mean(), "median APE": ape.median(),
                     "p90 APE": ape.quantile(0.9),
                     "MAPE const": ((g["constant_ms"] - m).abs() / m * 100).mean(),
                     "MAPE roofline": ((g["t_roof_ms"] - m).abs() / m * 100).mean(),
                     "extrapolated": int(g["extrapolated"].sum())})
    return pd.DataFrame(rows)
