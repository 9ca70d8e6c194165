"""The sweep data contract: one Parquet row per measured kernel configuration.

Schema version 1. Columns (shape columns are nullable: a row fills those of its
family, see families/):
  identity    family, provider, dtype, kv_dtype
  shape       SHAPE_COLUMNS (union over families)
  cost        flops, bytes, blocks            (from predictor's cost model)
  latency     latency_ms (median), latency_p10_ms, latency_p90_ms, samples
  timing      timing ('cold' | 'hot' L2, 'unknown' for imports), cuda_graph
  energy      energy_j (per call), power_w (mean)
  device      device (catalog key), device_name (as the driver reported it)
  provenance  source ('measured' | 'import:<dataset>@<version>'), sweep_id
  quality     status ('ok' | 'failed' | 'mismatch'), flags (comma-separated:
              eta_lt_1, throttled, ...), error (why a row failed)
File metadata: kernelsight.schema_version and kernelsight.environment (JSON).
A sweep is one file or a directory of shard files (*.parquet).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import KernelsightError, did_you_mean
from .families import REGISTRY, SHAPE_COLUMNS, get_family
from .hardware import list_hardware, resolve_device
from .outputs import atomic_file

SCHEMA_VERSION = 1
META_VERSION = b"kernelsight.schema_version"
META_ENV = b"kernelsight.environment"

STATUSES = ("ok", "failed", "mismatch")
TIMINGS = ("cold", "hot", "unknown")
# Devices a sweep may name besides the hardware catalog's keys: CPU-mode sweeps of the harness
# (microbench.environment.CPU_DEVICE), which exercise the pipeline but price nothing.
NON_CATALOG_DEVICES = ("cpu",)


def _shape_type(name: str) -> pa.DataType:
    for fam in REGISTRY.values():
        for f in fam.fields:
            if f.name == name:
                return {"pos": pa.int64(), "nonneg": pa.int64(), "bool": pa.bool_()}.get(f.kind, pa.string())
    raise KeyError(name)


_IDENTITY = [("family", pa.string()), ("provider", pa.string())]
_SHAPE = [(c, _shape_type(c)) for c in SHAPE_COLUMNS]
_REST = [
    ("flops", pa.float64()), ("bytes", pa.float64()), ("blocks", pa.float64()),
    ("latency_ms", pa.float64()), ("latency_p10_ms", pa.float64()), ("latency_p90_ms", pa.float64()),
    ("samples", pa.int64()),
    ("timing", pa.string()), ("cuda_graph", pa.bool_()),
    ("energy_j", pa.float64()), ("power_w", pa.float64()),
    ("device", pa.string()), ("device_name", pa.string()),
    ("source", pa.string()), ("sweep_id", pa.string()),
    ("status", pa.string()), ("flags", pa.string()), ("error", pa.string()),
]
SCHEMA = pa.schema([pa.field(n, t) for n, t in _IDENTITY + _SHAPE + _REST])
COLUMNS = tuple(SCHEMA.names)
REQUIRED = ("family", "provider", "device", "source", "sweep_id", "status", "latency_ms")
_DEFAULTS = {"timing": "unknown", "cuda_graph": False, "status": "ok", "flags": ""}


def with_cost(df: pd.DataFrame) -> pd.DataFrame:
    """Fill flops/bytes/blocks of every row from the cost model (validating the shapes)."""
    df = df.copy()
    for col in ("flops", "bytes", "blocks"):
        if col not in df.columns:
            df[col] = np.nan
    for family, part in df.groupby("family", sort=False):
        fam = get_family(family)
        cols = {c: part[c].to_numpy() for c in fam.columns if c in part.columns}
        cost = fam.cost(cols, index=part.index.to_numpy())
        df.loc[part.index, "flops"] = cost.flops
        df.loc[part.index, "bytes"] = cost.bytes
        df.loc[part.index, "blocks"] = cost.blocks
    return df


def conform(df: pd.DataFrame, where: str = "sweep") -> pd.DataFrame:
    """Check a frame against the contract and return it with exactly the schema's columns."""
    extra = [c for c in df.columns if c not in COLUMNS]
    if extra:
        raise KernelsightError(f"{where}: column(s) not in the sweep schema: {', '.join(map(str, extra))}")
    df = df.copy()
    for c, v in _DEFAULTS.items():
        df[c] = df[c].fillna(v) if c in df.columns else v
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise KernelsightError(f"{where}: missing required column(s): {', '.join(missing)}")
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    df = df[list(COLUMNS)]
    _check_values(df, where)
    return df


def _check_values(df: pd.DataFrame, where: str) -> None:
    def fail(mask, msg):
        i = df.index[np.flatnonzero(np.asarray(mask))[0]]
        raise KernelsightError(f"{where}: row {i}: {msg}")

    if df.empty:
        raise KernelsightError(f"{where}: no rows (a sweep file holds at least one measured configuration)")
    for col in ("family", "provider", "device", "source", "sweep_id"):
        if df[col].isna().any():
            fail(df[col].isna(), f"{col} is empty")
    unknown = ~df["family"].isin(list(REGISTRY))
    if unknown.any():
        bad = df["family"][unknown].iloc[0]
        fail(unknown, f"family = {bad!r}: unknown kernel family{did_you_mean(str(bad), REGISTRY)}; "
                      f"known: {', '.join(REGISTRY)}")
    _check_devices(df, fail)
    for col, allowed in (("status", STATUSES), ("timing", TIMINGS)):
        bad = ~df[col].isin(allowed)
        if bad.any():
            fail(bad, f"{col} = {df[col][bad].iloc[0]!r}: must be one of {list(allowed)}")
    lat = pd.to_numeric(df["latency_ms"], errors="coerce")
    ok = df["status"] == "ok"
    bad = ok & ~(lat > 0)
    if bad.any():
        fail(bad, f"latency_ms = {df['latency_ms'][bad].iloc[0]!r}: an ok row needs a positive latency")
    for family, part in df[ok].groupby("family", sort=False):
        fam = get_family(family)
        fam.validate({c: part[c].to_numpy() for c in fam.columns}, where=f"{where}: ",
                     index=part.index.to_numpy())


