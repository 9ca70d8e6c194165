"""The energy model from NVML readings: which rows, the fit, its honest evaluation, the report and the artifact.

Rows: every sweep row with an NVML energy reading (`energy_j` per call, `power_w` mean over the energy
loop: >= min_seconds of back-to-back calls, microbench/timing.py), by rules counted per device and
family, each row under the first rule that removes it:

1. status: only 'ok' rows;
2. no energy: energy_j or power_w missing or <= 0;
3. implausible power: mean power above `max_power_tdp` x TDP. Readings above TDP are KEPT below that:
   the energy counter's window does not match the loop's (the loop's own time, energy_j / power_w per
   call, is what the timed median says), so single readings scatter by tens of percent both ways, and
   dropping the high ones would bias the fit low (the report's "Readings above TDP" gives the figures);
4. other provider: families listed in `providers` keep those providers only: the kernels closest to what
   vLLM runs. A provider doing work the roofline does not count (torch's gather + SDPA copies the KV
   cache before attending) draws power no roofline share explains.

Throttled rows are kept (the throttling is the power cap at work: they are the high-power regime).

Time: a row's power belongs to its energy loop, whose time per call is energy_j / power_w (the loop's
wall time over its calls); the shares of the fit use that time. The timed median (latency_ms: cold L2,
the figure the η models learn) differs from it where the loop ran from a warm L2 or the timing had a
bias (data/sweeps/README.md); the report scores both.

Evaluation: grouped K-fold within each family (groups: calibrate.evaluate.group_ids, shapes rounded to
powers of two), the energy MAPE of the model beside two baselines: TDP x time and a constant power
(the median measured power of the family's training rows) x time; the repeat floor (the same kernels
measured in two campaigns, scored against each other); and a held-out GPU (fit on the fit GPU's rows,
predict the other GPU's rows with its own roofline and TDP).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.bundle import sha256_file
from kernelsight.predictor.energy import (MAX_COEF, POOLED, EnergyModel, PowerModel, default_energy_path, fraction,
                                          utilisation)
from kernelsight.predictor.errors import KernelsightError, check_seed, whole_number
from kernelsight.predictor.families import SHAPE_COLUMNS
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.outputs import ensure_dir, write_json, write_text
from kernelsight.predictor.paths import data_dir, reference_data
from kernelsight.predictor.roofline import roofline_frame
from kernelsight.predictor.sweep import read_sweep, sweep_files

from .evaluate import group_folds, group_ids
from .report import markdown_table

BASELINES = ("model", "constant", "tdp")


@dataclass(frozen=True)
class EnergySettings:
    """conf/calibrate_energy.yaml as plain values."""

    fit: list                        # sweep files or folders of the GPU the model is fitted on
    transfer: dict = field(default_factory=dict)   # held-out GPU label -> its sweep files or folders
    providers: dict = field(default_factory=dict)  # family -> providers kept (others: rule 4)
    max_power_tdp: float = 1.5
    min_groups: int = 10             # families with fewer shape groups share one pooled fit
    idle_max_share: float = 0.1      # rows whose larger share is below this give the idle power
    folds: int = 5
    seed: int = 0
    out: str = "reports/energy"
    artifact: str | None = None      # None: data/artifacts/energy.json

    @classmethod
    def from_mapping(cls, cfg: dict) -> "EnergySettings":
        data = cfg.get("data") or {}
        fit = data.get("fit")
        if not fit:
            raise KernelsightError("data.fit: name the sweeps the energy model is fitted on")
        s = cls(fit=list(fit), transfer={str(k): list(v) for k, v in (data.get("transfer") or {}).items()},
                providers={str(k): list(v) for k, v in (cfg.get("providers") or {}).items()},
                max_power_tdp=float(cfg.get("max_power_tdp", 1.5)), min_groups=cfg.get("min_groups", 10),
                idle_max_share=float(cfg.get("idle_max_share", 0.1)), folds=cfg.get("folds", 5),
                seed=cfg.get("seed", 0), out=str(cfg.get("out", "reports/energy")), artifact=cfg.get("artifact"))
        whole_number(s.folds, "folds", 2)
        whole_number(s.min_groups, "min_groups", 1)
        check_seed(s.seed)
        if not s.max_power_tdp > 1.0:
            raise KernelsightError(f"max_power_tdp={s.max_power_tdp}: must be > 1 (readings above TDP are kept)")
        if not 0.0 < s.idle_max_share < 1.0:
            raise KernelsightError(f"idle_max_share={s.idle_max_share}: must be in (0, 1)")
        return s


def _resolve(path) -> Path:
    """A sweep path as given, else under the data folder (data.fit: [sweeps/h100_sxm/energy-1]), which only a
    source checkout holds (one line saying so otherwise)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    if (data_dir() / "sweeps").is_dir() and not (data_dir() / p).exists():
        raise KernelsightError(f"{path}: no such sweep file or folder, here or under {data_dir()}")
    return reference_data(*p.parts, what="kernelsight calibrate energy")


