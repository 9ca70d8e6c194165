"""Write η bundles (the reader is kernelsight.predictor.bundle): byte-identical for the same inputs.

Everything is sorted, JSON is written with sorted keys, model text is
LightGBM's deterministic dump, and the only time in the bundle is the
manifest's `created`, which the caller pins (config `created=`, or the
SOURCE_DATE_EPOCH convention of reproducible builds); the content itself is
named by `content_id`, a hash over every file and the training data.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from kernelsight.predictor.bundle import FORMAT, MANIFEST, SCHEMA_VERSION, load_bundle, model_key, sha256_file
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


def _dump(obj) -> str:
    return json.dumps(obj, sort_keys=True, indent=1, allow_nan=False) + "\n"


def _card(model) -> dict:
    """The model's card with unbounded ranges written as null (JSON has no infinity)."""
    card = dict(model.card_)
    card["ranges"] = {k: [None if abs(v) == float("inf") else v for v in lohi] for k, lohi in card["ranges"].items()}
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
            for rel, text in ((f"{base}.txt", m.model_text_), (f"{base}.json", _dump(_card(m)))):
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
                files[rel] = sha256_file(target)
            entries[key] = {"tier": m.tier, "family": m.family, "device": m.device, "rows": m.card_["rows"],
                            "model": f"{base}.txt", "card": f"{base}.json"}
        data = sorted(training_data, key=lambda d: d["file"])
        content = hashlib.sha256(_dump({"files": files, "training_data": data}).encode()).hexdigest()
        features = {tier: {fam: feature_names(fam, tier) for fam in sorted({m.family for m in models
                                                                           if m.tier == tier})}
                    for tier in sorted({m.tier for m in models})}
        manifest = {
            "format": FORMAT, "schema_version": SCHEMA_VERSION, "code_version": package_version(),
            "created": creation_time(created), "content_id": content, "training_data": data,
            "devices": {}, "families": {}, "metrics": {}, **(extra or {}),
            "features": features,
            "libraries": {**{lib: package_version(lib) for lib in LIBRARIES}, "python": platform.python_version()},
            "models": entries, "files": files,
        }
        (tmp / MANIFEST).write_text(_dump(manifest), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return load_bundle(out)
