"""Small synthetic sweeps for the calibration tests (machinery only; never for reported accuracy).

Latency = roofline on the device's catalog entry x a known η(shape, device), so
a test can check that the machinery recovers what it was given.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.roofline import roofline_frame
from kernelsight.predictor.sweep import with_cost, write_sweep

DEVICES = ("h100_sxm", "a100_sxm", "l40s")
FAST_LEARNER = {"num_trees": 40, "learning_rate": 0.2, "num_leaves": 15, "min_data_in_leaf": 5}


def known_eta(flops: np.ndarray, device: str) -> np.ndarray:
    """η falls from ~6 for tiny kernels towards 1.2 for big ones; slower GPUs a little less efficient."""
    base = {"h100_sxm": 1.2, "a100_sxm": 1.3, "l40s": 1.4}.get(device, 1.25)
    return base + 5.0 / (1.0 + flops / 2e9)


GRID_M = (1, 8, 32, 128, 512, 2048, 8192)
GRID_DIMS = (64, 128, 256, 512, 1024, 2048, 4096)


def gemm_rows(device: str, seed: int = 0, n_rows: int | None = None, ms=GRID_M, dims=GRID_DIMS) -> pd.DataFrame:
    """A gemm grid (bf16; m in ms, n and k in dims) on `device` with known η and 1 % multiplicative noise."""
    grid = pd.DataFrame(list(itertools.product(ms, dims, dims)), columns=["m", "n", "k"])
    if n_rows is not None:
        grid = grid.sample(n_rows, random_state=seed).reset_index(drop=True)
    df = grid.assign(family="gemm", provider="torch.F.linear", dtype="bf16", device=device,
                     device_name=device, source="import:synthetic@0", sweep_id=f"synthetic/{device}/v-1.0",
                     status="ok", flags="", timing="unknown")
    df = with_cost(df)
    roof = roofline_frame(df, load_hardware(device))
    noise = np.random.default_rng(seed).normal(0.0, 0.01, len(df))
    eta = known_eta(df["flops"].to_numpy(), device) * np.exp(noise)
    df["latency_ms"] = roof["t_roof"].to_numpy(dtype=float) * eta * 1e3
    return df


def write_synthetic(folder, devices=DEVICES) -> list:
    """One sweep file per device under folder; returns the paths."""
    return [write_sweep(gemm_rows(d, seed=i), folder / f"{d}.parquet", {"dataset": "synthetic"})
            for i, d in enumerate(devices)]
