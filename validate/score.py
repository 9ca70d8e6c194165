"""Scoring the simulator against real serving runs (a validation CSV), tier by tier.

1. load_validation reads and checks the CSV (rows.py), maps each row to a
   model config and a TP layout, and checks the protocol and the fit settings;
   every row's mapping, layout and dtypes are checked before any row runs,
   and a row that cannot run is refused with its reason (the others run);
2. per tier (parse_tiers: target, the shipped η bundle with H100 kernel data;
   cross-device, a bundle fitted without every H100 row, cross_bundle.py),
   score_tier simulates every row as a closed loop (run.py; rows in parallel
   processes) and keeps its step log (store.py: on disk as each row finishes,
   reused by a later run with the same settings);
3. it scores the host terms of the engine profile (composition.py): the
   shipped values as simulated (fitted on every row: in-sample) and refitted
   leave-one-model-out (held-out), exactly, from the step logs; with
   candidate frontend delays (fit.frontend), the first tier simulates every row
   at each and picks one per scheduling mode, on every row (as simulated) and
   without each model (held out; choose_frontend), the other tiers reuse the picks;
4. score combines the tiers with their errors and each row's TPOT floor.
`kernelsight validate` (cli/validate.py) writes the report, plots and table.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError, did_you_mean, whole_number
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.predict import TIERS as PREDICTOR_TIERS
from kernelsight.predictor.predict import Predictor
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.engine_profile import EngineProfile, delay_label
from kernelsight.sim.memory import memory_plan
from kernelsight.sim.pricing import StepPricer
from kernelsight.sim.schema import Spec, check, plain

from . import composition as comp
from . import report as rep
from . import serving_error
from .cross_bundle import resolve_bundle
from .rows import ModelMapping, model_for, parallel_for, parse_mappings, read_rows, throughput, with_protocol
from .run import RunSettings, Tier, deployment_engine, first_token_group, group_row, refusals, simulate_rows
from .store import bundle_manifest


@dataclass(frozen=True)
class Validation:
    """The rows to validate, their model configs, the engine profile, protocol and what the host fit uses."""

    csvs: list
    rows: list
    models: list
    mappings: list[ModelMapping]
    engine: EngineProfile
    settings: RunSettings
    params: list[str]            # host terms fitted
    metrics: list[str]           # metrics they are fitted on
    num_requests: int | None     # requests per row instead of the protocol's rounds
    refused: tuple = ()          # (row, reason) of each row that cannot be simulated
    frontends: tuple = ()        # candidate frontend delays (latency_ms, jitter_ms); () the profile's own
    frontend_modes: tuple = ()   # scheduling modes ("sync", "async") whose delay is picked among them

    @cached_property
    def asynchronous(self) -> np.ndarray:
        """Per row: whether its engine schedules asynchronously (its release and deployment decide)."""
        return np.asarray([deployment_engine(self.settings.engine, group_row(r))["host"]["async_scheduling"]
                           for r in self.rows], dtype=bool)

    def candidate(self, index: int) -> RunSettings:
        """The protocol with frontend candidate `index` in both scheduling modes."""
        latency, jitter = self.frontends[index]
        frontend = {**self.settings.engine["frontend"], "latency_ms": latency, "jitter_ms": jitter,
                    "async_latency_ms": latency, "async_jitter_ms": jitter}
        return replace(self.settings, engine={**self.settings.engine, "frontend": frontend})

    def pick_label(self, index: int | None, asynchronous: bool) -> str:
        """The delay of candidate `index`, or (None) the profile's own delay in that scheduling mode."""
        if index is None:
            return f"profile {delay_label(self.engine.frontend.delay_ms(asynchronous))}"
        return delay_label(self.frontends[index])

    @property
    def measured(self) -> np.ndarray:
        """(rows, 2): measured TTFT and TPOT in ms."""
        return np.asarray([[r.ttft_ms, r.tpot_ms] for r in self.rows])

    @property
    def devices(self) -> list[str]:
        return sorted({r.device for r in self.rows})


