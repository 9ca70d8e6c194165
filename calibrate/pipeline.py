"""A calibration run from plain settings: select the rows, evaluate both tiers, report, fit and publish.

calibrate: read sweeps, apply the row rules, evaluate both tiers and the
baselines, write the report. publish: the same for every GPU, then fit the
final models on all selected rows and write a bundle. The settings are
conf/calibrate.yaml (and conf/calibrate_publish.yaml) as plain values
(CalibrationSettings): `kernelsight calibrate` composes them from the command
line, validation starts from the shipped files (shipped_settings).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

import pandas as pd

from kernelsight.predictor.bundle import sha256_file
from kernelsight.predictor.errors import KernelsightError, check_seed, whole_number
from kernelsight.predictor.families import get_family
from kernelsight.predictor.hardware import resolve_device
from kernelsight.predictor.outputs import ensure_dir
from kernelsight.predictor.paths import conf_dir, read_yaml

from . import evaluate as ev
from . import rows as rw
from .bundle import data_label, publish
from .intervals import fit_intervals, residual_frame
from .models import ConstantEtaBaseline, EtaRegressor, check_learner, run_fits
from .report import write_report


def _as_list(value) -> list | None:
    if value is None or value == "all":
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


@dataclass(frozen=True)
class CalibrationSettings:
    """conf/calibrate.yaml (+ conf/calibrate_publish.yaml) as plain values: which data, the row rules, the
    learner, the evaluation, where the report and the bundle go."""

    rules: dict
    learner: dict
    evaluation: dict
    seed: int = 0
    jobs: int = 2
    paths: list | None = None          # sweep files or folders; None: the committed data
    devices: list | None = None        # None: every GPU
    families: list | None = None       # None: every family
    target: list | None = None         # GPUs `calibrate` evaluates; None: every GPU with data
    out: str = "calibration"           # report folder
    bundle: str = "bundle"             # bundle folder (publish)
    evaluate: bool = True              # publish: evaluate before fitting the final models
    created: str | None = None         # publish: the manifest's creation time (pinned: reproducible bundles)

    @classmethod
    def from_mapping(cls, cfg: dict) -> "CalibrationSettings":
        """From the composed config as plain dicts (keys as in conf/calibrate*.yaml)."""
        data, publishing = cfg.get("data") or {}, cfg.get("publish") or {}
        return cls(rules=dict(cfg["rules"]), learner=dict(cfg["learner"]), evaluation=dict(cfg["evaluation"]),
                   seed=cfg.get("seed", 0), jobs=cfg.get("jobs", 2), paths=_as_list(data.get("paths")),
                   devices=_as_list(data.get("devices")), families=_as_list(data.get("families")),
                   target=_as_list(cfg.get("target")), out=str(cfg.get("out", "calibration")),
                   bundle=str(cfg.get("bundle", "bundle")), evaluate=bool(publishing.get("evaluate", True)),
                   created=publishing.get("created"))


def shipped_settings() -> CalibrationSettings:
    """The shipped configuration of `calibrate publish` (conf/calibrate.yaml under calibrate_publish.yaml)."""
    merged: dict = {}
    for name in ("calibrate.yaml", "calibrate_publish.yaml"):
        _merge(merged, read_yaml(conf_dir() / name, name))
    return CalibrationSettings.from_mapping(merged)


def _merge(into: dict, other: dict) -> None:
    """Deep-merge `other` into `into` (nested sections key by key, as Hydra composes config files)."""
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def rule_settings(settings: CalibrationSettings) -> dict:
    """The row rules as rows.select's keyword arguments (absent lists and tables empty)."""
    rules = settings.rules
    return {"prefer_sources": list(rules["prefer_sources"] or ()), "providers": rules["providers"] or {},
            "exclude_sweeps": list(rules["exclude_sweeps"] or ()), "family_sources": rules["family_sources"] or {},
            "prefer_providers": rules["prefer_providers"] or {}}


def learner_settings(settings: CalibrationSettings) -> dict:
    """EtaRegressor's parameters from the learner section and the seed, each checked (models.check_learner:
    one line naming a bad setting). Tier lists stay lists, as a bundle manifest records them."""
    learner = {k: list(v) if isinstance(v, tuple) else v for k, v in check_learner(settings.learner).items()}
    return {**learner, "seed": check_seed(settings.seed)}


def check_evaluation(evaluation: dict) -> None:
    """The evaluation section's numbers and switch, checked before any data is read."""
    whole_number(evaluation.get("folds"), "evaluation.folds", 2, hint="grouped K-fold: 2 folds or more")
    whole_number(evaluation.get("block_rows"), "evaluation.block_rows", hint="rows per (device, family)")
    whole_number(evaluation.get("cross_rows_per_device"), "evaluation.cross_rows_per_device")
    if not isinstance(evaluation.get("plots"), bool):
        raise KernelsightError(f"evaluation.plots={evaluation.get('plots')!r}: must be true or false")


