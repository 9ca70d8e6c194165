"""η bundles: a directory of fitted η models in open formats, verified on load.

Layout (written by kernelsight.calibrate.bundle.publish):

    manifest.json                     format, schema_version, code_version, created,
                                      training_data (file, sha256, rows, sweeps),
                                      devices, families, features, metrics,
                                      libraries, models, files (path -> sha256)
    models/target/<device>/<family>.txt   LightGBM model text (its card's learner.target says what it
                                      predicts: log η, or log of the time above the roofline)
    models/target/<device>/<family>.json  its card: features, training ranges, categories
    models/cross/<family>.txt|.json       the cross-device tier

Nothing in a bundle can run code: JSON is parsed as data and model text is
parsed by LightGBM's own C parser, reached through its C API so that
predicting needs neither the lightgbm Python package nor scikit-learn. Every
problem (missing file, hash mismatch, newer schema, features this version does
not compute, unparsable model) is ONE KernelsightError line.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import KernelsightError
from .features import feature_names, features
from .paths import data_dir

FORMAT = "kernelsight.eta-bundle"
# 2: a model may learn the time above the roofline instead of η (card learner.target, GAP_TARGET); a reader of
# schema 1 would take its output for log η, so it must refuse such a bundle.
SCHEMA_VERSION = 2
# What a model's raw output is the log of (its card's learner.target).
ETA_TARGET = "log eta"
GAP_TARGET = "log gap_us"  # t - t_roof in microseconds: eta = 1 + gap / t_roof
T_ROOF_FEATURE = "log2_t_roof_us"  # every family's feature (tests/test_calibrate_features.py) forming a gap model's η
MANIFEST = "manifest.json"
REQUIRED_KEYS = ("format", "schema_version", "code_version", "created", "training_data", "devices",
                 "families", "features", "metrics", "libraries", "models", "files")


def default_bundle_dir() -> Path:
    """The bundle shipped in the package: data/artifacts/default."""
    return data_dir() / "artifacts" / "default"


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- LightGBM model text through the C API ----------------------------------------------

_LIB_NAMES = {"linux": "lib_lightgbm.so", "darwin": "lib_lightgbm.dylib", "win32": "lib_lightgbm.dll"}


@lru_cache(maxsize=1)
def _lightgbm_lib():
    """LightGBM's shared library, located without importing the Python package (which imports sklearn)."""
    spec = importlib.util.find_spec("lightgbm")
    name = _LIB_NAMES.get(sys.platform, "lib_lightgbm.so")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for candidate in (Path(folder) / "lib" / name, Path(folder) / name):
            if candidate.is_file():
                lib = ctypes.cdll.LoadLibrary(str(candidate))
                lib.LGBM_GetLastError.restype = ctypes.c_char_p
                return lib
    raise KernelsightError(f"LightGBM's shared library {name} not found: install the lightgbm package "
                           f"(pip install lightgbm) to use η bundles")


class BoosterText:
    """A LightGBM model parsed from its text form; predict() = raw score, one thread, float64."""

    def __init__(self, text: str, where: str):
        self._lib = _lightgbm_lib()
        self._handle = ctypes.c_void_p()
        iterations = ctypes.c_int()
        if self._lib.LGBM_BoosterLoadModelFromString(ctypes.c_char_p(text.encode("utf-8")),
                                                     ctypes.byref(iterations), ctypes.byref(self._handle)):
            self._handle = None
            raise KernelsightError(f"{where}: not a valid LightGBM model text ({self._error()})")
        n = ctypes.c_int()
        self._check(self._lib.LGBM_BoosterGetNumFeature(self._handle, ctypes.byref(n)), where)
        self.num_features = n.value

    def _error(self) -> str:
        return self._lib.LGBM_GetLastError().decode("utf-8", "replace").splitlines()[0]

    def _check(self, rc: int, where: str) -> None:
        if rc:
            raise KernelsightError(f"{where}: LightGBM error: {self._error()}")

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float64)
        n, f = x.shape
        out = np.empty(n, dtype=np.float64)
        if n == 0:
            return out
        out_len = ctypes.c_int64()
        self._check(self._lib.LGBM_BoosterPredictForMat(
            self._handle, x.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(1), ctypes.c_int32(n),
            ctypes.c_int32(f), ctypes.c_int(1), ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(-1),
            ctypes.c_char_p(b"num_threads=1"), ctypes.byref(out_len),
            out.ctypes.data_as(ctypes.POINTER(ctypes.c_double))), "predict")
        return out

    def __del__(self):
        if getattr(self, "_handle", None):
            self._lib.LGBM_BoosterFree(self._handle)