def load_validation(csvs, lines: list | None, mappings: list, engine: dict, protocol: dict, seed: int,
                    fit: dict) -> Validation:
    """The rows of one CSV or a list of them (only data rows `lines` of a single CSV when given) under the
    protocol, each mapped to a model config and checked (run.refusals) before any is simulated. A row that
    cannot run is refused with its reason, naming the file and the row; the others run (every row refused:
    one error)."""
    csvs = [Path(c) for c in (csvs if isinstance(csvs, (list, tuple)) else [csvs])]
    if len({c.stem for c in csvs}) != len(csvs):
        raise KernelsightError(f"csv: two validation sets share a file name ({', '.join(map(str, csvs))}); "
                               f"rows are told apart by it")
    if lines is not None and (isinstance(lines, (str, bytes)) or not isinstance(lines, (list, tuple))):
        raise KernelsightError(f"rows={lines!r}: must be a list of 1-based data rows, e.g. [1,2,3] (or "
                               f"'<set>:<row>' strings with several CSVs), or null (all)")
    num_requests = protocol.get("num_requests")
    if num_requests is not None:
        whole_number(num_requests, "protocol.num_requests", hint="requests per row; null: the protocol's rounds")
    rows = [r for csv in csvs for r in read_rows(csv)]
    if lines is not None:
        wanted = {_selected(x, csvs) for x in lines}
        missing = sorted(wanted - {(r.set, r.line) for r in rows})
        if missing:
            raise KernelsightError(f"rows: {missing[0][0]}.csv has no data row {missing[0][1]}")
        rows = [r for r in rows if (r.set, r.line) in wanted]
    parsed = parse_mappings(mappings)
    profile = EngineProfile.from_mapping(engine, "engine config")
    settings = RunSettings.from_protocol(protocol, seed, engine)
    mapped, refused = [], []
    for row in (with_protocol(r, parsed) for r in rows):
        try:
            mapped.append((row, model_for(row, parsed, f"{_file(csvs, row)}: row {row.line}")))
        except KernelsightError as e:
            refused.append((row, str(e)))
    problems = refusals([r for r, _ in mapped], [m for _, m in mapped], engine)
    refused += [(r, f"{_file(csvs, r)}: row {r.line}: {problems[r.key]}") for r, _ in mapped if r.key in problems]
    kept = [(r, m) for r, m in mapped if r.key not in problems]
    if not kept:
        raise KernelsightError(f"every row refused; {refused[0][1]}")
    return Validation(csvs, [r for r, _ in kept], [m for _, m in kept], parsed, profile, settings,
                      list(fit["params"]), list(fit["metrics"]), num_requests,
                      tuple(sorted(refused, key=lambda x: (csvs.index(_file(csvs, x[0])), x[0].line))),
                      *parse_frontend_fit(fit.get("frontend")))


MODES = ("sync", "async")


def parse_frontend_fit(section) -> tuple[tuple, tuple]:
    """fit.frontend: {candidates: [{latency_ms, jitter_ms}, ...], modes: [sync and/or async]} (null: no choice,
    every row runs at the profile's delay), checked; as ((latency_ms, jitter_ms) pairs, modes)."""
    if section is None:
        return (), ()
    value = plain(section)
    if not isinstance(value, dict) or set(value) != {"candidates", "modes"}:
        raise KernelsightError(f"fit.frontend={value!r}: expected {{candidates: [{{latency_ms, jitter_ms}}, ...], "
                               f"modes: [sync, async]}}, or null")
    entries, modes = value["candidates"], value["modes"]
    if isinstance(entries, (str, bytes)) or not isinstance(entries, (list, tuple)) or not entries:
        raise KernelsightError(f"fit.frontend.candidates={entries!r}: must be a non-empty list of {{latency_ms, "
                               f"jitter_ms}}, e.g. [{{latency_ms: 5, jitter_ms: 10}}, {{latency_ms: 0, jitter_ms: 0}}]")
    if isinstance(modes, (str, bytes)) or not isinstance(modes, (list, tuple)) or not modes or \
            any(m not in MODES for m in modes):
        raise KernelsightError(f"fit.frontend.modes={modes!r}: must be a non-empty list of {', '.join(MODES)}")
    out = []
    for i, entry in enumerate(entries):
        got = check(entry, {"latency_ms": Spec("nonneg"), "jitter_ms": Spec("nonneg")}, "validate config",
                    f"fit.frontend.candidates[{i}].")
        out.append((got["latency_ms"], got["jitter_ms"]))
    if len(set(out)) != len(out):
        raise KernelsightError(f"fit.frontend.candidates: {delay_label(next(c for c in out if out.count(c) > 1))} "
                               f"is listed twice")
    return tuple(out), tuple(m for m in MODES if m in modes)


