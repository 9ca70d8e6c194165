"""`kernelsight predict`: predicted latency of one kernel shape, or of every row of a sweep file (with errors).

Config: conf/predict.yaml. A sweep's predictions come from calibrate/predictions.py. A one-kernel answer
should come back at once, so this module imports nothing that answer does not use: not pandas (the sweep
path imports it when it runs), not the simulator's config helpers (cli.config imports sim/), whose
container() is one OmegaConf call here.
"""
from __future__ import annotations

import sys

from omegaconf import OmegaConf

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import make_shape
from kernelsight.predictor.hardware import Hardware
from kernelsight.predictor.predict import Predictor


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
    shape = ", ".join(f"{c}={v}" for c, v in list(row.items())[1:])
    print(f"{row['family']}({shape}) on {hw.key}")
    print(f"  roofline  {p['t_roof'] * 1e6:.3f} us ({p['bound']}-bound)")
    print(f"  eta       {p['eta']:.4f}  [tier {p['tier']}, model {p['model']}"
          f"{', outside the training range: clamped' if p['extrapolated'] else ''}]")
    print(f"  predicted {p['seconds'] * 1e6:.3f} us")
    low, high = p.get("seconds_p10"), p.get("seconds_p90")
    if low is not None and high is not None and low == low and high == high:  # NaN: the bundle states none
        print(f"  80 % interval {low * 1e6:.3f}-{high * 1e6:.3f} us (p10-p90 of held-out errors, "
              f"{p.get('path', p['tier'])} path)")


def predict_kernel(hw: Hardware, kernel: dict, tier: str, bundle=None) -> tuple[dict, dict]:
    """(the shape row: family and shape fields, its prediction: t_roof, bound, eta, tier, model, extrapolated,
    seconds) of one kernel ({'family': ..., its shape fields; None = unset}), checked; priced through the
    predictor's columns path, so the answer needs no frame (nor pandas' import)."""
    family = kernel.get("family")
    if not family:
        given = [f"kernel.{k}={v}" for k, v in kernel.items() if k != "family" and v is not None]
        raise KernelsightError(f"{given[0] + ' without kernel.family: ' if given else ''}give "
                               f"kernel.family=<family> and its shape fields, or sweep_file=FILE")
    shape = make_shape(family, **{k: v for k, v in kernel.items() if k != "family" and v is not None})
    pred = Predictor(hw, tier=tier, bundle=bundle).predict(shape.as_columns(), family=family)
    return shape.row(), {k: v[0] for k, v in pred.items()}


def _predict_sweep(cfg, tier: str, bundle) -> None:
    from kernelsight.calibrate.predictions import error_table, predict_sweep
    from kernelsight.predictor.outputs import TABLE_FORMATS, file_path, write_table

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
