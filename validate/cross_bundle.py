"""The cross-device tier's η bundle: `calibrate publish` without some GPUs, cached and rebuilt when stale.

A cached bundle is current while its manifest records the data (file hashes),
calibration settings, features and code version the current configuration
would fit it with; any difference names what changed.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from kernelsight.calibrate import rows as calibration_rows
from kernelsight.calibrate.bundle import data_label, package_version
from kernelsight.calibrate.pipeline import CalibrationSettings, build_settings, shipped_settings
from kernelsight.predictor.bundle import locate_bundle, sha256_file
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.features import feature_names

PINNED_CREATED = "2000-01-01T00:00:00Z"  # the bundle depends on its inputs only


def resolve_bundle(value) -> str | None:
    """None (the shipped default), a bundle directory, or a bundle name: shipped under data/artifacts/,
    else built on demand into the user cache (predictor.bundle.locate_bundle), never into the package."""
    if value is None:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.exists() else locate_bundle(value))


def cross_bundle_settings(path: str, exclude: list[str], seed: int) -> CalibrationSettings:
    """The shipped `calibrate publish` settings on every calibration GPU except `exclude`, writing to `path`.
    It is evaluated leave-one-GPU-out on those GPUs (report beside it in `path`-report, no plots, no extra
    protocols) for its kernel intervals: a validated GPU's ranges come from the other GPUs' residuals only."""
    import pyarrow.parquet as pq

    files = calibration_rows.input_files(None)
    devices = sorted({d for f in files for d in pq.read_table(f, columns=["device"]).column(0).to_pylist()}
                     - set(exclude))
    if not devices:
        raise KernelsightError(f"no calibration GPUs left after excluding {', '.join(exclude)}")
    shipped = shipped_settings()
    evaluation = {**shipped.evaluation, "plots": False, "holdouts": {}}
    return replace(shipped, bundle=path, seed=seed, devices=devices, evaluation=evaluation,
                   out=f"{path}-report", created=PINNED_CREATED)


def stale_reason(settings: CalibrationSettings) -> str:
    """Why the bundle at settings.bundle must be (re)built ('' when it is current)."""
    files = calibration_rows.input_files(settings.paths)
    expected = {**build_settings(settings), "code_version": package_version(),
                "training_data": {data_label(f): sha256_file(f) for f in files}}
    manifest_path = Path(settings.bundle) / "manifest.json"
    if not manifest_path.is_file():
        return "not built yet"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        found = {**{k: manifest.get(k) for k in ("rules", "learner", "code_version")},
                 "training_data": {d["file"]: d["sha256"] for d in manifest.get("training_data", ())}}
        fitted = {(tier, family): names for tier, families in (manifest.get("features") or {}).items()
                  for family, names in families.items()}
        features_changed = any(names != feature_names(family, tier) for (tier, family), names in fitted.items())
    except (ValueError, TypeError, KeyError, AttributeError):
        return "its manifest is unreadable: rebuilding"
    changed = [k for k in expected if found.get(k) != expected[k]] + (["features"] if features_changed else [])
    if changed:
        return f"{' and '.join(changed)} changed since it was built: rebuilding"
    return "" if manifest.get("intervals") else "it has no kernel intervals (built without evaluation): rebuilding"
