"""Kernel power and energy from the roofline: what a kernel draws while it runs, and what the idle GPU draws.

    P = TDP x min(1, static + compute x compute_share + memory x memory_share),   E = P x t

for a kernel of time t whose roofline terms are t_compute and t_memory: compute_share = t_compute / t
and memory_share = t_memory / t (each at most 1) say how busy its math units and its memory system are;
`static` is what the powered GPU draws doing nothing useful (clocks up, leakage), the two other
parameters what full use of each unit would add. All three are fractions of the GPU's TDP (catalog
`tdp_w`), so parameters fitted on one GPU price a GPU that was never measured: its TDP, peaks and
bandwidth move the shares and the scale, not the form. The two coefficients may exceed 1 (up to
MAX_COEF): a GPU cannot run its tensor cores at the dense peak within TDP (an H100 reaches its 700 W
cap, and throttles, well below it), so the min() is the power cap. One parameter set per kernel family
(families with too few shapes share one fit; `*` is the fit over every row, for families the data
never held); `idle` is the GPU between kernels (host gaps, idle waits, launch waiting), as a
fraction of TDP too.

The fit (PowerModel) and the artifact (EnergyModel, data/artifacts/energy.json, written by
`kernelsight calibrate energy`, calibrate/energy.py) live here, free of torch and scikit-learn, so
the simulator reads them on a laptop. The artifact is plain JSON carrying a hash of its own content:
a missing, edited, malformed or newer-schema file is refused in one line.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import numpy as np

from .bundle import canonical_json, check_header
from .errors import KernelsightError
from .paths import data_dir

FORMAT = "kernelsight.energy-model"
SCHEMA_VERSION = 1
POOLED = "*"                    # the fit over every family's rows: families the data never held
PARAMS = ("static", "compute", "memory")
MAX_COEF = 4.0  # compute and memory coefficients: what full use of a unit would ask for, the cap aside
REQUIRED_KEYS = ("format", "schema_version", "model", "fitted_on", "idle", "families", "content_sha256")
FORM = "P = TDP x min(1, static + compute x t_compute / t + memory x t_memory / t)"


def default_energy_path() -> Path:
    """The energy model shipped in the package: data/artifacts/energy.json."""
    return data_dir() / "artifacts" / "energy.json"


def utilisation(t_compute, t_memory, seconds) -> tuple[np.ndarray, np.ndarray]:
    """(compute share, memory share) of kernels of time `seconds`: their roofline terms over their time,
    in [0, 1] (a kernel measured faster than its roofline counts as fully busy; t <= 0 as idle)."""
    t = np.asarray(seconds, dtype=np.float64)
    safe = np.where(t > 0, t, 1.0)
    c = np.where(t > 0, np.asarray(t_compute, dtype=np.float64) / safe, 0.0)
    m = np.where(t > 0, np.asarray(t_memory, dtype=np.float64) / safe, 0.0)
    return np.clip(c, 0.0, 1.0), np.clip(m, 0.0, 1.0)


class PowerModel:
    """Power as a fraction of TDP from (compute share, memory share): static + compute x c + memory x m,
    at most 1. An estimator in scikit-learn's manner (fit / predict, fitted attributes end in '_').

    max_static, max_coef: upper bounds of static and of the two coefficients (fractions of TDP; all >= 0).
    fit minimises the squared log ratio of predicted to measured power, so a 10 % miss counts alike at
    100 W and 700 W, and the fit is not pulled low as a least-squares fit of relative errors is.
    """

    def __init__(self, max_static: float = 1.0, max_coef: float = MAX_COEF):
        self.max_static = max_static
        self.max_coef = max_coef

    def get_params(self, deep: bool = True) -> dict:
        return {"max_static": self.max_static, "max_coef": self.max_coef}

    def set_params(self, **params) -> "PowerModel":
        for key, value in params.items():
            if key not in self.get_params():
                raise KernelsightError(f"PowerModel has no parameter {key!r}")
            setattr(self, key, value)
        return self

    def fit(self, X, y) -> "PowerModel":
        """X: (n, 2) compute and memory shares; y: measured power / TDP (> 0)."""
        from scipy.optimize import least_squares

        X, y = _check_xy(X, y)
        hi = np.array([self.max_static, self.max_coef, self.max_coef], dtype=np.float64)
        if not (hi > 0).all():
            raise KernelsightError(f"PowerModel bounds max_static={self.max_static}, max_coef={self.max_coef}: "
                                   f"must be > 0")
        design = np.column_stack([np.ones(len(X)), X])
        log_y = np.log(y)

        def residual(p):
            return np.log(np.clip(design @ p, 1e-6, 1.0)) - log_y

        start = np.minimum(np.array([0.2, 0.3, 0.3]), hi / 2)
        result = least_squares(residual, start, bounds=(np.zeros(3), hi), method="trf", x_scale=1.0,
                               xtol=1e-12, ftol=1e-12, gtol=1e-12)
        self.static_, self.compute_, self.memory_ = (float(v) for v in result.x)
        self.n_rows_ = len(X)
        return self

    @property
    def params_(self) -> dict:
        return {"static": self.static_, "compute": self.compute_, "memory": self.memory_}

    def predict(self, X) -> np.ndarray:
        """Power / TDP of each row of X (compute and memory shares)."""
        if not hasattr(self, "static_"):
            raise KernelsightError("PowerModel.predict before fit")
        X = _check_x(X)
        return fraction(self.params_, X[:, 0], X[:, 1])


def fraction(params: Mapping, compute_share, memory_share) -> np.ndarray:
    """Power / TDP of kernels with these shares under one parameter set (static, compute, memory)."""
    p = params["static"] + params["compute"] * np.asarray(compute_share, dtype=np.float64) \
        + params["memory"] * np.asarray(memory_share, dtype=np.float64)
    return np.minimum(p, 1.0)


def _check_x(X) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 2:
        raise KernelsightError(f"power model inputs: expected (rows, 2) compute and memory shares, got shape {X.shape}")
    if not np.isfinite(X).all() or (X < 0).any() or (X > 1).any():
        raise KernelsightError("power model inputs: shares must be finite and in [0, 1]")
    return X


def _check_xy(X, y) -> tuple[np.ndarray, np.ndarray]:
    X = _check_x(X)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if len(y) != len(X):
        raise KernelsightError(f"power model fit: {len(X)} rows of shares but {len(y)} power readings")
    if len(y) < 3:
        raise KernelsightError(f"power model fit: {len(y)} rows; three parameters need at least 3")
    if not np.isfinite(y).all() or (y <= 0).any():
        raise KernelsightError("power model fit: power readings must be finite and > 0")
    return X, y


# -- the artifact ------------------------------------------------------------------------------

def content_sha256(doc: dict) -> str:
    """The hash an energy model carries: over its canonical JSON without this field."""
    body = {k: v for k, v in doc.items() if k != "content_sha256"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


class EnergyModel:
    """Fitted power parameters per kernel family (fractions of TDP) and the idle fraction; price any GPU
    with a TDP through bind(hw)."""

    def __init__(self, families: Mapping[str, Mapping], idle: float, fitted_on: Mapping | None = None,
                 metrics: Mapping | None = None, path: Path | None = None):
        self.families = {f: {k: float(p[k]) for k in PARAMS} for f, p in families.items()}
        self.details = {f: {k: v for k, v in p.items() if k not in PARAMS} for f, p in families.items()}
        self.idle = float(idle)
        self.fitted_on = dict(fitted_on or {})
        self.metrics = dict(metrics or {})
        self.path = path
        where = str(path) if path else "energy model"
        if POOLED not in self.families:
            raise KernelsightError(f"{where}: no pooled '{POOLED}' parameters for families without their own")
        for family, params in self.families.items():
            for key, value in params.items():
                top = 1.0 if key == "static" else MAX_COEF
                if not 0.0 <= value <= top:
                    raise KernelsightError(f"{where}: families.{family}.{key} = {value}: must be in [0, {top:g}] "
                                           f"(a fraction of TDP)")
        if not 0.0 <= self.idle <= 1.0:
            raise KernelsightError(f"{where}: idle = {self.idle}: must be a fraction of TDP in [0, 1]")

    def params(self, family: str) -> dict:
        """The family's parameters, or the pooled ones for a family the data never held."""
        return self.families.get(family) or self.families[POOLED]

    def source(self, family: str) -> str:
        """Which fit prices `family`: its own, a pooled one, or '*' (not in the data)."""
        if family not in self.families:
            return POOLED
        return str(self.details.get(family, {}).get("fit", "family"))

    def bind(self, hw) -> "KernelPower":
        """This model on one GPU (its TDP); one line when the catalog has no TDP for it."""
        if not hw.tdp_w:
            raise KernelsightError(f"GPU {hw.key!r} has no TDP in the hardware catalog (tdp_w is null): "
                                   f"its energy cannot be priced")
        return KernelPower(self, float(hw.tdp_w))

    def to_dict(self) -> dict:
        """The artifact's document, its content hash included."""
        doc = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "model": FORM,
               "fitted_on": self.fitted_on, "idle": self.idle,
               "families": {f: {**self.families[f], **self.details.get(f, {})} for f in sorted(self.families)},
               "metrics": self.metrics}
        doc["content_sha256"] = content_sha256(doc)
        return doc

    def save(self, path) -> Path:
        """Write the artifact (canonical JSON, atomically)."""
        from .outputs import write_text

        return write_text(path, canonical_json(self.to_dict()), "artifact")

    @classmethod
    def from_dict(cls, doc, where: str = "energy model", path: Path | None = None) -> "EnergyModel":
        """An artifact's document, checked: format, schema, keys, content hash, parameter ranges."""
        if not isinstance(doc, dict):
            raise KernelsightError(f"{where}: not a JSON object")
        check_header(doc, where, FORMAT, SCHEMA_VERSION, REQUIRED_KEYS, "kernelsight energy model")
        if doc["content_sha256"] != content_sha256(doc):
            raise KernelsightError(f"{where}: content hash mismatch: the file was changed after it was written "
                                   f"(rebuild it with `kernelsight calibrate energy`)")
        families = doc["families"]
        if not isinstance(families, dict) or not families:
            raise KernelsightError(f"{where}: families must be a non-empty mapping")
        for family, params in families.items():
            bad = [k for k in PARAMS if not isinstance(params, dict) or isinstance(params.get(k), bool)
                   or not isinstance(params.get(k), (int, float))]
            if bad:
                raise KernelsightError(f"{where}: families.{family}: {', '.join(bad)} must be numbers")
        idle = doc["idle"]
        if isinstance(idle, bool) or not isinstance(idle, (int, float)):
            raise KernelsightError(f"{where}: idle must be a number")
        return cls(families, idle, doc.get("fitted_on"), doc.get("metrics"), path)


