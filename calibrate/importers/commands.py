"""`kernelsight import` and `kernelsight data`: convert public data, and count what is committed.

Both are Hydra command functions (see predictor/cli.py); their settings live in
conf/import.yaml and conf/data.yaml.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pandas as pd

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.paths import data_dir
from kernelsight.predictor.sweep import read_sweep, sweep_files

from . import aiconfigurator, neusight, vidur
from .common import format_report, write_public

IMPORTERS = {m.DATASET: m for m in (aiconfigurator, vidur, neusight)}


def import_dataset(cfg) -> pd.DataFrame:
    """Convert one dataset (or all) into <out>/<dataset>/; print and return the kept/flagged/rejected report.

    Every requested dataset is converted before anything is written, so a bad
    input leaves the output folder as it was.
    """
    dataset = str(cfg.dataset)
    if dataset != "all" and dataset not in IMPORTERS:
        raise KernelsightError(f"dataset={dataset}: unknown{did_you_mean(dataset, [*IMPORTERS, 'all'])}; "
                               f"choose one of {', '.join(IMPORTERS)} or all")
    src = Path(str(cfg.src))
    if not src.is_dir():
        raise KernelsightError(f"src={src}: no such directory (give the dataset's folder, or for dataset=all "
                               f"a folder holding {', '.join(f'{d}/' for d in IMPORTERS)})")
    names = list(IMPORTERS) if dataset == "all" else [dataset]
    converted = []
    for name in names:
        folder = src / name if dataset == "all" or (src / name).is_dir() else src
        start = time.perf_counter()
        converted.append((name, IMPORTERS[name].convert(folder), time.perf_counter() - start))
    out = Path(str(cfg.out))
    reports = []
    for name, result, seconds in converted:
        start = time.perf_counter()
        files = write_public(result, out, IMPORTERS[name].CONVERSION)
        size = sum(f.stat().st_size for f in files) / 2**20
        print(format_report(result))
        print(f"wrote {len(files)} files ({size:.1f} MiB) to {out / name} "
              f"[convert {seconds:.1f} s, write {time.perf_counter() - start:.1f} s]\n")
        reports.append(result.report())
    return pd.concat(reports, ignore_index=True)


def data_summary(cfg) -> pd.DataFrame:
    """Rows per device and family (ok / flagged / total) in the committed data or in `path`."""
    if cfg.get("path"):
        roots = [Path(str(cfg.path))]
    else:
        roots = [data_dir() / d for d in ("public", "sweeps") if (data_dir() / d).is_dir()]
        if not roots:
            raise KernelsightError(f"{data_dir()}: holds neither public/ nor sweeps/ (run `kernelsight import` "
                                   f"or a sweep first, or pass path=)")
    # only the columns the summary needs: whole sweeps take seconds per million rows to read into pandas
    frames = [read_sweep(f, columns=SUMMARY_COLUMNS) for root in roots for f in sweep_files(root)]
    summary = summarize(pd.concat(frames, ignore_index=True))
    print(f"rows in {', '.join(map(str, roots))}")
    print(summary.to_string(index=False))
    return summary


SUMMARY_COLUMNS = ["device", "family", "status", "flags", "source"]


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per device and family: ok (unflagged), flagged (eta_lt_1, throttled, ...), failed, total; plus sources."""
    ok = df["status"].eq("ok").to_numpy()
    flagged = df["flags"].fillna("").ne("").to_numpy()
    counts = pd.DataFrame({"device": df["device"], "family": df["family"], "ok": ok & ~flagged,
                           "flagged": ok & flagged, "failed": ~ok})
    out = counts.groupby(["device", "family"], sort=True).agg(
        ok=("ok", "sum"), flagged=("flagged", "sum"), failed=("failed", "sum"), total=("ok", "size"))
    pairs = df[["device", "family", "source"]].drop_duplicates()
    pairs["source"] = pairs["source"].map({s: re.sub(r"^import:|@.*$", "", s) for s in pairs["source"].unique()})
    out["sources"] = pairs.groupby(["device", "family"])["source"].agg(lambda s: ", ".join(sorted(set(s))))
    out = out.reset_index()
    total = {c: int(out[c].sum()) for c in ("ok", "flagged", "failed", "total")}
    total = pd.DataFrame([{"device": "all", "family": "all", **total,
                           "sources": ", ".join(sorted(set(pairs["source"])))}])
    return pd.concat([out, total], ignore_index=True)
