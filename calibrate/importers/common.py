"""What every public-data importer shares: reading inputs, checking rows, pricing, writing.

An importer maps its source files onto *candidate* rows of the sweep contract
(predictor/sweep.py) plus two bookkeeping columns: `reject` (why the row cannot
be used, None when it can) and `where` (file and row, to point at an example).
`finish` then rejects rows with a non-positive or missing latency or an invalid
shape (using the families' own field rules), prices the rest with the cost model
(`with_cost`), and flags rows measured faster than their roofline on the
device's catalog entry (η < 1: `eta_lt_1`); those are kept, never dropped.
`write_public` writes one Parquet file per device plus the dataset's LICENSE
and SOURCE.md, deterministically (sorted rows, no timestamps).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import SHAPE_COLUMNS, get_family
from kernelsight.predictor.hardware import load_hardware, resolve_device
from kernelsight.predictor.outputs import write_text
from kernelsight.predictor.roofline import roofline_frame
from kernelsight.predictor.sweep import COLUMNS, with_cost, write_sweep

ETA_LT_1 = "eta_lt_1"
BOOKKEEPING = ("reject", "where")
# Row order of the written files: provenance, kernel identity, shape, then latency.
SORT_KEY = ["sweep_id", "family", "provider", "dtype", "kv_dtype", *SHAPE_COLUMNS, "cuda_graph", "latency_ms"]


@dataclass(frozen=True)
class SourceInfo:
    """Provenance of a dataset folder, parsed from its SOURCE.md."""

    dataset: str
    folder: Path
    url: str
    commit: str
    license: str

    @property
    def version(self) -> str:
        """The 8-character commit that names the import: source = import:<dataset>@<version>."""
        return self.commit[:8]

    @property
    def source(self) -> str:
        return f"import:{self.dataset}@{self.version}"


def read_source_info(folder: Path, dataset: str) -> SourceInfo:
    """SOURCE.md must name the upstream repository, its commit and license; LICENSE must exist."""
    folder = Path(folder)
    if not folder.is_dir():
        raise KernelsightError(f"{folder}: no such {dataset} folder")
    note = folder / "SOURCE.md"
    if not note.is_file():
        raise KernelsightError(f"{note}: missing (every imported dataset needs its SOURCE.md)")
    if not (folder / "LICENSE").is_file():
        raise KernelsightError(f"{folder / 'LICENSE'}: missing (every imported dataset needs its license)")
    text = note.read_text(encoding="utf-8")
    found = re.search(r"Source:\s*(\S+)\s+at commit\s+([0-9a-f]{40})", text)
    if not found:
        raise KernelsightError(f"{note}: no 'Source: <repository> at commit <40 hex digits>' line")
    if found.group(1).rstrip("/").rsplit("/", 1)[-1].lower() != dataset:
        raise KernelsightError(f"{note}: names {found.group(1)}, not the {dataset} repository (wrong folder?)")
    lic = re.search(r"\(([A-Za-z0-9.\-]+), see LICENSE\)", text)
    if not lic:
        raise KernelsightError(f"{note}: no '(<license>, see LICENSE)' note")
    return SourceInfo(dataset, folder, found.group(1), found.group(2), lic.group(1))


def read_table(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """A CSV or Parquet input with at least `columns`; bad files fail with one line naming the file."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            df = pq.read_table(path).to_pandas()
        else:
            df = pd.read_csv(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise KernelsightError(f"{path}: not a readable Parquet file (truncated or corrupt?): "
                               f"{str(e).splitlines()[0]}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise KernelsightError(f"{path}: not a readable CSV file: {str(e).splitlines()[0]}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KernelsightError(f"{path}: missing column(s) {', '.join(missing)}")
    return df


def row_locations(path: Path, n: int) -> np.ndarray:
    """'file line N' (CSV, header = line 1) or 'file row N' (Parquet) for each of n rows."""
    if Path(path).suffix == ".parquet":
        return np.asarray([f"{path} row {i}" for i in range(n)], dtype=object)
    return np.asarray([f"{path} line {i + 2}" for i in range(n)], dtype=object)


def resolve_devices(raw: Iterable) -> dict:
    """Raw device name -> (catalog key or None, reason when unknown)."""
    out = {}
    for name in sorted(set(raw), key=str):
        try:
            out[name] = (resolve_device(str(name)), None)
        except KernelsightError:
            out[name] = (None, f"unknown device {name!r} (not in the hardware catalog)")
    return out


def assign_devices(names: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Per row: the catalog key of its raw device name (None when unknown) and why not (None when known)."""
    known = resolve_devices(names)
    return names.map(lambda n: known[n][0]), names.map(lambda n: known[n][1])


def first_reason(*reasons) -> np.ndarray:
    """Element-wise the first reason that is set (None/NaN: not set), None where none is."""
    out = np.full(len(reasons[0]), None, dtype=object)
    for r in reasons:
        r = np.asarray(r, dtype=object)
        take = pd.isna(out) & ~pd.isna(r)
        out[take] = r[take]
    return out


def candidates(count: int, /, **columns) -> pd.DataFrame:
    """A frame of `count` candidate rows: the given columns (scalars broadcast), bookkeeping included."""
    df = pd.DataFrame({k: (v if np.ndim(v) else [v] * count) for k, v in columns.items()}, index=range(count))
    for col in BOOKKEEPING:
        if col not in df.columns:
            df[col] = None
    return df


# -- checking and pricing ------------------------------------------------------

def shape_problems(family: str, part: pd.DataFrame) -> np.ndarray:
    """Per row: why its shape is invalid under the family's own rules, or None."""
    fam = get_family(family)
    reasons = fam.violations({c: part[c].to_numpy() for c in fam.columns if c in part.columns})
    reasons[reasons != None] = ["invalid shape: " + r for r in reasons[reasons != None]]  # noqa: E711
    return reasons


@dataclass
class ImportResult:
    """Kept rows (sweep contract, priced and flagged), rejected rows (device, family, reason, where)."""

    info: SourceInfo
    rows: pd.DataFrame
    rejected: pd.DataFrame
    notes: tuple = ()
    sweeps: dict | None = None  # sweep_id -> facts about it (versions, settings) for the file metadata

    def report(self) -> pd.DataFrame:
        """Per device and family: kept, flagged (η < 1), rejected."""
        kept = self.rows.assign(flagged=self.rows["flags"].str.contains(ETA_LT_1, regex=False))
        a = kept.groupby(["device", "family"]).agg(kept=("family", "size"), flagged=("flagged", "sum"))
        b = self.rejected.groupby(["device", "family"]).size().rename("rejected")
        out = pd.concat([a, b], axis=1).fillna(0).astype(int).reset_index()
        out.insert(0, "dataset", self.info.dataset)
        return out.sort_values(["device", "family"], ignore_index=True)

    def reasons(self) -> pd.DataFrame:
        """Rejected rows counted per device, family and reason, with the first example's location."""
        if self.rejected.empty:
            return pd.DataFrame(columns=["device", "family", "reason", "rows", "example"])
        g = self.rejected.groupby(["device", "family", "reason"], sort=True)
        return g.agg(rows=("where", "size"), example=("where", "first")).reset_index()


def finish(info: SourceInfo, cands: pd.DataFrame, notes: Iterable[str] = (),
           sweeps: dict | None = None) -> ImportResult:
    """Reject unusable rows, price the rest, flag η < 1, fill provenance."""
    df = cands.reset_index(drop=True)
    reject = first_reason(df["reject"])
    lat = pd.to_numeric(df["latency_ms"], errors="coerce").to_numpy(dtype=np.float64)
    open_ = reject == None  # noqa: E711
    reject[open_ & ~(lat > 0)] = "latency not positive or missing"
    for family, idx in df[reject == None].groupby("family", sort=True).groups.items():  # noqa: E711
        problems = shape_problems(family, df.loc[idx])
        reject[np.asarray(idx)[problems != None]] = problems[problems != None]  # noqa: E711
    df["reject"] = reject
    ok = df[reject == None].drop(columns="reject")  # noqa: E711  ('where' stays for late rejections)
    ok = ok.assign(source=info.source, timing="unknown", status="ok", flags="",
                   cuda_graph=ok["cuda_graph"].eq(True) if "cuda_graph" in ok.columns else False)
    ok, late = _price(ok)
    rejected = df[df["reject"].notna()]
    if late is not None:
        rejected = pd.concat([rejected, late], ignore_index=True)
    rejected = pd.DataFrame({"device": rejected["device"].fillna(rejected["device_name"]).astype(str),
                             "family": rejected["family"].astype(str),
                             "reason": rejected["reject"].astype(str),
                             "where": rejected["where"].astype(str)})
    return ImportResult(info, _sorted(ok), rejected.reset_index(drop=True), tuple(notes), sweeps)


def _price(df: pd.DataFrame):
    """flops/bytes/blocks from the cost model; flags from η = latency / roofline on the device.

    A (device, family, dtype) group whose roofline cannot be formed (the catalog
    has no peak for that dtype on that GPU) is rejected with the catalog's reason.
    """
    if df.empty:
        return df, None
    df = with_cost(df)
    eta = np.full(len(df), np.nan)
    late = []
    keep = np.ones(len(df), dtype=bool)
    for (device, family, dtype), idx in df.groupby(["device", "family", "dtype"], sort=True).groups.items():
        pos = df.index.get_indexer(idx)
        try:
            roof = roofline_frame(df.loc[idx], load_hardware(device))
        except KernelsightError as e:
            keep[pos] = False
            late.append(df.loc[idx].assign(reject=f"no roofline: {e}"))
            continue
        eta[pos] = df.loc[idx, "latency_ms"].to_numpy(dtype=np.float64) / 1e3 / roof["t_roof"].to_numpy()
    df["flags"] = np.where(eta < 1.0, ETA_LT_1, "")
    return df[keep], (pd.concat(late) if late else None)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    """Exactly the schema's columns, in a deterministic row order."""
    df = df.reindex(columns=list(COLUMNS))
    return df.sort_values(SORT_KEY, kind="mergesort", na_position="first", ignore_index=True)


# -- writing -------------------------------------------------------------------

def write_public(result: ImportResult, out: Path, conversion: str) -> list[Path]:
    """data/public/<dataset>/<device>.parquet per device, plus LICENSE and an extended SOURCE.md.

    Files of devices this import no longer produces are removed, so the folder
    always matches exactly one conversion.
    """
    info = result.info
    folder = Path(out) / info.dataset
    written = []
    for device, part in result.rows.groupby("device", sort=True):
        env = {"dataset": info.dataset, "source": info.source, "repository": info.url,
               "commit": info.commit, "license": info.license, "device": device,
               "device_name": sorted(part["device_name"].astype(str).unique()),
               "sweeps": {s: (result.sweeps or {}).get(s, {}) for s in sorted(part["sweep_id"].unique())},
               "timing": "unknown (imported)"}
        written.append(write_sweep(part[list(COLUMNS)].reset_index(drop=True), folder / f"{device}.parquet", env))
    for stale in sorted(folder.glob("*.parquet")):
        if stale not in written:
            stale.unlink()
    write_text(folder / "LICENSE", (info.folder / "LICENSE").read_text(encoding="utf-8"))
    note = (info.folder / "SOURCE.md").read_text(encoding="utf-8").rstrip("\n")
    write_text(folder / "SOURCE.md", f"{note}\n\n## Conversion by kernelsight\n\n{conversion.strip()}\n\n"
                                     f"{_markdown_report(result)}")
    return written


def _markdown_report(result: ImportResult) -> str:
    rep = result.report()
    lines = ["Rows per device and family (flagged: measured faster than the roofline, kept):", "",
             "| device | family | kept | flagged | rejected |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r.device} | {r.family} | {r.kept} | {r.flagged} | {r.rejected} |" for r in rep.itertuples()]
    reasons = result.reasons()
    if not reasons.empty:
        lines += ["", "Rejected rows by reason:", ""]
        lines += [f"- {r.device} {r.family}: {r.rows} x {r.reason}" for r in reasons.itertuples()]
    return "\n".join(lines) + "\n"


def format_report(result: ImportResult) -> str:
    """The printed report: per device and family kept / flagged / rejected, then rejection reasons."""
    rep = result.report()
    head = (f"{result.info.dataset} ({result.info.source}): {int(rep.kept.sum())} rows kept, "
            f"{int(rep.flagged.sum())} flagged eta<1, {int(rep.rejected.sum())} rejected")
    table = rep.drop(columns="dataset").to_string(index=False) if not rep.empty else "(no rows)"
    lines = [head, table]
    reasons = result.reasons()
    if not reasons.empty:
        lines.append("rejected:")
        lines += [f"  {r.device} {r.family}: {r.rows} x {r.reason} (e.g. {r.example})"
                  for r in reasons.itertuples()]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
