"""The simulator against our own serving runs (`kernelsight bench serve`, data/validation/transformers).

A run directory holds, per workload, the requests as sent (<workload>_trace.csv), one measured row per
request (<workload>.parquet) and the workload's definition (workloads.json); run.json names the model and
GPU, engine.json what the engine resolved. Each workload is replayed in the simulator: the trace's arrival
times (Poisson) or its closed loop of `concurrency` clients, the same lengths and shared prefix, under an
engine profile (conf/engine/transformers_cb.yaml). Scored per workload: mean TTFT, mean TPOT and output
throughput: for Poisson workloads output tokens / (last finish - first send), as bench serve's summary.csv
computes it; for closed loops concurrency * osl / (TTFT + (osl - 1) * TPOT) from the means, the definition
`kernelsight validate` uses for the vLLM rows (measured, simulated and held-out alike).

Host terms (composition.py). A synchronous closed loop's step log is independent of step durations, so
its means are affine in the host terms: they are fitted on the closed-loop workloads of every run given.
Held out: with several runs (each one model on one GPU), every workload of a run is scored with the terms
fitted on the other runs' closed loops (leave-one-run-out: another model, or another GPU); with one run,
each closed loop with the terms fitted on the others (leave-one-workload-out) and the Poisson workloads,
never fitted on, with the terms fitted on every closed loop.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.paths import conf_dir, data_dir, read_yaml
from kernelsight.sim.engine_profile import EngineProfile
from kernelsight.sim.model import load_model
from kernelsight.sim.parallel import ParallelConfig
from kernelsight.sim.report import BreakdownAccumulator
from kernelsight.sim.run import Setup, build_setup
from kernelsight.sim.workload import WorkloadConfig

from . import composition as comp
from . import report as rep
from .rows import throughput
from .run import Recorder, step_log


ENERGY_METRICS = ("energy_per_token", "power")   # J per output token, mean W per GPU


@dataclass(frozen=True)
class ServeWorkloadRun:
    """One measured workload of a run: its definition, trace file and measured means."""

    name: str
    arrival: str
    concurrency: int | None
    rate: float | None
    shared_prefix: int
    osl: int
    trace: Path
    requests: int
    ttft_ms: float
    tpot_ms: float
    throughput: float  # output tokens per second
    output_tokens: int = 0
    energy_j: float = float("nan")      # NVML over the workload (bench serve on a GPU), NaN when not measured
    mean_power_w: float = float("nan")
    idle_power_w: float = float("nan")  # the engine idle, before the call's first workload


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise KernelsightError(f"{path}: not a readable bench serve record ({e})") from None


def load_run(run_dir) -> tuple[dict, list[ServeWorkloadRun]]:
    """(run.json, the measured workloads in definition order) of a bench serve run directory."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise KernelsightError(f"serve.run={run_dir}: no such run directory (kernelsight bench serve writes "
                               f"data/validation/transformers/<gpu>/<run_id>/)")
    env = _read_json(run_dir / "run.json")
    overrides = {k: v for k, v in (env.get("config", {}).get("model_overrides") or {}).items() if v is not None}
    if overrides:
        raise KernelsightError(f"{run_dir}: measured with model_overrides {overrides}; the simulator prices the "
                               f"shipped architecture only")
    out = []
    for name, record in _read_json(run_dir / "workloads.json").items():
        w = record.get("workload", {}) if isinstance(record, dict) else {}
        try:
            rows = pd.read_parquet(run_dir / f"{name}.parquet")
        except Exception as e:  # noqa: BLE001 - any unreadable file is one line
            raise KernelsightError(f"{run_dir / (name + '.parquet')}: not readable ({e})") from None
        missing = {"ttft_ms", "tpot_ms", "send_s", "finish_s", "output_len"} - set(rows.columns)
        if missing or rows.empty:
            raise KernelsightError(f"{run_dir / (name + '.parquet')}: no measured requests or missing columns "
                                   f"{sorted(missing)}")
        span = rows["finish_s"].max() - rows["send_s"].min()
        out.append(ServeWorkloadRun(
            name=name, arrival=str(w.get("arrival")), concurrency=w.get("concurrency"), rate=w.get("rate"),
            shared_prefix=int(w.get("shared_prefix", 0)), osl=int(w.get("osl", 0)),
            trace=run_dir / f"{name}_trace.csv", requests=len(rows),
            ttft_ms=float(rows["ttft_ms"].mean()), tpot_ms=float(rows["tpot_ms"].mean()),
            throughput=(throughput(w.get("concurrency"), int(w.get("osl", 0)), rows["ttft_ms"].mean(),
                                   rows["tpot_ms"].mean()) if w.get("arrival") == "closed_loop"
                        else float(rows["output_len"].sum() / span)),
            output_tokens=int(rows["output_len"].sum()), **_energy(record, run_dir, name)))
    if not out:
        raise KernelsightError(f"{run_dir}/workloads.json: no measured workloads")
    return env, out


