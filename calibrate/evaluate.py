"""Honest evaluation of the η models, separate from fitting what ships.

* target tier: K-fold over shape GROUPS within one (device, family) sweep. A
  group is the shape rounded to powers of two (round(log2 x) of every count,
  round(log2(1 + x)) of fields that may be 0, exact dtypes/ops/flags), so
  near-duplicate shapes (m = 4096 and m = 4097, or the same GEMM in two
  neighbouring grid cells) never straddle train and test.
* cross-device tier: leave-one-device-out for every GPU with data of the
  family, scoring the predictor's cross path (die siblings' target models
  where they cover the kernel, the LightGBM cross model elsewhere; the
  LightGBM model alone is reported beside it), plus GB200 held out (the seed paper's protocol: trained on the other
  GPUs, B200 included) and a stricter variant with no Blackwell GPU in training.
* baselines beside each: plain roofline (η = 1) and a constant η per (device,
  family) (the training median; for a held-out GPU the median over the
  training GPUs' medians).
* other sources, where the data has them: each GPU's target model, fitted on
  its whole block as a bundle holds it, scored on the same GPU's rows of the
  same providers that another source timed (another harness and campaign, at
  its own shapes: Vidur's model shapes off aiconfigurator's grid).
* repeat measurements, where the data has them: the kept sweep's kernels that
  another sweep of the same source and GPU timed again (same harness, provider
  and shape; another campaign), scored against each other. How far two campaigns disagree is a
  floor no model of one of them can be expected to beat.

Every prediction is scored on latency: APE = |predicted - measured| / measured.
Subsampling (stated in the report): at most `block_rows` rows per (device,
family), a seeded uniform sample; the cross tier trains on at most
`cross_rows_per_device` of each training GPU's rows and tests on the whole
held-out block.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd

from kernelsight.predictor.families import get_family
from kernelsight.predictor.features import feature_matrix
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.roofline import roofline_columns
from kernelsight.predictor.transfer import ROOFLINE, cross_eta, die_siblings

from .models import ConstantEtaBaseline, EtaRegressor, RooflineBaseline, run_fits
from .rows import unusable

MODELS = ("lightgbm", "constant", "roofline")
# Diagnostics beside the model: the same model without the η >= floor rule (what the floor costs), and the
# cross tier without die-sibling transfer (the LightGBM cross-device model alone; the model itself in the
# target tier).
DIAGNOSTIC = "lightgbm_no_floor"
NO_SIBLING = "lightgbm_no_sibling"
DIAGNOSTICS = (DIAGNOSTIC, NO_SIBLING)


@dataclass
class Block:
    """The selected rows of one (device, family) with both tiers' feature matrices."""

    device: str
    family: str
    rows: pd.DataFrame  # sweep columns + t_roof (s) + eta
    x: dict  # tier -> feature matrix
    groups: np.ndarray
    cols: dict  # the family's shape columns
    roof: dict  # their roofline columns on the block's GPU
    sweeps: str = ""  # the sweeps its rows were chosen from (rows.select), for a model card

    @property
    def eta(self) -> np.ndarray:
        return self.rows["eta"].to_numpy(dtype=np.float64)


def group_ids(family: str, rows: pd.DataFrame) -> np.ndarray:
    """Near-duplicate shapes share an id: counts rounded to powers of two, categories exact."""
    keys = {}
    for f in get_family(family).fields:
        v = rows[f.name]
        if f.kind == "pos":
            keys[f.name] = np.round(np.log2(v.astype(float))).astype(int)
        elif f.kind == "nonneg":
            keys[f.name] = np.round(np.log2(1.0 + v.astype(float))).astype(int)
        else:
            keys[f.name] = v.astype(str).to_numpy()
    return pd.DataFrame(keys, index=rows.index).groupby(list(keys), sort=True).ngroup().to_numpy()


