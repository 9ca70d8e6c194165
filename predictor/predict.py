"""Kernel latency prediction: roofline time times η, the family's efficiency gap.

`Predictor.predict` is the one entry point: a DataFrame of kernel shapes (any
mix of families) gives a DataFrame of latencies, and the columns of one family
(family=...) give arrays, the path the simulator prices its steps with (no
frame is built per step). η comes from an η bundle (predictor/bundle.py; the
one shipped in the package by default):

  tier 'target'   the model fitted on this GPU's own sweep;
  tier 'cross'    no data of this GPU: a die sibling's target model where the
                  bundle has one that covers the kernel (predictor/transfer.py:
                  same architecture and SM count, e.g. H200 for H100), the
                  cross-device model (hardware features) for the rest;
  tier 'auto'     target where the bundle has this GPU's data for the family
                  (rows whose dtype/op/link the target sweep never held go to
                  cross), cross otherwise;
  tier 'roofline' η = 1.

Every prediction carries the tier and model that produced it, an
`extrapolated` flag (inputs outside the training range, clamped to it, or η
outside the η the model was trained on) and an 80 % interval [p10, p90] from
the bundle's held-out residual quantiles of the path that priced it (target
model, cross-device model or die sibling; calibrate/intervals.py): never below
the roofline, and for an extrapolated prediction the widest of its path's, its
path's extrapolated group's and the cross path's. A roofline-priced kernel has no interval (NaN). η >= 1
always. A family that no model in the bundle covers is priced at η = 1 with a
warning, once per family.
"""
from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING, Mapping

import numpy as np

from .bundle import Bundle, default_bundle_dir, load_bundle, shared_bundle
from .errors import KernelsightError, did_you_mean
from .features import feature_matrix
from .hardware import Hardware, load_hardware
from .roofline import roofline_columns, roofline_frame
from .transfer import ROOFLINE, cross_eta, die_siblings, take

if TYPE_CHECKING:  # frames in and out only where a caller passes one: pricing columns imports no pandas
    import pandas as pd

TIERS = ("auto", "target", "cross", ROOFLINE)
BANDS = (None, "p10", "p90")


def _quantiles(intervals: dict, path: str, family: str) -> tuple[float, float] | None:
    """(q10, q90) of held-out log(measured / predicted) for `family` priced by `path` (its family's, else
    the path's pooled '*'), or None when the bundle has none."""
    table = intervals.get(path) or {}
    q = table.get(family) or table.get("*")
    return (float(q["p10"]), float(q["p90"])) if q else None


def interval_quantiles(intervals: dict, path: str, family: str, extrapolated: bool) -> tuple[float, float] | None:
    """(q10, q90) of a prediction of `family` by `path` (None: no interval): an extrapolated one gets the widest
    of its path's, its path's extrapolated group's ('<path> extrapolated') and the cross path's."""
    own = _quantiles(intervals, path, family)
    if own is None or not extrapolated:
        return own
    found = [q for q in (own, _quantiles(intervals, f"{path} extrapolated", family),
                         _quantiles(intervals, "cross", family)) if q is not None]
    return min(q[0] for q in found), max(q[1] for q in found)


def _check_band(band: str | None) -> str | None:
    if band not in BANDS:
        raise KernelsightError(f"band={band!r}: expected one of {', '.join(map(str, BANDS))}")
    return band


def column_key(value) -> tuple:
    """A column of shapes as a memo key part: its dtype, shape and values (an object column by its values,
    not its pointers)."""
    a = np.asarray(value)
    return a.dtype.str, a.shape, tuple(a.ravel().tolist()) if a.dtype == object else a.tobytes()


