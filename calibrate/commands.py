"""`kernelsight calibrate`, `kernelsight calibrate publish` and `kernelsight predict`.

calibrate: read sweeps, apply the row rules, evaluate both tiers and the
baselines, write the report. publish: the same for every GPU, then fit the
final models on all selected rows and write a bundle. predict: one kernel
shape, or every row of a sweep file (with per-row errors where it holds
measurements).
"""
from __future__ import annotations

import inspect
import sys
import time
from functools import partial
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from kernelsight.predictor.bundle import load_bundle, sha256_file, shared_bundle
from kernelsight.predictor.errors import KernelsightError, whole_number
from kernelsight.predictor.families import SHAPE_COLUMNS, get_family, make_shape
from kernelsight.predictor.features import TIERS
from kernelsight.predictor.hardware import resolve_device

from . import evaluate as ev
from . import rows as rw
from .bundle import data_label, publish
from .models import ConstantEtaBaseline, EtaRegressor, run_fits
from .report import write_report


def _as_list(value) -> list | None:
    if value is None or value == "all":
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


def rule_settings(cfg: DictConfig) -> dict:
    """cfg.rules as rows.select's keyword arguments (absent lists and tables empty)."""
    rules = OmegaConf.to_container(cfg.rules)
    return {"prefer_sources": list(rules["prefer_sources"] or ()), "providers": rules["providers"] or {},
            "exclude_sweeps": list(rules["exclude_sweeps"] or ()), "family_sources": rules["family_sources"] or {},
            "prefer_providers": rules["prefer_providers"] or {}}


def learner_settings(cfg: DictConfig) -> dict:
    """EtaRegressor's parameters from cfg.learner and cfg.seed, checked (one line naming a bad key)."""
    learner = {**OmegaConf.to_container(cfg.learner), "seed": int(cfg.seed)}
    known = set(inspect.signature(EtaRegressor).parameters) - {"family", "tier", "device"}
    for key in learner:
        if key not in known:
            raise KernelsightError(f"learner.{key}: unknown setting; known: {', '.join(sorted(known))}")
    for key in ("linear_tiers", "gap_tiers"):
        bad = [t for t in learner.get(key) or () if t not in TIERS]
        if bad:
            raise KernelsightError(f"learner.{key}: {bad[0]!r} is not a tier ({', '.join(TIERS)})")
    return learner


