"""Which measured rows calibration uses, by stated rules, with counts of what each rule removed.

Rules, in order (each row is counted under the first rule that removes it):

1. status: only 'ok' rows; 'failed' and 'mismatch' rows are excluded.
2. throttled: rows flagged 'throttled' (clocks dropped while timing) are excluded.
3. excluded sweep: sweep ids containing an `exclude_sweeps` substring, for
   setups the features cannot tell apart (Vidur's pairwise_nvlink nodes: pairs
   of NVLink GPUs joined by a slower network, labelled like the DGX rows).
4. sweep: per (device, family) ONE dataset is used, for both tiers: the first
   source in the order of `family_sources[family]` then `prefer_sources`
   (substrings of the source: our own sweeps are 'measured', imports
   'import:aiconfigurator@...'), then the most rows. Within
   it, sweep ids are '<series>-<version>' (aiconfigurator/h100_sxm/vllm-0.24.0)
   and only the newest version of each series is kept; unversioned series are
   shards of one campaign (Vidur's per-model profiles, NeuSight's train/test)
   and are kept together.
5. provider: per (device, family) and kernel variant (dtype and the other
   categorical shape fields: op, kv_dtype, link, ...) the provider with the
   most rows (the engine's default kernel: torch.F.linear for bf16 GEMMs,
   per-tensor CUTLASS for fp8, FA3 on Hopper, ...) unless `providers` names
   one per family (collectives: NCCL, the implementation every dataset
   measured; a variant without it is excluded) or `prefer_providers` lists
   some (the first the variant has; the most rows when it has none); rows of
   other providers (block-scaled fp8, alternative attention backends, vLLM's
   custom all-reduce, eager PyTorch norms beside Triton ones) are excluded.
6. η < 1 rows (measured faster than the roofline: L2-resident operands,
   split-K GEMMs beating the wave-quantized bound) are KEPT: models learn log η
   as measured, predictions are floored at η_floor (1 by default), and the
   evaluation scores them against the measurement, so the floor's cost shows.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import get_family
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.paths import data_dir
from kernelsight.predictor.roofline import roofline_frame
from kernelsight.predictor.sweep import read_sweep, sweep_files

_VERSION = re.compile(r"^(?P<series>.*?)[-_@]v?(?P<version>\d+(?:\.\d+)*)$")


def default_inputs() -> list[Path]:
    """The committed data: data/public (imports) and data/sweeps (our harness), where present."""
    return [p for p in (data_dir() / "public", data_dir() / "sweeps") if p.is_dir()]


def input_files(paths) -> list[Path]:
    """Every sweep file under the given files/directories, sorted, each once."""
    paths = [Path(p) for p in (paths or default_inputs())]
    if not paths:
        raise KernelsightError("no calibration inputs: data/public and data/sweeps are not installed with the "
                               "package (the reference data lives in the kernelsight source repository: run from "
                               "a checkout), and no data.paths=[...] was given")
    return sorted({f.resolve() for p in paths for f in sweep_files(p)})


def devices_in(files) -> list[str]:
    """The GPUs the given sweep files hold rows of, from their device column alone (fast: no row is loaded)."""
    return sorted({d for f in files for d in read_sweep(f, columns=["device"])["device"].unique()})


def load_rows(files) -> pd.DataFrame:
    """All rows of the given sweep files, with the file each came from (column 'file')."""
    frames = [read_sweep(f).assign(file=str(f)) for f in files]
    return pd.concat(frames, ignore_index=True)


def split_sweep_id(sweep_id: str) -> tuple[str, tuple]:
    """'aiconfigurator/h100_sxm/vllm-0.24.0' -> ('aiconfigurator/h100_sxm/vllm', (0, 24, 0))."""
    m = _VERSION.match(str(sweep_id))
    if not m:
        return str(sweep_id), ()
    return m.group("series"), tuple(int(x) for x in m.group("version").split("."))


def choose_sweeps(part: pd.DataFrame, prefer_sources=()) -> list[str]:
    """The sweep ids of a (device, family) block, by rule 4 of the module docstring."""
    stats = part.groupby(["source", "sweep_id"], sort=True).size()

    def rank(source):
        pref = next((i for i, s in enumerate(prefer_sources) if s in source), len(prefer_sources))
        return (pref, -int(stats[source].sum()), source)

    source = min(stats.index.get_level_values("source").unique(), key=rank)
    newest: dict[str, tuple] = {}
    for sweep_id in stats[source].index:
        series, version = split_sweep_id(sweep_id)
        if series not in newest or version > newest[series][1]:
            newest[series] = (sweep_id, version)
    return sorted(sweep_id for sweep_id, _ in newest.values())


def variant_columns(family: str) -> list[str]:
    """The categorical shape fields that make a kernel variant (dtype, op, link, ...)."""
    return [f.name for f in get_family(family).fields if f.kind in ("dtype", "choice", "bool")]


def unusable(df: pd.DataFrame, exclude_sweeps=()) -> pd.Series:
    """Rules 1-3 per row: why it cannot be used ('status not ok', 'throttled', 'excluded sweep'), None if it can."""
    reason = pd.Series(None, index=df.index, dtype=object)
    reason[df["status"] != "ok"] = "status not ok"
    throttled = df["flags"].fillna("").str.contains(r"(?:^|,)throttled(?:,|$)", regex=True)
    reason[reason.isna() & throttled] = "throttled"
    for pattern in exclude_sweeps:
        reason[reason.isna() & df["sweep_id"].str.contains(pattern, regex=False)] = "excluded sweep"
    return reason


def select(df: pd.DataFrame, prefer_sources=(), providers=None, exclude_sweeps=(), family_sources=None,
           prefer_providers=None) -> tuple:
    """Apply rules 1-5: (kept rows, counts per device/family/rule, chosen sweeps and providers per block)."""
    providers, prefer_providers = dict(providers or {}), dict(prefer_providers or {})
    family_sources = dict(family_sources or {})
    reason = unusable(df, exclude_sweeps)
    chosen = []
    for (device, family), part in df[reason.isna()].groupby(["device", "family"], sort=True):
        sweeps = choose_sweeps(part, (*family_sources.get(family, ()), *prefer_sources))
        reason[part.index[~part["sweep_id"].isin(sweeps)]] = "other sweep"
        in_sweep = part[part["sweep_id"].isin(sweeps)]
        wanted = providers.get(family)
        used = set()
        for _variant, sub in in_sweep.groupby(variant_columns(family), sort=True, dropna=False):
            counts = sub["provider"].value_counts()
            preferred = [p for p in prefer_providers.get(family, ()) if p in counts.index]
            if wanted is not None:
                provider = wanted if wanted in counts.index else None
            elif preferred:
                provider = preferred[0]
            else:
                provider = sorted(counts.index, key=lambda p: (-counts[p], p))[0]
            reason[sub.index[sub["provider"] != provider]] = "other provider"
            used.add(provider)
        chosen.append({"device": device, "family": family, "sweeps": ", ".join(sweeps),
                       "providers": ", ".join(sorted(p for p in used if p is not None))})
    kept = df[reason.isna()]
    counts = (pd.DataFrame({"device": df["device"], "family": df["family"], "rule": reason.fillna("used")})
              .groupby(["device", "family", "rule"], sort=True).size().unstack("rule", fill_value=0))
    return kept, counts.reset_index(), pd.DataFrame(chosen, columns=["device", "family", "sweeps", "providers"])


def with_eta(df: pd.DataFrame) -> pd.DataFrame:
    """Rows with their roofline (t_roof, s) and measured η = latency / t_roof on their device's catalog entry."""
    parts = []
    for device, part in df.groupby("device", sort=True):
        roof = roofline_frame(part, load_hardware(device))
        parts.append(part.assign(t_roof=roof["t_roof"].astype(float),
                                 eta=part["latency_ms"].astype(float) / 1e3 / roof["t_roof"].astype(float)))
    out = pd.concat(parts) if parts else df.assign(t_roof=np.nan, eta=np.nan)
    return out.loc[df.index]