class KernelPower:
    """An EnergyModel on one GPU: watts and joules of kernels, watts of the idle GPU."""

    def __init__(self, model: EnergyModel, tdp_w: float):
        self.model, self.tdp_w = model, tdp_w
        self.idle_w = model.idle * tdp_w

    def watts(self, family: str, t_compute, t_memory, seconds) -> np.ndarray:
        c, m = utilisation(t_compute, t_memory, seconds)
        return self.tdp_w * fraction(self.model.params(family), c, m)

    def joules(self, family: str, t_compute, t_memory, seconds) -> np.ndarray:
        """Energy of each kernel: its power times its time."""
        return self.watts(family, t_compute, t_memory, seconds) * np.asarray(seconds, dtype=np.float64)


def load_energy_model(path=None) -> EnergyModel:
    """Read and check an energy model (default: the one shipped in the package); every problem is one line."""
    path = Path(path) if path is not None else default_energy_path()
    where = f"energy model {path}"
    if not path.is_file():
        hint = ("; the package ships data/artifacts/energy.json: reinstall, or rebuild it with "
                "`kernelsight calibrate energy`") if path == default_energy_path() else ""
        raise KernelsightError(f"{where}: no such file{hint}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KernelsightError(f"{where}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise KernelsightError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return EnergyModel.from_dict(doc, where, path)


@lru_cache(maxsize=4)
def _cached(path: str) -> EnergyModel:
    return load_energy_model(path)


def shared_energy_model(path=None) -> EnergyModel:
    """load_energy_model, cached per resolved path (simulations of many setups read it once)."""
    return _cached(str((Path(path) if path is not None else default_energy_path()).resolve()))