# -- rows ---------------------------------------------------------------------------------------

def read_rows(paths) -> pd.DataFrame:
    """Every row of the given sweeps, with the file each came from."""
    frames = []
    for p in paths:
        path = _resolve(p)
        files = sweep_files(path)
        if not files:
            raise KernelsightError(f"{path}: no sweep files")
        frames += [read_sweep(f).assign(file=str(f)) for f in files]
    return pd.concat(frames, ignore_index=True)


def select_rows(raw: pd.DataFrame, providers: dict, max_power_tdp: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rules of the module docstring: (kept rows with their times, shares and TDP; counts per device,
    family and rule)."""
    tdp = raw["device"].map(lambda d: load_hardware(d).tdp_w).astype(float)
    reason = pd.Series(None, index=raw.index, dtype=object)
    reason[raw["status"] != "ok"] = "status not ok"
    no_energy = ~((raw["energy_j"] > 0) & (raw["power_w"] > 0))
    reason[reason.isna() & no_energy] = "no energy"
    reason[reason.isna() & (raw["power_w"] > max_power_tdp * tdp)] = "implausible power"
    listed = raw["family"].map(lambda f: tuple(providers.get(f, ())))
    other = np.array([bool(ps) and p not in ps for p, ps in zip(raw["provider"], listed)])
    reason[reason.isna() & other] = "other provider"
    counts = (pd.DataFrame({"device": raw["device"], "family": raw["family"], "rule": reason.fillna("used")})
              .groupby(["device", "family", "rule"], sort=True).size().unstack("rule", fill_value=0).reset_index())
    return with_shares(raw.assign(tdp_w=tdp)[reason.isna()]), counts


def with_shares(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with t_loop (s per call in the energy loop), t_timed (the timed median, s), their roofline terms
    on their GPU and the shares at both times."""
    rows = rows.copy()
    rows["t_loop"] = rows["energy_j"] / rows["power_w"]
    rows["t_timed"] = rows["latency_ms"] / 1e3
    rows["t_compute"], rows["t_memory"] = np.nan, np.nan
    for device, part in rows.groupby("device", sort=True):
        roof = roofline_frame(part, load_hardware(device))
        rows.loc[part.index, "t_compute"] = roof["t_compute"].astype(float)
        rows.loc[part.index, "t_memory"] = roof["t_memory"].astype(float)
    for time in ("loop", "timed"):
        c, m = utilisation(rows["t_compute"], rows["t_memory"], rows[f"t_{time}"])
        rows[f"compute_share_{time}"], rows[f"memory_share_{time}"] = c, m
    return rows


def _x(rows: pd.DataFrame, time: str = "loop") -> np.ndarray:
    return rows[[f"compute_share_{time}", f"memory_share_{time}"]].to_numpy(dtype=np.float64)


def _y(rows: pd.DataFrame) -> np.ndarray:
    return (rows["power_w"] / rows["tdp_w"]).to_numpy(dtype=np.float64)


# -- fitting ------------------------------------------------------------------------------------

def shape_groups(rows: pd.DataFrame) -> pd.Series:
    """Per row its near-duplicate shape group within its family (calibrate.evaluate.group_ids)."""
    out = pd.Series(0, index=rows.index, dtype=np.int64)
    for family, part in rows.groupby("family", sort=True):
        out[part.index] = group_ids(family, part)
    return out


def pooled_families(rows: pd.DataFrame, min_groups: int) -> list[str]:
    """Families with fewer than min_groups shape groups: fitted together, as one pool."""
    groups = shape_groups(rows)
    n = groups.groupby(rows["family"]).nunique()
    return sorted(n.index[n < min_groups])


def fit_families(rows: pd.DataFrame, pooled: list[str]) -> dict:
    """family -> {static, compute, memory, rows, fit}: each family's own fit, one fit over the pooled
    families' rows for each of them, and '*' over every row."""
    out = {}
    pool = rows[rows["family"].isin(pooled)]
    pool_fit = PowerModel().fit(_x(pool), _y(pool)).params_ if len(pool) >= 3 else None
    every = PowerModel().fit(_x(rows), _y(rows)).params_
    for family, part in rows.groupby("family", sort=True):
        if family in pooled:
            params, how = (pool_fit, "pooled: " + ", ".join(pooled)) if pool_fit else (every, POOLED)
        elif len(part) >= 3:
            params, how = PowerModel().fit(_x(part), _y(part)).params_, "family"
        else:
            params, how = every, POOLED
        out[family] = {**params, "rows": int(len(part)), "fit": how}
    out[POOLED] = {**every, "rows": int(len(rows)), "fit": "every row"}
    return out


def idle_fraction(rows: pd.DataFrame, max_share: float) -> tuple[float, int]:
    """(median power / TDP of the rows whose kernels barely use the GPU, their count): the GPU launching
    tiny kernels, mostly waiting, clocks up, as it is between a serving engine's steps."""
    busy = np.maximum(rows["compute_share_loop"], rows["memory_share_loop"])
    idle = rows[busy < max_share]
    if idle.empty:
        raise KernelsightError(f"no row has both shares below idle_max_share={max_share}: the idle power "
                               f"cannot be estimated")
    return float(np.median(idle["power_w"] / idle["tdp_w"])), int(len(idle))


def predict_power(params: dict, rows: pd.DataFrame, time: str = "loop") -> np.ndarray:
    """Predicted watts of each row from per-family parameters (the pooled '*' for a family not there)."""
    out = np.empty(len(rows))
    fam = rows["family"].to_numpy()
    for family in np.unique(fam):
        sel = fam == family
        p = params.get(family) or params[POOLED]
        x = _x(rows[sel], time)
        out[sel] = rows["tdp_w"].to_numpy()[sel] * fraction(p, x[:, 0], x[:, 1])
    return out


# -- evaluation ---------------------------------------------------------------------------------

def folds_of(rows: pd.DataFrame, k: int, seed: int) -> np.ndarray:
    """Fold per row: within each family, whole shape groups (calibrate.evaluate.group_folds)."""
    out = np.empty(len(rows), dtype=np.int64)
    fam = rows["family"].to_numpy()
    for family in np.unique(fam):
        sel = fam == family
        out[sel] = group_folds(group_ids(family, rows[sel]), k, seed)
    return out


def crossval(rows: pd.DataFrame, s: EnergySettings) -> pd.DataFrame:
    """Held-out predictions of every row: power of the model and the constant baseline (each fold fitted on
    the other folds), at the loop's time and at the timed median."""
    pooled = pooled_families(rows, s.min_groups)
    folds = folds_of(rows, s.folds, s.seed)
    out = rows.assign(fold=folds)
    for col in ("model_w_loop", "model_w_timed", "constant_w"):
        out[col] = np.nan
    for f in range(s.folds):
        test = folds == f
        if not test.any():
            continue
        train = rows[~test]
        params = fit_families(train, [p for p in pooled if p in set(train["family"])])
        out.loc[test, "model_w_loop"] = predict_power(params, rows[test], "loop")
        out.loc[test, "model_w_timed"] = predict_power(params, rows[test], "timed")
        median = train.groupby("family")["power_w"].median()
        out.loc[test, "constant_w"] = rows.loc[test, "family"].map(median).fillna(train["power_w"].median())
    return out


def score(pred: pd.DataFrame, by=("family",)) -> pd.DataFrame:
    """Energy MAPE (%) of the model and both baselines per group, with the kernel's time from the energy loop
    (the power model's own error: its energy is power x that time) and from the timed median."""
    e = pred["energy_j"]
    energies = {
        ("model", "loop"): pred["model_w_loop"] * pred["t_loop"],
        ("constant", "loop"): pred["constant_w"] * pred["t_loop"],
        ("tdp", "loop"): pred["tdp_w"] * pred["t_loop"],
        ("model", "timed"): pred["model_w_timed"] * pred["t_timed"],
        ("constant", "timed"): pred["constant_w"] * pred["t_timed"],
        ("tdp", "timed"): pred["tdp_w"] * pred["t_timed"],
    }
    frame = pd.DataFrame({f"{m}_{t}": (v - e).abs() / e * 100 for (m, t), v in energies.items()})
    frame["ratio"] = energies[("model", "loop")] / e
    frame[list(by)] = pred[list(by)].to_numpy()
    cols = [f"{m}_{t}" for t in ("loop", "timed") for m in BASELINES]

    def summary(part: pd.DataFrame) -> dict:
        return {"rows": len(part), **part[cols].mean().to_dict(),
                "p90_model_loop": part["model_loop"].quantile(0.9), "median_ratio": part["ratio"].median()}

    records = [{**dict(zip(by, key if isinstance(key, tuple) else (key,))), **summary(part)}
               for key, part in frame.groupby(list(by), sort=True)]
    records.append({**{k: "all" for k in by}, **summary(frame)})
    return pd.DataFrame(records)


def repeat_floor(rows: pd.DataFrame) -> pd.DataFrame:
    """The same kernels (provider and shape) measured in two sweeps: per family the MAPE of one sweep's energy
    and power against the other's (the last sweep id against the first), a floor for any model of one reading."""
    key = ["device", "family", "provider", *SHAPE_COLUMNS]
    cols = [c for c in dict.fromkeys(key) if c in rows.columns]
    k = rows[cols].astype(object).where(rows[cols].notna(), "").astype(str).agg("|".join, axis=1)
    pairs = []
    for _, part in rows.assign(_k=k).groupby("_k", sort=True):
        part = part.sort_values("sweep_id")
        if part["sweep_id"].nunique() < 2:
            continue
        a, b = part.iloc[0], part.iloc[-1]
        pairs.append({"family": a["family"], "energy_ape": abs(b["energy_j"] - a["energy_j"]) / a["energy_j"] * 100,
                      "power_ape": abs(b["power_w"] - a["power_w"]) / a["power_w"] * 100,
                      "sweeps": f"{b['sweep_id']} vs {a['sweep_id']}"})
    if not pairs:
        return pd.DataFrame(columns=["family", "kernels", "energy_mape", "power_mape", "sweeps"])
    df = pd.DataFrame(pairs)
    g = df.groupby("family", sort=True)
    out = pd.DataFrame({"kernels": g.size(), "energy_mape": g["energy_ape"].mean(),
                        "power_mape": g["power_ape"].mean(), "sweeps": g["sweeps"].first()}).reset_index()
    return pd.concat([out, pd.DataFrame([{"family": "all", "kernels": len(df), "energy_mape": df["energy_ape"].mean(),
                                          "power_mape": df["power_ape"].mean(), "sweeps": ""}])], ignore_index=True)


def above_tdp(raw: pd.DataFrame) -> pd.DataFrame:
    """Readings above TDP per sweep: how many, how many throttled, the largest power / TDP, and how the
    loop's own time per call compares with the timed median (median ratio, all rows and those above)."""
    ok = raw[(raw["status"] == "ok") & (raw["energy_j"] > 0) & (raw["power_w"] > 0)]
    rows = []
    for (device, sweep), part in ok.groupby(["device", "sweep_id"], sort=True):
        tdp = load_hardware(device).tdp_w
        hi = part["power_w"] > tdp
        ratio = part["energy_j"] / part["power_w"] / (part["latency_ms"] / 1e3)
        throttled = part["flags"].fillna("").str.contains("throttled")
        rows.append({"device": device, "sweep": sweep, "rows": len(part), "above TDP": int(hi.sum()),
                     "of them throttled": int((hi & throttled).sum()),
                     "max power / TDP": float((part["power_w"] / tdp).max()),
                     "loop / timed, all": float(ratio.median()),
                     "loop / timed, above TDP": float(ratio[hi].median()) if hi.any() else float("nan")})
    return pd.DataFrame(rows)


@dataclass
class EnergyRun:
    """What `kernelsight calibrate energy` produced: the model, the figures, where they went."""

    model: EnergyModel
    cv: pd.DataFrame
    transfer: pd.DataFrame
    repeats: pd.DataFrame
    counts: pd.DataFrame
    report: Path
    artifact: Path


def calibrate_energy(s: EnergySettings, write_artifact: bool = True) -> EnergyRun:
    """Select the rows, evaluate (K-fold, held-out GPUs, repeat floor), fit the final model on every fit row,
    write the report to s.out and the artifact to s.artifact (default data/artifacts/energy.json)."""
    raw = read_rows(s.fit)
    devices = sorted(raw["device"].unique())
    if len(devices) != 1:
        raise KernelsightError(f"data.fit holds rows of {', '.join(devices)}: the model is fitted on one GPU")
    rows, counts = select_rows(raw, s.providers, s.max_power_tdp)
    if rows.empty:
        raise KernelsightError("data.fit: no row has an energy reading")
    pooled = pooled_families(rows, s.min_groups)
    cv = crossval(rows, s)
    cv_scores = score(cv)
    params = fit_families(rows, pooled)
    idle, idle_rows = idle_fraction(rows, s.idle_max_share)
    groups = shape_groups(rows).groupby(rows["family"]).nunique()
    for family in params:
        if family != POOLED:
            params[family]["groups"] = int(groups[family])
    transfer, others, extra_raw = [], [], []
    for label, paths in s.transfer.items():
        t_raw = read_rows(paths)
        extra_raw.append(t_raw)
        t_rows, t_counts = select_rows(t_raw, s.providers, s.max_power_tdp)
        counts = pd.concat([counts, t_counts], ignore_index=True)
        if t_rows.empty:
            continue
        t_pred = t_rows.assign(model_w_loop=predict_power(params, t_rows, "loop"),
                               model_w_timed=predict_power(params, t_rows, "timed"),
                               constant_w=t_rows["family"].map(rows.groupby("family")["power_w"].median()))
        transfer.append(score(t_pred).assign(held_out=label))
    # the providers rule 4 left out, scored by the final model (what it would miss on them)
    left = raw[(raw["status"] == "ok") & (raw["energy_j"] > 0) & (raw["power_w"] > 0)
               & ~raw.index.isin(rows.index)]
    if not left.empty:
        left = with_shares(left.assign(tdp_w=left["device"].map(lambda d: load_hardware(d).tdp_w).astype(float)))
        left = left.assign(model_w_loop=predict_power(params, left, "loop"),
                           model_w_timed=predict_power(params, left, "timed"),
                           constant_w=left["family"].map(rows.groupby("family")["power_w"].median()))
        others = score(left, by=("family", "provider"))
    transfer = pd.concat(transfer, ignore_index=True) if transfer else pd.DataFrame()
    repeats = repeat_floor(rows)
    fitted_on = {"device": devices[0], "tdp_w": float(rows["tdp_w"].iloc[0]),
                 "sweeps": sorted(rows["sweep_id"].unique().tolist()),
                 "files": [{"file": _shown(f), "sha256": sha256_file(f)} for f in sorted(rows["file"].unique())],
                 "rows": int(len(rows)), "providers": {k: list(v) for k, v in sorted(s.providers.items())},
                 "idle_rows": idle_rows, "idle_max_share": s.idle_max_share, "min_groups": s.min_groups}
    metrics = {"energy_mape_kfold": _records(cv_scores, "family"),
               "energy_mape_held_out_gpu": _records(transfer, "family", "held_out") if not transfer.empty else {},
               "repeat_floor_mape": _records(repeats, "family") if not repeats.empty else {},
               "folds": s.folds, "seed": s.seed}
    model = EnergyModel(params, idle, fitted_on, metrics)
    out = ensure_dir(Path(s.out), "out")
    all_raw = pd.concat([raw, *extra_raw], ignore_index=True)
    report = write_text(out / "REPORT.md", report_text(model, cv_scores, transfer, repeats, counts,
                                                      above_tdp(all_raw), others, s), "out")
    write_json(out / "evaluation.json", {"kfold": cv_scores.to_dict("records"),
                                         "held_out_gpu": transfer.to_dict("records") if not transfer.empty else [],
                                         "repeat_floor": repeats.to_dict("records"),
                                         "other_providers": others.to_dict("records") if len(others) else [],
                                         "above_tdp": above_tdp(all_raw).to_dict("records"),
                                         "counts": counts.to_dict("records")}, "out", default=float)
    artifact = Path(s.artifact) if s.artifact else default_energy_path()
    if write_artifact:
        model.save(artifact)
    return EnergyRun(model, cv_scores, transfer, repeats, counts, report, artifact)


def _shown(path: str) -> str:
    """A sweep file as the artifact names it: relative to the data folder when under it."""
    p = Path(path).resolve()
    try:
        return p.relative_to(data_dir().resolve()).as_posix()
    except ValueError:
        return p.name


def _records(df: pd.DataFrame, *keys: str) -> dict:
    """{family[/held_out]: {model, constant, tdp energy MAPE % at the loop's time, rows}} rounded for the artifact."""
    out = {}
    for r in df.to_dict("records"):
        name = "/".join(str(r[k]) for k in reversed(keys)) if len(keys) > 1 else str(r[keys[0]])
        if "model_loop" in r:
            out[name] = {"rows": int(r["rows"]), **{m: round(float(r[f"{m}_loop"]), 2) for m in BASELINES}}
        else:
            out[name] = {"kernels": int(r["kernels"]), "energy": round(float(r["energy_mape"]), 2),
                         "power": round(float(r["power_mape"]), 2)}
    return out


# -- report ---------------------------------------------------------------------------------------

def _score_table(df: pd.DataFrame, first: str = "family") -> pd.DataFrame:
    cols = {first: first, "rows": "rows", "model_loop": "model", "constant_loop": "constant x t",
            "tdp_loop": "TDP x t", "p90_model_loop": "model p90 APE", "median_ratio": "model median pred/meas",
            "model_timed": "model (timed t)", "constant_timed": "constant (timed t)", "tdp_timed": "TDP (timed t)"}
    keep = [c for c in cols if c in df.columns] + (["provider"] if "provider" in df.columns else [])
    out = df[keep].rename(columns=cols)
    if "provider" in out.columns and first != "provider":
        out = out[[first, "provider", *[c for c in out.columns if c not in (first, "provider")]]]
    return out.round(2)


def report_text(model: EnergyModel, cv: pd.DataFrame, transfer: pd.DataFrame, repeats: pd.DataFrame,
                counts: pd.DataFrame, high: pd.DataFrame, others, s: EnergySettings) -> str:
    fo = model.fitted_on
    params = pd.DataFrame([{"family": f, "static": p["static"], "compute": p["compute"], "memory": p["memory"],
                            "rows": model.details[f].get("rows"), "groups": model.details[f].get("groups", ""),
                            "fit": model.details[f].get("fit")} for f, p in model.families.items()])
    for col in ("static", "compute", "memory"):
        params[col] = params[col].map(lambda v: f"{v:.3f}")
    shown = high.copy()
    for col in ("max power / TDP", "loop / timed, all", "loop / timed, above TDP"):
        shown[col] = shown[col].map(lambda v: "" if np.isnan(v) else f"{v:.2f}")
    top = float(high["max power / TDP"].max()) if len(high) else float("nan")
    lines = [
        "# Energy model: kernel power from the roofline, fitted on NVML readings", "",
        f"`{model.to_dict()['model']}`, E = P x t; parameters are fractions of TDP (compute and memory up to "
        f"{MAX_COEF:g}: full use of a unit would ask for more than TDP; the min() is the cap). Fitted on "
        f"{fo['rows']} rows of {fo['device']} (TDP {fo['tdp_w']:.0f} W), sweeps {', '.join(fo['sweeps'])}. "
        f"Idle (between kernels) = {model.idle:.3f} x TDP = {model.idle * fo['tdp_w']:.0f} W: the median power of "
        f"the {fo['idle_rows']} rows whose kernels use under {s.idle_max_share:.0%} of either roofline "
        f"(launching tiny kernels, mostly waiting). Families with fewer than {s.min_groups} shape groups share "
        f"one pooled fit; `*` (every row) prices families without energy rows.", "",
        "## Parameters", "", markdown_table(params),
        "## Held-out energy MAPE % (grouped K-fold)", "",
        f"{s.folds} folds of whole shape groups per family (shapes rounded to powers of two, seed {s.seed}). "
        "Energy = power x time. Time = the energy loop's own time per call, so the first three columns are the "
        "power model's error against the two baselines: TDP x t, and a constant power (the median of the "
        "family's training rows) x t. The last three use the timed median (cold L2, what the η models "
        "predict) as the time, so the loop's and the timing's disagreement adds to every method alike.", "",
        markdown_table(_score_table(cv)),
    ]
    if not transfer.empty:
        lines += ["## Held-out GPU: fitted on the fit GPU only", "",
                  "The other GPU's rows priced with its own roofline (peaks, bandwidth) and TDP; the constant "
                  "baseline is the fit GPU's median power per family.", ""]
        for label, part in transfer.groupby("held_out", sort=True):
            lines += [f"**{label}**", "", markdown_table(_score_table(part.drop(columns="held_out")))]
    if not repeats.empty:
        lines += ["## Repeat floor", "",
                  "The same kernels (provider and shape) in two campaigns on the same GPU model, one against "
                  "the other (the sweeps column): MAPE % of energy per call and of mean power. No model of a "
                  "single reading can be expected to beat this.", "", markdown_table(repeats.round(2))]
    lines += ["## Readings above TDP", "",
              f"Kept (rule 3 drops only readings above {s.max_power_tdp} x TDP). The loop's time per call "
              "(energy_j / power_w) matches the timed median (the median ratio below is about 1), so the loop "
              "ran as long as it should have: the energy counter read more than TDP x that time. Almost all of "
              "these rows are throttled, i.e. the GPU was at its power cap. Repeated readings of the same "
              f"kernel differ by up to tens of percent (Repeat floor), and the highest reading ({top:.2f} x TDP; "
              f"loops of 0.3-0.5 s) is what a counter whose window is off from the loop's by about 0.1 s gives "
              "at the cap (0.4 / 0.3 = 1.33); a cap acting over a longer window than the loop would explain it "
              "too. Not settled by these data; either way a single reading scatters both ways, so none is "
              "dropped for being high.", "", markdown_table(shown)]
    if len(others):
        lines += ["## Providers left out (rule 4), scored by the final model", "",
                  "What the model misses on kernels that are not the family's vLLM-like provider.", "",
                  markdown_table(_score_table(others))]
    lines += ["## Rows per rule", "", markdown_table(counts.fillna(0))]
    return "\n".join(lines)