def choose_frontend(errors: np.ndarray, asynchronous: np.ndarray, groups: list[str], eligible=None,
                    modes_fitted=MODES) -> dict:
    """Frontend candidate per scheduling mode: errors [rows, candidates] are each row's absolute relative TTFT
    error at each candidate. Returns {"all rows": {mode: index}, group: {mode: index}, ...}: per mode
    ("sync", "async") of modes_fitted, the candidate with the lowest median error over that mode's eligible
    rows (default all; validate leaves out rows queueing for KV capacity, whose TTFT a few ms of delay cannot
    move), of every group ("all rows") and of every group but one (that group's held-out pick); the first
    candidate where a mode has no rows to choose on. A mode not fitted: None (the profile's own delay)."""
    groups = np.asarray(groups)
    modes = np.where(asynchronous, "async", "sync")
    if eligible is not None:
        modes = np.where(eligible, modes, "")

    def pick(mode: str, mask: np.ndarray) -> int | None:
        if mode not in modes_fitted:
            return None
        mask = mask & (modes == mode)
        return int(np.argmin(np.median(errors[mask], axis=0))) if mask.any() else 0

    everyone = np.ones(len(groups), dtype=bool)
    out = {"all rows": {m: pick(m, everyone) for m in MODES}}
    for g in sorted(set(groups.tolist())):
        out[g] = {m: pick(m, groups != g) for m in MODES}
    return out



def _selected(x, csvs: list) -> tuple[str, int]:
    """(set, line) of one `rows` entry: a 1-based data row of the only CSV, or '<set>:<row>'."""
    if isinstance(x, str) and ":" in x:
        name, _, line = x.partition(":")
        if name not in {c.stem for c in csvs}:
            raise KernelsightError(f"rows: {x!r} names no validation set; sets: {', '.join(c.stem for c in csvs)}")
        number = int(line) if line.strip().isdigit() else line
        return name, whole_number(number, f"rows: {x!r}: row", hint="'<set>:<1-based data row>'")
    if len(csvs) > 1:
        raise KernelsightError(f"rows: {x!r} is ambiguous over {len(csvs)} validation sets; write "
                               f"'<set>:<row>' (e.g. '{csvs[0].stem}:{x}') or pass one csv=")
    return csvs[0].stem, whole_number(x, "rows", hint="1-based data rows")


def _file(csvs: list, row) -> Path:
    return next(c for c in csvs if c.stem == row.set)


def excluded(exclude: dict, device: str) -> list[str]:
    """The GPUs the bundle of `device`'s rows is fitted without (a parse_tiers mapping)."""
    return exclude.get(device) or exclude.get("*") or [device]


def parse_tiers(tiers: dict) -> list[tuple[Tier, dict]]:
    """(Tier, {validated GPU: GPUs its bundle is fitted without}) per configured tier (a null tier is skipped).
    exclude_devices is that mapping, or one list for every GPU; a GPU the mapping does not name is fitted
    without itself alone."""
    out = []
    for name, spec in tiers.items():
        if spec is None:
            continue
        unknown = set(spec) - {"predictor_tier", "bundle", "exclude_devices"}
        if unknown:
            raise KernelsightError(f"tiers.{name}: unknown key {sorted(unknown)[0]!r}; known: predictor_tier, "
                                   f"bundle, exclude_devices")
        predictor_tier = str(spec.get("predictor_tier", "auto"))
        if predictor_tier not in PREDICTOR_TIERS:
            raise KernelsightError(f"tiers.{name}.predictor_tier={predictor_tier!r}: choose one of "
                                   f"{', '.join(PREDICTOR_TIERS)}{did_you_mean(predictor_tier, PREDICTOR_TIERS)}")
        raw = spec.get("bundle")
        bundle = raw if raw is not None and "{device}" in str(raw) else resolve_bundle(raw)
        exclude = spec.get("exclude_devices") or {}
        if isinstance(exclude, (list, tuple)):
            exclude = {"*": list(exclude)}
        if not isinstance(exclude, dict) or not all(isinstance(v, (list, tuple)) for v in exclude.values()):
            raise KernelsightError(f"tiers.{name}.exclude_devices: a list of GPUs, or a mapping of validated GPU to "
                                   f"such a list")
        if exclude and bundle is None:
            raise KernelsightError(f"tiers.{name}: exclude_devices needs a bundle path to build and cache")
        if "*" not in exclude and exclude and "{device}" not in str(bundle):
            raise KernelsightError(f"tiers.{name}: exclude_devices per GPU needs one bundle per GPU: a bundle name "
                                   f"with '{{device}}', e.g. no_{{device}}")
        out.append((Tier(name, predictor_tier, bundle), {k: list(v) for k, v in exclude.items()}))
    if not out:
        raise KernelsightError("tiers: nothing to validate (every tier is null)")
    return out


