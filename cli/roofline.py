"""`kernelsight roofline`: per-kernel roofline tables for a model step, one kernel shape, or a sweep.

Config: conf/roofline.yaml (`kernelsight roofline --help`). The tables come from
sim/roofline_tables.py; this module picks the mode, prints and writes them.
"""
from __future__ import annotations

import pandas as pd

from kernelsight.predictor.errors import KernelsightError, whole_number
from kernelsight.predictor.outputs import TABLE_FORMATS, file_path, write_table
from kernelsight.sim.memory import GiB
from kernelsight.sim.roofline_tables import eta_summary, kernel_table, model_steps, sweep_table

from .config import container, hardware_config, parallel_config, typed_configs
from .tables import format_table


def roofline(cfg) -> None:
    """Entry point of `kernelsight roofline` (see conf/roofline.yaml for the modes)."""
    kernel = {k: v for k, v in container(cfg.kernel).items() if v is not None}
    if cfg.out:
        file_path(cfg.out, "out", TABLE_FORMATS)  # a bad out= is refused before the tables are built
    limit = whole_number(cfg.limit, "limit", hint="sweep rows printed")
    if cfg.sweep_file:
        if kernel:
            raise KernelsightError("choose one mode: sweep_file= or kernel.family=..., not both")
        table = _sweep(cfg.sweep_file, limit)
    elif kernel:
        hw = hardware_config(cfg, parallel_config(cfg))
        table = kernel_table(dict(kernel), hw)
        print(f"roofline of one {kernel.get('family')} kernel on {hw.name} ({hw.key})")
        print(format_table(table))
    else:
        table = _model_steps(cfg)
    if cfg.out:
        print(f"wrote {write_table(table, cfg.out)}")


def _sweep(path, limit: int) -> pd.DataFrame:
    table = sweep_table(path)
    print(f"roofline of {len(table)} sweep rows from {path} (each on its own device; eta = measured / roofline)")
    shown = table.head(limit)
    print(format_table(shown))
    if len(table) > len(shown):
        print(f"... {len(table) - len(shown)} more rows (limit={limit}; out= writes all)")
    print()
    print(format_table(eta_summary(table)))
    return table


def _sliding_note(plan) -> str:
    if plan.sliding is None:
        return ""
    g = plan.sliding
    kept = f"the current {g.window}-token attention chunk" if g.chunked else f"the last {g.window} tokens"
    return (f" in the full-attention layers, shared with {g.groups} local-attention group(s) that keep {kept} of "
            f"each request")


def _model_steps(cfg) -> pd.DataFrame:
    """The decode and prefill steps of model= on hardware= (printed), as one table with a step column."""
    batch, kv_len = whole_number(cfg.decode.batch, "decode.batch"), whole_number(cfg.decode.kv_len, "decode.kv_len")
    tokens, cached = whole_number(cfg.prefill.tokens, "prefill.tokens"), whole_number(cfg.prefill.cached,
                                                                                     "prefill.cached", 0)
    model, hw, engine, par = typed_configs(cfg)
    plan, steps = model_steps(model, hw, engine, par, batch, kv_len, tokens, cached)
    print(f"{model.name} on {hw.name} ({hw.key}), tp={par.tp} pp={par.pp} ep={par.ep}, "
          f"weights {model.weight_dtype}, KV cache {model.kv_dtype}: {plan.weights / GiB:.1f} GiB of weights "
          f"per GPU, {plan.blocks} KV blocks ({plan.kv_tokens:,} tokens{_sliding_note(plan)})")
    for step in steps:
        tokens = step.batch.num_tokens
        print(f"\n{step.title}: roofline {step.total_us / 1e3:.3f} ms per step, "
              f"{tokens / step.total_us * 1e6:,.0f} tokens/s (kernels only: no launch or host overhead, eta = 1)")
        print(format_table(step.table))
    return pd.concat([s.table.assign(step=s.title.split(":")[0]) for s in steps], ignore_index=True)
