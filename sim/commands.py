"""`kernelsight roofline`: per-kernel roofline tables for a model step, one kernel shape, or a sweep.

Config: conf/roofline.yaml (`kernelsight roofline --help`). The tables reuse the cost model and
roofline of predictor and the step graph of graph.py, so they show exactly the kernels and
shapes the simulator prices (at eta = 1).
"""
from __future__ import annotations

import os
from pathlib import Path

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
from .memory import GiB, memory_plan
from .model import ModelConfig
from .parallel import ParallelConfig
from .schema import plain

STEP_COLUMNS = ["kernel", "family", "shape", "count", "GFLOP/call", "MB/call", "FLOP/B", "bound",
                "us/call", "us/step", "share %"]


def roofline(cfg) -> None:
    """Entry point of `kernelsight roofline` (see conf/roofline.yaml for the modes)."""
    kernel = {k: v for k, v in plain(cfg.kernel).items() if v is not None}
    if cfg.sweep_file:
        if kernel:
            raise KernelsightError("choose one mode: sweep_file= or kernel.family=..., not both")
        table = sweep_table(cfg.sweep_file)
        print(f"roofline of {len(table)} sweep rows from {cfg.sweep_file} (each on its own device; "
              f"eta = measured / roofline)")
        shown = table.head(int(cfg.limit))
        print(format_table(shown))
        if len(table) > len(shown):
            print(f"... {len(table) - len(shown)} more rows (limit={cfg.limit}; out= writes all)")
        print()
        print(format_table(eta_summary(table)))
    elif kernel:
        hw = _hardware(cfg, _parallel(cfg))
        table = kernel_table(dict(kernel), hw)
        print(f"roofline of one {kernel.get('family')} kernel on {hw.name} ({hw.key})")
        print(format_table(table))
    else:
        model, hw, engine, par = typed_configs(cfg)
        plan = memory_plan(model, hw, engine, par)  # refuses layouts and models that do not fit
        steps = [(f"decode step: {cfg.decode.batch} sequences at KV length {cfg.decode.kv_len}",
                  StepBatch(decode_ctx=(int(cfg.decode.kv_len),) * int(cfg.decode.batch))),
                 (f"prefill step: {cfg.prefill.tokens} prompt tokens after {cfg.prefill.cached} cached",
                  StepBatch(prefill_new=(int(cfg.prefill.tokens),), prefill_ctx=(int(cfg.prefill.cached),),
                            prefill_sampled=1))]
        print(f"{model.name} on {hw.name} ({hw.key}), tp={par.tp} pp={par.pp} ep={par.ep}, "
              f"weights {model.weight_dtype}, KV cache {model.kv_dtype}: {plan.weights / GiB:.1f} GiB of weights "
              f"per GPU, {plan.blocks} KV blocks ({plan.kv_tokens:,} tokens)")
        tables = []
        for title, batch in steps:
            table = step_table(step_kernels(model, batch, par, engine), hw)
            total_us = table["us/step"].sum()
            tokens = batch.num_tokens
            print(f"\n{title}: roofline {total_us / 1e3:.3f} ms per step, {tokens / total_us * 1e6:,.0f} tokens/s "
                  f"(kernels only: no launch or host overhead, eta = 1)")
            print(format_table(table))
            tables.append(table.assign(step=title.split(":")[0]))
        table = pd.concat(tables, ignore_index=True)
    if cfg.out:
        print(f"wrote {write_table(table, cfg.out)}")


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


def format_table(df: pd.DataFrame) -> str:
    """Aligned columns: text left, numbers right with precision chosen per magnitude."""
    if df.empty:
        return "(no rows)"
    columns = list(df.columns)
    cells = [[str(c) for c in columns]]
    numeric = {c: pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) for c in columns}
    for _, row in df.iterrows():
        cells.append([_cell(row[c], numeric[c]) for c in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = []
    for r in cells:
        parts = [r[i].rjust(widths[i]) if numeric[columns[i]] else r[i].ljust(widths[i]) for i in range(len(columns))]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value, numeric: bool) -> str:
    if not numeric:
        return "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)
    if value is None or pd.isna(value):
        return "-"
    x = float(value)
    if x.is_integer() and abs(x) < 1e9:
        return f"{int(x):,}"
    magnitude = abs(x)
    if magnitude >= 100:
        return f"{x:,.0f}"
    if magnitude >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def write_table(df: pd.DataFrame, path) -> Path:
    """Write a .csv or .parquet atomically (temp file + rename: never a half-written table)."""
    path = Path(path)
    if path.suffix not in (".csv", ".parquet"):
        raise KernelsightError(f"out={path}: unknown format {path.suffix!r}; use a .csv or .parquet file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


# -- config helpers --------------------------------------------------------------------------

def config_source(group: str) -> str:
    """conf/<group>/<choice>.yaml of the running Hydra job, for error messages."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return f"conf/{group}/{HydraConfig.get().runtime.choices[group]}.yaml"
    except (ImportError, ValueError, KeyError):
        return f"{group} config"


def _hardware(cfg, parallel: ParallelConfig) -> Hardware:
    """The configured GPU on the layout's scale-out network."""
    hw = Hardware.from_mapping(plain(cfg.hardware), config_source("hardware"))
    return hw.on_network(parallel.net_gbs_per_gpu)


def _parallel(cfg) -> ParallelConfig:
    return ParallelConfig.from_mapping(cfg.parallel, config_source("parallel"))


def typed_configs(cfg):
    """(model, hardware, engine, parallel) of a composed config, each validated with its file named."""
    parallel = _parallel(cfg)
    return (ModelConfig.from_mapping(cfg.model, config_source("model")), _hardware(cfg, parallel),
            EngineProfile.from_mapping(cfg.engine, config_source("engine")), parallel)
