"""The public datasets the importers convert, and counts of the committed data.

convert_datasets converts one dataset (or all) in memory; nothing is written
until every requested dataset converted, so a bad input leaves the output
folder as it was. summarize counts rows per device and family.
`kernelsight import` and `kernelsight data` (cli/data.py) print and write them.
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
from .common import ImportResult

IMPORTERS = {m.DATASET: m for m in (aiconfigurator, vidur, neusight)}
SUMMARY_COLUMNS = ["device", "family", "status", "flags", "source"]


def convert_datasets(dataset: str, src: Path, progress=None) -> list[tuple[str, ImportResult, float]]:
    """(name, conversion, seconds) of `dataset` (or every dataset for 'all', each in <src>/<name>/).
    progress: a tqdm-like factory, handed to each importer for a bar over its files; or None."""
    if dataset != "all" and dataset not in IMPORTERS:
        raise KernelsightError(f"dataset={dataset}: unknown{did_you_mean(dataset, [*IMPORTERS, 'all'])}; "
                               f"choose one of {', '.join(IMPORTERS)} or all")
    if not src.is_dir():
        raise KernelsightError(f"src={src}: no such directory (give the dataset's folder, or for dataset=all "
                               f"a folder holding {', '.join(f'{d}/' for d in IMPORTERS)})")
    names = list(IMPORTERS) if dataset == "all" else [dataset]
    converted = []
    for name in names:
        folder = src / name if dataset == "all" or (src / name).is_dir() else src
        start = time.perf_counter()
        converted.append((name, IMPORTERS[name].convert(folder, progress), time.perf_counter() - start))
    return converted


def data_roots(path=None) -> list[Path]:
    """`path`, or the committed data/public/ and data/sweeps/."""
    if path:
        return [Path(str(path))]
    roots = [data_dir() / d for d in ("public", "sweeps") if (data_dir() / d).is_dir()]
    if not roots:
        raise KernelsightError(f"{data_dir()}: holds neither public/ nor sweeps/ (run `kernelsight import` "
                               f"or a sweep first, or pass path=)")
    return roots


def count_rows(roots: list[Path]) -> pd.DataFrame:
    """summarize() of every sweep file under `roots`."""
    # only the columns the summary needs: whole sweeps take seconds per million rows to read into pandas
    frames = [read_sweep(f, columns=SUMMARY_COLUMNS) for root in roots for f in sweep_files(root)]
    return summarize(pd.concat(frames, ignore_index=True))


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