@dataclass
class TierScore:
    """One tier's per-row table, its host-term fits (all rows, and per left-out model), frontend picks
    (choose_frontend's; None without candidates), warnings, timing."""

    frame: pd.DataFrame
    fits: dict
    warnings: list[str]
    timing: str
    frontend: dict | None = None


def score_tier(v: Validation, tier: Tier, processes: int, progress=None, store=None,
               intervals: bool = False, picks: dict | None = None) -> TierScore:
    """Simulate every row in `tier` and score it as simulated and with the host terms held out. progress: a
    tqdm-like factory for a bar over the rows, or None; store: a store.RowStore that keeps each row's
    simulation as it finishes and gives back those of an earlier run with the same settings. intervals:
    simulate every row again with each kernel at the low and at the high end of its 80 % interval
    (Tier.at_band); the table gets each metric's simulated range (<metric>_lo, <metric>_hi, host terms as
    simulated) and whether the measured value fell inside (<metric>_inside). With frontend candidates
    (v.frontends): picks, choose_frontend's answer of an earlier tier (None: every row is simulated at every
    candidate and the picks are made here, on this tier's TTFT); a row is simulated as simulated at the
    "all rows" pick of its scheduling mode and held out at its own model's pick."""
    t0 = time.perf_counter()
    measured, groups = v.measured, [r.model_path for r in v.rows]
    modes = np.where(v.asynchronous, "async", "sync")
    if not v.frontends:
        wanted = [{None}] * len(v.rows)
    elif picks is None:
        wanted = [set(range(len(v.frontends))) if m in v.frontend_modes else {None} for m in modes]
    else:
        wanted = [{p[m] for p in picks.values()} for m in modes]
    jobs = [(i, c) for i, cands in enumerate(wanted) for c in sorted(cands, key=lambda c: -1 if c is None else c)]
    reused = store.reused if store is not None else 0
    logs_at = dict(zip(jobs, _simulate(v, tier, jobs, processes, progress, f"validate ({tier.name} tier)", store)))
    wall = time.perf_counter() - t0
    reused = (store.reused if store is not None else 0) - reused
    steps = sum(len(log.gpu_s) for log in logs_at.values())
    loop_s = sum(log.wall_s for log in logs_at.values())
    timing = (f"tier {tier.name}: {len(v.rows)} rows in {len(jobs)} simulations"
              + (f" ({reused} reused from an earlier run)" if reused else "")
              + f", {steps:,} engine steps in {wall:.0f} s wall ({loop_s:.0f} s in the event loops when simulated, "
              f"{steps / max(loop_s, 1e-9):,.0f} steps/s per process, {processes} processes)")
    warned = sorted({w for log in logs_at.values() for w in log.warnings})
    masks_at = {(i, c): comp.measured_requests(log, group_row(v.rows[i]).concurrency, v.settings.warmup_rounds)
                for (i, c), log in logs_at.items()}
    lins_at = {key: comp.linearize(log, v.engine.host, masks_at[key]) for key, log in logs_at.items()}
    # rows queueing for KV capacity: waiting makes their latencies, so they inform neither the host terms nor the delay
    eligible = ~rep.queueing(measured[:, 0], [f"{r.model_path} {r.precision}" for r in v.rows])
    if v.frontends and picks is None:
        errors = np.asarray([[abs(lins_at[i, c].ttft0 / measured[i, 0] - 1) if (i, c) in lins_at else np.nan
                              for c in range(len(v.frontends))] for i in range(len(v.rows))])
        picks = choose_frontend(errors, v.asynchronous, groups, eligible=eligible, modes_fitted=v.frontend_modes)

    def at(key) -> list:
        """Each row's candidate under the picks of `key` ("all rows" or a model)."""
        return [picks[key][m] if picks else None for m in modes]

    lins = [lins_at[i, c] for i, c in enumerate(at("all rows"))]
    simulated = comp.predict(lins, {})
    own = [picks[g][m] if picks else None for g, m in zip(groups, modes)]  # each row at its model's held-out pick
    if len(set(groups)) > 1:
        heldout, thetas = comp.leave_one_group_out(
            lins, measured, groups, v.params, v.metrics,
            fold_lins={g: [lins_at[i, c] for i, c in enumerate(at(g))] for g in set(groups)} if picks else None,
            train=eligible)
    else:
        heldout, thetas = np.full_like(simulated, np.nan), {}
    fits = {"all rows": comp.fit([lin for lin, x in zip(lins, eligible) if x], measured[eligible], v.params,
                                 v.metrics), **thetas}
    exposed = [r.key for r, lin in zip(v.rows, lins) if not all(lin.hidden(theta) for theta in ({}, *fits.values()))]
    if exposed:  # an asynchronous row scored as it ran although a fitted host term outlasts a GPU step
        warned.append(f"rows {', '.join(map(str, exposed))}: async scheduling, but the fitted host terms outlast "
                      f"some steps' GPU time; scored as if hidden")
    keys = list(enumerate(own))
    frame = _frame(v, tier, [logs_at[k] for k in keys], [masks_at[k] for k in keys], simulated, heldout)
    if v.frontends:
        frame["frontend"] = [v.pick_label(c, m == "async") for c, m in zip(own, modes)]
    if intervals and tier.predictor_tier != "roofline":
        if all(bundle_manifest(tier.on(device)).get("intervals") for device in v.devices):
            ends = [_simulated(v, tier.at_band(band), keys, processes, progress, store) for band in BANDS]
            for kind, values in _interval_columns(frame, *ends).items():
                frame[kind] = values
        else:
            warned.append("its η bundle holds no kernel intervals (published without its evaluation), so its "
                          "rows have no kernel range")
    return TierScore(frame, fits, warned, timing, picks)


