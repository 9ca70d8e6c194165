"""What a simulation leaves behind: Parquet tables, a Perfetto trace, plots and the terminal summary.

Files in the output directory:
  requests.parquet   one row per finished request (times in s from the first arrival, latencies in ms)
  steps.parquet      one row per engine step: when it was formed, launched and done, its batch,
                     queue lengths and KV usage
  breakdown.csv      GPU seconds per kernel family in prefill-only, decode-only and mixed steps,
                     and the pricer's prefill / decode split of every step
  trace.json         Chrome / Perfetto trace (ui.perfetto.dev, chrome://tracing): host and GPU
                     slices per step, kernels of the first steps, queue and KV counters
  summary.json       every metric of the terminal summary
  latency_cdf.png, timeline.png, breakdown.png
Tables are written in chunks while the simulation runs, so memory stays flat.
"""
from __future__ import annotations

import math
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from kernelsight.predictor.outputs import atomic_file, ensure_dir, save_figure, write_json, write_text
from kernelsight.sim.energy import EnergyAccumulator, add_run_parts, energy_families, run_steps

CHUNK_ROWS = 65_536

REQUEST_COLUMNS = ("request_id", "replica", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
                   "input_len", "output_len", "cached_tokens", "preemptions", "queue_ms", "ttft_ms",
                   "tpot_ms", "e2el_ms")
STEP_COLUMNS = ("replica", "step", "schedule_s", "launch_s", "end_s", "host_ms", "gpu_ms", "prefill_seqs",
                "prefill_tokens", "decode_seqs", "sampled", "running", "waiting", "kv_usage", "preempted")
STEP_KINDS = ("prefill", "decode", "mixed")


def request_row(req, latencies) -> tuple:
    """A finished request as the values of REQUEST_COLUMNS (latencies: ttft, tpot, e2el in seconds)."""
    ttft, tpot, e2el = latencies
    return (req.request_id, req.replica, req.arrival_time, req.first_scheduled_time, req.first_token_time,
            req.finish_time, req.prompt_len, req.output_len, max(req.num_cached_tokens, 0), req.num_preemptions,
            req.queue_time * 1e3, ttft * 1e3, tpot * 1e3, e2el * 1e3)


class _ChunkedTable:
    """Rows appended as columns of Python lists, flushed every CHUNK_ROWS rows to a temporary file that
    close() renames to `path` (a run that dies leaves no half table under the final name)."""

    def __init__(self, path: Path, columns: tuple):
        # pyarrow is imported by the run that writes tables (here, before it starts), not by every run
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa, self._pq = pa, pq
        self.path = path
        self._file = ExitStack()
        self.tmp = self._file.enter_context(atomic_file(path, "output_dir"))
        self.columns = columns
        self.buffers = {c: [] for c in columns}
        self.writer = None
        self.rows = 0

    def append(self, values: tuple) -> None:
        for buf, v in zip(self.buffers.values(), values):
            buf.append(v)
        self.rows += 1
        if len(self.buffers[self.columns[0]]) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.buffers[self.columns[0]] and self.writer is not None:
            return
        table = self._pa.table({c: self.buffers[c] for c in self.columns})
        if self.writer is None:
            self.writer = self._pq.ParquetWriter(self.tmp, table.schema)
        self.writer.write_table(table)
        self.buffers = {c: [] for c in self.columns}

    def close(self) -> None:
        with self._file:  # renamed into place only when the last chunk is written
            self.flush()
            self.writer.close()


