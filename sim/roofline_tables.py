"""Per-kernel roofline tables: the kernels of a model's decode and prefill steps, one kernel shape, or a sweep.

They reuse the cost model and roofline of predictor and the step graph of
graph.py, so they show exactly the kernels and shapes the simulator prices (at
eta = 1). `kernelsight roofline` prints them (cli/roofline.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import get_family, make_shape
from kernelsight.predictor.hardware import Hardware, load_hardware
from kernelsight.predictor.roofline import roofline_columns, roofline_frame
from kernelsight.predictor.sweep import read_sweep

from .batch import StepBatch
from .engine_profile import EngineProfile
from .graph import KernelCall, step_kernels
from .memory import MemoryPlan, memory_plan
from .model import ModelConfig
from .parallel import ParallelConfig

STEP_COLUMNS = ["kernel", "family", "shape", "count", "GFLOP/call", "MB/call", "FLOP/B", "bound",
                "us/call", "us/step", "share %"]


@dataclass
class StepRoofline:
    """The kernels of one engine step at eta = 1: what it runs, its table (step_table) and its totals."""

    title: str
    batch: StepBatch
    table: pd.DataFrame

    @property
    def total_us(self) -> float:
        return float(self.table["us/step"].sum())


def model_steps(model: ModelConfig, hw: Hardware, engine: EngineProfile, parallel: ParallelConfig,
                decode_batch: int, kv_len: int, prefill_tokens: int, cached: int) -> tuple[MemoryPlan, list]:
    """(memory plan, [decode step, prefill step] as StepRoofline) of a model on a GPU and layout:
    `decode_batch` sequences decoding at KV length `kv_len`, and one prompt of `prefill_tokens` tokens
    after `cached` cached ones, served as vLLM serves it on the GPU (ModelConfig.served_on). Refuses layouts
    and models that do not fit."""
    model = model.served_on(hw)
    plan = memory_plan(model, hw, engine, parallel)
    steps = [(f"decode step: {decode_batch} sequences at KV length {kv_len}",
              StepBatch(decode_ctx=(int(kv_len),) * int(decode_batch))),
             (f"prefill step: {prefill_tokens} prompt tokens after {cached} cached",
              StepBatch(prefill_new=(int(prefill_tokens),), prefill_ctx=(int(cached),), prefill_sampled=1))]
    return plan, [StepRoofline(title, batch, step_table(step_kernels(model, batch, parallel, engine), hw))
                  for title, batch in steps]


# -- tables --------------------------------------------------------------------------------

def step_table(calls: list[KernelCall], hw: Hardware) -> pd.DataFrame:
    """One row per kernel call of a step: per-call work, bound and time, time per step, share."""
    rows = []
    for call in calls:
        roof = roofline_columns(call.family, call.columns(), hw)
        flops, nbytes, seconds = roof["flops"].sum(), roof["bytes"].sum(), roof["t_roof"].sum()
        bound = roof["bound"][0] if call.num_rows == 1 else (
            "compute" if roof["t_compute"].sum() >= roof["t_memory"].sum() else "memory")
        rows.append({"kernel": call.name, "family": call.family, "shape": shape_summary(call.family, call.cols),
                     "count": call.count, "GFLOP/call": flops / 1e9, "MB/call": nbytes / 1e6,
                     "FLOP/B": flops / nbytes if nbytes else np.nan, "bound": bound,
                     "us/call": seconds * 1e6, "us/step": seconds * 1e6 * call.count})
    table = pd.DataFrame(rows, columns=STEP_COLUMNS[:-1])
    table["share %"] = 100 * table["us/step"] / table["us/step"].sum()
    return table


def kernel_table(params: dict, hw: Hardware) -> pd.DataFrame:
    """The roofline of one kernel shape given as keyword fields (family included)."""
    if "family" not in params:
        raise KernelsightError(f"kernel.family is required with kernel.{sorted(params)[0]}")
    family = params.pop("family")
    shape = make_shape(family, **params)  # one line on unknown, missing or bad fields
    call = KernelCall(family, family, {k: v for k, v in shape.row().items() if k != "family"}, 1, "-")
    table = step_table([call], hw)
    roof = roofline_columns(family, call.columns(), hw)
    table["wave"] = roof["wave_factor"]
    table["us compute"] = roof["t_compute"] * 1e6
    table["us memory"] = roof["t_memory"] * 1e6
    return table.drop(columns=["kernel", "count", "us/step", "share %"])


def sweep_table(path) -> pd.DataFrame:
    """Roofline of every sweep row on its own device's catalog entry, and eta where a latency was measured."""
    df = read_sweep(path)
    out = pd.DataFrame(index=df.index)
    for device, part in df.groupby("device", sort=False):
        roof = roofline_frame(part, load_hardware(device))
        out.loc[part.index, ["flops", "bytes", "t_roof", "bound"]] = roof[["flops", "bytes", "t_roof", "bound"]]
    measured = df["latency_ms"].where(df["status"] == "ok")
    return pd.DataFrame({
        "device": df["device"], "family": df["family"], "provider": df["provider"],
        "shape": _shape_strings(df),
        "GFLOP": out["flops"].astype(float) / 1e9, "MB": out["bytes"].astype(float) / 1e6,
        "FLOP/B": out["flops"].astype(float) / out["bytes"].astype(float).where(out["bytes"] > 0),
        "bound": out["bound"], "roof us": out["t_roof"].astype(float) * 1e6,
        "measured us": measured * 1e3, "eta": measured * 1e-3 / out["t_roof"].astype(float),
        "source": df["source"]})