BANDS = ("p10", "p90")
INTERVAL_METRICS = ("ttft", "tpot", "throughput")


def _simulate(v: Validation, tier: Tier, jobs: list[tuple], processes: int, progress, desc: str, store) -> list:
    """Step logs of (row index, frontend candidate or None: the profile's own) jobs in `tier`; a candidate's
    rows are kept apart in the store (their own tier name)."""
    out = []
    for i, c in jobs:
        settings, named = v.settings, tier
        if c is not None:
            settings = v.candidate(c)
            named = replace(tier, name=f"{tier.name}-frontend{v.frontends[c][0]:g}-{v.frontends[c][1]:g}")
        row = v.rows[i]
        out.append((row, v.models[i], named.on(row.device), settings, v.num_requests))
    return simulate_rows(out, processes, progress, desc, store)


def _simulated(v: Validation, tier: Tier, keys: list[tuple], processes: int, progress=None,
               store=None) -> np.ndarray:
    """rows x (TTFT ms, TPOT ms) of every row simulated in `tier` at its frontend candidate (keys: (row
    index, candidate) per row), host terms as simulated."""
    logs = _simulate(v, tier, keys, processes, progress, f"validate ({tier.name})", store)
    masks = [comp.measured_requests(log, group_row(r).concurrency, v.settings.warmup_rounds)
             for r, log in zip(v.rows, logs)]
    return comp.predict([comp.linearize(log, v.engine.host, mask) for log, mask in zip(logs, masks)], {})


def _interval_columns(frame: pd.DataFrame, low: np.ndarray, high: np.ndarray) -> dict:
    """Each metric's simulated range over the two interval ends and whether the measured value is inside."""
    out = {}
    ends = {"ttft": (low[:, 0], high[:, 0]), "tpot": (low[:, 1], high[:, 1])}
    ends["throughput"] = tuple(throughput(frame["concurrency"], frame["osl"], ttft, tpot).to_numpy(dtype=float)
                               for ttft, tpot in zip(ends["ttft"], ends["tpot"]))
    for metric in INTERVAL_METRICS:
        a, b = ends[metric]
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        measured = frame[metric].to_numpy(dtype=float)
        out[f"{metric}_lo"], out[f"{metric}_hi"] = lo, hi
        out[f"{metric}_inside"] = (measured >= lo) & (measured <= hi)
    return out