class Recorder:
    """Receives every step and finished request from the Engine and writes the output files."""

    def __init__(self, out_dir: Path, trace_steps: int = 2000, trace_kernel_steps: int = 20):
        self.out_dir = ensure_dir(Path(out_dir), "output_dir")
        self.requests = _ChunkedTable(self.out_dir / "requests.parquet", REQUEST_COLUMNS)
        self.steps = _ChunkedTable(self.out_dir / "steps.parquet", STEP_COLUMNS)
        self.trace_steps = trace_steps
        self.trace_kernel_steps = trace_kernel_steps
        self.events: list[dict] = []
        self._traced = 0

    def step(self, replica, step, t_schedule: float, t_launch: float, t_end: float, gpu_s: float,
             host_s: float) -> None:
        b = step.batch
        sched = replica.scheduler
        self.steps.append((replica.index, step.index, t_schedule, t_launch, t_end, host_s * 1e3, gpu_s * 1e3, len(b.prefill_new), b.num_prefill_tokens, len(b.decode_ctx),
                           b.num_sampled, len(sched.running), len(sched.waiting), replica.kv.usage,
                           len(step.preempted)))
        if self._traced < self.trace_steps:
            self._trace_step(replica, step, t_schedule, t_launch, t_end, gpu_s, host_s)

    def _trace_step(self, replica, step, t_schedule, t_launch, t_end, gpu_s, host_s) -> None:
        self._traced += 1
        b = step.batch
        pid = replica.index
        us = 1e6
        name = f"step {step.index}: {b.num_prefill_tokens} prefill tok, {len(b.decode_ctx)} decodes"
        args = {"prefill_chunks": list(b.prefill_new), "prefill_cached": list(b.prefill_ctx),
                "decodes": len(b.decode_ctx), "gpu_ms": gpu_s * 1e3, "host_ms": host_s * 1e3,
                "preempted": [r.request_id for r in step.preempted]}
        ev = self.events
        ev.append({"name": "schedule+prepare", "ph": "X", "pid": pid, "tid": 0, "ts": t_schedule * us,
                   "dur": host_s * us})
        ev.append({"name": name, "ph": "X", "pid": pid, "tid": 1, "ts": t_launch * us,
                   "dur": (t_end - t_launch) * us, "args": args})
        sched = replica.scheduler
        ev.append({"name": "queue", "ph": "C", "pid": pid, "ts": t_schedule * us,
                   "args": {"running": len(sched.running), "waiting": len(sched.waiting)}})
        ev.append({"name": "kv_usage", "ph": "C", "pid": pid, "ts": t_schedule * us,
                   "args": {"kv_usage": replica.kv.usage}})
        if step.index < self.trace_kernel_steps and hasattr(replica.pricer, "kernels"):
            t = t_launch
            for k in replica.pricer.kernels(b):
                dur = k.total_s
                ev.append({"name": k.call.name, "ph": "X", "pid": pid, "tid": 2, "ts": t * us, "dur": dur * us,
                           "args": {"family": k.call.family, "launches": k.call.count,
                                    "us_per_launch": k.seconds * us}})
                t += dur

    def request(self, req, latencies) -> None:
        self.requests.append(request_row(req, latencies))

    def close(self, num_replicas: int) -> None:
        self.requests.close()
        self.steps.close()
        meta = [{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"replica {r}"}}
                for r in range(num_replicas)]
        for r in range(num_replicas):
            for tid, label in ((0, "host"), (1, "GPU steps"), (2, "kernels (identical layers merged)")):
                meta.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": label}})
        write_json(self.out_dir / "trace.json", {"traceEvents": meta + self.events, "displayTimeUnit": "ms"},
                   "output_dir", indent=None)


# ----- breakdown -----

def step_kind(batch) -> str:
    if batch.prefill_new and batch.decode_ctx:
        return "mixed"
    return "prefill" if batch.prefill_new else "decode"


SAMPLE_STEPS = 64  # steps, evenly spread over a run, whose kernels are re-priced to say what priced them


PENDING_RUNS = 256  # decode runs whose sums BreakdownAccumulator.add_run defers, at most


