"""`kernelsight simulate`: replay a serving workload on simulated vLLM engines, kernel by kernel.

conf/simulate.yaml composes model=, hardware=, engine=, workload=, parallel=;
`kernelsight simulate --help` lists the settings. The composed config goes to
sim.compose.run_config, the path kernelsight.simulate takes too; this module
prints the `vllm bench serve`-style summary, with output_dir writes the
breakdown, summary.json and plots beside the tables the run wrote, and in a
Hydra multirun (`-m`) gives every job its own output folder and adds its row
to one combined table.

Nothing is half-written: the run fills a hidden staging folder that replaces
output_dir only once summary.json, written last, is there (predictor/outputs.py
RunDirectory; an existing non-empty output_dir needs overwrite=true), and the
results table is only appended to (a CSV that is not a results table is
refused before the run).
"""
from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

from kernelsight.sim.compose import run_config
from kernelsight.sim.report import format_summary, write_run_outputs
from kernelsight.predictor.outputs import append_row, results_table, run_directory
from kernelsight.sim.run import SimulationResult, Setup

from . import on_interrupt
from .config import container, flag, group_sources, hydra_job, sweep_dir, task_overrides
from .progress import progress_bars

TABLE_NAME = "simulate_runs"
KEY_COLUMNS = ("model", "hardware", "engine", "workload")  # a results table of ours has these columns


def simulate(cfg) -> dict:
    """Entry point of `kernelsight simulate`; returns the summary."""
    multirun, job = hydra_job()
    out_dir = Path(cfg.output_dir) if cfg.output_dir else None
    if out_dir is not None and multirun:
        out_dir = out_dir / str(job)
    plots, overwrite = flag(cfg, "plots"), flag(cfg, "overwrite")
    table = cfg.results_table or (Path(sweep_dir()) / f"{TABLE_NAME}.csv" if multirun else None)
    if table:
        results_table(table, KEY_COLUMNS)  # refused before the run when it is not ours to append to
    unchanged = [name for name, given in (("output_dir", out_dir), ("results_table", table)) if given]
    with on_interrupt(f"nothing written ({' and '.join(unchanged)} unchanged)" if unchanged else "nothing written"):
        if out_dir is None:
            result = _report(cfg, None, plots)
        else:  # a failed or interrupted run leaves output_dir as it was
            with run_directory(out_dir, f"kernelsight simulate {' '.join(task_overrides())}".strip(),
                               overwrite) as staging:
                result = _report(cfg, staging, plots)
            result.out_dir = out_dir  # where the finished run now lies
            print(f"outputs in {out_dir}/: requests.parquet, steps.parquet, breakdown.csv, trace.json, "
                  f"summary.json{', plots (*.png)' if plots else ''}")
        if table:
            path = append_row(table, {**_run_columns(cfg, result.setup), **result.summary}, KEY_COLUMNS)
            print(f"run added to {path}")
    return result.summary


def _report(cfg, out_dir: Path | None, plots: bool) -> SimulationResult:
    """Run, print the warnings and the summary, and with out_dir write the files there (summary.json last)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _run(cfg, out_dir)
    for message in _merge_warnings(str(w.message).splitlines()[0] for w in caught):
        print(f"kernelsight simulate: warning: {message}", file=sys.stderr)
    for odd in result.implausible_families():
        print(f"kernelsight simulate: warning: {odd['family']} takes {odd['share']:.0%} of the kernel time for "
              f"{odd['roofline_share']:.0%} of the roofline time (effective η {odd['eta']:.1f} against "
              f"{odd['rest_eta']:.1f} for the rest of the step): its η model may not describe these kernels; "
              f"do not trust this run's latencies", file=sys.stderr)
    summary = result.summary
    print(format_summary(summary, result.setup.describe(), result.engine.breakdown, result.pricing_sources()))
    print(f"simulated {summary['completed'] + summary['failed']} requests in {summary['wall_s']:.2f} s of wall time "
          f"({(summary['completed'] + summary['failed']) / summary['wall_s']:.0f} requests/s)")
    if out_dir is not None:
        write_run_outputs(result, out_dir, plots)
    return result


def _run(cfg, out_dir: Path | None) -> SimulationResult:
    """The composed config through the library's one path from mapping to run; a bar over finished requests
    on a terminal when the run takes over 2 s."""
    return run_config(container(cfg), group_sources(), out_dir=out_dir, progress=progress_bars(cfg, delay=2.0))


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


def _run_columns(cfg, setup: Setup) -> dict:
    """What identifies a run in the combined table: config choices, key settings and the overrides."""
    cols = {"model": setup.model.name, "hardware": setup.hw.key, "engine": setup.engine.name,
            "workload": setup.workload.config.name, "tp": setup.parallel.tp, "pp": setup.parallel.pp,
            "ep": setup.parallel.ep, "dp": setup.parallel.dp, "request_rate": setup.workload.config.request_rate,
            "max_concurrency": setup.workload.config.max_concurrency, "num_requests": cfg.num_requests,
            "seed": cfg.seed, "router": cfg.router, "kv_blocks": setup.num_blocks}
    for override in task_overrides():
        key, _, value = override.lstrip("+~").partition("=")
        cols.setdefault(f"override.{key}", value)
    return cols
