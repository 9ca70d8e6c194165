"""`kernelsight simulate`: replay a serving workload on simulated vLLM engines, kernel by kernel.

conf/simulate.yaml composes model=, hardware=, engine=, workload=, parallel=;
`kernelsight simulate --help` lists the settings. The run:

1. builds the model, GPU, engine profile and parallel layout from their typed
   configs, sizes the KV cache the way vLLM does (memory.kv_cache_blocks; one
   block is vLLM's null block) and prices steps with StepPricer over the
   predictor (η bundle, or roofline with a warning);
2. creates `parallel.dp` replicas, each with its own scheduler and KV pool,
   behind the router, and streams the workload's requests through them
   (engine.Engine);
3. prints the `vllm bench serve`-style summary; with output_dir it writes the
   Parquet tables, trace, plots and breakdown (report.py); in a Hydra
   multirun (`-m`) every job also adds its row to one combined table.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kernelsight.predictor.errors import KernelsightError, whole_number
from kernelsight.predictor.hardware import Hardware
from kernelsight.predictor.predict import Predictor

from .commands import typed_configs, write_table
from .engine import Engine, Replica, build_replicas
from .engine_profile import EngineProfile
from .memory import kv_cache_blocks
from .model import ModelConfig
from .parallel import ParallelConfig
from .pricing import StepPricer
from .report import BreakdownAccumulator, Recorder, format_summary, write_breakdown, write_plots
from .scheduler import SchedulerConfig
from .schema import plain
from .workload import Workload, WorkloadConfig

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
TABLE_NAME = "simulate_runs"


@dataclass
class Setup:
    """Everything a run needs, built and validated from the composed config."""

    model: ModelConfig
    hw: Hardware
    engine: EngineProfile
    parallel: ParallelConfig
    pricer: StepPricer
    scheduler: SchedulerConfig
    num_blocks: int
    max_model_len: int
    workload: Workload

    def replicas(self) -> list[Replica]:
        # Replicas are identical, so they share one pricer (it is a pure function with memo tables).
        return build_replicas(self.parallel.dp, self.scheduler, self.num_blocks, lambda: self.pricer,
                              self.parallel.pp)

    def new_engine(self, seed: int, router: str = "least_outstanding", **kwargs) -> Engine:
        """A fresh Engine over fresh replicas, with this setup's concurrency limit and frontend path."""
        frontend = self.engine.frontend
        kwargs.setdefault("max_concurrency", self.workload.max_concurrency)
        return Engine(self.replicas(), router, max_model_len=self.max_model_len,
                      frontend_latency_s=frontend.latency_ms * 1e-3, frontend_jitter_s=frontend.jitter_ms * 1e-3,
                      seed=seed, **kwargs)

    def describe(self) -> str:
        p = self.parallel
        layout = f"tp={p.tp} pp={p.pp} ep={p.ep} dp={p.dp}"
        return (f"{self.model.name} on {self.hw.name} ({layout}), engine {self.engine.name}, "
                f"workload {self.workload.config.name}, pricing tier {self.pricer.predictor.tier}")


def build_setup(cfg) -> Setup:
    """Typed objects from the composed config; any problem is one KernelsightError line."""
    model, hw, engine, parallel = typed_configs(cfg)
    workload = Workload(WorkloadConfig.from_config(plain(cfg.workload)))
    blocks = kv_cache_blocks(model, hw, engine, parallel)  # refuses layouts that do not fit
    if blocks < 2:
        raise KernelsightError(f"model {model.name} on {hw.key}: only {blocks} KV block fits; "
                               f"nothing is left beside vLLM's null block")
    sched = SchedulerConfig.from_engine(engine)
    pred = plain(cfg.predictor)
    predictor = Predictor(hw, tier=pred.get("tier", "auto"), bundle=pred.get("bundle"))
    pricer = StepPricer(model, hw, engine, parallel, predictor)
    max_len = int(cfg.max_model_len) if cfg.max_model_len else model.max_position
    if max_len < 2:
        raise KernelsightError(f"max_model_len={cfg.max_model_len}: must be >= 2")
    if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < max_len:
        raise KernelsightError(f"without chunked prefill a whole prompt must fit one step: "
                               f"scheduler.max_num_batched_tokens={sched.max_num_batched_tokens} < max_model_len="
                               f"{max_len} (vLLM refuses this too); raise it or set max_model_len")
    return Setup(model, hw, engine, parallel, pricer, sched, blocks - 1, max_len, workload)