class BreakdownAccumulator:
    """GPU seconds per kernel family by step kind, and per phase, summed over every step's breakdown; with a
    power model, the steps' joules (`energy`, sim/energy.py). A decode run's sums wait with up to PENDING_RUNS
    others (_flush: one reduction over all of them instead of a few per run); reading `family` or `phase`
    adds them first."""

    def __init__(self, sample_steps: int = SAMPLE_STEPS):
        self._family = {kind: {} for kind in STEP_KINDS}
        self._phase: dict[str, float] = {}
        self._energy = EnergyAccumulator()
        self.sample_steps = sample_steps
        self.sample: list = []  # every stride-th step's batch, stride doubling to keep at most 2 x sample_steps
        self._stride, self._steps = 1, 0
        self._runs: list = []   # (prices, steps) of decode runs not added yet

    @property
    def family(self) -> dict:
        self._flush()
        return self._family

    @property
    def phase(self) -> dict:
        self._flush()
        return self._phase

    @property
    def energy(self) -> EnergyAccumulator:
        self._flush()
        return self._energy

    def add(self, batch, parts: dict) -> None:
        if self._steps % self._stride == 0:
            self._take(batch)
        self._steps += 1
        acc = self._family[step_kind(batch)]
        for name, seconds in parts["family"].items():
            acc[name] = acc.get(name, 0.0) + seconds
        phase = self._phase
        for name, seconds in parts["phase"].items():
            phase[name] = phase.get(name, 0.0) + seconds
        if "energy" in parts:
            self._energy.add(parts)

    def add_run(self, prices, steps: int, batch_at) -> None:
        """Add the first `steps` steps of a decode run as add() would add each: prices is the run's
        pricing.DecodeRun with its breakdown parts, batch_at(j) step j's batch (for the sample)."""
        base = self._steps
        j = -base % self._stride
        while j < steps:
            self._take(batch_at(j))
            j += 1
            j += -(base + j) % self._stride
        self._steps = base + steps
        self._runs.append((prices, steps))
        if len(self._runs) >= PENDING_RUNS:
            self._flush()

    def _flush(self) -> None:
        """Add the pending decode runs: each family's fixed seconds times the steps of the runs that share them,
        attention and launch waiting as one sum each (a family listed only where it took time, as breakdown()
        lists it), the decode phase as one sum; their joules to `energy`."""
        runs = self._runs
        if not runs:
            return
        self._runs = []
        add_run_parts(self._family["decode"], runs, "families", (("attention_s", runs[0][0].attention_family),
                                                                 ("launch_s", "launch")))
        phase = self._phase
        phase["prefill"] = phase.get("prefill", 0.0)
        phase["decode"] = phase.get("decode", 0.0) + float(run_steps(runs, "decode_phase_s").sum())
        if runs[0][0].attention_j is not None:
            self._energy.add_runs(runs)

    def _take(self, batch) -> None:
        self.sample.append(batch)
        if len(self.sample) >= 2 * self.sample_steps:
            self.sample, self._stride = self.sample[::2], 2 * self._stride

    def rows(self) -> list[dict]:
        """Per family, largest total first: 'family', seconds per step kind, 'total_s' and 'share' of all GPU
        time; plain values, so the printed summary imports no pandas (table() is the same as a frame)."""
        family = self.family
        rows = [{"family": f, **{kind: family[kind].get(f, 0.0) for kind in STEP_KINDS}}
                for f in sorted({f for kind in STEP_KINDS for f in family[kind]})]
        for r in rows:
            r["total_s"] = sum(r[kind] for kind in STEP_KINDS)
        grand = sum(r["total_s"] for r in rows)
        for r in rows:
            r["share"] = r["total_s"] / grand if grand else 0.0
        return sorted(rows, key=lambda r: -r["total_s"])

    def table(self):
        """DataFrame: family x step kind seconds, total and share of all GPU time (rows())."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=["family", *STEP_KINDS, "total_s", "share"]).set_index("family")


def write_breakdown(acc: BreakdownAccumulator, path: Path) -> None:
    df = acc.table().rename(columns={k: f"{k}_steps_s" for k in STEP_KINDS})
    write_text(path, df.to_csv(float_format="%.6g") + "\n# pricer phase split of GPU time (s): "
               + ", ".join(f"{k}={v:.6g}" for k, v in acc.phase.items()) + "\n", "output_dir")


# ----- plots -----

def write_plots(out_dir: Path, metrics, acc: BreakdownAccumulator | None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    out_dir = Path(out_dir)
    written = []
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, name, title in zip(axes, ("ttft", "tpot", "itl", "e2el"), ("TTFT", "TPOT", "ITL", "E2E latency")):
        dist = metrics.dist[name]
        if dist.count:
            x, y = dist.cdf_points()
            ax.step(x, y, where="post")
            if dist.max > 20 * dist.min > 0:      # wide range: log axis with plain labels
                ax.set_xscale("log")
                ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
                ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests (ITL: of gaps)")
    fig.tight_layout()
    written.append(out_dir / "latency_cdf.png")
    save_figure(fig, written[-1], "output_dir", dpi=110)
    plt.close(fig)

    steps_path = out_dir / "steps.parquet"
    if steps_path.is_file():
        import pyarrow.parquet as pq

        t = pq.read_table(steps_path, columns=["end_s", "sampled", "running", "waiting", "kv_usage"])
        end = t["end_s"].to_numpy()
        if end.size:
            bins = np.linspace(0.0, float(end.max()) * (1 + 1e-9), min(200, max(10, end.size // 50)) + 1)
            width = bins[1] - bins[0]
            tokens = np.histogram(end, bins, weights=t["sampled"].to_numpy())[0] / width
            count = np.maximum(np.histogram(end, bins)[0], 1)
            mean = {c: np.histogram(end, bins, weights=t[c].to_numpy())[0] / count
                    for c in ("running", "waiting", "kv_usage")}
            centers = (bins[:-1] + bins[1:]) / 2
            fig, axes = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
            axes[0].plot(centers, tokens)
            axes[0].set_ylabel("output tokens/s")
            axes[1].plot(centers, mean["running"], label="running")
            axes[1].plot(centers, mean["waiting"], label="waiting")
            axes[1].set_ylabel("requests (all replicas' steps)")
            axes[1].legend()
            axes[2].plot(centers, mean["kv_usage"])
            axes[2].set_ylabel("KV usage")
            axes[2].set_xlabel("simulated time (s)")
            for ax in axes:
                ax.grid(alpha=0.3)
            fig.tight_layout()
            written.append(out_dir / "timeline.png")
            save_figure(fig, written[-1], "output_dir", dpi=110)
            plt.close(fig)

    if acc is not None:
        df = acc.table()
        if len(df):
            fig, ax = plt.subplots(figsize=(9, 4))
            bottom = np.zeros(len(STEP_KINDS))
            for family, row in df.iterrows():
                values = np.array([row[k] for k in STEP_KINDS])
                ax.bar(STEP_KINDS, values, bottom=bottom, label=family)
                bottom += values
            ax.set_ylabel("GPU seconds")
            ax.set_title("GPU time by kernel family and step kind")
            ax.legend(fontsize=7, ncol=2, bbox_to_anchor=(1.02, 1), loc="upper left")
            fig.tight_layout()
            written.append(out_dir / "breakdown.png")
            save_figure(fig, written[-1], "output_dir", dpi=110)
            plt.close(fig)
    return written


# ----- terminal summary -----

def write_run_outputs(result, out_dir: Path, plots: bool = False) -> None:
    """breakdown.csv, the plots and summary.json beside the tables and trace the run wrote; summary.json
    last, so a folder holding it holds a finished run."""
    write_breakdown(result.engine.breakdown, out_dir / "breakdown.csv")
    if plots:
        write_plots(out_dir, result.engine.metrics, result.engine.breakdown)
    write_json(out_dir / "summary.json", {"setup": result.setup.describe(), **result.summary,
                                          "pricing_sources": result.pricing_sources(),
                                          "implausible_families": result.implausible_families()},
               "output_dir", default=float)


def _fmt(value) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.2f}"
    return str(value)


def format_summary(summary: dict, title: str, acc: BreakdownAccumulator | None = None,
                   sources: list[dict] | None = None) -> str:
    """`vllm bench serve`-style result block, plus engine statistics, the kernel breakdown and what
    priced the kernels (sources: StepPricer.pricing_sources())."""
    width = 50
    lines = ["{s:{c}^{n}}".format(s=" Serving Simulation Result ", n=width, c="="), title]

    ranges = summary.get("intervals") or {}

    def row(label, key, fmt=_fmt):
        span = f" ({_fmt(ranges[key][0])}-{_fmt(ranges[key][1])})" if key in ranges else ""
        lines.append(f"{label:<40} {fmt(summary[key]) + span:<10}")

    def section(text):
        lines.append("{s:{c}^{n}}".format(s=text, n=width, c="-"))

    row("Successful requests:", "completed")
    row("Failed requests (too long):", "failed")
    row("Benchmark duration (s):", "duration_s")
    row("Total input tokens:", "total_input_tokens")
    row("Total generated tokens:", "total_output_tokens")
    row("Request throughput (req/s):", "request_throughput")
    row("Output token throughput (tok/s):", "output_throughput")
    row("Total Token throughput (tok/s):", "total_token_throughput")
    if not math.isnan(summary["request_goodput"]):
        row("Request goodput (req/s):", "request_goodput")
    for key, label, heading in (("ttft", "TTFT", "Time to First Token"),
                                ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
                                ("itl", "ITL", "Inter-token Latency"),
                                ("e2el", "E2EL", "End-to-end Latency")):
        section(heading)
        row(f"Mean {label} (ms):", f"mean_{key}_ms")
        row(f"Median {label} (ms):", f"median_{key}_ms")
        row(f"P90 {label} (ms):", f"p90_{key}_ms")
        row(f"P99 {label} (ms):", f"p99_{key}_ms")
    section("Engine")
    pct = lambda v: "n/a" if isinstance(v, float) and math.isnan(v) else f"{100 * v:.1f}%"
    row("KV cache blocks per replica:", "kv_blocks_per_replica")
    row("KV usage, mean over steps / max:", "kv_usage_mean", lambda v: f"{pct(v)} / {pct(summary['kv_usage_max'])}")
    row("Prefix cache hit rate:", "prefix_cache_hit_rate", pct)
    row("Preemptions (requests preempted):", "preemptions",
        lambda v: f"{v} ({summary['preempted_requests']})")
    row("Mean queueing time (ms):", "mean_queue_ms")
    row("Mean requests in system / waiting:", "mean_requests_in_system",
        lambda v: f"{_fmt(v)} / {_fmt(summary['mean_requests_waiting'])}")
    row("Engine steps:", "num_steps")
    row("GPU busy:", "gpu_busy_fraction", pct)
    if acc is not None:
        families = acc.rows()
        if families:
            section("GPU time by kernel family")
            lines.append(f"{'family':<16}{'share':>8}{'prefill':>9}{'decode':>9}{'mixed':>9}  (steps, s)")
            for r in families[:10]:
                lines.append(f"{r['family']:<16}{100 * r['share']:>7.1f}%{r['prefill']:>9.2f}{r['decode']:>9.2f}"
                             f"{r['mixed']:>9.2f}")
    if not math.isnan(summary.get("energy_j", float("nan"))):
        section("Energy")
        row("Energy per output token (J):", "energy_per_output_token_j")
        row("Energy per request (J):", "energy_per_request_j")
        row("Mean / peak power per GPU (W):", "mean_power_w_per_gpu",
            lambda v: f"{v:.0f} / {summary['peak_power_w_per_gpu']:.0f}")
        row("Total energy (kJ):", "energy_j",
            lambda v: f"{v / 1e3:.2f} ({summary['energy_gpus']} GPU{'' if summary['energy_gpus'] == 1 else 's'})")
        lines.append(f"{'family':<16}{'share':>8}{'kJ':>10}  (idle: host gaps, waits, launch-bound time)")
        for family, joules in energy_families(summary)[:10]:
            lines.append(f"{family:<16}{100 * joules / summary['energy_j']:>7.1f}%{joules / 1e3:>10.3f}")
    if sources:
        section("Priced by (share of family time)")
        shown = False  # an extrapolated share printed (0.5 % or more)
        for family in dict.fromkeys(s["family"] for s in sources):
            for i, s in enumerate(r for r in sources if r["family"] == family):
                outside = round(100 * s["outside_training_range"])
                shown |= outside > 0
                lines.append(f"{family if i == 0 else '':<16}{100 * s['time_share']:>5.1f}%  {s['tier']}: "
                             f"{s['model']}" + (f", {outside}% extrapolated" if outside else ""))
        if shown:
            lines.append("extrapolated: of that time, kernels with a feature outside the model's training "
                         "range (clamped to it) or unknown to the GPU catalog")
    if ranges:
        lines.append("(low-high): 80 % range: every kernel at each end of its interval" + (
            ", widened to the engine profile's serving_error (its held-out error on real runs)"
            if summary.get("intervals_serving_error") else "; the engine profile has no serving_error"))
    lines.append("=" * width)
    return "\n".join(lines)
