"""`kernelsight plan`: search GPUs, layouts and vLLM settings for the cheapest deployment meeting latency SLOs.

conf/plan.yaml composes model=, engine=, workload= and pricing=; the search itself is sim/plan.py. This
module builds the typed inputs, runs the candidates in parallel processes with a progress bar,
and writes output_dir/: candidates.parquet (every candidate, with why it was dropped), probes.parquet
(every simulated load), ranked.csv and pareto.png; it prints the ranked table.

An interrupted plan loses nothing: each finished candidate is appended to output_dir/partial.jsonl as it
arrives, headed by a fingerprint of the settings, and `resume=true` with the same output_dir and settings
simulates only the rest.
"""
from __future__ import annotations

import hashlib
import json
import math
import signal
from functools import partial
from pathlib import Path

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.hardware import Hardware, resolve_device
from kernelsight.predictor.outputs import ensure_dir, save_figure, write_table
from kernelsight.predictor.paths import conf_dir
from kernelsight.sim.compose import group_config
from kernelsight.sim.engine_profile import EngineProfile
from kernelsight.sim.model import ModelConfig
from kernelsight.sim.plan import (Candidate, PlanSettings, SearchSpace, Slo, batches, candidates, evaluate_many,
                                  interval, pareto, rank)
from kernelsight.sim.workload import WorkloadConfig

from . import on_interrupt
from .config import config_source, container
from .progress import progress_bars

PARTIAL = "partial.jsonl"
FINISHED = "candidates.parquet"
# Settings that change neither a candidate nor its result: a resumed plan may differ in these.
PRESENTATION = ("output_dir", "resume", "quiet", "jobs", "top", "intervals", "objective")


def plan(cfg) -> list[dict]:
    """Entry point of `kernelsight plan`; returns the ranked rows."""
    raw = container(cfg)
    rank([], str(raw["objective"]))  # an unknown objective is refused before any work
    settings, space = _settings(raw)
    cands = candidates(settings.model, settings.engine, space, settings.hardware)
    if not cands:
        raise KernelsightError("no candidate: the search space has no layout vLLM would start for this model "
                               f"(search.tp={list(space.tp)}, search.max_gpus_per_replica={space.max_gpus_per_replica})")
    out_dir = Path(str(raw["output_dir"]))
    resume = _flag(raw, "resume")
    jobs = _count(raw, "jobs")
    done = _open_partial(out_dir, _fingerprint(raw), resume)
    todo = [c for c in cands if c.key not in done]
    print(f"kernelsight plan: {settings.model.name}, target {settings.load.target:g} {settings.load.unit()} "
          f"({settings.workload.name}), SLO {settings.slo.describe()}; {len(cands)} candidates on "
          f"{len(space.gpus)} GPUs" + (f", {len(cands) - len(todo)} kept from {out_dir / PARTIAL}" if done else ""))

    def kept() -> str:
        return (f"{len(done)} of {len(cands)} candidates kept in {out_dir / PARTIAL}; rerun with "
                f"output_dir={out_dir} resume=true to simulate only the rest")

    with on_interrupt(kept):
        for row, probes in _evaluate_all(settings, todo, jobs, progress_bars(raw, delay=0.5)):
            done[row["key"]] = (row, probes)
            _append(out_dir / PARTIAL, {"row": row, "probes": probes})
    rows = [done[c.key][0] for c in cands]
    probes = [p for c in cands for p in done[c.key][1]]
    ranked = rank(rows, str(raw["objective"]))
    with on_interrupt(kept):
        _add_intervals(settings, _distinct(ranked)[:_count(raw, "intervals", 0)], jobs)
    for i, row in enumerate(ranked, 1):
        row["rank"] = i
    print(_table(_distinct(ranked)[:_count(raw, "top")], settings))
    print(_counts(rows))
    _write(out_dir, rows, probes, ranked, settings)
    (out_dir / PARTIAL).unlink(missing_ok=True)
    print(f"outputs in {out_dir}/: ranked.csv, candidates.parquet, probes.parquet, pareto.png")
    return ranked


