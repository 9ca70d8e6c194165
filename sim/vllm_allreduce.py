"""vLLM's tensor-parallel all-reduce as measured, for the engine profile's `allreduce.measured`.

aiconfigurator times vLLM's own entry point (`tensor_model_parallel_all_reduce`, captured in
CUDA graphs: collector/network/collect_all_reduce.py), so its `vllm.custom_ar` rows hold
whatever vLLM dispatches at each message size: the custom one-/two-shot kernel, torch
symmetric memory (multimem or two-shot on Hopper and Blackwell), NCCL. On H100 at TP 8 that
is 0.5-0.8x NCCL's latency between 0.25 and 16 MiB, where a custom-kernel-or-NCCL model
prices NCCL. The measurement prices an all-reduce by log-log interpolation over message size,
per world size, within the measured range, from the GPU's own rows or, where the predictor
has no data of the GPU (tier cross), from a die sibling on the same NVLink bandwidth
(H200 for H100). Elsewhere the engine profile's custom-kernel model and the predictor's NCCL
model stay in charge (sim/pricing.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import get_family
from kernelsight.predictor.hardware import Hardware, load_hardware
from kernelsight.predictor.outputs import write_table
from kernelsight.predictor.paths import data_dir, reference_data
from kernelsight.predictor.transfer import die_siblings

if TYPE_CHECKING:  # pandas is imported where a frame is read or built: a plain simulation needs none
    import pandas as pd

PROVIDER = "vllm.custom_ar"
_COLUMNS = ["provider", "status", "cuda_graph", "link", "msg_bytes", "world_size", "dtype", "device",
            "latency_ms"]
SHIPPED_COLUMNS = ["device", "world_size", "dtype", "msg_bytes", "latency_ms"]


def shipped_rows_path():
    """The rows the package ships (data/engine/), so a wheel without the reference data prices them too."""
    return data_dir() / "engine" / "vllm_custom_ar.csv"


def measured_rows(folder) -> pd.DataFrame:
    """The CUDA-graph `vllm.custom_ar` rows over NVLink of a sweep folder, in the shipped columns."""
    from kernelsight.predictor.sweep import read_sweep

    df = read_sweep(folder, columns=_COLUMNS, filters=[("provider", "=", PROVIDER)])
    df = df[(df["status"] == "ok") & df["cuda_graph"].fillna(False).astype(bool)
            & (df["link"] == "nvlink") & (df["latency_ms"] > 0) & (df["msg_bytes"] > 0)]
    if df.empty:
        raise KernelsightError(f"{folder}: no {PROVIDER} rows measured in CUDA graphs")
    return (df[SHIPPED_COLUMNS].astype({"device": str, "dtype": str})
            .sort_values(SHIPPED_COLUMNS).reset_index(drop=True))


def write_shipped_rows(folder=None) -> None:
    """Refresh data/engine/vllm_custom_ar.csv from the reference data (after re-importing aiconfigurator)."""
    folder = folder or reference_data("public", "aiconfigurator", what="the measured vLLM all-reduce")
    write_table(measured_rows(folder), shipped_rows_path(), float_format="%.9g")


def vllm_allreduce_rows(path=None) -> pd.DataFrame:
    """CUDA-graph `vllm.custom_ar` rows over NVLink with their bus bytes, link bandwidth and seconds: from a
    sweep folder, or (None) the rows the package ships."""
    import pandas as pd

    df = measured_rows(path) if path is not None else pd.read_csv(shipped_rows_path())
    bw = {d: load_hardware(d).nvlink_gbs_per_dir or 0.0 for d in df["device"].unique()}
    df = df[df["device"].map(bw) > 0].copy()
    cols = {"msg_bytes": df["msg_bytes"].to_numpy(), "world_size": df["world_size"].to_numpy(),
            "link": np.full(len(df), "nvlink", dtype=object), "dtype": df["dtype"].to_numpy()}
    df["bus_bytes"] = get_family("allreduce").cost(cols).bytes
    df["link_bw"] = df["device"].map(bw) * 1e9
    df["seconds"] = df["latency_ms"] * 1e-3
    return df.reset_index(drop=True)


@dataclass(frozen=True)
class MeasuredAllReduce:
    """One GPU's measured vLLM all-reduce: per world size, log message bytes -> log seconds (sorted)."""

    device: str  # the GPU whose rows these are (the priced GPU or its die sibling)
    curves: dict  # world size -> (log bytes, log seconds), message sizes ascending

    @classmethod
    def from_rows(cls, device: str, rows: pd.DataFrame) -> "MeasuredAllReduce":
        curves = {}
        for world, part in rows.groupby("world_size"):
            per_size = part.groupby("msg_bytes")["seconds"].median().sort_index()
            if len(per_size) >= 2:
                curves[int(world)] = (np.log(per_size.index.to_numpy(dtype=np.float64)),
                                      np.log(per_size.to_numpy(dtype=np.float64)))
        return cls(device, curves)

    def seconds(self, msg_bytes, world_size) -> np.ndarray:
        """Latency per row; NaN where the world size was not measured or the message lies outside
        the measured sizes (no extrapolation)."""
        msg = np.asarray(msg_bytes, dtype=np.float64)
        world = np.asarray(world_size, dtype=np.int64)
        out = np.full(msg.shape, np.nan)
        for w, (log_bytes, log_s) in self.curves.items():
            sel = (world == w) & (msg >= np.exp(log_bytes[0])) & (msg <= np.exp(log_bytes[-1]))
            if sel.any():
                out[sel] = np.exp(np.interp(np.log(msg[sel]), log_bytes, log_s))
        return out


@lru_cache(maxsize=None)
def _rows_by_device() -> dict:
    return {d: part for d, part in vllm_allreduce_rows().groupby("device")}


def measured_allreduce(hw: Hardware | str, tier: str = "auto") -> MeasuredAllReduce | None:
    """The measured vLLM all-reduce that prices `hw` in a predictor tier: none for the plain roofline;
    in tier cross (no data of the GPU itself) the nearest die sibling's rows on the same NVLink
    bandwidth; otherwise the GPU's own rows, a sibling's where it has none. None when neither exists."""
    hw = load_hardware(hw) if isinstance(hw, str) else hw
    if tier == "roofline" or not hw.nvlink_gbs_per_dir:
        return None
    rows = _rows_by_device()
    if tier != "cross" and hw.key in rows:
        return MeasuredAllReduce.from_rows(hw.key, rows[hw.key])
    for key in die_siblings(hw, sorted(rows)):
        if load_hardware(key).nvlink_gbs_per_dir == hw.nvlink_gbs_per_dir:
            return MeasuredAllReduce.from_rows(key, rows[key])
    return None