def _energy(record: dict, run_dir: Path, name: str) -> dict:
    """A workload record's NVML reading as ServeWorkloadRun fields ({} when it has none); one clear line for a
    reading that is not positive joules and watts."""
    energy = record.get("energy") if isinstance(record, dict) else None
    if energy is None:
        return {}
    try:
        out = {k: float(energy[k]) for k in ("energy_j", "mean_power_w")}
        out["idle_power_w"] = float("nan") if energy.get("idle_power_w") is None else float(energy["idle_power_w"])
    except (TypeError, ValueError, KeyError) as e:
        raise KernelsightError(f"{run_dir}/workloads.json: workload {name}: energy is not an NVML reading of "
                               f"bench serve ({type(e).__name__}: {e})") from None
    if not (out["energy_j"] > 0 and out["mean_power_w"] > 0):
        raise KernelsightError(f"{run_dir}/workloads.json: workload {name}: energy_j and mean_power_w must be "
                               f"positive (got {out['energy_j']}, {out['mean_power_w']})")
    return out


def _setup(env: dict, w: ServeWorkloadRun, engine: dict, tier: dict) -> Setup:
    """The simulator setup replaying one workload: the run's model and GPU, the default layout, its trace."""
    cfg = env.get("config", {})
    workload = read_yaml(conf_dir() / "workload" / "trace.yaml", "workload")
    workload.update({"name": w.name, "trace_file": str(w.trace),
                     "max_concurrency": w.concurrency if w.arrival == "closed_loop" else None})
    parallel = read_yaml(conf_dir() / "parallel" / "default.yaml", "parallel")
    return build_setup(load_model(cfg.get("model", {}).get("name", "?")), load_hardware(env.get("device", "?")),
                       EngineProfile.from_mapping(engine, "engine config"),
                       ParallelConfig.from_mapping(parallel, "parallel config"), WorkloadConfig.from_config(workload),
                       tier=tier.get("tier", "auto"), bundle=tier.get("bundle"))


def simulate_workload(env: dict, w: ServeWorkloadRun, engine: dict, tier: dict, energy: bool = False):
    """(recorder, summary, setup) of one workload replayed in the simulator; energy: price the kernels'
    joules too (the summary's energy fields, sim/energy.py)."""
    setup = _setup(env, w, engine, tier)
    recorder = Recorder()
    sim = setup.new_engine(0, recorder=recorder, breakdown=BreakdownAccumulator() if energy else None)
    summary = sim.run(setup.workload.requests(None, 0))
    if summary["failed"]:
        raise KernelsightError(f"workload {w.name}: {summary['failed']} requests do not fit the simulated KV cache")
    if energy:
        summary.update(setup.energy(sim, summary))
    return recorder, summary, setup


def sim_metrics(summary: dict, w: ServeWorkloadRun) -> tuple[float, float, float]:
    """(mean TTFT ms, mean TPOT ms, output tokens/s) of a simulated run, as they are measured (the
    engine's summary: output tokens over first send to last finish for Poisson traffic)."""
    ttft, tpot = summary["mean_ttft_ms"], summary["mean_tpot_ms"]
    if w.arrival == "closed_loop":
        return ttft, tpot, throughput(w.concurrency, w.osl, ttft, tpot)
    return ttft, tpot, summary["output_throughput"]


def run_dirs(run) -> list[Path]:
    """serve.run as run directories: one path, a list of them, or 'all' (every run under
    data/validation/transformers/<gpu>/)."""
    if run == "all":
        found = sorted(p.parent for p in (data_dir() / "validation" / "transformers").glob("*/*/workloads.json"))
        if not found:
            raise KernelsightError("serve.run=all: no bench serve runs under data/validation/transformers/")
        return found
    runs = [run] if isinstance(run, (str, Path)) else list(run)
    if not runs:
        raise KernelsightError("serve.run: an empty list; give a run directory, a list of them, or all")
    return [Path(r) for r in runs]


def _label(run_dir: Path) -> str:
    """A run's name in tables: <gpu>/<run_id>."""
    return f"{run_dir.parent.name}/{run_dir.name}"


