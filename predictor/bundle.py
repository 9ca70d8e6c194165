"""η bundles: a directory of fitted η models in open formats, verified as they are read.

Layout (written by kernelsight.calibrate.bundle.publish):

    manifest.json                     format, schema_version, code_version, created, content_id,
                                      training_data (file, sha256, rows, sweeps),
                                      devices, families, features, metrics,
                                      libraries, models, files (path -> sha256)
    models/target/<device>/<family>.txt.gz  LightGBM model text, gzipped (its card's learner.target says what
                                      it predicts: log η, or log of the time above the roofline)
    models/target/<device>/<family>.json    its card: tier, family, device, features, training ranges,
                                      categories, text_sha256 (the hash of the uncompressed model text)
    models/cross/<family>.txt.gz|.json      the cross-device tier

Integrity is a chain: content_id hashes the manifest (every entry and every file hash it lists), each
file's sha256 is in the manifest, each card names the GPU, family and tier it prices (checked against
the manifest entry that points at it) and the hash of its model text. Opening a bundle reads and checks
the manifest only; a model's two files are hashed when that model is first used, so pricing one kernel
on one GPU does not read the rest. Bundle.verify_files() hashes everything.

Nothing in a bundle can run code: JSON is parsed as data and model text is
parsed by LightGBM's own C parser, reached through its C API so that
predicting needs neither the lightgbm Python package nor scikit-learn. Every
problem (missing file, hash mismatch, an entry whose files describe another
model, newer schema, features this version does not compute, unparsable
model) is ONE KernelsightError line naming the bundle (and the entry).
"""
from __future__ import annotations

import ctypes
import gzip
import hashlib
import importlib.util
import json
import os
import re
import sys
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import KernelsightError
from .features import feature_names, features
from .paths import cache_dir, data_dir