def _settings(raw: dict) -> tuple[PlanSettings, SearchSpace]:
    model = ModelConfig.from_mapping(raw["model"], config_source("model"))
    engine = dict(raw["engine"])
    EngineProfile.from_mapping(engine, config_source("engine"))  # the file itself, checked once
    workload = WorkloadConfig.from_config(raw["workload"])
    gpus = _gpus(raw["gpus"])
    search = dict(raw["search"])
    space = SearchSpace.from_mapping({k: v for k, v in search.items() if k not in ("num_requests", "tolerance")},
                                     gpus)
    hardware = {}
    for gpu in gpus:
        mapping, source = group_config("hardware", gpu)
        hardware[gpu] = Hardware.from_mapping(mapping, source)
    predictor = raw.get("predictor") or {}
    settings = PlanSettings(model=model, engine=engine, workload=workload, slo=Slo.from_mapping(raw["slo"]),
                            hardware=hardware, prices=_prices(raw["pricing"]), num_requests=search.get("num_requests", 300),
                            tolerance=float(search.get("tolerance", 0.1)), seed=raw.get("seed", 0),
                            tier=predictor.get("tier", "auto"), bundle=predictor.get("bundle"),
                            max_model_len=raw.get("max_model_len"))
    return settings, space


def _catalog() -> list[str]:
    return sorted(p.stem for p in (conf_dir() / "hardware").glob("*.yaml"))


def _gpus(value) -> list[str]:
    if value == "all":
        return _catalog()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(g, str) for g in items):
        raise KernelsightError(f"gpus={value!r}: a list of catalog keys (gpus=[h100_sxm,h200_sxm]) or all")
    folder = conf_dir() / "hardware"
    return list(dict.fromkeys(g if (folder / f"{g}.yaml").is_file() else resolve_device(g) for g in items))


def _prices(pricing: dict) -> dict:
    prices = pricing.get("usd_per_gpu_hour") or {}
    catalog = _catalog()
    for gpu, price in prices.items():
        if gpu not in catalog:
            raise KernelsightError(f"pricing.usd_per_gpu_hour.{gpu}: not a catalog GPU{did_you_mean(gpu, catalog)}")
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price <= 0:
            raise KernelsightError(f"pricing.usd_per_gpu_hour.{gpu}={price!r}: a positive number of $ per GPU-hour")
    return {gpu: float(price) for gpu, price in prices.items()}


def _flag(raw: dict, key: str) -> bool:
    if not isinstance(raw.get(key), bool):
        raise KernelsightError(f"{key}={raw.get(key)!r}: must be true or false")
    return raw[key]


def _count(raw: dict, key: str, least: int = 1) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise KernelsightError(f"{key}={value!r}: a whole number >= {least}")
    return value


def _fingerprint(raw: dict) -> str:
    kept = {k: v for k, v in raw.items() if k not in PRESENTATION}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _open_partial(out_dir: Path, fingerprint: str, resume: bool) -> dict:
    """Candidates an interrupted plan in out_dir finished (key -> (row, probes)); refuses an out_dir that
    holds a finished plan, or an interrupted one of other settings or without resume=true."""
    ensure_dir(out_dir, "output_dir")
    if (out_dir / FINISHED).exists():
        raise KernelsightError(f"output_dir={out_dir} holds a finished plan ({FINISHED}); choose another output_dir")
    partial = out_dir / PARTIAL
    if not partial.exists():
        _append(partial, {"fingerprint": fingerprint})
        return {}
    if not resume:
        raise KernelsightError(f"output_dir={out_dir} holds an interrupted plan ({PARTIAL}); resume=true continues "
                               f"it, or choose another output_dir")
    done = {}
    with partial.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                if number == 1:
                    raise KernelsightError(f"{partial}: line 1 is not a plan header; remove the file") from None
                break  # a line cut by the interrupt: the candidates before it are kept
            if number == 1:
                if entry.get("fingerprint") != fingerprint:
                    raise KernelsightError(f"{partial}: written with other settings than this run's; resume with "
                                           f"the same model, workload, SLO, search and pricing, or choose another "
                                           f"output_dir")
                continue
            done[entry["row"]["key"]] = (entry["row"], entry["probes"])
    return done