class Calibration:
    """The selected data of one run: rows, blocks, counts and timings."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.learner = learner_settings(cfg)  # a bad setting fails before the data is read
        self.jobs = whole_number(cfg.jobs, "jobs", hint="models fitted at once")
        self.timings: dict[str, float] = {}
        t = time.perf_counter()
        self.files = rw.input_files(_as_list(cfg.data.paths))
        raw = rw.load_rows(self.files)
        devices, families = _as_list(cfg.data.devices), _as_list(cfg.data.families)
        if devices:
            raw = raw[raw["device"].isin(devices)]
        if families:
            for f in families:
                get_family(f)
            raw = raw[raw["family"].isin(families)]
        if raw.empty:
            raise KernelsightError("no rows left after the data.devices / data.families filters")
        self.tick("read", t)
        t = time.perf_counter()
        rules = rule_settings(cfg)
        kept, self.counts, self.chosen = rw.select(raw, **rules)
        self.repeats = ev.repeat_measurements(raw, kept, rules["exclude_sweeps"])
        self.rows = rw.with_eta(kept)
        self.other_rows = rw.with_eta(ev.other_source_rows(raw, kept, rules["exclude_sweeps"]))
        self.others = pd.DataFrame()
        lt1 = self.rows.assign(lt1=self.rows["eta"] < 1.0).groupby(["device", "family"], sort=True)["lt1"]
        self.eta_lt_1 = lt1.agg(rows="size", eta_lt_1="sum").reset_index()
        self.eta_lt_1 = self.eta_lt_1[self.eta_lt_1["eta_lt_1"] > 0].reset_index(drop=True)
        sweeps = {(r.device, r.family): r.sweeps for r in self.chosen.itertuples()}
        self.blocks = ev.build_blocks(self.rows, int(cfg.evaluation.block_rows), int(cfg.seed), sweeps)
        self.fitted: dict = {}  # whole-block target models, each fitted once (evaluate.target_models)
        self.tick("select + features", t)

    def tick(self, step: str, start: float) -> None:
        self.timings[step] = round(time.perf_counter() - start, 1)

    def evaluate(self, targets) -> pd.DataFrame:
        ecfg = self.cfg.evaluation
        holdouts = OmegaConf.to_container(ecfg.holdouts) or {}
        t = time.perf_counter()
        target = ev.evaluate_target(self.blocks, self.learner, int(ecfg.folds), int(self.cfg.seed), targets,
                                    self.jobs)
        self.tick("evaluate target tier", t)
        t = time.perf_counter()
        cross = ev.evaluate_cross(self.blocks, self.learner, int(ecfg.cross_rows_per_device), int(self.cfg.seed),
                                  holdouts, targets, self.jobs, self.fitted)
        self.tick("evaluate cross tier", t)
        t = time.perf_counter()
        self.others = ev.evaluate_other_sources(self.blocks, self.other_rows, self.learner, int(ecfg.block_rows),
                                                int(self.cfg.seed), targets, self.jobs, self.fitted)
        self.tick("evaluate other sources", t)
        return pd.concat([target, cross], ignore_index=True)

    def report(self, scored: pd.DataFrame) -> dict:
        t = time.perf_counter()
        settings = {"learner": self.learner, "evaluation": OmegaConf.to_container(self.cfg.evaluation),
                    "rules": OmegaConf.to_container(self.cfg.rules), "seed": int(self.cfg.seed),
                    "inputs": [data_label(f) for f in self.files]}
        summary = write_report(self.cfg.out, scored, self.counts, self.chosen, self.eta_lt_1, settings,
                               self.timings, bool(self.cfg.evaluation.plots), int(self.cfg.seed), self.repeats,
                               self.others)
        self.tick("report", t)
        return summary

    def final_models(self) -> list[EtaRegressor]:
        """Target models per (device, family) and cross models per family on all selected rows."""
        cap, seed = int(self.cfg.evaluation.cross_rows_per_device), int(self.cfg.seed)
        tasks = []
        for family in sorted({f for _, f in self.blocks}):
            x, eta, devices = ev.cross_training_set(self.blocks, family, (), cap, seed)
            rows = pd.Series(devices).value_counts().sort_index()
            tasks.append(partial(EtaRegressor(family, "cross", None, **self.learner).fit, x, eta,
                                 {"devices": {d: int(n) for d, n in rows.items()},
                                  "sweeps": sorted({self.blocks[(d, family)].sweeps for d in rows.index})}))
        target = ev.target_models(self.blocks, sorted(self.blocks), self.learner, self.jobs, self.fitted)
        return [*target.values(), *run_fits(tasks, self.jobs)]

    def constant_eta(self) -> dict:
        """The constant-η baseline per family and GPU (the median of its rows), for `predict` error tables."""
        return ConstantEtaBaseline().fit(self.rows["device"], self.rows["family"], self.rows["eta"]).table()


def _print_headline(summary: dict) -> None:
    head = pd.DataFrame(summary["headline_mape"])
    if head.empty:
        print("no evaluation (no family had enough data)")
        return
    cols = [c for c in ("tier", "family", "lightgbm", "constant", "roofline", *ev.DIAGNOSTICS) if c in head.columns]
    print("MAPE % (target: grouped K-fold; cross: leave-one-device-out)")
    print(head[cols].round(1).to_string(index=False, na_rep="-"))  # -: a diagnostic the tier does not have


def calibrate(cfg: DictConfig) -> None:
    """Fit and evaluate both tiers on the configured GPUs; write the report to cfg.out."""
    run = Calibration(cfg)
    targets = _as_list(cfg.target)
    if targets:
        targets = [resolve_device(str(t)) for t in targets]
        known = sorted(run.rows["device"].unique())
        missing = [d for d in targets if d not in known]
        if missing:
            raise KernelsightError(f"target={missing[0]}: no calibration rows for this GPU; GPUs with data: "
                                   f"{', '.join(known)}")
    scored = run.evaluate(targets)
    summary = run.report(scored)
    _print_headline(summary)
    print(f"report: {Path(cfg.out) / 'REPORT.md'}  ({sum(run.timings.values()):.0f} s)")


def build_settings(cfg: DictConfig) -> dict:
    """What a bundle was fitted with beyond its data (the manifest's rules and learner): a cached bundle
    whose manifest differs from the current configuration is stale."""
    return {"rules": {**rule_settings(cfg), "eta_floor": float(cfg.learner.eta_floor),
                      "block_rows": int(cfg.evaluation.block_rows),
                      "cross_rows_per_device": int(cfg.evaluation.cross_rows_per_device)},
            "learner": learner_settings(cfg)}


def calibrate_publish(cfg: DictConfig) -> None:
    """Evaluate every GPU (unless publish.evaluate=false), fit the final models, write the bundle to cfg.bundle."""
    start = time.perf_counter()
    run = Calibration(cfg)
    summary = {}
    if cfg.publish.evaluate:
        summary = run.report(run.evaluate(None))
        _print_headline(summary)
    t = time.perf_counter()
    models = run.final_models()
    run.tick("fit final models", t)
    training = []
    used = run.rows.groupby("file", sort=True)
    for f in run.files:
        part = used.get_group(str(f)) if str(f) in used.groups else run.rows.iloc[:0]
        training.append({"file": data_label(f), "sha256": sha256_file(f), "rows_used": int(len(part)),
                         "sweeps": sorted(part["sweep_id"].unique().tolist())})
    devices: dict = {}
    for r in run.chosen.itertuples():
        if (r.device, r.family) in run.blocks:
            devices.setdefault(r.device, {})[r.family] = {"sweeps": r.sweeps, "providers": r.providers}
    families = {fam: {"target": sorted(d for d, f in run.blocks if f == fam),
                      "cross": sorted(d for d, f in run.blocks if f == fam)}
                for fam in sorted({f for _, f in run.blocks})}
    extra = {"devices": devices, "families": families, "metrics": summary,
             "baselines": {"constant_eta": run.constant_eta()}, **build_settings(cfg)}
    bundle = publish(cfg.bundle, models, training, created=cfg.publish.created, extra=extra)
    print(f"bundle: {bundle.path} ({len(models)} models, content {bundle.manifest['content_id'][:12]}, "
          f"{time.perf_counter() - start:.0f} s)")


# -- predict ---------------------------------------------------------------------------------

def _kernel_frame(kernel: dict) -> pd.DataFrame:
    family = kernel.get("family")
    if not family:
        raise KernelsightError("give kernel.family=<family> and its shape fields, or sweep_file=FILE")
    fam = get_family(family)
    given = {k: v for k, v in kernel.items() if k != "family" and v is not None}
    shape = make_shape(family, **given)
    return pd.DataFrame([shape.row()], columns=["family", *fam.columns])


def predict(cfg: DictConfig) -> None:
    """Price one kernel (kernel.family=... and its fields) or every row of a sweep file (sweep_file=FILE)."""
    from kernelsight.predictor.hardware import Hardware
    from kernelsight.predictor.predict import Predictor

    bundle = cfg.get("bundle")
    tier = str(cfg.tier)
    if cfg.get("sweep_file"):
        return _predict_sweep(cfg, tier, bundle)
    hw = Hardware.from_mapping(OmegaConf.to_container(cfg.hardware), "hardware config").on_network(
        cfg.net_gbs_per_gpu)
    df = _kernel_frame(OmegaConf.to_container(cfg.kernel))
    pred = Predictor(hw, tier=tier, bundle=bundle).predict_frame(df)
    row, p = df.iloc[0], pred.iloc[0]
    shape = ", ".join(f"{c}={row[c]}" for c in df.columns[1:])
    print(f"{row['family']}({shape}) on {hw.key}")
    print(f"  roofline  {p['t_roof'] * 1e6:.3f} us ({p['bound']}-bound)")
    print(f"  eta       {p['eta']:.4f}  [tier {p['tier']}, model {p['model']}"
          f"{', outside the training range: clamped' if p['extrapolated'] else ''}]")
    print(f"  predicted {p['predicted_ms'] * 1e3:.3f} us")


def _predict_sweep(cfg: DictConfig, tier: str, bundle) -> None:
    from kernelsight.predictor.hardware import load_hardware
    from kernelsight.predictor.predict import Predictor
    from kernelsight.predictor.sweep import read_sweep

    df = read_sweep(cfg.sweep_file)
    loaded = load_bundle(bundle) if bundle else shared_bundle()
    usable = df[df["status"] == "ok"] if "status" in df.columns else df
    parts = []
    for device, part in usable.groupby("device", sort=True):
        hw = load_hardware(device).on_network(cfg.net_gbs_per_gpu)
        pred = Predictor(hw, tier=tier, bundle=loaded).predict_frame(part)
        parts.append(pred.assign(device=device))
    pred = pd.concat(parts).loc[usable.index]
    shape_cols = [c for c in SHAPE_COLUMNS if c in usable.columns]
    out = usable[["device", "family", "provider", *shape_cols]].copy()
    out["t_roof_ms"] = pred["t_roof"].astype(float) * 1e3
    out[["eta", "predicted_ms", "tier", "model", "extrapolated"]] = pred[["eta", "predicted_ms", "tier", "model",
                                                                          "extrapolated"]]
    measured = pd.to_numeric(usable["latency_ms"], errors="coerce")
    if measured.notna().any():
        const = ConstantEtaBaseline.from_table(loaded.manifest.get("baselines", {}).get("constant_eta", {}))
        out["latency_ms"] = measured
        out["ape_pct"] = (out["predicted_ms"] - measured).abs() / measured * 100
        out["constant_ms"] = out["t_roof_ms"] * const.predict(out["device"], out["family"])
        _print_errors(out)
    if cfg.get("out"):
        path = Path(cfg.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".csv":
            out.to_csv(path, index=False)
        else:
            out.to_parquet(path, index=False)
        print(f"wrote {len(out)} predictions to {path}")
    elif not measured.notna().any():
        out.to_csv(sys.stdout, index=False)


def _print_errors(out: pd.DataFrame) -> None:
    """Errors per family, GPU and provider: a sweep may time several implementations of one kernel
    (CUTLASS and DeepGEMM fp8, FA2 and FA3), while an η model describes the one calibration chose."""
    rows = []
    for (family, device, provider), g in out.groupby(["family", "device", "provider"], sort=True):
        m = g["latency_ms"]
        ape = g["ape_pct"]
        rows.append({"family": family, "device": device, "provider": provider,
                     "tier": ",".join(sorted(g["tier"].unique())),
                     "rows": len(g), "MAPE": ape.mean(), "median APE": ape.median(),
                     "p90 APE": ape.quantile(0.9),
                     "MAPE const": ((g["constant_ms"] - m).abs() / m * 100).mean(),
                     "MAPE roofline": ((g["t_roof_ms"] - m).abs() / m * 100).mean(),
                     "extrapolated": int(g["extrapolated"].sum())})
    table = pd.DataFrame(rows)
    print(table.round(1).to_string(index=False))