def group_folds(groups: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold (0..k-1) per row: whole groups, shuffled with the seed, each to the currently smallest fold."""
    uniq, sizes = np.unique(groups, return_counts=True)
    order = np.random.default_rng(seed).permutation(len(uniq))
    fold_of, load = np.empty(len(uniq), dtype=int), np.zeros(k, dtype=int)
    for i in order:
        f = int(np.argmin(load))
        fold_of[i] = f
        load[f] += sizes[i]
    return fold_of[np.searchsorted(uniq, groups)]


def build_blocks(rows: pd.DataFrame, block_rows: int, seed: int, sweeps: dict | None = None) -> dict:
    """(device, family) -> Block, each capped at block_rows by a seeded uniform sample; sweeps: (device, family)
    -> the sweeps rows.select chose for it."""
    blocks = {}
    for (device, family), part in rows.groupby(["device", "family"], sort=True):
        part = part.iloc[_sample(len(part), block_rows, seed)]
        hw = load_hardware(device)
        cols = {c: part[c].to_numpy() for c in get_family(family).columns}
        roof = roofline_columns(family, cols, hw)
        x = {tier: feature_matrix(family, tier, cols, hw, roof) for tier in ("target", "cross")}
        blocks[(device, family)] = Block(device, family, part, x, group_ids(family, part), cols, roof,
                                         (sweeps or {}).get((device, family), ""))
    return blocks


def _sample(n: int, cap: int, seed: int) -> np.ndarray:
    if n <= cap:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, cap, replace=False))


def _scored(block: Block, idx: np.ndarray, tier: str, split: str, preds: dict,
            sibling: np.ndarray | None = None, at_roofline: np.ndarray | None = None,
            extrapolated: dict | None = None) -> pd.DataFrame:
    """One scored row per test row; sibling: priced by a die sibling; at_roofline: priced at η = 1 by rule
    (cross tier: collectives over the scale-out network), rows no interval is fitted on; extrapolated:
    {column: flag per row} of the models that priced them (EtaModel.eta), for the intervals."""
    rows = block.rows.iloc[idx]
    dom = get_family(block.family).dominant
    out = pd.DataFrame({"tier": tier, "split": split, "device": block.device, "family": block.family,
                        "dominant": rows[dom].to_numpy(dtype=np.float64),
                        "latency_ms": rows["latency_ms"].to_numpy(dtype=np.float64),
                        "t_roof_ms": rows["t_roof"].to_numpy(dtype=np.float64) * 1e3,
                        "eta": block.eta[idx],
                        "sibling": np.zeros(len(idx), dtype=bool) if sibling is None else sibling,
                        "at_roofline": np.zeros(len(idx), dtype=bool) if at_roofline is None else at_roofline})
    for name, eta_pred in preds.items():
        out[f"pred_{name}"] = out["t_roof_ms"] * eta_pred
    for name, flag in (extrapolated or {}).items():
        out[name] = np.asarray(flag, dtype=bool)
    return out


def _baselines(const: ConstantEtaBaseline, block: Block, n: int) -> dict:
    dev, fam = np.full(n, block.device, dtype=object), np.full(n, block.family, dtype=object)
    return {"constant": const.predict(dev, fam), "roofline": RooflineBaseline().predict(dev, fam)}


def _predict_target(model: EtaRegressor, const: ConstantEtaBaseline, block: Block,
                    idx: np.ndarray) -> tuple[dict, np.ndarray]:
    """(η per model, the target model's extrapolated flag) of rows idx."""
    raw, flag = model.model_.eta(np.ascontiguousarray(block.x["target"][idx], dtype=np.float64), floor=False)
    eta = np.maximum(raw, model.eta_floor)
    return {"lightgbm": eta, DIAGNOSTIC: raw, **_baselines(const, block, len(idx))}, flag


def _target_fold(block: Block, fold: np.ndarray, f: int, learner: dict) -> pd.DataFrame:
    train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
    model = EtaRegressor(block.family, "target", block.device, **learner).fit(block.x["target"][train],
                                                                              block.eta[train])
    const = ConstantEtaBaseline().fit([block.device] * len(train), [block.family] * len(train), block.eta[train])
    preds, flag = _predict_target(model, const, block, test)
    return _scored(block, test, "target", f"fold {f}", preds, extrapolated={"extrapolated": flag}).assign(fold=f)


def evaluate_target(blocks: dict, learner: dict, folds: int, seed: int, devices=None, jobs: int = 1,
                    progress=None) -> pd.DataFrame:
    """Grouped K-fold within each (device, family) block; one scored row per test row. jobs: fits at once;
    progress: a tqdm-like factory for a bar over the fits (run_fits), or None."""
    tasks = []
    for (device, family), block in sorted(blocks.items()):
        if devices is not None and device not in devices:
            continue
        k = min(folds, len(np.unique(block.groups)))
        if k < 2:
            continue
        fold = group_folds(block.groups, k, seed)
        tasks += [partial(_target_fold, block, fold, f, learner) for f in range(k)]
    out = run_fits(tasks, jobs, progress, "target tier folds")
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def training_devices(blocks: dict, family: str, exclude=()) -> list[str]:
    """The GPUs whose rows of `family` a cross-tier model trains on: every one with data not in exclude."""
    return sorted(d for d, f in blocks if f == family and d not in exclude)


def cross_training_set(blocks: dict, family: str, exclude, cap: int, seed: int):
    """Stacked cross-tier features and η of every GPU of `family` not in exclude, each capped."""
    xs, etas, devices = [], [], []
    for device in training_devices(blocks, family, exclude):
        block = blocks[(device, family)]
        idx = _sample(len(block.rows), cap, seed)
        xs.append(block.x["cross"][idx])
        etas.append(block.eta[idx])
        devices += [device] * len(idx)
    if not xs:
        return None, None, []
    return np.vstack(xs), np.concatenate(etas), devices


def holdout_protocols(blocks: dict, family: str, extra: dict) -> list[tuple[str, str, tuple]]:
    """(split name, held-out GPU, GPUs excluded from training): LODO for all, plus the named extras."""
    devices = sorted(d for d, f in blocks if f == family)
    out = [(f"lodo {d}", d, (d,)) for d in devices]
    for name, spec in sorted(extra.items()):
        if spec["test"] in devices:
            out.append((name, spec["test"], tuple(sorted(set(spec["exclude"]) | {spec["test"]}))))
    return out


def fit_block(block: Block, learner: dict) -> EtaRegressor:
    """One (device, family) target model on the whole block, with its provenance: what a bundle holds."""
    provenance = {"devices": {block.device: len(block.rows)}, "sweeps": block.sweeps} if block.sweeps else None
    return EtaRegressor(block.family, "target", block.device, **learner).fit(block.x["target"], block.eta,
                                                                             provenance)


def target_models(blocks: dict, keys, learner: dict, jobs: int = 1, fitted: dict | None = None,
                  progress=None) -> dict:
    """The whole-block target models (fit_block) of `keys`, each fitted once: those already in `fitted` are
    reused and the new ones added to it (the die-sibling transfer, the other-sources check and the bundle
    share them)."""
    fitted = {} if fitted is None else fitted
    missing = sorted(set(keys) - set(fitted))
    tasks = [partial(fit_block, blocks[key], learner) for key in missing]
    fitted.update(zip(missing, run_fits(tasks, jobs, progress, "target models")))
    return {key: fitted[key] for key in keys}


def _cross_split(blocks: dict, family: str, split: str, test_device: str, exclude: tuple, learner: dict,
                 cap: int, seed: int, sibling_models: dict) -> pd.DataFrame | None:
    x, eta, train_devices = cross_training_set(blocks, family, exclude, cap, seed)
    if x is None:
        return None
    model = EtaRegressor(family, "cross", None, **learner).fit(x, eta)
    const = ConstantEtaBaseline().fit(train_devices, [family] * len(eta), eta)
    block = blocks[(test_device, family)]
    hw = load_hardware(test_device)
    siblings = [(load_hardware(d), sibling_models[(d, family)])
                for d in die_siblings(hw, training_devices(blocks, family, exclude))]
    path = {floor: cross_eta(family, block.cols, hw, block.roof, model.model_, siblings, floor=floor)
            for floor in (True, False)}
    idx = np.arange(len(block.rows))
    alone, alone_flag = model.model_.eta(np.ascontiguousarray(block.x["cross"], dtype=np.float64))
    preds = {"lightgbm": path[True]["eta"], DIAGNOSTIC: path[False]["eta"], NO_SIBLING: alone,
             **_baselines(const, block, len(idx))}
    flags = {"extrapolated": path[True]["extrapolated"], "extrapolated_no_sibling": alone_flag}
    return _scored(block, idx, "cross", split, preds, path[True]["sibling"], path[True]["model"] == ROOFLINE,
                   flags).assign(fold=-1)


def evaluate_cross(blocks: dict, learner: dict, cap: int, seed: int, extra: dict, devices=None,
                   jobs: int = 1, fitted: dict | None = None, progress=None) -> pd.DataFrame:
    """Leave-one-device-out (and the extra hold-out protocols) per family on the cross tier: what the
    predictor's cross path does for a GPU it has no data of (predictor/transfer.py: die siblings among
    the training GPUs where their target models cover the kernel, the LightGBM cross model for the rest).
    jobs: fits at once; fitted: whole-block target models to reuse and add to (target_models); progress: a
    tqdm-like factory for bars over the fits, or None."""
    splits, needed = [], set()
    for family in sorted({f for _, f in blocks}):
        for split, test_device, exclude in holdout_protocols(blocks, family, extra):
            if devices is not None and test_device not in devices:
                continue
            splits.append((family, split, test_device, exclude))
            train = training_devices(blocks, family, exclude)
            needed |= {(d, family) for d in die_siblings(load_hardware(test_device), train)}
    # siblings' target models on their whole block, as a bundle holds them
    sibling_models = {key: m.model_ for key, m in target_models(blocks, needed, learner, jobs, fitted,
                                                                 progress).items()}
    out = run_fits([partial(_cross_split, blocks, *s, learner, cap, seed, sibling_models) for s in splits], jobs,
                   progress, "cross tier splits")
    out = [o for o in out if o is not None]
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


# Families whose dominant field counts tokens: their rows of at most this many are decode-sized, scored apart.
TOKEN_FIELDS = ("m", "tokens")
DECODE_SIZED = 64


def other_source_rows(raw: pd.DataFrame, kept: pd.DataFrame, exclude_sweeps=()) -> pd.DataFrame:
    """Per (device, family) of the kept rows: the GPU's usable rows (rules 1-3) of that family and of the kept
    providers that other sources timed."""
    usable = raw[unusable(raw, exclude_sweeps).isna()]
    parts = [usable[(usable["device"] == device) & (usable["family"] == family)
                    & ~usable["source"].isin(part["source"].unique())
                    & usable["provider"].isin(part["provider"].unique())]
             for (device, family), part in kept.groupby(["device", "family"], sort=True)]
    return pd.concat(parts) if parts else raw.iloc[:0]


def evaluate_other_sources(blocks: dict, rows: pd.DataFrame, learner: dict, cap: int, seed: int, devices=None,
                           jobs: int = 1, fitted: dict | None = None, progress=None) -> pd.DataFrame:
    """The target model of each block that `rows` (other_source_rows, with η) has rows for, fitted on the whole
    block (target_models, reusing `fitted`), scored on them: one scored row per row, split 'other <source>',
    band the dominant size."""
    keys = sorted(k for k in set(zip(rows["device"], rows["family"])) & set(blocks)
                  if devices is None or k[0] in devices)
    out = []
    for (device, family), model in target_models(blocks, keys, learner, jobs, fitted, progress).items():
        block = blocks[(device, family)]
        const = ConstantEtaBaseline().fit([device] * len(block.rows), [family] * len(block.rows), block.eta)
        part = rows[(rows["device"] == device) & (rows["family"] == family)]
        for source, src in part.groupby("source", sort=True):
            other = build_blocks(src, cap, seed)[(device, family)]
            idx = np.arange(len(other.rows))
            scored = _scored(other, idx, "target", f"other {source}", _predict_target(model, const, other, idx)[0])
            small = scored["dominant"] <= DECODE_SIZED
            band = np.where(small, f"<= {DECODE_SIZED}", f"> {DECODE_SIZED}")
            token_count = get_family(family).dominant in TOKEN_FIELDS
            out.append(scored.assign(band=band if token_count else "all", fold=-1))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _ape(pred: pd.Series, meas: pd.Series) -> np.ndarray:
    return (np.abs(pred.to_numpy() - meas.to_numpy()) / meas.to_numpy()) * 100.0


def metrics(scored: pd.DataFrame, by=("tier", "split", "family", "device")) -> pd.DataFrame:
    """Per group and model: rows, MAPE, median and p90 absolute percentage error (percent)."""
    rows = []
    if scored.empty:
        return pd.DataFrame(columns=[*by, "model", "rows", "mape", "median_ape", "p90_ape", "sibling_pct"])
    for key, part in scored.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        for model in (*MODELS, *DIAGNOSTICS):
            column = f"pred_{model}"
            if column not in part or part[column].isna().all():  # a diagnostic of the other tier
                continue
            ape = _ape(part[column], part["latency_ms"])
            rows.append({**dict(zip(by, key)), "model": model, "rows": len(part), "mape": float(ape.mean()),
                         "median_ape": float(np.median(ape)), "p90_ape": float(np.percentile(ape, 90)),
                         "sibling_pct": float(100.0 * part["sibling"].mean()) if "sibling" in part else 0.0})
    return pd.DataFrame(rows)


def headline(scored: pd.DataFrame) -> pd.DataFrame:
    """Per tier and family, pooled over devices (cross: over the LODO folds only): MAPE of each model."""
    if scored.empty:
        return pd.DataFrame()
    pooled = scored[(scored["tier"] == "target") | scored["split"].str.startswith("lodo ")]
    m = metrics(pooled.assign(split="all", device="all"))
    return m.pivot_table(index=["tier", "family"], columns="model", values="mape").reset_index()


def repeat_measurements(raw: pd.DataFrame, kept: pd.DataFrame, exclude_sweeps=()) -> pd.DataFrame:
    """Per (device, family, other sweep of the same source): the kept rows whose kernel (provider and every
    shape field) that sweep timed too, and the APE of its latency against the kept one (a shape timed
    several times in one sweep counts at its median). Only the other sweep's usable rows count
    (rows.unusable: status ok, not throttled, not an excluded sweep)."""
    usable = raw[unusable(raw, exclude_sweeps).isna()]
    out = []
    for (device, family), part in kept.groupby(["device", "family"], sort=True):
        others = usable[(usable["device"] == device) & (usable["family"] == family)
                        & usable["source"].isin(part["source"].unique())
                        & ~usable["sweep_id"].isin(part["sweep_id"].unique())]
        if others.empty:
            continue
        keys = ["provider", *(f.name for f in get_family(family).fields)]
        mine = _median_latency(part, keys).reset_index()
        timed = _median_latency(others, ["sweep_id", *keys]).reset_index()
        for sweep_id, theirs in timed.groupby("sweep_id", sort=True):
            both = mine.merge(theirs, on=keys, suffixes=("", "_other"))
            if both.empty:
                continue
            ape = _ape(both["latency_ms_other"], both["latency_ms"])
            out.append({"device": device, "family": family, "kept sweeps": ", ".join(sorted(part["sweep_id"].unique())),
                        "other sweep": sweep_id, "rows": len(both), "mape": float(ape.mean()),
                        "median_ape": float(np.median(ape)), "p90_ape": float(np.percentile(ape, 90))})
    return pd.DataFrame(out, columns=["device", "family", "kept sweeps", "other sweep", "rows", "mape",
                                      "median_ape", "p90_ape"])


def _median_latency(df: pd.DataFrame, keys: list) -> pd.Series:
    """Median latency per kernel (grouped by `keys`); missing shape fields as a sentinel so they match."""
    return df.assign(**{k: df[k].astype(object).where(df[k].notna(), "-") for k in keys}).groupby(
        keys, sort=True, dropna=False)["latency_ms"].median().rename("latency_ms")