def _shape_strings(df: pd.DataFrame) -> pd.Series:
    """shape_summary of every row, one family at a time (columns zipped, no per-row frame access)."""
    out = pd.Series("", index=df.index, dtype=object)
    for family, part in df.groupby("family", sort=False):
        columns = get_family(family).columns
        values = zip(*(part[c].tolist() for c in columns))
        out.loc[part.index] = [shape_summary(family, dict(zip(columns, row))) for row in values]
    return out


def eta_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Rows and eta quantiles per device and family (rows without a measured latency are counted, not used)."""
    grouped = table.groupby(["device", "family"], sort=True)
    summary = grouped.agg(rows=("family", "size"), measured=("eta", "count"),
                          eta_p10=("eta", lambda x: x.quantile(0.1)), eta_median=("eta", "median"),
                          eta_p90=("eta", lambda x: x.quantile(0.9)))
    return summary.reset_index()


# -- formatting -------------------------------------------------------------------------------

_SHAPE_FORMATS = {
    "gemm": "{m}x{n}x{k} {dtype}",
    "attn_decode": "b={batch} kv={seq_kv} h={heads}/{kv_heads} d={head_dim}{window_txt} {kv_dtype}",
    "attn_prefill": "b={batch} q={seq_q} kv={seq_kv} h={heads}/{kv_heads} d={head_dim}{window_txt} {kv_dtype}",
    "kv_write": "t={tokens} kvh={kv_heads} d={head_dim} {dtype}->{kv_dtype}",
    "rope": "t={tokens} h={heads}/{kv_heads} d={head_dim}",
    "norm": "t={tokens} x {hidden} {op}{residual_txt}",
    "act": "t={tokens} x {intermediate} {op}",
    "elementwise": "{numel} {op} {dtype}",
    "moe": "t={tokens} e={experts} k={top_k} h={hidden} i={intermediate} {dtype}",
    "mla_decode": "b={batch} kv={seq_kv} h={heads} lora={q_lora_rank}/{kv_lora_rank} {dtype} {kv_dtype}",
    "mla_prefill": "b={batch} q={seq_q} kv={seq_kv} h={heads} lora={q_lora_rank}/{kv_lora_rank} {dtype} {kv_dtype}",
    "mla_bmm": "t={tokens} h={heads} d={head_dim} lora={kv_lora_rank} {op} {dtype}",
}


def shape_summary(family: str, cols: dict) -> str:
    """A short human description of a shape; array columns (varlen rows) show as 'n x' and their ranges."""
    rows = max((np.size(v) for v in cols.values() if np.ndim(v)), default=1)
    if rows > 1:
        values = {k: (_range(v) if np.ndim(v) else v) for k, v in cols.items()}
        return f"{rows} seqs: " + _format(family, values)
    return _format(family, {k: (np.asarray(v).reshape(-1)[0] if np.ndim(v) else v) for k, v in cols.items()})


def _format(family: str, v: dict) -> str:
    if family in _SHAPE_FORMATS:
        window = v.get("window")
        v = {**v, "window_txt": f" win={_plain_value(window)}" if window not in (None, 0, "0") else "",
             "residual_txt": "+residual" if v.get("fused_residual") in (True, "True") else ""}
        return _SHAPE_FORMATS[family].format(**{k: _plain_value(x) for k, x in v.items()})
    return f"{_mb(v['msg_bytes'])} x{_plain_value(v['world_size'])} {v['link']}"  # collectives


def _range(values) -> str:
    lo, hi = np.min(values), np.max(values)
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def _plain_value(x):
    if isinstance(x, (np.integer, np.floating)) or (isinstance(x, float) and x.is_integer()):
        return int(x) if float(x).is_integer() else float(x)
    return x


def _mb(nbytes) -> str:
    return f"{float(nbytes) / 1e6:.3g} MB"