def validate_serve(runs, engine_map: dict, tier: dict, params, metrics, progress=None) -> tuple[pd.DataFrame, dict]:
    """Per-workload table of every run (measured, simulated with the profile's host terms, and held-out:
    see the module docstring) and the fitted terms. progress: a tqdm-like factory for a bar over the
    workloads, or None."""
    engine = EngineProfile.from_mapping(engine_map, "engine config")
    if engine.host.async_scheduling:
        raise KernelsightError("validate serve needs engine.host.async_scheduling=false (exact host-term fits)")
    loaded = [(_label(Path(r)), *load_run(r)) for r in runs]
    labels = [label for label, _, _ in loaded]
    if len(set(labels)) < len(labels):
        raise KernelsightError(f"serve.run: a run is given twice ({', '.join(labels)})")
    rows, lins, closed, replays = [], [], [], []  # replays: (run.json, workload) per row
    todo = [(label, env, w) for label, env, workloads in loaded for w in workloads]
    for label, env, w in progress(todo, desc="validate serve", unit="workload") if progress else todo:
        t0 = time.perf_counter()
        recorder, summary, setup = simulate_workload(env, w, engine_map, tier)
        ttft, tpot, thr = sim_metrics(summary, w)
        replays.append((env, w))
        rows.append({"run": label, "workload": w.name, "arrival": w.arrival, "concurrency": w.concurrency,
                     "rate": w.rate,
                     "shared_prefix": w.shared_prefix, "requests": w.requests,
                     "ttft": w.ttft_ms, "tpot": w.tpot_ms, "throughput": w.throughput,
                     "ttft_simulated": ttft, "tpot_simulated": tpot, "throughput_simulated": thr,
                     "prefix_hit_rate": summary.get("prefix_cache_hit_rate", np.nan),
                     "steps": len(recorder.steps), "wall_s": time.perf_counter() - t0,
                     **({"energy_per_token": w.energy_j / w.output_tokens, "power": w.mean_power_w,
                         "idle_power": w.idle_power_w} if np.isfinite(w.energy_j) else {})})
        if w.arrival == "closed_loop":
            log = step_log(recorder, summary, setup.num_blocks, 0.0, f"workload {w.name}")
            lins.append(comp.linearize(log, engine.host, np.ones(len(log.request_id), dtype=bool)))
            closed.append(len(rows) - 1)
    df = pd.DataFrame(rows)
    energy_cols = ("energy_per_token_heldout", "power_heldout", "energy_per_token_tdp", "power_tdp",
                   "idle_power_model") if "energy_per_token" in df else ()
    for col in ("ttft_heldout", "tpot_heldout", "throughput_heldout", *energy_cols):
        df[col] = np.nan
    if not lins:  # nothing to fit on: the profile's host terms only
        return rep.add_errors(df), {}  # energy needs the fitted terms: not scored
    measured = df.loc[closed, ["ttft", "tpot"]].to_numpy()
    theta = comp.fit(lins, measured, params, metrics)
    fits = {"all closed-loop workloads": theta}
    by_run = len(loaded) > 1
    groups = list(df.loc[closed, "run" if by_run else "workload"])
    thetas = {}
    if len(set(groups)) > 1:
        held, thetas = comp.leave_one_group_out(lins, measured, groups, params, metrics)
        fits.update({f"without {k}": v for k, v in thetas.items()})
        for i, (ttft, tpot) in zip(closed, held):
            w = replays[i][1]
            df.loc[i, ["ttft_heldout", "tpot_heldout", "throughput_heldout"]] = (
                ttft, tpot, throughput(w.concurrency, w.osl, ttft, tpot))
    for i, (env, w) in enumerate(replays):
        measured_energy = np.isfinite(w.energy_j)
        if w.arrival == "closed_loop" and not measured_energy:
            continue
        # held-out terms: a closed loop's from the fit without its group, a Poisson workload's from every
        # closed loop of the other runs (one run: of that run; a run without closed loops: never fitted on)
        terms = thetas.get(df.loc[i, "run" if by_run else "workload"], theta)
        fitted = {**engine_map, "host": {**engine_map["host"], **{k: terms[k] for k in params}}}
        _, summary, setup = simulate_workload(env, w, fitted, tier, energy=measured_energy)
        if w.arrival != "closed_loop":
            df.loc[i, ["ttft_heldout", "tpot_heldout", "throughput_heldout"]] = sim_metrics(summary, w)
        if measured_energy:
            df.loc[i, ["energy_per_token_heldout", "power_heldout"]] = (
                summary["energy_per_output_token_j"], summary["mean_power_w_per_gpu"])
            duration = w.energy_j / w.mean_power_w  # the measured window; the baseline draws TDP all of it
            df.loc[i, ["energy_per_token_tdp", "power_tdp", "idle_power_model"]] = (
                setup.hw.tdp_w * duration / w.output_tokens, setup.hw.tdp_w, setup.pricer.power.idle_w)
    return rep.add_errors(rep.add_errors(df), ENERGY_METRICS, ("heldout", "tdp")), fits