def _append(path: Path, entry: dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, default=_plain) + "\n")


def _plain(value):
    return float(value) if hasattr(value, "__float__") else str(value)


def _evaluate_all(settings: PlanSettings, todo: list[Candidate], jobs: int, progress):
    """(row, probes) of each candidate as it finishes: in this process for jobs=1, else in worker processes."""
    bar = progress(total=len(todo), desc="plan", unit="candidate") if progress and todo else None
    groups = batches(todo)
    pool = _pool(jobs) if jobs > 1 and len(groups) > 1 else None
    try:
        results = (pool.imap_unordered(partial(evaluate_many, settings), groups) if pool is not None
                   else (evaluate_many(settings, group) for group in groups))
        for group in results:
            if bar is not None:
                bar.update(len(group))
            yield from group
    finally:
        if pool is not None:
            pool.terminate()  # every result is in; on Ctrl-C the workers stop at once
            pool.join()
        if bar is not None:
            bar.close()


def _pool(jobs: int):
    """Worker processes that leave Ctrl-C to this one (which stops them), so an interrupt is one line."""
    import multiprocessing

    return multiprocessing.get_context("spawn").Pool(jobs, initializer=signal.signal,
                                                      initargs=(signal.SIGINT, signal.SIG_IGN))


def _add_intervals(settings: PlanSettings, rows: list[dict], jobs: int) -> None:
    """Each row's TTFT and TPOT range: at the ends of the kernels' 80 % intervals, widened to the engine
    profile's serving error (not with roofline pricing)."""
    rows = [r for r in rows if r["tier"] != "roofline"]
    if not rows:
        return
    args = [(settings, Candidate(**{k: r[k] for k in Candidate.__dataclass_fields__}), r["replicas"]) for r in rows]
    if jobs == 1 or len(rows) == 1:
        ends = [interval(*a) for a in args]
    else:
        pool = _pool(jobs)
        try:
            ends = pool.starmap(interval, args)
        finally:
            pool.terminate()
            pool.join()
    error = EngineProfile.from_mapping(settings.engine, "engine config").serving_error
    for row, end in zip(rows, ends):
        for metric, (low, high) in end.items():
            row[f"{metric}_p10"], row[f"{metric}_p90"] = error.widen(metric, row[metric], low, high)