def _catalog_keys(names, setting: str) -> list[str]:
    """GPU names as catalog keys, a typo refused in one line naming the setting."""
    keys = []
    for name in names or ():
        try:
            keys.append(resolve_device(str(name)))
        except KernelsightError as e:
            raise KernelsightError(f"{setting}={name}: {e}") from None
    return keys


def check_gpus(settings: CalibrationSettings, files) -> tuple[list[str] | None, list[str] | None]:
    """(data.devices, target) as catalog keys (None: every GPU), each a GPU the files hold rows of (a target
    also one data.devices keeps), read from their device column alone: a typo or a GPU without data fails
    before the data loads."""
    devices, targets = _catalog_keys(settings.devices, "data.devices"), _catalog_keys(settings.target, "target")
    present = rw.devices_in(files) if devices or targets else []
    for setting, names in (("data.devices", devices), ("target", targets)):
        missing = [d for d in names if d not in present]
        if missing:
            raise KernelsightError(f"{setting}={missing[0]}: no calibration rows for this GPU; GPUs with data: "
                                   f"{', '.join(present)}")
        present = [d for d in present if not devices or d in devices]
    return devices or None, targets or None


class Calibration:
    """The selected data of one run: rows, blocks, counts and timings. progress: a tqdm-like factory for bars
    over the model fits (calibrate.models.run_fits), or None."""

    def __init__(self, settings: CalibrationSettings, progress=None):
        self.settings = settings
        self.progress = progress
        self.learner = learner_settings(settings)  # a bad setting fails before the data is read
        self.jobs = whole_number(settings.jobs, "jobs", hint="models fitted at once")
        check_evaluation(settings.evaluation)
        if settings.evaluate:  # the report's folder: a path under a file fails now, not after the fits
            ensure_dir(Path(settings.out), "out", create=False)
        self.timings: dict[str, float] = {}
        t = time.perf_counter()
        self.files = rw.input_files(settings.paths)
        devices, self.targets = check_gpus(settings, self.files)
        families = [get_family(f).name for f in settings.families or ()]
        raw = rw.load_rows(self.files)
        if devices:
            raw = raw[raw["device"].isin(devices)]
        if families:
            raw = raw[raw["family"].isin(families)]
        if raw.empty:
            raise KernelsightError("no rows left after the data.devices / data.families filters")
        self.tick("read", t)
        t = time.perf_counter()
        rules = rule_settings(settings)
        kept, self.counts, self.chosen = rw.select(raw, **rules)
        self.repeats = ev.repeat_measurements(raw, kept, rules["exclude_sweeps"])
        self.rows = rw.with_eta(kept)
        self.other_rows = rw.with_eta(ev.other_source_rows(raw, kept, rules["exclude_sweeps"]))
        self.others = pd.DataFrame()
        lt1 = self.rows.assign(lt1=self.rows["eta"] < 1.0).groupby(["device", "family"], sort=True)["lt1"]
        self.eta_lt_1 = lt1.agg(rows="size", eta_lt_1="sum").reset_index()
        self.eta_lt_1 = self.eta_lt_1[self.eta_lt_1["eta_lt_1"] > 0].reset_index(drop=True)
        sweeps = {(r.device, r.family): r.sweeps for r in self.chosen.itertuples()}
        self.blocks = ev.build_blocks(self.rows, int(settings.evaluation["block_rows"]), int(settings.seed), sweeps)
        self.fitted: dict = {}  # whole-block target models, each fitted once (evaluate.target_models)
        self.tick("select + features", t)

    def tick(self, step: str, start: float) -> None:
        self.timings[step] = round(time.perf_counter() - start, 1)

    def evaluate(self, targets) -> pd.DataFrame:
        ecfg, seed = self.settings.evaluation, int(self.settings.seed)
        holdouts = ecfg.get("holdouts") or {}
        t = time.perf_counter()
        target = ev.evaluate_target(self.blocks, self.learner, int(ecfg["folds"]), seed, targets, self.jobs,
                                    self.progress)
        self.tick("evaluate target tier", t)
        t = time.perf_counter()
        cross = ev.evaluate_cross(self.blocks, self.learner, int(ecfg["cross_rows_per_device"]), seed, holdouts,
                                  targets, self.jobs, self.fitted, self.progress)
        self.tick("evaluate cross tier", t)
        t = time.perf_counter()
        self.others = ev.evaluate_other_sources(self.blocks, self.other_rows, self.learner,
                                                int(ecfg["block_rows"]), seed, targets, self.jobs, self.fitted,
                                                self.progress)
        self.tick("evaluate other sources", t)
        return pd.concat([target, cross], ignore_index=True)

    def report(self, scored: pd.DataFrame) -> dict:
        """Write the report (REPORT.md, evaluation.json, plots) to settings.out; returns its summary."""
        s = self.settings
        t = time.perf_counter()
        settings = {"learner": self.learner, "evaluation": s.evaluation, "rules": s.rules, "seed": int(s.seed),
                    "inputs": [data_label(f) for f in self.files]}
        summary = write_report(s.out, scored, self.counts, self.chosen, self.eta_lt_1, settings, self.timings,
                               bool(s.evaluation["plots"]), int(s.seed), self.repeats, self.others)
        self.tick("report", t)
        return summary

    def final_models(self) -> list[EtaRegressor]:
        """Target models per (device, family) and cross models per family on all selected rows."""
        cap, seed = int(self.settings.evaluation["cross_rows_per_device"]), int(self.settings.seed)
        tasks = []
        for family in sorted({f for _, f in self.blocks}):
            x, eta, devices = ev.cross_training_set(self.blocks, family, (), cap, seed)
            rows = pd.Series(devices).value_counts().sort_index()
            tasks.append(partial(EtaRegressor(family, "cross", None, **self.learner).fit, x, eta,
                                 {"devices": {d: int(n) for d, n in rows.items()},
                                  "sweeps": sorted({self.blocks[(d, family)].sweeps for d in rows.index})}))
        target = ev.target_models(self.blocks, sorted(self.blocks), self.learner, self.jobs, self.fitted,
                                  self.progress)
        return [*target.values(), *run_fits(tasks, self.jobs, self.progress, "cross models")]

    def constant_eta(self) -> dict:
        """The constant-η baseline per family and GPU (the median of its rows), for `predict` error tables."""
        return ConstantEtaBaseline().fit(self.rows["device"], self.rows["family"], self.rows["eta"]).table()