def _frame(v: Validation, tier: Tier, logs, masks, simulated: np.ndarray, heldout: np.ndarray) -> pd.DataFrame:
    rows, measured = v.rows, v.measured
    frame = pd.DataFrame({
        "tier": tier.name, "set": [r.set for r in rows], "line": [r.line for r in rows],
        "row_id": [r.row_id for r in rows],
        "model_path": [r.model_path for r in rows], "precision": [r.precision for r in rows],
        "model": [m.name for m in v.models], "model_label": [f"{r.model_path.split('/')[-1]} {r.precision}"
                                                             for r in rows],
        "device": [r.device for r in rows], "tp": [r.tp for r in rows], "layout": [parallel_for(r, m).name for r, m in zip(rows, v.models)],
        "concurrency": [r.concurrency for r in rows],
        "band": [r.band for r in rows], "isl": [r.isl for r in rows], "osl": [r.osl for r in rows],
        "ttft": measured[:, 0], "tpot": measured[:, 1],
        "throughput": [r.throughput for r in rows],
        "ttft_simulated": simulated[:, 0], "tpot_simulated": simulated[:, 1],
        "ttft_heldout": heldout[:, 0], "tpot_heldout": heldout[:, 1],
        "requests": [len(log.request_id) for log in logs],
        "measured_requests": [int(mask.sum()) for mask in masks],
        "first_token_group": [first_token_group(log, mask) for log, mask in zip(logs, masks)],
        "steps": [len(log.gpu_s) for log in logs], "kv_blocks": [log.kv_blocks for log in logs],
        "preemptions": [log.summary.get("preemptions", 0) for log in logs],
        "wall_s": [log.wall_s for log in logs]})
    for kind in rep.KINDS:
        frame[f"throughput_{kind}"] = throughput(frame["concurrency"], frame["osl"], frame[f"ttft_{kind}"],
                                                 frame[f"tpot_{kind}"])
    return frame


def score(v: Validation, tiers: list[tuple[Tier, list]], processes: int, progress=None,
          store=None, intervals: bool = False) -> tuple[pd.DataFrame, list[TierScore]]:
    """Every tier's rows in one table, with errors and each row's TPOT floor; and the per-tier scores.
    progress, store, intervals: see score_tier."""
    scores, picks = [], None
    for tier, _ in tiers:   # frontend picks are made on the first tier and kept for the others
        scores.append(score_tier(v, tier, processes, progress, store, intervals, picks))
        picks = scores[-1].frontend
    df = serving_error.add_heldout_ranges(rep.add_errors(pd.concat([s.frame for s in scores], ignore_index=True)))
    df["tpot_floor"] = np.tile(tpot_floor(v.rows, v.models, v.engine), len(tiers))
    return df, scores


def refused_frame(v: Validation) -> pd.DataFrame:
    """The refused rows as table rows: what identifies them, the measurement and the reason (`refused`)."""
    cols = {"set": "set", "line": "line", "row_id": "row_id", "model_path": "model_path", "precision": "precision", "tp": "tp",
            "concurrency": "concurrency", "isl": "isl", "osl": "osl", "ttft": "ttft_ms", "tpot": "tpot_ms"}
    return pd.DataFrame([{**{c: getattr(r, a) for c, a in cols.items()}, "refused": why} for r, why in v.refused],
                        columns=[*cols, "refused"])


def tpot_floor(rows, models, engine: EngineProfile) -> list[float]:
    """η = 1 kernel time (ms) of the closed loop's average step: n clients decoding at the mean KV length
    isl + osl / 2 (n = concurrency, or as many as the KV cache holds at that length) plus the
    n x isl / osl prompt tokens prefilled per output token. No overhead, perfect kernels: a measured
    TPOT below it cannot come from the simulated setup."""
    pricers, out = {}, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row, model in zip(rows, models):
            key = (row.device, row.tp, row.pp, row.attention_dp, row.moe_tp, row.moe_ep, model)
            if key not in pricers:
                hw, par = load_hardware(row.device), parallel_for(row, model)
                pricers[key] = (StepPricer(model, hw, engine, par, Predictor(hw, tier="roofline")),
                                memory_plan(model, hw, engine, par).kv_tokens)
            pricer, kv_tokens = pricers[key]
            context = row.isl + row.osl // 2
            n = max(1, min(-(-row.concurrency // row.attention_dp), kv_tokens // context))  # per attention group
            batch = StepBatch(prefill_new=(-(-n * row.isl // row.osl),), prefill_ctx=(0,), decode_ctx=(context,) * n)
            out.append(sum(k.total_s for k in pricer.kernels(batch)) * 1e3)
    return out