def _distinct(ranked: list[dict]) -> list[dict]:
    """The best row of each GPU and layout (their engine-knob variants are in ranked.csv)."""
    seen, out = set(), []
    for r in ranked:
        key = (r["gpu"], r["tp"], r["pp"], r["ep"], r["attention_dp"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _layout(r: dict) -> str:
    parts = [f"TP{r['tp']}"] + [f"{name}{r[key]}" for name, key in (("PP", "pp"), ("ADP", "attention_dp"),
                                                                      ("EP", "ep")) if r[key] > 1]
    return "x".join(parts)


def _with_interval(r: dict, metric: str) -> str:
    value = f"{r[metric]:.1f}"
    low, high = r.get(f"{metric}_p10"), r.get(f"{metric}_p90")
    return f"{value} ({low:.1f}-{high:.1f})" if low is not None and math.isfinite(low) else value


def _money(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def _table(rows: list[dict], settings: PlanSettings) -> str:
    if not rows:
        return "no candidate meets the SLOs at any load; relax them, or add GPUs or layouts (see candidates.parquet)"
    p = settings.slo.percentile
    head = ["#", "GPU", "layout", "seqs", "batched", "KV", "tier", "GPUs", "req/s/GPU", "tok/s/GPU", "$/h",
            "$/Mtok", "J/tok", f"TTFT {p} ms", f"TPOT {p} ms"]
    body = [[str(r["rank"]), r["gpu"], _layout(r), str(r["max_num_seqs"]), str(r["max_num_batched_tokens"]),
             r["kv_cache_dtype"], r["tier"], str(r["gpus"]), f"{r['req_s_per_gpu']:.2f}",
             f"{r['output_tok_s_per_gpu']:.0f}", _money(r["usd_per_hour"]), _money(r["usd_per_mtok"], 3),
             _money(r["j_per_output_token"]), _with_interval(r, "ttft_ms"), _with_interval(r, "tpot_ms")]
            for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in [head, *body]]
    note = ("best engine settings of each GPU and layout (all candidates: ranked.csv); GPUs, $, J and latencies "
            "at the target load (80 % range: the kernels' intervals, widened to the engine's serving error); req/s "
            "and tok/s per GPU at the highest load meeting the SLOs")
    return "\n".join([*lines, note])


def _counts(rows: list[dict]) -> str:
    by = {}
    for r in rows:
        by[r["status"]] = by.get(r["status"], 0) + 1
    return "candidates: " + ", ".join(f"{n} {status}" for status, n in sorted(by.items()))


def _write(out_dir: Path, rows: list[dict], probes: list[dict], ranked: list[dict], settings: PlanSettings) -> None:
    import pandas as pd

    ranks = {r["key"]: r["rank"] for r in ranked}
    table = pd.DataFrame([{**r, "rank": ranks.get(r["key"])} for r in rows])
    write_table(pd.DataFrame(probes), out_dir / "probes.parquet", "output_dir")
    if ranked:
        write_table(pd.DataFrame(ranked), out_dir / "ranked.csv", "output_dir")
    _pareto_png(out_dir / "pareto.png", probes, {r["key"]: r for r in rows}, settings)
    write_table(table, out_dir / FINISHED, "output_dir")  # last: its presence marks a finished plan


def _pareto_png(path: Path, probes: list[dict], rows: dict, settings: PlanSettings) -> None:
    """Output tokens/s per GPU and per $ against TPOT, over every simulated load that met the SLOs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    met = [p for p in probes if p["slo_met"]]
    p = settings.slo.percentile
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    panels = (("output tokens/s per GPU", lambda q: q["output_tok_s_per_gpu"]),
              ("output tokens per $", lambda q: q["output_tok_s_per_gpu"] * 3600 / rows[q["key"]]["usd_per_gpu_hour"]))
    for ax, (label, value) in zip(axes, panels):
        points = [(q["tpot_ms"], value(q), q) for q in met if math.isfinite(value(q))]
        if points:
            ax.scatter([x for x, _, _ in points], [y for _, y, _ in points], s=8, color="0.7",
                       label="loads meeting the SLOs")
            front = [points[i] for i in pareto([(x, y) for x, y, _ in points])]
            ax.plot([x for x, _, _ in front], [y for _, y, _ in front], "-", color="0.4", lw=1, label="Pareto front")
            colours = {g: f"C{i}" for i, g in enumerate(dict.fromkeys(rows[q["key"]]["gpu"] for _, _, q in front))}
            for gpu, colour in colours.items():
                mine = [(x, y) for x, y, q in front if rows[q["key"]]["gpu"] == gpu]
                ax.scatter([x for x, _ in mine], [y for _, y in mine], s=28, color=colour, zorder=3, label=gpu)
            shown = None
            for x, y, q in front:  # name the layout where the front moves to another GPU or layout
                name = _layout(rows[q["key"]])
                if (rows[q["key"]]["gpu"], name) != shown:
                    shown = (rows[q["key"]]["gpu"], name)
                    ax.annotate(name, (x, y), fontsize=7, xytext=(4, -10), textcoords="offset points")
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no load met the SLOs", ha="center", transform=ax.transAxes)
        ax.set_xlabel(f"TPOT {p} (ms)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{settings.model.name}: {settings.slo.describe()}")
    fig.tight_layout()
    save_figure(fig, path, "output_dir", dpi=110)
    plt.close(fig)
