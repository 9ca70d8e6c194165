"""Kept rows: every simulated validation row saved as it finishes, so an interrupted run loses nothing.

Simulating a validation set takes many minutes; the host-term fit and the
report need every row. Each row's step log (run.StepLog: what the fit and the
scores are computed from) is written atomically to its own file in a folder
beside the per-row table, `<table>.parts/<tier>-row<line>.npz` (NumPy arrays
plus one JSON string; loaded without pickle). The file holds a key: a hash of
everything that decides the simulation (the row's configuration, its model
config, the tier and its η bundle's content id, the protocol, the engine
mapping, the request count, the package version). A later run with the same
key reuses the log instead of simulating the row again; any other key (a
changed setting, another CSV whose row has that line number) simulates the
row and replaces the file. An unreadable file counts as not kept.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

from kernelsight.predictor.bundle import default_bundle_dir
from kernelsight.predictor.outputs import atomic_file, ensure_dir

from .run import StepLog

SUFFIX = ".parts"


def parts_dir(table) -> Path:
    """Where the rows of the per-row table `table` are kept: <table without suffix>.parts/."""
    return Path(table).with_suffix(SUFFIX)


def bundle_manifest(tier) -> dict:
    """The manifest of the tier's η bundle, read without loading its models ({} for roofline pricing, or a
    bundle not built yet)."""
    if tier.predictor_tier == "roofline":
        return {}
    manifest = (Path(tier.bundle) if tier.bundle else default_bundle_dir()) / "manifest.json"
    try:
        found = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _bundle_identity(tier) -> str | None:
    """The content id of the tier's η bundle (None for roofline pricing, or a bundle not built yet)."""
    return bundle_manifest(tier).get("content_id")


def row_key(row, model, tier, settings, num_requests) -> str:
    """A hash of everything that decides a row's simulation (the measured TTFT and TPOT do not)."""
    from kernelsight.calibrate.bundle import package_version

    config = {k: v for k, v in dataclasses.asdict(row).items() if k not in ("ttft_ms", "tpot_ms")}
    # the engine profile's serving_error says how far runs are from real ones; it changes no run
    settings = dataclasses.replace(settings, engine={k: v for k, v in settings.engine.items() if k != "serving_error"})
    what = {"row": config, "model": repr(model), "tier": [tier.name, tier.predictor_tier, tier.bundle],
            "bundle": _bundle_identity(tier), "settings": repr(settings), "num_requests": num_requests,
            "version": package_version()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _plain(value):
    """JSON for numpy scalars in a run summary."""
    return value.item() if hasattr(value, "item") else str(value)


class RowStore:
    """The kept step logs of one per-row table; counts what it reused and what it holds for this run."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.reused = 0  # rows loaded instead of simulated
        self.kept = 0    # rows of this run on disk (reused or written)

    def _path(self, row, tier) -> Path:
        return self.folder / f"{tier.name}-{row.key}.npz"

    def get(self, job: tuple) -> StepLog | None:
        """The kept log of a simulate_row job (row, model, tier, settings, num_requests), if its key matches."""
        row, _, tier, _, _ = job
        path = self._path(row, tier)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta.pop("key") != row_key(*job):
                    return None
                arrays = {f: data[f] for f in data.files if f != "meta"}
            log = StepLog(**arrays, **meta)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
            return None
        log.warnings = tuple(log.warnings)
        self.reused += 1
        self.kept += 1
        return log

    def put(self, job: tuple, log: StepLog) -> None:
        """Keep the log of a finished job (atomically: a file is whole or absent)."""
        row, _, tier, _, _ = job
        arrays, meta = {}, {"key": row_key(*job)}
        for f in dataclasses.fields(log):
            value = getattr(log, f.name)
            if isinstance(value, np.ndarray):
                arrays[f.name] = value
            else:
                meta[f.name] = list(value) if isinstance(value, tuple) else value
        ensure_dir(self.folder, "table")
        with atomic_file(self._path(row, tier), "table") as tmp, open(tmp, "wb") as f:
            np.savez_compressed(f, meta=np.array(json.dumps(meta, default=_plain)), **arrays)
        self.kept += 1
