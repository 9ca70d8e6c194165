"""Write η bundles (the reader is kernelsight.predictor.bundle): byte-identical for the same inputs.

Everything is sorted, JSON is written with sorted keys, model text is
LightGBM's deterministic dump with its values rounded to stated steps
(slim_model_text) and gzipped without a name or time in the header, and the
only time in the bundle is the manifest's `created`, which the caller pins
(config `created=`, or the SOURCE_DATE_EPOCH convention of reproducible
builds); the content itself is named by `content_id`, a hash over the whole
manifest, whose file hashes cover every file.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import platform
import shutil
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from kernelsight.predictor.bundle import (FORMAT, MANIFEST, SCHEMA_VERSION, canonical_json, content_id, load_bundle,
                                         model_key)
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.features import feature_names
from kernelsight.predictor.paths import data_dir

LIBRARIES = ("lightgbm", "numpy", "pandas", "pyarrow")


def package_version(dist: str = "kernelsight") -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def creation_time(created: str | None = None) -> str:
    """ISO-8601 UTC: the pinned value, else SOURCE_DATE_EPOCH, else now."""
    if created:
        return str(created)
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch else datetime.now(timezone.utc)
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def data_label(path) -> str:
    """A training file named portably: relative to the package's data/ when inside it."""
    path = Path(path).resolve()
    try:
        return "data/" + path.relative_to(data_dir().resolve()).as_posix()
    except ValueError:
        return path.name


# Rounding of published model text (slim_model_text). Leaf values and a linear leaf's constant are log η (or
# log gap) terms, rounded to VALUE_DECIMALS decimals: each moves a prediction by at most half that step per
# tree. A linear leaf's coefficient c of feature x is rounded to the decimal step that moves c * x by at most
# COEFF_TOLERANCE / 2 anywhere in x's training range (inputs are clamped to it), so a coefficient of a large
# feature keeps more decimals than one of a fraction. Split thresholds stay exact (the shortest spelling of
# the same double): a rounded threshold can pass a training value next to it and send kernels to another leaf.
VALUE_DECIMALS = 6
COEFF_TOLERANCE = 1e-5
GZIP_LEVEL = 9


def _fixed(value: str, decimals: int) -> str:
    """value rounded to `decimals` decimals, in its shortest spelling ('0' for zero)."""
    rounded = round(float(value), decimals)
    if rounded == 0:
        return "0"
    text = repr(rounded)
    return text[:-2] if text.endswith(".0") else text


def _feature_scales(card: dict) -> list[float]:
    """Per feature (card order), the largest |value| in its training range or categories, at least 1."""
    scales = []
    for name in card["features"]:
        seen = card["ranges"].get(name) or card["categories"].get(name) or ()
        finite = [abs(v) for v in seen if v is not None and math.isfinite(v)]
        scales.append(max([1.0, *finite]))
    return scales


def slim_model_text(text: str, card: dict) -> str:
    """LightGBM model text with leaf values, linear-leaf constants and coefficients rounded to the steps
    above, thresholds in their shortest exact spelling and the tree offsets (tree_sizes) dropped; everything
    else verbatim, so it stays LightGBM's own format. Applying it twice changes nothing."""
    decimals = [max(0, math.ceil(-math.log10(COEFF_TOLERANCE / s))) for s in _feature_scales(card)]
    head, sep, tail = text.partition("\nparameters:\n")
    lines, leaf_features = [], []
    for line in head.split("\n"):
        key, eq, values = line.partition("=")
        eq = eq and values  # a one-leaf tree has empty split lists: kept as they are
        if eq and key in ("leaf_value", "leaf_const"):
            line = key + "=" + " ".join(_fixed(v, VALUE_DECIMALS) for v in values.split(" "))
        elif eq and key == "threshold":
            line = key + "=" + " ".join(repr(float(v)) for v in values.split(" "))
        elif eq and key == "leaf_features":
            leaf_features = values.split(" ")  # per leaf, separated by an empty item: aligned with leaf_coeff
        elif eq and key == "leaf_coeff":
            coeffs = values.split(" ")
            if len(coeffs) != len(leaf_features):
                raise ValueError("leaf_coeff does not line up with leaf_features")
            line = key + "=" + " ".join(c and _fixed(c, decimals[int(f)]) for c, f in zip(coeffs, leaf_features))
        elif eq and key == "tree_sizes":
            continue  # byte offsets of the trees, which rounding shortens (LightGBM parses without them)
        lines.append(line)
    return "\n".join(lines) + sep + tail


def gzip_text(text: str) -> bytes:
    """text as gzip bytes that depend on nothing but the text (and the zlib that compresses it): no file
    name and time 0 in the header."""
    return gzip.compress(text.encode("utf-8"), compresslevel=GZIP_LEVEL, mtime=0)


def _card(model, text: str) -> dict:
    """The model's card with unbounded ranges written as null (JSON has no infinity) and the hash of the
    model text it describes."""
    card = dict(model.card_)
    card["ranges"] = {k: [None if abs(v) == float("inf") else v for v in lohi] for k, lohi in card["ranges"].items()}
    card["text_sha256"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return card


def publish(out, models: list, training_data: list[dict], created: str | None = None, extra: dict | None = None):
    """Write a bundle directory from fitted EtaRegressors and return the loaded, verified Bundle.

    training_data: [{'file', 'sha256', 'rows', 'sweeps'}]; extra: devices,
    families, rules, metrics ... merged into the manifest.
    """
    out = Path(out)
    if out.exists() and not (out / MANIFEST).is_file() and any(out.iterdir()):
        raise KernelsightError(f"{out}: exists and is not a bundle; refusing to overwrite it")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    files, entries = {}, {}
    try:
        for m in sorted(models, key=lambda m: model_key(m.tier, m.family, m.device)):
            key = model_key(m.tier, m.family, m.device)
            base = f"models/{key}"
            text = slim_model_text(m.model_text_, m.card_)
            for rel, data in ((f"{base}.txt.gz", gzip_text(text)),
                              (f"{base}.json", canonical_json(_card(m, text)).encode("utf-8"))):
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                files[rel] = hashlib.sha256(data).hexdigest()
            entries[key] = {"tier": m.tier, "family": m.family, "device": m.device, "rows": m.card_["rows"],
                            "model": f"{base}.txt.gz", "card": f"{base}.json"}
        data = sorted(training_data, key=lambda d: d["file"])
        features = {tier: {fam: feature_names(fam, tier) for fam in sorted({m.family for m in models
                                                                           if m.tier == tier})}
                    for tier in sorted({m.tier for m in models})}
        manifest = {
            "format": FORMAT, "schema_version": SCHEMA_VERSION, "code_version": package_version(),
            "created": creation_time(created), "training_data": data,
            "devices": {}, "families": {}, "metrics": {}, **(extra or {}),
            "features": features,
            "libraries": {**{lib: package_version(lib) for lib in LIBRARIES}, "python": platform.python_version()},
            "models": entries, "files": files,
        }
        manifest = json.loads(canonical_json(manifest))  # hashed as a reader will parse it
        manifest["content_id"] = content_id(manifest)
        (tmp / MANIFEST).write_text(canonical_json(manifest), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return load_bundle(out)