class FamilyModels:
    """The η models that may price one family on one GPU: `target`, the GPU's own model (None without one;
    loaded up front), and the cross-device path's models (transfer.py: the cross model, die siblings' target
    models), each loaded the first time a kernel goes that way, so pricing kernels that the GPU's own model
    covers reads no other model's files (nor the hardware catalog the siblings come from)."""

    def __init__(self, target=None, bundle: Bundle | None = None, family: str | None = None,
                 hw: Hardware | None = None):
        self.target = target
        self._bundle, self._family, self._hw = bundle, family, hw
        self.has_cross = bundle is not None and bundle.has("cross", family)
        self._devices = None if bundle is not None else []
        self._siblings = None

    @property
    def sibling_devices(self) -> list[str]:
        """Catalog keys of the die siblings with a target model of the family, nearest first."""
        if self._devices is None:
            self._devices = die_siblings(self._hw, self._bundle.target_devices(self._family))
        return self._devices

    @property
    def cross_path(self) -> bool:
        """Whether the cross-device path has a model (the cross one or a die sibling's) for the family."""
        return self.has_cross or bool(self.sibling_devices)

    def cross(self):
        """The cross-device model, or None."""
        return self._bundle.model("cross", self._family) if self.has_cross else None

    def siblings(self) -> list:
        """[(Hardware, target model)] of the die siblings, nearest first."""
        if self._siblings is None:
            self._siblings = [(load_hardware(d), self._bundle.model("target", self._family, d))
                              for d in self.sibling_devices]
        return self._siblings


