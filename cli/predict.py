"""`kernelsight predict`: predicted latency of one kernel shape, or of every row of a sweep file (with errors).

Config: conf/predict.yaml. The predictions come from calibrate/predictions.py. A one-kernel answer should
come back at once, so this module imports nothing the command does not use: not the simulator's config
helpers (cli.config imports sim/), whose container() is one OmegaConf call here.
"""
from __future__ import annotations

import sys

from omegaconf import OmegaConf

from kernelsight.calibrate.predictions import error_table, predict_kernel, predict_sweep
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import Hardware
from kernelsight.predictor.outputs import TABLE_FORMATS, file_path, write_table


def container(node) -> dict:
    """A config section as plain dicts and lists, interpolations resolved."""
    return OmegaConf.to_container(node, resolve=True)


def predict(cfg) -> None:
    """Price one kernel (kernel.family=... and its fields) or every row of a sweep file (sweep_file=FILE)."""
    bundle = cfg.get("bundle")
    tier = str(cfg.tier)
    if cfg.get("sweep_file"):
        if cfg.kernel.family:
            raise KernelsightError("choose one mode: sweep_file= or kernel.family=..., not both")
        return _predict_sweep(cfg, tier, bundle)
    hw = Hardware.from_mapping(container(cfg.hardware), "hardware config").on_network(cfg.net_gbs_per_gpu)
    row, p = predict_kernel(hw, container(cfg.kernel), tier, bundle)
    shape = ", ".join(f"{c}={row[c]}" for c in row.index[1:])
    print(f"{row['family']}({shape}) on {hw.key}")
    print(f"  roofline  {p['t_roof'] * 1e6:.3f} us ({p['bound']}-bound)")
    print(f"  eta       {p['eta']:.4f}  [tier {p['tier']}, model {p['model']}"
          f"{', outside the training range: clamped' if p['extrapolated'] else ''}]")
    print(f"  predicted {p['latency_us']:.3f} us")


def _predict_sweep(cfg, tier: str, bundle) -> None:
    if cfg.get("out"):
        file_path(cfg.out, "out", TABLE_FORMATS)  # a bad out= is refused before the predictions are made
    out = predict_sweep(cfg.sweep_file, tier, bundle, cfg.net_gbs_per_gpu)
    measured = "latency_ms" in out.columns
    if measured:
        print(error_table(out).round(1).to_string(index=False))
    if cfg.get("out"):
        print(f"wrote {len(out)} predictions to {write_table(out, cfg.out)}")
    elif not measured:
        out.to_csv(sys.stdout, index=False)