def slo_from_config(cfg) -> dict:
    slo = plain(cfg.slo) or {}
    for key, value in slo.items():
        if key not in SLO_KEYS:
            raise KernelsightError(f"slo.{key}: unknown SLO; known: {', '.join(SLO_KEYS)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise KernelsightError(f"slo.{key}={value!r}: must be a positive number of milliseconds or null")
    return {k: float(v) for k, v in slo.items() if v is not None}


def run(setup: Setup, num_requests, seed: int, router: str = "least_outstanding", slo_ms: dict | None = None,
        out_dir: Path | None = None, trace_steps: int = 2000, trace_kernel_steps: int = 20,
        breakdown: bool = True) -> tuple[dict, Engine]:
    """Simulate; returns (summary dict, the engine with its metrics and breakdown)."""
    recorder = Recorder(out_dir, trace_steps, trace_kernel_steps) if out_dir is not None else None
    engine = setup.new_engine(seed, router, slo_ms=slo_ms, recorder=recorder,
                              breakdown=BreakdownAccumulator() if breakdown else None)
    start = time.perf_counter()
    summary = engine.run(setup.workload.requests(num_requests, seed))
    summary["wall_s"] = time.perf_counter() - start
    if recorder is not None:
        recorder.close(len(engine.replicas))
    return summary, engine


def simulate(cfg) -> dict:
    """Entry point of `kernelsight simulate`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        num_requests = cfg.num_requests
        if num_requests is not None:
            whole_number(num_requests, "num_requests", hint="null: every row of a trace")
        if not isinstance(cfg.seed, int):
            raise KernelsightError(f"seed={cfg.seed!r}: must be an integer")
        setup = build_setup(cfg)
        slo = slo_from_config(cfg)
        if num_requests is None and setup.workload.trace is None:
            raise KernelsightError("num_requests=null only replays a whole trace; synthetic workloads need a count")
        multirun, job = _hydra_job()
        out_dir = Path(cfg.output_dir) if cfg.output_dir else None
        if out_dir is not None and multirun:
            out_dir = out_dir / str(job)
        summary, engine = run(setup, num_requests, int(cfg.seed), str(cfg.router), slo, out_dir,
                              int(cfg.trace_steps), int(cfg.trace_kernel_steps))
    for message in _merge_warnings(str(w.message).splitlines()[0] for w in caught):
        print(f"kernelsight simulate: warning: {message}", file=sys.stderr)

    title = setup.describe()
    sources = setup.pricer.pricing_sources(engine.breakdown.sample) if engine.breakdown is not None else []
    print(format_summary(summary, title, engine.breakdown, sources))
    print(f"simulated {summary['completed'] + summary['failed']} requests in {summary['wall_s']:.2f} s of wall time "
          f"({(summary['completed'] + summary['failed']) / summary['wall_s']:.0f} requests/s)")
    if out_dir is not None:
        write_breakdown(engine.breakdown, out_dir / "breakdown.csv")
        with open(out_dir / "summary.json", "w") as f:
            json.dump({"setup": title, **summary, "pricing_sources": sources}, f, indent=1, default=float)
        if cfg.plots:
            write_plots(out_dir, engine.metrics, engine.breakdown)
        print(f"outputs in {out_dir}/: requests.parquet, steps.parquet, breakdown.csv, trace.json, "
              f"summary.json{', plots (*.png)' if cfg.plots else ''}")
    table = cfg.results_table or (Path(_sweep_dir()) / f"{TABLE_NAME}.csv" if multirun else None)
    if table:
        row = {**_run_columns(cfg, setup), **summary}
        path = append_result(Path(table), row, job if multirun else None)
        print(f"run added to {path}")
    return summary


def _merge_warnings(messages) -> list[str]:
    """Unique warnings; the predictor's per-family 'X latencies on GPU ...' lines become one line."""
    merged: dict[tuple, list] = {}
    for message in messages:
        found = re.match(r"^(.*): (\w+) latencies on (.*)$", message)
        key = (found.group(1), found.group(3)) if found else (message, None)
        names = merged.setdefault(key, [])
        if found and found.group(2) not in names:
            names.append(found.group(2))
    return [f"{head}: {', '.join(names)} latencies on {tail}" if tail is not None else head
            for (head, tail), names in merged.items()]


def _hydra_job() -> tuple[bool, int]:
    """(inside a Hydra multirun?, job number)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return False, 0
        return True, int(hc.job.num)
    except (ImportError, ValueError):
        return False, 0


def _sweep_dir() -> str:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().sweep.dir


def _run_columns(cfg, setup: Setup) -> dict:
    """What identifies a run in the combined table: config choices, key settings and the overrides."""
    cols = {"model": setup.model.name, "hardware": setup.hw.key, "engine": setup.engine.name,
            "workload": setup.workload.config.name, "tp": setup.parallel.tp, "pp": setup.parallel.pp,
            "ep": setup.parallel.ep, "dp": setup.parallel.dp, "request_rate": setup.workload.config.request_rate,
            "max_concurrency": setup.workload.config.max_concurrency, "num_requests": cfg.num_requests,
            "seed": cfg.seed, "router": cfg.router, "kv_blocks": setup.num_blocks}
    try:
        from hydra.core.hydra_config import HydraConfig

        for override in HydraConfig.get().overrides.task:
            key, _, value = override.lstrip("+~").partition("=")
            cols.setdefault(f"override.{key}", value)
    except (ImportError, ValueError):
        pass
    return cols


def append_result(table: Path, row: dict, job: int | None) -> Path:
    """Add one run to a combined table shared by concurrent jobs (joblib processes, SLURM tasks).

    Each run first writes its own one-row file atomically under <table>_parts/;
    the CSV and Parquet tables are then rebuilt from all parts under an
    exclusive file lock, so whichever job finishes last leaves the complete
    table and no job can lose another's row.
    """
    table = table.with_suffix(".csv")
    parts = table.parent / f"{table.stem}_parts"
    parts.mkdir(parents=True, exist_ok=True)
    name = f"{job:05d}" if job is not None else f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    part = parts / f"{name}.json"
    tmp = part.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(row, f, default=str)
    os.replace(tmp, part)
    with open(table.parent / f".{table.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = [json.loads(p.read_text()) for p in sorted(parts.glob("*.json"))]
        df = pd.DataFrame(rows)
        write_table(df, table)
        write_table(df, table.with_suffix(".parquet"))
    return table