FORMAT = "kernelsight.eta-bundle"
# 2: a model may learn the time above the roofline instead of η (card learner.target, GAP_TARGET); a reader of
# schema 1 would take its output for log η, so it must refuse such a bundle.
# 3: model text is gzipped (models/...txt.gz), content_id hashes the whole manifest, and each card carries
# text_sha256, the hash of the model text it describes. Schemas 1 and 2 are still read.
SCHEMA_VERSION = 3
WHOLE_MANIFEST = 3  # the first schema whose content_id covers the whole manifest and whose cards name their text
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
        trained = card.get("eta_train")  # [min, median, max] of the training η
        self._eta_lo, self._eta_hi = (float(trained[0]), float(trained[-1])) if trained else (0.0, np.inf)

    @property
    def label(self) -> str:
        """'target/h100_sxm/gemm' or 'cross/gemm': which model produced a prediction."""
        return f"{self.tier}/{self.device}/{self.family}" if self.device else f"{self.tier}/{self.family}"

    def unseen_category(self, x: np.ndarray) -> np.ndarray:
        """Rows with a categorical value (dtype, op, link, flag) that training never saw."""
        flag = np.zeros(len(x), dtype=bool)
        for j, seen in self._cats:
            # np.isin(x[:, j], seen) as its comparison loop: over a few categories this is the branch np.isin
            # takes for short columns, and it spares long ones np.isin's sort (and importing numpy.ma, which
            # np.unique does)
            hit = np.zeros(len(x), dtype=bool)
            for value in seen:
                hit |= x[:, j] == value
            flag |= ~hit
        return flag

    def out_of_range(self, x: np.ndarray) -> np.ndarray:
        """Rows with a feature outside training: numeric beyond [lo, hi], unseen category, new NaN."""
        num = x[:, self._numeric]
        flag = ((num < self._lo) | (num > self._hi)).any(axis=1)
        flag |= (np.isnan(x) & self._nan_flag).any(axis=1)
        return flag | self.unseen_category(x)

    def eta(self, x: np.ndarray, floor: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(η, extrapolated flag) per row of the feature matrix x; numeric inputs clamped to training. The flag
        also marks an η outside the range of the training η (a gap model can leave it on a short kernel).

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
        eta = np.maximum(eta, self.eta_floor) if floor else eta
        return eta, flag | (eta < self._eta_lo * (1 - 1e-9)) | (eta > self._eta_hi * (1 + 1e-9))


# -- the bundle --------------------------------------------------------------------------

def model_key(tier: str, family: str, device: str | None = None) -> str:
    return f"{tier}/{device}/{family}" if tier == "target" else f"{tier}/{family}"


def canonical_json(obj) -> str:
    """The one JSON spelling of a bundle's documents: sorted keys, one-space indent, no NaN; what the
    writer puts on disk and what content_id hashes (so reformatting a manifest does not change it)."""
    return json.dumps(obj, sort_keys=True, indent=1, allow_nan=False) + "\n"


def content_id(manifest: dict) -> str:
    """The hash that names a bundle: over the whole manifest but this field (schema >= WHOLE_MANIFEST),
    so it binds every entry and, through the file hashes listed, every file; older schemas hashed the
    file list and the training data only."""
    if manifest.get("schema_version", 0) >= WHOLE_MANIFEST:
        body = {k: v for k, v in manifest.items() if k != "content_id"}
    else:
        body = {"files": manifest.get("files"), "training_data": manifest.get("training_data")}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


class Bundle:
    """A bundle whose manifest is verified; each model's files are hash-checked and parsed on first use."""

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

    def read(self, rel: str, where: str) -> bytes:
        """A file the manifest lists, read once and checked against its sha256 there."""
        try:
            data = (self.path / rel).read_bytes()
        except FileNotFoundError:
            raise KernelsightError(f"{where}: {rel} is missing") from None
        except OSError as e:
            raise KernelsightError(f"{where}: cannot read {rel} ({e.strerror or e})") from None
        actual, digest = hashlib.sha256(data).hexdigest(), self.manifest["files"][rel]
        if actual != digest:
            raise KernelsightError(f"{where}: {rel} hash mismatch (sha256 {actual[:12]}... but the manifest "
                                   f"says {str(digest)[:12]}...): the file was modified; re-publish the bundle")
        return data

    def verify_files(self) -> None:
        """Hash every file the manifest lists (opening a bundle checks only those a model it prices reads)."""
        for rel in sorted(self.manifest["files"]):
            self.read(rel, f"bundle {self.path}")

    def model(self, tier: str, family: str, device: str | None = None) -> EtaModel:
        key = model_key(tier, family, device)
        if key not in self._models:
            entry = self.manifest["models"].get(key)
            if entry is None:
                raise KernelsightError(f"bundle {self.path}: no {key} model")
            self._models[key] = self._load(key, entry)
        return self._models[key]

    def _load(self, key: str, entry: dict) -> EtaModel:
        """The entry's model after its files' hashes, its card's identity (the GPU, family and tier the
        manifest says it prices) and, from schema 3, the card's hash of the model text are checked."""
        where = f"bundle {self.path}: entry {key}"
        raw = self.read(entry["model"], where)
        card = _parse_json(self.read(entry["card"], where), f"{where}: {entry['card']}")
        said = model_key(card.get("tier"), card.get("family"), card.get("device"))
        if said != key:
            raise KernelsightError(f"{where}: its card {entry['card']} describes {said}, not {key} (the entry was "
                                   f"altered or points at another model's files)")
        if entry["model"].endswith(".gz"):
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, zlib.error) as e:
                raise KernelsightError(f"{where}: {entry['model']} is not valid gzip ({e})") from None
        if self.manifest["schema_version"] >= WHOLE_MANIFEST:
            text_hash = hashlib.sha256(raw).hexdigest()
            if card.get("text_sha256") != text_hash:
                raise KernelsightError(f"{where}: {entry['model']} is not the model text its card "
                                       f"{entry['card']} describes (text_sha256 differs)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise KernelsightError(f"{where}: {entry['model']} is not UTF-8 text") from None
        return EtaModel(text, card, f"{where}: {entry['model']}")


def _parse_json(data: bytes, where: str) -> dict:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise KernelsightError(f"{where}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise KernelsightError(f"{where}: expected a JSON object at the top level")
    return doc


def _inside(root: Path, rel, folders: dict | None = None) -> bool:
    """Whether root / rel, symlinks resolved, lies inside root (itself resolved). folders: a cache of resolved
    folders, shared by the calls over one bundle's files (most of them share a few folders): a path whose last
    part is a plain name and not a symlink resolves to its resolved folder plus that name."""
    if not isinstance(rel, str):
        return False
    path = root / rel
    if folders is None or path.name in ("", ".", "..") or os.path.islink(path):
        return root in path.resolve().parents
    folder = folders.get(path.parent)
    if folder is None:
        folder = folders[path.parent] = str(path.parent.resolve()).rstrip("/") + "/"
    # both sides resolved, so "strictly below root" is a prefix test on their text
    return (folder + path.name).startswith(str(root).rstrip("/") + "/")


def check_header(doc: dict, where: str, fmt: str, schema_version: int, required, what: str) -> None:
    """The checks every versioned kernelsight JSON document opens with: its format (`what` it is not
    otherwise), a schema version this kernelsight reads, and its required keys; one line naming `where`."""
    if doc.get("format") != fmt:
        raise KernelsightError(f"{where}: format is {doc.get('format')!r}, not {fmt!r} (not a {what})")
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise KernelsightError(f"{where}: schema_version {version!r} is not an integer >= 1")
    if version > schema_version:
        raise KernelsightError(f"{where}: schema_version {version} is newer than this kernelsight reads "
                               f"({schema_version}); upgrade kernelsight")
    missing = [k for k in required if k not in doc]
    if missing:
        raise KernelsightError(f"{where}: missing {', '.join(missing)}")


def verify_manifest(path: Path, manifest: dict) -> None:
    """What opening a bundle checks, without reading its models: format, schema version, required keys,
    content_id, each model entry consistent with its key and covered by the file hashes, and every listed
    file inside the bundle and present. The hashes of a model's files are checked when it is loaded."""
    where = f"bundle {path}"
    check_header(manifest, f"{where}: manifest", FORMAT, SCHEMA_VERSION, REQUIRED_KEYS, "kernelsight η bundle")
    files, models = manifest["files"], manifest["models"]
    if not isinstance(files, dict) or not isinstance(models, dict):
        raise KernelsightError(f"{where}: manifest files and models must be JSON objects")
    if manifest.get("content_id") != content_id(manifest):
        raise KernelsightError(f"{where}: manifest content_id does not match its contents: the manifest was "
                               f"edited; re-publish the bundle")
    root, folders = path.resolve(), {}
    for rel, digest in sorted(files.items()):
        if not _inside(root, rel, folders):
            raise KernelsightError(f"{where}: file entry {rel!r} points outside the bundle")
        if not isinstance(digest, str) or len(digest) != 64:
            raise KernelsightError(f"{where}: file entry {rel!r} has no sha256")
        if not (path / rel).is_file():
            raise KernelsightError(f"{where}: {rel} is missing")
    for key, entry in sorted(models.items()):
        try:
            said = model_key(entry["tier"], entry["family"], entry.get("device"))
            rels = (entry["model"], entry["card"])
        except (KeyError, TypeError):
            raise KernelsightError(f"{where}: entry {key} lacks tier/family/model/card") from None
        if said != key:
            raise KernelsightError(f"{where}: entry {key} says it prices {said}")
        for rel in rels:
            if rel not in files:
                raise KernelsightError(f"{where}: entry {key}: {rel} is not covered by the manifest's file hashes")


# Bundle names that are not paths: a letter or digit, then letters, digits, '.', '_', '-'.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def locate_bundle(name) -> Path:
    """The directory of a bundle given by name: the one shipped in the package (data/artifacts/<name>) when
    it exists, else the user cache's cache_dir()/bundles/<name>, which is where a bundle built on demand
    belongs (the path returned need not exist yet). A value that is not a bare name (a path separator,
    '~', a leading '.') is a directory, returned as given."""
    text = str(name)
    if not _NAME.fullmatch(text):
        return Path(text).expanduser()
    shipped = data_dir() / "artifacts" / text
    return shipped if shipped.is_dir() else cache_dir() / "bundles" / text


def _bundle_path(path) -> Path:
    """None: the shipped default; a directory that exists here; else a bundle name (locate_bundle)."""
    if path is None:
        return default_bundle_dir()
    if not Path(path).is_dir() and _NAME.fullmatch(str(path)):
        return locate_bundle(path)
    return Path(path)


def load_bundle(path=None) -> Bundle:
    """Open and verify a bundle (default: the one shipped in the package): a directory, or a bundle name
    (locate_bundle) where no directory of that name exists here. Models load on first use."""
    path = _bundle_path(path)
    if not path.is_dir():
        raise KernelsightError(f"bundle {path}: no such directory")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise KernelsightError(f"bundle {path}: {MANIFEST} is missing (not a kernelsight η bundle?)")
    try:
        data = manifest_path.read_bytes()
    except OSError as e:
        raise KernelsightError(f"bundle {path}: cannot read {MANIFEST} ({e.strerror or e})") from None
    manifest = _parse_json(data, f"bundle {path}: {MANIFEST}")
    verify_manifest(path, manifest)
    return Bundle(path, manifest)


@lru_cache(maxsize=4)
def _cached(path: str) -> Bundle:
    return load_bundle(path)


def shared_bundle(path=None) -> Bundle:
    """load_bundle, cached per resolved path: predictors of many GPUs share parsed models."""
    return _cached(str(_bundle_path(path).resolve()))
