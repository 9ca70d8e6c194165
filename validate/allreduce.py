"""The custom all-reduce latency model of the engine profile, fitted on public kernel measurements.

vLLM runs tensor-parallel all-reduces below a size limit with its own one-shot /
two-shot kernel over NVLink peer memory, captured in CUDA graphs (engine profile
`allreduce` section; sim/pricing.py prices them). Its latency is modelled as

    t = custom_alpha_us + bus bytes / (custom_bus_efficiency * NVLink bandwidth per direction)

with bus bytes from the cost model (2 (n - 1) / n x message bytes). Procedure:
least squares on log latency over the `vllm.custom_ar` rows measured inside CUDA
graphs (data/public/aiconfigurator: A100, H100, H200, B200, GB200 over NVLink),
messages up to 64 MiB (the largest vLLM sends to the custom kernel), with the
GPUs in `exclude` left out. The shipped values exclude every H100 row, so the
cross-device validation tier never sees an H100 measurement; the fit reports its
error on the held-out GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError
from kernelsight.sim.vllm_allreduce import vllm_allreduce_rows

MAX_MESSAGE = 64 * 2**20


@dataclass(frozen=True)
class CustomAllReduceFit:
    alpha_us: float
    bus_efficiency: float
    train_devices: tuple
    errors: pd.DataFrame  # per device and world size: rows, median and mean absolute % error, held_out

    def seconds(self, bus_bytes, link_bw) -> np.ndarray:
        return self.alpha_us * 1e-6 + np.asarray(bus_bytes) / (self.bus_efficiency * np.asarray(link_bw))


def custom_allreduce_rows(path=None) -> pd.DataFrame:
    """The measured vLLM all-reduce rows (sim/vllm_allreduce.py) up to the custom kernel's largest message."""
    rows = vllm_allreduce_rows(path)
    return rows[rows["msg_bytes"] <= MAX_MESSAGE].reset_index(drop=True)


def fit_custom_allreduce(rows: pd.DataFrame, exclude=()) -> CustomAllReduceFit:
    """(alpha, efficiency) by least squares on log latency over the rows of GPUs not in `exclude`."""
    from scipy.optimize import least_squares

    train = rows[~rows["device"].isin(exclude)]
    if train.empty:
        raise KernelsightError(f"no custom all-reduce rows left after excluding {', '.join(exclude)}")
    bus, bw, t = (train[c].to_numpy(dtype=np.float64) for c in ("bus_bytes", "link_bw", "seconds"))

    def residual(p):
        return np.log(p[0] * 1e-6 + bus / (p[1] * bw)) - np.log(t)

    sol = least_squares(residual, x0=[5.0, 0.7], bounds=([0.0, 1e-3], [np.inf, 1.0]))
    alpha, eff = (float(x) for x in sol.x)
    pred = alpha * 1e-6 + rows["bus_bytes"] / (eff * rows["link_bw"])
    ape = (pred / rows["seconds"] - 1).abs() * 100
    errors = (rows.assign(ape=ape).groupby(["device", "world_size"], sort=True)["ape"]
              .agg(rows="size", median_ape="median", mape="mean").reset_index())
    errors["held_out"] = errors["device"].isin(exclude)
    return CustomAllReduceFit(round(alpha, 2), round(eff, 3), tuple(sorted(train["device"].unique())), errors)