# -- one fitted η model -------------------------------------------------------------------

class EtaModel:
    """A LightGBM model of log η (or of log gap above the roofline) plus its card; eta() clamps inputs to the
    training range.

    card: tier, family, device (None for cross), features (names, in order),
    ranges {name: [lo, hi]} of numeric features, categories {name: [values]}
    of categorical ones, nan (features that had NaN in training), eta_floor,
    learner.target (ETA_TARGET or GAP_TARGET; absent: ETA_TARGET), rows,
    devices (training rows per GPU), sweeps.
    """

    def __init__(self, text: str, card: dict, where: str):
        self.card = card
        self.where = where
        try:
            self.tier, self.family, self.device = card["tier"], card["family"], card.get("device")
            names = list(card["features"])
            ranges, cats, nan_ok = card["ranges"], card["categories"], set(card["nan"])
        except (KeyError, TypeError):
            raise KernelsightError(f"{where}: model card lacks tier/family/features/ranges/categories/nan") \
                from None
        expected = feature_names(self.family, self.tier)
        if names != expected:
            raise KernelsightError(f"{where}: fitted on features {names} but this kernelsight computes "
                                   f"{expected}; re-publish the bundle with this version")
        specs = features(self.family, self.tier)
        self.booster = BoosterText(text, where)
        if self.booster.num_features != len(names):
            raise KernelsightError(f"{where}: model text has {self.booster.num_features} features, "
                                   f"card lists {len(names)}")
        numeric = [j for j, f in enumerate(specs) if not f.categorical]
        self._numeric = np.asarray(numeric, dtype=np.intp)
        try:
            bounds = [ranges[names[j]] for j in numeric]  # null: unbounded (all-NaN in training)
            self._lo = np.asarray([-np.inf if b[0] is None else b[0] for b in bounds], dtype=np.float64)
            self._hi = np.asarray([np.inf if b[1] is None else b[1] for b in bounds], dtype=np.float64)
            self._cats = [(j, np.asarray(cats[names[j]], dtype=np.float64))
                          for j, f in enumerate(specs) if f.categorical]
        except (KeyError, IndexError, TypeError, ValueError):
            raise KernelsightError(f"{where}: model card has no valid range/categories for every feature") \
                from None
        self._nan_flag = np.asarray([names[j] not in nan_ok for j in range(len(names))])
        self.eta_floor = float(card.get("eta_floor", 1.0))
        learner = card.get("learner")
        self.target = learner.get("target", ETA_TARGET) if isinstance(learner, dict) else ETA_TARGET
        if self.target not in (ETA_TARGET, GAP_TARGET):
            raise KernelsightError(f"{where}: model learns {self.target!r}, which this kernelsight cannot turn into "
                                   f"η (it reads {ETA_TARGET!r} and {GAP_TARGET!r}); upgrade kernelsight")
        self._t_roof = names.index(T_ROOF_FEATURE) if self.target == GAP_TARGET else None

    @property
    def label(self) -> str:
        """'target/h100_sxm/gemm' or 'cross/gemm': which model produced a prediction."""
        return f"{self.tier}/{self.device}/{self.family}" if self.device else f"{self.tier}/{self.family}"

    def unseen_category(self, x: np.ndarray) -> np.ndarray:
        """Rows with a categorical value (dtype, op, link, flag) that training never saw."""
        flag = np.zeros(len(x), dtype=bool)
        for j, seen in self._cats:
            flag |= ~np.isin(x[:, j], seen)
        return flag

    def out_of_range(self, x: np.ndarray) -> np.ndarray:
        """Rows with a feature outside training: numeric beyond [lo, hi], unseen category, new NaN."""
        num = x[:, self._numeric]
        flag = ((num < self._lo) | (num > self._hi)).any(axis=1)
        flag |= (np.isnan(x) & self._nan_flag).any(axis=1)
        return flag | self.unseen_category(x)

    def eta(self, x: np.ndarray, floor: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(η, extrapolated flag) per row of the feature matrix x; numeric inputs clamped to training.

        η is floored at the card's eta_floor (1: never faster than the roofline);
        floor=False is for evaluation only, to show what the floor costs. A gap model's time above the
        roofline is added to the row's own roofline (not the clamped one): η = 1 + gap / t_roof.
        """
        flag = self.out_of_range(x)
        clamped = x
        if flag.any():
            clamped = x.copy()
            clamped[:, self._numeric] = np.clip(x[:, self._numeric], self._lo, self._hi)
        raw = np.exp(self.booster.predict(clamped))
        eta = raw if self._t_roof is None else 1.0 + raw / np.exp2(x[:, self._t_roof])
        return (np.maximum(eta, self.eta_floor) if floor else eta), flag


# -- the bundle --------------------------------------------------------------------------

def model_key(tier: str, family: str, device: str | None = None) -> str:
    return f"{tier}/{device}/{family}" if tier == "target" else f"{tier}/{family}"


class Bundle:
    """A verified bundle directory; models are parsed on first use."""

    def __init__(self, path: Path, manifest: dict):
        self.path = path
        self.manifest = manifest
        self._models: dict[str, EtaModel] = {}

    @property
    def name(self) -> str:
        return self.path.name

    def has(self, tier: str, family: str, device: str | None = None) -> bool:
        return model_key(tier, family, device) in self.manifest["models"]

    def covers(self, family: str) -> bool:
        """Whether any model of any tier prices this family."""
        return any(m["family"] == family for m in self.manifest["models"].values())

    def target_devices(self, family: str) -> list[str]:
        return sorted(m["device"] for m in self.manifest["models"].values()
                      if m["tier"] == "target" and m["family"] == family)

    def model(self, tier: str, family: str, device: str | None = None) -> EtaModel:
        key = model_key(tier, family, device)
        if key not in self._models:
            entry = self.manifest["models"].get(key)
            if entry is None:
                raise KernelsightError(f"bundle {self.path}: no {key} model")
            where = f"bundle {self.path}: {entry['model']}"
            text = (self.path / entry["model"]).read_text(encoding="utf-8")
            card = _read_json(self.path / entry["card"], f"bundle {self.path}: {entry['card']}")
            self._models[key] = EtaModel(text, card, where)
        return self._models[key]


def _read_json(path: Path, where: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KernelsightError(f"{where}: file missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise KernelsightError(f"{where}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise KernelsightError(f"{where}: expected a JSON object at the top level")
    return data


def verify_manifest(path: Path, manifest: dict) -> None:
    """Format, schema version, required keys, and every listed file present with its sha256."""
    where = f"bundle {path}"
    if manifest.get("format") != FORMAT:
        raise KernelsightError(f"{where}: manifest format is {manifest.get('format')!r}, not {FORMAT!r} "
                               f"(not a kernelsight η bundle)")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise KernelsightError(f"{where}: manifest schema_version {version!r} is not an integer")
    if version > SCHEMA_VERSION:
        raise KernelsightError(f"{where}: schema_version {version} is newer than this kernelsight reads "
                               f"({SCHEMA_VERSION}); upgrade kernelsight")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise KernelsightError(f"{where}: manifest lacks {', '.join(missing)}")
    files = manifest["files"]
    for entry in manifest["models"].values():
        for rel in (entry["model"], entry["card"]):
            if rel not in files:
                raise KernelsightError(f"{where}: {rel} is not covered by the manifest's file hashes")
    for rel, digest in sorted(files.items()):
        target = (path / rel).resolve()
        if path.resolve() not in target.parents:
            raise KernelsightError(f"{where}: file entry {rel!r} points outside the bundle")
        if not target.is_file():
            raise KernelsightError(f"{where}: {rel} is missing")
        actual = sha256_file(target)
        if actual != digest:
            raise KernelsightError(f"{where}: {rel} hash mismatch (sha256 {actual[:12]}... but the manifest "
                                   f"says {str(digest)[:12]}...): the file was modified; re-publish the bundle")


def load_bundle(path=None) -> Bundle:
    """Load and verify a bundle directory (default: the one shipped in the package)."""
    path = Path(path) if path is not None else default_bundle_dir()
    if not path.is_dir():
        raise KernelsightError(f"bundle {path}: no such directory")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise KernelsightError(f"bundle {path}: {MANIFEST} is missing (not a kernelsight η bundle?)")
    manifest = _read_json(manifest_path, f"bundle {path}: {MANIFEST}")
    verify_manifest(path, manifest)
    return Bundle(path, manifest)


@lru_cache(maxsize=4)
def _cached(path: str) -> Bundle:
    return load_bundle(path)


def shared_bundle(path=None) -> Bundle:
    """load_bundle, cached per resolved path: predictors of many GPUs share parsed models."""
    return _cached(str(Path(path).resolve() if path is not None else default_bundle_dir().resolve()))
