"""Kernel latency prediction: roofline time times η, the family's efficiency gap.

`Predictor.latency(family, cols)` is what the simulator calls for every kernel
it prices. Without an η bundle η = 1 (plain roofline) and a warning says so.
"""
from __future__ import annotations

import warnings
from typing import Mapping

import numpy as np
import pandas as pd

from .hardware import Hardware, load_hardware
from .roofline import roofline_columns, roofline_frame


class Predictor:
    """Prices kernels on one GPU. tier: 'roofline' (η = 1) until a bundle provides models."""

    def __init__(self, hardware: Hardware | str, tier: str = "roofline"):
        self.hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
        self.tier = tier
        if tier == "roofline":
            warnings.warn(f"no η bundle loaded: kernel latencies on {self.hw.key} are plain roofline (η = 1)",
                          stacklevel=2)

    def eta(self, family: str, cols: Mapping, roof: dict) -> np.ndarray:
        return np.ones_like(roof["t_roof"])

    def latency(self, family: str, cols: Mapping) -> np.ndarray:
        """Predicted seconds for each kernel described by `cols` (one family)."""
        roof = roofline_columns(family, cols, self.hw)
        return roof["t_roof"] * self.eta(family, cols, roof)

    def predict_frame(self, df: pd.DataFrame) -> pd.DataFrame:
        """Roofline, η, predicted latency (ms) and tier for every row of a sweep-like frame."""
        out = roofline_frame(df, self.hw)
        eta = pd.Series(1.0, index=df.index)
        for family, part in df.groupby("family", sort=False):
            roof = {k: out.loc[part.index, k].to_numpy() for k in ("t_roof",)}
            cols = {c: part[c].to_numpy() for c in part.columns}
            eta.loc[part.index] = self.eta(family, cols, roof)
        out["eta"] = eta
        out["predicted_ms"] = out["t_roof"].astype(float) * out["eta"] * 1e3
        out["tier"] = self.tier
        return out