def serve_report(df: pd.DataFrame, fits: dict, runs: list[Path], engine_name: str, tier: dict, params, metrics,
                 table: Path, seconds: float) -> list[str]:
    """The Markdown report of validate_serve's table and fits, as lines (the title and intro are the first six)."""
    by_run = len(runs) > 1
    heldout = ("every workload with the terms fitted on the other runs' closed loops (leave-one-run-out)" if by_run
               else "closed loops with terms fitted without them, Poisson workloads (never fitted on) with the "
                    "terms fitted on every closed loop")
    lines = [f"# Validation against bench serve runs: {', '.join(_label(r) for r in runs)}", "",
             f"Engine profile {engine_name}, predictor tier {tier['tier']} (bundle "
             f"{tier['bundle'] or 'shipped'}). Means over every request of a workload (no warm-up excluded: "
             f"bench serve warms the engine before the first workload). Host terms {', '.join(params)} fitted "
             f"on log {' and '.join(m.upper() for m in metrics)} of the closed-loop workloads; 'held-out': "
             f"{heldout}. 'simulated': the profile's own host terms.", "",
             "| run | workload | traffic | TTFT ms measured | simulated | held-out | TPOT ms measured | simulated | "
             "held-out | throughput tok/s measured | simulated | held-out |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in df.itertuples():
        traffic = (f"closed loop c={r.concurrency:g}" if r.arrival == "closed_loop" else f"Poisson {r.rate:g}/s") + \
            (f", shared prefix {r.shared_prefix}" if r.shared_prefix else "")
        cells = []
        for m in ("ttft", "tpot", "throughput"):
            cells += [f"{getattr(r, m):.1f}"] + [
                f"{getattr(r, f'{m}_{kind}'):.1f} ({getattr(r, f'err_{m}_{kind}'):+.0f}%)"
                if np.isfinite(getattr(r, f"{m}_{kind}")) else "-" for kind in ("simulated", "heldout")]
        lines.append(f"| {r.run} | {r.workload} | {traffic} | " + " | ".join(cells) + " |")
    if not fits:
        lines += ["", "No closed-loop workload in these runs: nothing fitted, no held-out scores (the profile's "
                      "host terms only)."]
    else:
        lines += ["", "Median absolute held-out error, %:", "", "| runs | workloads | TTFT | TPOT | throughput |",
                  "| --- | --- | --- | --- | --- |"]
        parts = [("all", df)] + ([(name, part) for name, part in df.groupby("run", sort=False)] if by_run else [])
        for name, part in parts:
            lines.append(f"| {name} | {len(part)} | " + " | ".join(
                f"{part[f'abs_{m}_heldout'].median():.1f}" for m in ("ttft", "tpot", "throughput")) + " |")
        lines += ["", "Fitted host terms (us):", ""]
    lines += [f"- {name}: " + ", ".join(f"{k} {theta[k]:.0f}" for k in params) for name, theta in fits.items()]
    lines += energy_lines(df)
    lines += ["", f"Per-workload table: {table}; {seconds:.0f} s."]
    return lines


def energy_lines(df: pd.DataFrame) -> list[str]:
    """The energy section of the report: the workloads whose GPU energy bench serve measured (NVML), against
    the simulator's (its power model was fitted on kernel sweeps, never on a serving run; the step times
    with held-out host terms) and a baseline drawing the TDP over the measured time."""
    if "energy_per_token_heldout" not in df:
        return []
    scored = df[np.isfinite(df["energy_per_token_heldout"])]
    if scored.empty:
        return []
    lines = ["", "Energy, where measured (NVML energy counter over each workload, one GPU): J per output token and "
                 "mean power, simulated with the held-out host terms; baseline: TDP x measured time.", "",
             "| run | workload | J/token measured | simulated | TDP x time | mean W measured | simulated | "
             "idle W measured | power model's idle W |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    idle = {}
    for r in scored.itertuples():
        idle_w = r.idle_power if "idle_power" in scored and np.isfinite(r.idle_power) else None
        idle[r.run] = idle_w
        lines.append(f"| {r.run} | {r.workload} | {r.energy_per_token:.3f} | {r.energy_per_token_heldout:.3f} "
                     f"({r.err_energy_per_token_heldout:+.0f}%) | {r.energy_per_token_tdp:.3f} "
                     f"({r.err_energy_per_token_tdp:+.0f}%) | {r.power:.0f} | {r.power_heldout:.0f} "
                     f"({r.err_power_heldout:+.0f}%) | {'-' if idle_w is None else f'{idle_w:.0f}'} | "
                     f"{r.idle_power_model:.0f} |")
    lines += ["", f"Median absolute error over {len(scored)} workloads: J/token "
                  f"{scored['abs_energy_per_token_heldout'].median():.1f} % (TDP x time "
                  f"{scored['abs_energy_per_token_tdp'].median():.1f} %), mean power "
                  f"{scored['abs_power_heldout'].median():.1f} % (TDP {scored['abs_power_tdp'].median():.1f} %)."]
    return lines