class Predictor:
    """Prices kernels on one GPU with an η bundle.

    bundle: None (the shipped default), a directory, a loaded Bundle, or False
    (no bundle: η = 1 with a warning per family).
    band: None, or 'p10' / 'p90': predict(columns, family=...) then gives that end of each kernel's interval
    as `seconds` (the central value where a kernel has none), so a simulation priced with it is the run
    at that end of the interval.
    memo: keep every prediction of a mapping of columns and give it back for the same columns (read-only
    arrays), for callers that price the same kernels again; with_band shares it, since the predictions of
    the other bands come with it (runs at the ends of the intervals after the central run in one process
    price from its predictions).
    """

    def __init__(self, hardware: Hardware | str, tier: str = "auto", bundle=None, band: str | None = None,
                 memo: bool = False):
        self.hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
        if tier not in TIERS:
            raise KernelsightError(f"unknown tier {tier!r}{did_you_mean(tier, TIERS)}; expected one of {TIERS}")
        self.tier, self.band = tier, _check_band(band)
        self.bundle = self._bundle(bundle) if tier != ROOFLINE else None
        self._warned: set[str] = set()
        self._chosen: dict[str, tuple] = {}
        self._memo: dict | None = {} if memo else None

    def with_band(self, band: str | None) -> Predictor:
        """This predictor (its GPU, tier, bundle, models, warnings given and memo) pricing `band` instead."""
        other = copy.copy(self)
        other.band = _check_band(band)
        return other

    @staticmethod
    def _bundle(bundle) -> Bundle | None:
        if bundle is False:
            return None
        if isinstance(bundle, Bundle):
            return bundle
        if bundle is None:
            if not (default_bundle_dir() / "manifest.json").is_file():
                return None  # a source tree before the first publish: every family warns, η = 1
            return shared_bundle()
        return load_bundle(bundle)

    # -- which models price a family ---------------------------------------------------
    def _models(self, family: str) -> FamilyModels:
        """The models that may price `family` on this GPU (chosen once per family)."""
        if family not in self._chosen:
            self._chosen[family] = self._choose(family)
        return self._chosen[family]

    def _choose(self, family: str) -> FamilyModels:
        b, key = self.bundle, self.hw.key
        if self.tier == ROOFLINE:
            return FamilyModels()
        if b is None or not b.covers(family):
            if family not in self._warned:
                self._warned.add(family)
                where = "no η bundle loaded" if b is None else f"bundle {b.path} has no {family} model"
                warnings.warn(f"{where}: {family} latencies on {key} are plain roofline (η = 1)", stacklevel=4)
            return FamilyModels()
        if self.tier == "target":
            if not b.has("target", family, key):
                devices = ", ".join(b.target_devices(family)) or "none"
                raise KernelsightError(f"bundle {b.path} has no target-tier {family} model for {key} "
                                       f"(GPUs with one: {devices}); use tier=cross or tier=auto")
            return FamilyModels(b.model("target", family, key))
        if self.tier == "cross":
            models = FamilyModels(None, b, family, self.hw)
            if not models.cross_path:
                raise KernelsightError(f"bundle {b.path} has no cross-device {family} model; "
                                       f"use tier=target or tier=auto")
            return models
        return FamilyModels(b.model("target", family, key) if b.has("target", family, key) else None, b, family,
                            self.hw)

    # -- prediction ------------------------------------------------------------------------
    def predict(self, shapes, family: str | None = None):
        """Predicted latency of kernels on this GPU, with the tier and model that priced each one.

        shapes: a DataFrame of kernel shapes, a 'family' column and each family's shape columns (sweep-contract
        names, any mix of families). Returns a DataFrame with the same index: the roofline terms (flops,
        bytes, blocks, wave_factor, t_compute, t_memory, t_roof in s, bound), eta, latency_us, tier, model and
        the extrapolated flag (inputs outside the training range, clamped to it).

        Or a mapping of column arrays of one family, with family=...: returns a dict of arrays (t_roof and the
        other roofline terms, eta, seconds, tier, model, extrapolated), so callers pricing many small batches
        (the simulator) build no frame.
        """
        if not isinstance(shapes, Mapping):  # a DataFrame (not a Mapping)
            if family is not None:
                raise KernelsightError("predict(frame): the frame's 'family' column names the families; "
                                       "family= is for a mapping of one family's columns")
            return self._predict_frame(shapes)
        if family is None:
            raise KernelsightError("predict(columns): a mapping of shape columns needs family=<family>")
        if self._memo is None:
            out = self._predict_columns(shapes, family)
        else:
            key = (family, tuple(sorted((name, column_key(value)) for name, value in shapes.items())))
            kept = self._memo.get(key)
            if kept is None:
                kept = self._memo[key] = self._predict_columns(shapes, family)
                for value in kept.values():
                    value.flags.writeable = False
            out = dict(kept)
        if self.band is not None:
            end = out[f"seconds_{self.band}"]
            out = {**out, "seconds": np.where(np.isnan(end), out["seconds"], end)}
        return out

    def _predict_columns(self, shapes: Mapping, family: str) -> dict:
        """predict(columns, family=...) at the central value (its band's end as 'seconds_<band>')."""
        roof = roofline_columns(family, shapes, self.hw)
        out = {**roof, **self._estimate(family, shapes, roof)}
        out["seconds"] = roof["t_roof"] * out["eta"]
        out["seconds_p10"], out["seconds_p90"] = self._interval(family, out["seconds"], roof["t_roof"], out)
        return out

    def _interval(self, family: str, seconds: np.ndarray, t_roof, res: dict) -> tuple[np.ndarray, np.ndarray]:
        """[p10, p90] of each prediction (see the module docstring)."""
        lo, hi = np.full(len(seconds), np.nan), np.full(len(seconds), np.nan)
        intervals = self.bundle.manifest.get("intervals") if self.bundle is not None else None
        if not intervals:
            return lo, hi
        for path in ("target", "cross", "sibling"):
            q, wide = (interval_quantiles(intervals, path, family, x) for x in (False, True))
            rows = res["path"] == path
            if q is None or not rows.any():
                continue
            q10 = np.where(res["extrapolated"][rows], wide[0], q[0])
            q90 = np.where(res["extrapolated"][rows], wide[1], q[1])
            lo[rows] = np.maximum(seconds[rows] * np.exp(q10), np.asarray(t_roof, dtype=float)[rows])
            hi[rows] = np.maximum(seconds[rows] * np.exp(q90), lo[rows])
        return lo, hi

    def _predict_frame(self, df: pd.DataFrame) -> pd.DataFrame:
        out = roofline_frame(df, self.hw)
        n = len(df)
        eta, extrapolated = np.ones(n), np.zeros(n, dtype=bool)
        tier, model = np.full(n, ROOFLINE, dtype=object), np.full(n, ROOFLINE, dtype=object)
        path = np.full(n, ROOFLINE, dtype=object)
        if n:
            for family, idx in df.groupby("family", sort=False).indices.items():
                part = df.iloc[idx]
                roof = {k: out[k].to_numpy()[idx] for k in out.columns}
                res = self._estimate(family, {c: part[c].to_numpy() for c in part.columns}, roof)
                eta[idx], tier[idx], model[idx], extrapolated[idx] = (res["eta"], res["tier"], res["model"],
                                                                      res["extrapolated"])
                path[idx] = res["path"]
        out["eta"] = eta
        out["latency_us"] = out["t_roof"].astype(float).to_numpy() * eta * 1e6
        lo, hi = np.full(n, np.nan), np.full(n, np.nan)
        if n:
            for family, idx in df.groupby("family", sort=False).indices.items():
                res = {"path": path[idx], "extrapolated": extrapolated[idx]}
                lo[idx], hi[idx] = self._interval(family, out["latency_us"].to_numpy()[idx],
                                                  out["t_roof"].astype(float).to_numpy()[idx] * 1e6, res)
        out["latency_p10_us"], out["latency_p90_us"] = lo, hi
        out["tier"] = tier
        out["model"] = model
        out["extrapolated"] = extrapolated
        return out

    def _estimate(self, family: str, cols: Mapping, roof: Mapping) -> dict:
        """η, tier, model label and extrapolated flag for each kernel of one family."""
        n = len(roof["t_roof"])
        half = None
        if family == "gemm" and n and (np.asarray(cols["dtype"]) == "fp32").any():
            half = next((d for d in ("bf16", "fp16") if d in self.hw.supported_dtypes), None)
        if half:
            # No sweep times fp32 GEMMs (cuBLAS SGEMM on CUDA cores, e.g. MiniMax-M2's fp32 router, or a whole
            # model served in fp32 on a GPU without bf16): the same shape's 16-bit GEMM (cuBLAS as well; fp16
            # where the GPU has no bf16) as predicted, plus the roofline time fp32 adds to it (twice the bytes,
            # the CUDA-core rate), as the η of the fp32 roofline. A GPU without either prices them directly.
            proxy = {**cols, "dtype": np.where(np.asarray(cols["dtype"]) == "fp32", half, cols["dtype"])}
            proxy_roof = roofline_columns(family, proxy, self.hw)
            out = self._estimate(family, proxy, proxy_roof)
            t, t16 = (np.asarray(r["t_roof"], dtype=np.float64) for r in (roof, proxy_roof))
            out["eta"] = (out["eta"] * t16 + np.maximum(t - t16, 0.0)) / t
            return out
        out = {"eta": np.ones(n), "tier": np.full(n, ROOFLINE, dtype=object),
               "model": np.full(n, ROOFLINE, dtype=object), "extrapolated": np.zeros(n, dtype=bool),
               "path": np.full(n, ROOFLINE, dtype=object)}
        models = self._models(family)
        target = models.target
        if n == 0 or (target is None and not models.cross_path):
            return out
        rest = np.ones(n, dtype=bool)
        if target is not None:
            x = feature_matrix(family, target.tier, cols, self.hw, roof)
            # auto: what the target sweep never held goes to the cross path, when there is one
            rows = ~target.unseen_category(x) if models.cross_path else rest
            out["eta"][rows], out["extrapolated"][rows] = target.eta(x if rows.all() else x[rows])
            out["tier"][rows], out["model"][rows], out["path"][rows] = target.tier, target.label, "target"
            rest = ~rows
        if rest.any():
            self._cross(family, cols, roof, rest, models.cross(), models.siblings(), out)
        return out

    def _cross(self, family: str, cols: Mapping, roof: Mapping, rows: np.ndarray, cross, siblings,
               out: dict) -> None:
        """The cross-device path (predictor/transfer.py) for `rows`."""
        idx = np.flatnonzero(rows)
        if not rows.all():
            cols, roof = take(cols, idx), take(roof, idx)
        res = cross_eta(family, cols, self.hw, roof, cross, siblings)
        priced = res["sibling"] | (cross is not None)
        out["eta"][idx], out["extrapolated"][idx], out["model"][idx] = res["eta"], res["extrapolated"], res["model"]
        out["tier"][idx[priced]] = "cross"
        out["path"][idx] = np.where(res["sibling"], "sibling", np.where(priced, "cross", ROOFLINE))
        if not priced.all() and family not in self._warned:
            self._warned.add(family)
            warnings.warn(f"bundle {self.bundle.path} has no cross-device {family} model: {int((~priced).sum())} "
                          f"{family} kernels on {self.hw.key} that no die sibling covers are plain roofline (η = 1)",
                          stacklevel=4)