def _check_devices(df: pd.DataFrame, fail) -> None:
    """Every device is a hardware catalog key (an alias or raw device name is refused, naming the key)."""
    keys = list_hardware()
    unknown = ~df["device"].isin(keys + list(NON_CATALOG_DEVICES))
    if not unknown.any():
        return
    bad = df["device"][unknown].iloc[0]
    try:
        hint = f" (did you mean {resolve_device(str(bad))!r}?)"
    except KernelsightError:
        hint = did_you_mean(str(bad), keys)
    fail(unknown, f"device = {bad!r}: not a hardware catalog key{hint}")


def write_sweep(df: pd.DataFrame, path, environment: dict | None = None, setting: str = "out") -> Path:
    """Write a sweep file atomically (outputs.atomic_file): a temp file renamed into place, never a half file."""
    path = Path(path)
    table = _to_table(conform(df, where=str(path)), environment, str(path))
    with atomic_file(path, setting) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def _to_table(df: pd.DataFrame, environment: dict | None, where: str = "sweep") -> pa.Table:
    arrays = []
    for field in SCHEMA:
        col = df[field.name]
        if col.dtype == object and pa.types.is_integer(field.type):
            col = pd.to_numeric(col, errors="coerce")
        try:
            arrays.append(pa.array(col, type=field.type, from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise KernelsightError(f"{where}: column {field.name!r} does not fit {field.type}: "
                                   f"{str(e).splitlines()[0]}") from None
    meta = {META_VERSION: str(SCHEMA_VERSION).encode(),
            META_ENV: json.dumps(environment or {}, sort_keys=True, default=str).encode()}
    return pa.Table.from_arrays(arrays, schema=SCHEMA.with_metadata(meta))


def sweep_files(path) -> list[Path]:
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet") if not p.name.startswith("."))
        if not files:
            raise KernelsightError(f"{path}: directory holds no .parquet sweep files")
        return files
    if not path.exists():
        raise KernelsightError(f"{path}: no such file or directory")
    return [path]


def read_environment(path) -> dict:
    """The environment stored in a sweep file's metadata."""
    meta = _read_meta(Path(path))
    return json.loads(meta.get(META_ENV, b"{}"))


def _absent_shape_columns(path: Path, wanted) -> list:
    """Shape columns a file predates (a family gained a field later): read as null, which the family's
    default then fills."""
    names = set(pq.read_schema(path).names)
    return [c for c in wanted if c not in names]


def _read_meta(path: Path) -> dict:
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise KernelsightError(f"{path}: not a readable Parquet file (truncated or corrupt?): "
                               f"{str(e).splitlines()[0]}") from None
    meta = schema.metadata or {}
    if META_VERSION not in meta:
        raise KernelsightError(f"{path}: not a kernelsight sweep (no schema_version in the file metadata)")
    try:
        version = int(meta[META_VERSION])
    except ValueError:
        raise KernelsightError(f"{path}: schema_version {meta[META_VERSION]!r} is not a number") from None
    if version > SCHEMA_VERSION:
        raise KernelsightError(f"{path}: schema_version {version} is newer than this kernelsight reads "
                               f"({SCHEMA_VERSION}); upgrade kernelsight")
    missing = [c for c in COLUMNS if c not in schema.names and c not in SHAPE_COLUMNS]
    if missing:
        raise KernelsightError(f"{path}: missing column(s) {', '.join(missing)}")
    return meta


def read_sweep(path, validate: bool = True, columns=None, filters=None) -> pd.DataFrame:
    """Read a sweep file or directory of shards; refuse bad files with one clear line.

    columns: read only these (row validation then covers only what was read); filters: pyarrow
    row filters ([(column, op, value)]), applied while reading so unwanted rows never load.
    The environment of the first file is in `df.attrs['environment']`.
    """
    wanted = list(COLUMNS) if columns is None else list(columns)
    unknown = [c for c in wanted if c not in COLUMNS]
    if unknown:
        raise KernelsightError(f"{path}: not sweep column(s): {', '.join(map(str, unknown))}")
    frames, env = [], None
    for f in sweep_files(path):
        meta = _read_meta(f)
        try:
            if pq.read_metadata(f).num_rows == 0:
                raise KernelsightError(f"{f}: no rows (an empty sweep file)")
            absent = _absent_shape_columns(f, wanted)
            table = pq.read_table(f, columns=[c for c in wanted if c not in absent], filters=filters)
        except (pa.ArrowInvalid, OSError) as e:
            raise KernelsightError(f"{f}: not a readable Parquet file (truncated or corrupt?): "
                                   f"{str(e).splitlines()[0]}") from None
        frame = table.to_pandas()
        for c in absent:
            frame[c] = np.nan if _shape_type(c) == pa.int64() else None
        frame = frame[wanted] if absent else frame
        if validate and columns is None and (filters is None or len(frame)):
            # rows are numbered within their file (within what the filters kept of it)
            _check_values(frame, str(f) if filters is None else f"{f} (rows matching the filters)")
        frames.append(frame)
        if env is None:
            env = json.loads(meta.get(META_ENV, b"{}"))
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    df.attrs["environment"] = env or {}
    return df