def evaluate_targets(settings: CalibrationSettings, progress=None) -> tuple[Calibration, dict]:
    """`calibrate`: evaluate both tiers on settings.target (every GPU when None) and write the report;
    returns the run (with its timings) and the report's summary. progress: see Calibration."""
    run = Calibration(settings, progress)
    targets = run.targets
    if targets:  # the rules may have removed every row of a GPU
        known = sorted(run.rows["device"].unique())
        missing = [d for d in targets if d not in known]
        if missing:
            raise KernelsightError(f"target={missing[0]}: no calibration rows for this GPU left by the row rules; "
                                   f"GPUs with rows: {', '.join(known)}")
    scored = run.evaluate(targets)
    return run, run.report(scored)


def build_settings(settings: CalibrationSettings) -> dict:
    """What a bundle was fitted with beyond its data (the manifest's rules and learner): a cached bundle
    whose manifest differs from the current configuration is stale."""
    ecfg = settings.evaluation
    return {"rules": {**rule_settings(settings), "eta_floor": float(settings.learner["eta_floor"]),
                      "block_rows": int(ecfg["block_rows"]),
                      "cross_rows_per_device": int(ecfg["cross_rows_per_device"])},
            "learner": learner_settings(settings)}


@dataclass
class Published:
    """A written bundle, its models and the evaluation summary (empty when publishing skipped evaluation)."""

    bundle: object
    models: list
    summary: dict


def check_publish(settings: CalibrationSettings) -> None:
    """Where the bundle goes (a folder, not a file) and its pinned creation time (ISO 8601), checked before
    any data is read: a bad value fails at once, not after the fits."""
    bundle = Path(settings.bundle)
    ensure_dir(bundle.parent, "bundle", shown=bundle, create=False)
    if bundle.exists() and not bundle.is_dir():
        raise KernelsightError(f"bundle={bundle}: is a file, not a directory")
    if settings.created is not None:
        try:
            datetime.fromisoformat(str(settings.created).replace("Z", "+00:00"))
        except ValueError:
            raise KernelsightError(f"publish.created={settings.created!r}: not an ISO 8601 time, e.g. "
                                   f"2026-01-01T00:00:00Z (null: now)") from None


def publish_bundle(settings: CalibrationSettings, progress=None) -> Published:
    """`calibrate publish`: evaluate every GPU (unless settings.evaluate is false), fit the final models on
    every selected row and write the bundle to settings.bundle. progress: see Calibration."""
    check_publish(settings)
    run = Calibration(settings, progress)
    scored = run.evaluate(None) if settings.evaluate else None
    summary = run.report(scored) if settings.evaluate else {}
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
             "intervals": fit_intervals(residual_frame(scored)) if scored is not None else {},
             "baselines": {"constant_eta": run.constant_eta()}, **build_settings(settings)}
    bundle = publish(settings.bundle, models, training, created=settings.created, extra=extra)
    return Published(bundle, models, summary)
