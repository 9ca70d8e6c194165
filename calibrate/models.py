"""η estimators with sklearn habits: parameters in the constructor, fit(), predict() -> η.

EtaRegressor is the learner (LightGBM on log η, or on log of the time above the
roofline for the tiers in gap_tiers; deterministic); its predict()
goes through the predictor's EtaModel built from the model text it would
publish, so what is evaluated is byte for byte what ships. The baselines are
what every model is reported beside: plain roofline (η = 1) and one constant
η per (device, family).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pandas as pd

from kernelsight.predictor.bundle import ETA_TARGET, GAP_TARGET, T_ROOF_FEATURE, EtaModel
from kernelsight.predictor.errors import KernelsightError, check_seed, did_you_mean, whole_number
from kernelsight.predictor.families import get_family
from kernelsight.predictor.features import TIERS, features

from .bundle import slim_model_text

# Deterministic LightGBM settings: fixed seeds and threads, row-wise histograms.
DETERMINISTIC = {"deterministic": True, "force_row_wise": True, "seed": 0, "bagging_seed": 0,
                 "feature_fraction_seed": 0, "data_random_seed": 0, "verbosity": -1}


# Per-node training statistics LightGBM writes but never reads to predict, and the tree
# offsets index (LightGBM parses trees sequentially without it): dropped to keep bundles small.
TRAINING_ONLY = ("split_gain", "leaf_weight", "leaf_count", "internal_value", "internal_weight",
                 "internal_count", "tree_sizes")
# A gap model's rows at or below the roofline (η < 1 + MIN_GAP) learn a gap of MIN_GAP roofline times: the
# log needs a positive gap, and predictions stay at or above the roofline.
MIN_GAP = 0.02
T = TypeVar("T")


def compact_model_text(text: str) -> str:
    """LightGBM model text without training-only statistics and feature importances; its values are rounded
    once, to the published steps, by calibrate.bundle.slim_model_text."""
    head, sep, tail = text.partition("\nfeature_importances:\n")
    if sep:
        tail = tail[tail.index("\nparameters:\n"):]
    kept = []
    for line in head.split("\n"):
        key = line.split("=", 1)[0]
        if key in TRAINING_ONLY:
            continue
        kept.append(line)
    return "\n".join(kept) + tail


# LightGBM regression objectives that take any real label (log η and log gap are negative too).
OBJECTIVES = ("regression", "regression_l1", "huber", "fair", "quantile", "mape")


def check_learner(settings: Mapping | None = None, where: str = "learner", **more) -> dict:
    """EtaRegressor's learner settings checked before any data is read or any fit starts: each a value of
    the right type and range (a bool is not a count), or one line naming `where.<setting>`. Unknown names
    are refused too. Returns the checked settings (numbers as int / float, tier lists as tuples)."""
    values = {**(settings or {}), **more}
    out = {}
    for name, value in values.items():
        setting = f"{where}.{name}"
        if name not in _LEARNER_RULES:
            raise KernelsightError(f"{setting}: unknown setting{did_you_mean(name, _LEARNER_RULES)}; "
                                   f"known: {', '.join(sorted(_LEARNER_RULES))}")
        out[name] = _LEARNER_RULES[name](value, setting)
    return out


def _count(minimum: int):
    return lambda value, setting: whole_number(value, setting, minimum)


def _real(low: float, low_open: bool, high: float = math.inf):
    def rule(value, setting):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or \
                value < low or (low_open and value == low) or value > high:
            bound = f"> {low:g}" if low_open else f">= {low:g}"
            raise KernelsightError(f"{setting}={value!r}: must be a finite number {bound}"
                                   f"{f' and <= {high:g}' if high < math.inf else ''}")
        return float(value)
    return rule


def _tiers(value, setting):
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise KernelsightError(f"{setting}={value!r}: must be a list of tiers ({', '.join(TIERS)}), e.g. [target]")
    for tier in value:
        if tier not in TIERS:
            raise KernelsightError(f"{setting}: {tier!r} is not a tier ({', '.join(TIERS)})")
    return tuple(value)


def _objective(value, setting):
    if value not in OBJECTIVES:
        raise KernelsightError(f"{setting}={value!r}: must be one of {', '.join(OBJECTIVES)}"
                               f"{did_you_mean(str(value), OBJECTIVES)}")
    return value


_LEARNER_RULES = {
    "num_trees": _count(1), "learning_rate": _real(0.0, True), "num_leaves": _count(2),
    "min_data_in_leaf": _count(0), "linear_tiers": _tiers, "linear_lambda": _real(0.0, False),
    "gap_tiers": _tiers, "objective": _objective, "num_threads": _count(1),
    "seed": lambda value, setting: check_seed(value, setting), "eta_floor": _real(0.0, True),
}


class EtaRegressor:
    """LightGBM regression of log η on the family's features of one tier.

    num_trees, learning_rate, num_leaves, min_data_in_leaf: the LightGBM
    knobs that matter here; linear_tiers: the tiers whose trees hold a linear
    model of the features in each leaf instead of a constant, so log η follows
    log size between grid points (a launch-bound kernel's η falls as 1 / size;
    a constant leaf prices every size between two measured ones like one of
    them); not the cross tier, where a leaf would extrapolate linearly in the
    hardware features of an unseen GPU; linear_lambda: its ridge penalty;
    num_threads is fixed (results depend on it); eta_floor: predictions never
    go below it (1: never faster than the roofline). Collectives (unit 'link') learn log η in every tier:
    their bounds span 2 GB/s (PCIe through the host bridge) to 900 GB/s (NVLink 5), so the time above the
    bound scales with it and a gap in microseconds learned on NVLink GPUs does not carry to a PCIe one
    (leave-one-GPU-out: calibration report).
    """

    def __init__(self, family: str, tier: str, device: str | None = None, num_trees: int = 100,
                 learning_rate: float = 0.2, num_leaves: int = 31, min_data_in_leaf: int = 20,
                 linear_tiers: tuple = (), linear_lambda: float = 0.0, gap_tiers: tuple = (),
                 objective: str = "regression", num_threads: int = 1, seed: int = 0, eta_floor: float = 1.0):
        check_learner(num_trees=num_trees, learning_rate=learning_rate, num_leaves=num_leaves,
                      min_data_in_leaf=min_data_in_leaf, linear_tiers=linear_tiers, linear_lambda=linear_lambda,
                      gap_tiers=gap_tiers, objective=objective, num_threads=num_threads, seed=seed,
                      eta_floor=eta_floor)
        if tier not in TIERS:
            raise KernelsightError(f"tier={tier!r}: must be one of {', '.join(TIERS)}")
        self.family, self.tier, self.device = family, tier, device
        self.num_trees, self.learning_rate, self.num_leaves = num_trees, learning_rate, num_leaves
        self.min_data_in_leaf, self.objective = min_data_in_leaf, objective
        self.linear_tiers, self.linear_lambda = tuple(linear_tiers), float(linear_lambda)
        self.gap_tiers = tuple(gap_tiers)
        self.num_threads, self.seed, self.eta_floor = num_threads, seed, eta_floor
        self._link = get_family(family).unit == "link"

    def _lgb_params(self) -> dict:
        return {**DETERMINISTIC, "objective": self.objective, "learning_rate": self.learning_rate,
                "num_leaves": self.num_leaves, "min_data_in_leaf": self.min_data_in_leaf,
                "linear_tree": self.tier in self.linear_tiers, "linear_lambda": self.linear_lambda,
                "num_threads": self.num_threads, "seed": self.seed}

    def fit(self, x: np.ndarray, eta: np.ndarray, provenance: dict | None = None) -> "EtaRegressor":
        """Fit log η; provenance (training devices, sweeps, rows) goes into the model card."""
        import lightgbm as lgb

        specs = features(self.family, self.tier)
        names = [f.name for f in specs]
        x = np.ascontiguousarray(x, dtype=np.float64)
        eta = np.asarray(eta, dtype=np.float64)
        if x.shape[1] != len(names):
            raise ValueError(f"{self.family}/{self.tier}: {x.shape[1]} feature columns, expected {len(names)}")
        if len(eta) == 0 or not np.all(eta > 0):
            raise ValueError(f"{self.family}/{self.tier}: need positive η values to fit")
        target = GAP_TARGET if self.tier in self.gap_tiers and not self._link else ETA_TARGET
        if target == GAP_TARGET:
            t_roof_us = np.exp2(x[:, names.index(T_ROOF_FEATURE)])
            label = np.log(np.maximum(eta - 1.0, MIN_GAP) * t_roof_us)
        else:
            label = np.log(eta)
        data = lgb.Dataset(x, label=label, feature_name=names, params={"verbosity": -1}, free_raw_data=True)
        booster = lgb.train(self._lgb_params(), data, num_boost_round=self.num_trees)
        self.model_text_ = compact_model_text(booster.model_to_string())
        self.card_ = {
            "tier": self.tier, "family": self.family, "device": self.device,
            "features": names,
            "ranges": {f.name: [float(np.nanmin(x[:, j])), float(np.nanmax(x[:, j]))]
                       for j, f in enumerate(specs) if not f.categorical and not np.isnan(x[:, j]).all()},
            "categories": {f.name: sorted({float(v) for v in x[:, j]}) for j, f in enumerate(specs)
                           if f.categorical},
            "nan": [n for j, n in enumerate(names) if np.isnan(x[:, j]).any()],
            "eta_floor": self.eta_floor,
            "eta_train": [float(eta.min()), float(np.median(eta)), float(eta.max())],
            "rows": int(len(eta)),
            "learner": {"library": "lightgbm", "target": target, **self._lgb_params(),
                        "num_trees": self.num_trees},
            **(provenance or {}),
        }
        for name in names:  # a feature that is NaN for every training row: no range to clamp to
            if name not in self.card_["ranges"] and name not in self.card_["categories"]:
                self.card_["ranges"][name] = [float("-inf"), float("inf")]
        self.model_text_ = slim_model_text(self.model_text_, self.card_)  # as published: evaluated = shipped
        self.model_ = EtaModel(self.model_text_, self.card_, f"{self.family}/{self.tier} (in memory)")
        return self

    def predict(self, x: np.ndarray, floor: bool = True) -> np.ndarray:
        """η per row (inputs clamped to the training range); floor=False shows what the floor costs."""
        eta, _ = self.model_.eta(np.ascontiguousarray(x, dtype=np.float64), floor=floor)
        return eta


def run_fits(tasks: Sequence[Callable[[], T]], jobs: int, progress=None, desc: str = "fits") -> list[T]:
    """Independent fits on up to `jobs` threads, results in task order. LightGBM releases the GIL while
    it trains and predicts, and each model trains on its own single thread (learner.num_threads), so the
    results, bundles included, do not depend on `jobs`. progress: a tqdm-like factory for a bar over the
    fits (as they finish, in order), or None."""
    jobs = min(jobs, len(tasks))

    def track(results):
        return progress(results, total=len(tasks), desc=desc, unit="fit") if progress and tasks else results

    if jobs <= 1:
        return list(track(task() for task in tasks))
    pool = ThreadPoolExecutor(jobs)
    try:
        return list(track(pool.map(lambda task: task(), tasks)))
    finally:  # an error or Ctrl-C drops the fits not started yet
        pool.shutdown(wait=True, cancel_futures=True)


class RooflineBaseline:
    """η = 1: the plain roofline."""

    def fit(self, devices, families, eta) -> "RooflineBaseline":
        return self

    def predict(self, devices, families) -> np.ndarray:
        return np.ones(len(devices))


class ConstantEtaBaseline:
    """One η per (device, family): the median of its training rows.

    A key never seen in training (cross-device: a held-out GPU) gets the median
    over the training devices' medians of that family.
    """

    def fit(self, devices, families, eta) -> "ConstantEtaBaseline":
        frame = {"device": np.asarray(devices, dtype=object), "family": np.asarray(families, dtype=object),
                 "eta": np.asarray(eta, dtype=np.float64)}
        per = pd.DataFrame(frame).groupby(["device", "family"], sort=True)["eta"].median()
        self.per_device_ = {k: float(v) for k, v in per.items()}
        self.per_family_ = {f: float(v) for f, v in per.groupby(level="family").median().items()}
        return self

    @classmethod
    def from_table(cls, table: Mapping) -> "ConstantEtaBaseline":
        """The fitted baseline from its published table {family: {device: η}} (a bundle's manifest)."""
        self = cls()
        self.per_device_ = {(d, f): float(v) for f, per in table.items() for d, v in per.items()}
        self.per_family_ = {f: float(np.median(list(per.values()))) for f, per in table.items() if per}
        return self

    def table(self) -> dict:
        """{family: {device: η}}, the form a bundle's manifest publishes."""
        out: dict = {}
        for (device, family), value in sorted(self.per_device_.items()):
            out.setdefault(family, {})[device] = round(value, 6)
        return out

    def predict(self, devices, families) -> np.ndarray:
        out = [self.per_device_.get((d, f), self.per_family_.get(f, 1.0)) for d, f in zip(devices, families)]
        return np.asarray(out, dtype=np.float64)
