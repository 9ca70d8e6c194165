"""`kernelsight calibrate`, `kernelsight calibrate publish` and `kernelsight calibrate energy`.

calibrate: evaluate both η tiers and the baselines, write the report to out=.
publish: evaluate every GPU (unless publish.evaluate=false), fit the final
models and write a bundle to bundle=. Configs: conf/calibrate.yaml and
conf/calibrate_publish.yaml; the work is calibrate/pipeline.py.
energy: fit and evaluate the kernel power model, write its report to out= and
the artifact to artifact= (conf/calibrate_energy.yaml; calibrate/energy.py).
"""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from kernelsight.calibrate import evaluate as ev
from kernelsight.calibrate.pipeline import CalibrationSettings, evaluate_targets, publish_bundle

from .config import container
from .progress import progress_bars


def settings(cfg) -> CalibrationSettings:
    """The composed config as calibration settings."""
    return CalibrationSettings.from_mapping(container(cfg))


def calibrate(cfg) -> None:
    """Fit and evaluate both tiers on the configured GPUs; write the report to cfg.out."""
    run, summary = evaluate_targets(settings(cfg), progress_bars(cfg))
    print_headline(summary)
    print(f"report: {Path(cfg.out) / 'REPORT.md'}  ({sum(run.timings.values()):.0f} s)")


def calibrate_publish(cfg) -> None:
    """Evaluate every GPU (unless publish.evaluate=false), fit the final models, write the bundle to cfg.bundle."""
    publish(settings(cfg), progress_bars(cfg))


def publish(s: CalibrationSettings, progress=None):
    """Publish a bundle and print its headline and where it went; returns calibrate.pipeline.Published.
    progress: bars over the fits (cli/progress.py), or None."""
    start = time.perf_counter()
    done = publish_bundle(s, progress)
    if s.evaluate:
        print_headline(done.summary)
    print(f"bundle: {done.bundle.path} ({len(done.models)} models, content {done.bundle.manifest['content_id'][:12]}, "
          f"{time.perf_counter() - start:.0f} s)")
    return done


def print_headline(summary: dict) -> None:
    head = pd.DataFrame(summary["headline_mape"])
    if head.empty:
        print("no evaluation (no family had enough data)")
        return
    cols = [c for c in ("tier", "family", "lightgbm", "constant", "roofline", *ev.DIAGNOSTICS) if c in head.columns]
    print("MAPE % (target: grouped K-fold; cross: leave-one-device-out)")
    print(head[cols].round(1).to_string(index=False, na_rep="-"))  # -: a diagnostic the tier does not have


def calibrate_energy(cfg) -> None:
    """Fit and evaluate the power model; print the held-out figures and where the report and artifact went."""
    from kernelsight.calibrate.energy import EnergySettings, calibrate_energy as run_energy

    start = time.perf_counter()
    done = run_energy(EnergySettings.from_mapping(container(cfg)))
    cols = {"family": "family", "rows": "rows", "model_loop": "model", "constant_loop": "constant x t",
            "tdp_loop": "TDP x t"}
    print("energy MAPE % (grouped K-fold on the fit GPU; time = the energy loop's own)")
    print(done.cv[list(cols)].rename(columns=cols).round(1).to_string(index=False))
    for label, part in done.transfer.groupby("held_out", sort=True) if len(done.transfer) else ():
        print(f"energy MAPE % on {label}, held out (fitted without it)")
        print(part[list(cols)].rename(columns=cols).round(1).to_string(index=False))
    print(f"report: {done.report}  artifact: {done.artifact}  ({time.perf_counter() - start:.0f} s)")
