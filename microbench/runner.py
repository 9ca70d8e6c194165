"""The sweep runner: plan, skip what is done, measure, flush every row to disk.

A sweep is a directory <out>/<device>/<sweep_id>/ of Parquet shards that
read_sweep reads as one. After every shape the current shard is rewritten
atomically (write_sweep), so Ctrl-C, a crash or an out-of-memory loses at most
the shape in flight; a shard holds at most `shard_rows` rows, then the next
begins. Resuming reads the shards already there and skips every row's key
(family, provider, shape columns, timing mode), whatever its status: a failed
or mismatched shape is recorded, not retried. An error on one shape (OOM, a
kernel that fails to compile or launch) becomes a 'failed' row and the sweep
goes on; only a CUDA error that poisons the context stops it.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.outputs import interrupts_latched
from kernelsight.predictor.families import Shape, get_family
from kernelsight.predictor.roofline import roofline_shape
from kernelsight.predictor.sweep import read_sweep, sweep_files, with_cost, write_sweep

from .providers import FamilyBench, Provider, get_bench
from .providers.base import check_dtype, relative_error
from .timing import Clock, measure_energy

# CUDA errors after which the context is unusable: stop instead of failing every later shape.
STICKY_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "device-side assert",
                      "misaligned address", "illegal instruction")


@dataclass(frozen=True)
class WorkItem:
    shape: Shape
    provider: Provider

    @property
    def family(self) -> str:
        return self.shape.family.name


def shape_key(family: str, provider: str, timing: str, values: dict) -> tuple:
    """Identity of a measurement: equal for a planned item and the row it produced."""
    fam = get_family(family)
    norm = []
    for f in fam.fields:
        v = values[f.name]
        norm.append(int(v) if f.kind in ("pos", "nonneg") else bool(v) if f.kind == "bool" else str(v))
    return (family, provider, timing, *norm)


def item_key(item: WorkItem, timing: str) -> tuple:
    return shape_key(item.family, item.provider.name, timing, item.shape.row())


def row_key(row: dict) -> tuple:
    return shape_key(row["family"], row["provider"], row["timing"], row)


def done_keys(sweep_dir: Path) -> set:
    """Keys of every row already in the sweep directory (empty if it holds no shards)."""
    try:
        sweep_files(sweep_dir)
    except KernelsightError:  # no directory yet, or no shard in it
        return set()
    df = read_sweep(sweep_dir)
    return {row_key(r) for r in df.to_dict("records")}


def remove_stale_temp_files(sweep_dir: Path) -> None:
    """Half-written shards of a killed run (write_sweep's temp files): never data, safe to drop."""
    for tmp in sweep_dir.glob(".shard-*.tmp"):
        tmp.unlink()


class ShardWriter:
    """Appends rows to shard files, rewriting the current shard atomically after each row."""

    def __init__(self, sweep_dir: Path, environment: dict, shard_rows: int):
        if shard_rows < 1:
            raise KernelsightError(f"shard_rows = {shard_rows}: must be >= 1")
        self.dir, self.environment, self.shard_rows = Path(sweep_dir), environment, shard_rows
        self.prefix = f"shard-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
        self.index, self.rows, self.written = 0, [], 0

    def add(self, row: dict, extra_env: dict | None = None) -> None:
        self.rows.append(row)
        env = {**self.environment, **(extra_env or {})}
        write_sweep(with_cost(pd.DataFrame(self.rows)), self.dir / f"{self.prefix}-{self.index:04d}.parquet", env)
        self.written += 1
        if len(self.rows) >= self.shard_rows:
            self.index, self.rows = self.index + 1, []


def seed_for(item: WorkItem, timing: str, seed: int) -> int:
    """A stable per-measurement seed: same inputs for the same shape on every run and resume."""
    digest = hashlib.sha256(repr((seed, item_key(item, timing))).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:500]


def assert_not_all_zero(inputs: dict) -> None:
    """Zero inputs make kernels draw less power and run at other clocks than real data does."""
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and not bool(t.reshape(-1).view(torch.uint8).any()):
            raise RuntimeError(f"input {name!r} is all zero")


@dataclass
class Context:
    """Everything a measurement needs besides the item."""

    device: torch.device
    clock: Clock
    rtol: dict
    seed: int
    base_row: dict
    monitor: Any = None
    hardware: Any = None           # catalog entry of the device (None in CPU mode): flags eta_lt_1
    energy: Callable[[str], float] = lambda family: 0.0   # energy-loop seconds for a family (0: off)
    interpreting: bool = False


def measure(item: WorkItem, ctx: Context) -> dict:
    """One row: check the provider against the reference, then time it (and its energy)."""
    bench: FamilyBench = get_bench(item.family)
    timing = ctx.clock.cfg.l2
    row = {**item.shape.row(), "provider": item.provider.name, "timing": timing, **ctx.base_row, "latency_ms": None}
    flags = []
    if ctx.interpreting and item.provider.library == "triton":
        flags.append("triton_interpret")
    gen = torch.Generator(device=ctx.device).manual_seed(seed_for(item, timing, ctx.seed))
    inputs = bench.make_inputs(item.shape, ctx.device, gen)
    assert_not_all_zero(inputs)
    expected = bench.reference(item.shape, inputs, item.provider.options)
    fn = item.provider.build(item.shape, inputs)
    out = fn()
    ctx.clock.sync()
    actual = bench.observe(item.shape, inputs, item.provider.unpack(item.shape, inputs, out))
    err = relative_error(actual, expected)
    dtype = check_dtype(item.shape)
    bound = float(ctx.rtol[dtype])
    del out, actual, expected
    if not err <= bound:
        return {**row, "status": "mismatch", "flags": ",".join(flags),
                "error": f"relative error {err:.3g} > {dtype} bound {bound:g} against the float32 reference"}
    before = ctx.monitor.clocks() if ctx.monitor else None
    stats, runner = ctx.clock.measure(fn, graphable=item.provider.graphable, always_graph=item.provider.always_graph)
    energy_j = power_w = None
    if ctx.energy(item.family):
        energy_j, power_w = measure_energy(runner, ctx.clock, ctx.monitor, stats.median_ms, ctx.energy(item.family))
    after = ctx.monitor.clocks() if ctx.monitor else None
    if before and (before.throttled or after.throttled):
        flags.append("throttled")
    if ctx.hardware is not None and stats.median_ms / 1e3 < roofline_shape(item.shape, ctx.hardware)["t_roof"]:
        flags.append("eta_lt_1")
    clocks = {"sm_clock_mhz": [before.sm_mhz, after.sm_mhz]} if before else {}
    return {**row, "status": "ok", "flags": ",".join(flags), "latency_ms": stats.median_ms,
            "latency_p10_ms": stats.p10_ms, "latency_p90_ms": stats.p90_ms, "samples": stats.samples,
            "cuda_graph": stats.cuda_graph, "energy_j": energy_j, "power_w": power_w, "_clocks": clocks}


def failed_row(item: WorkItem, ctx: Context, error: str) -> dict:
    return {**item.shape.row(), "provider": item.provider.name, "timing": ctx.clock.cfg.l2, **ctx.base_row,
            "status": "failed", "error": error, "latency_ms": None}


def run_items(items: list[WorkItem], ctx: Context, writer: ShardWriter,
              progress: Callable[[WorkItem], None] = lambda item: None) -> dict:
    """Measure every item, writing each row as it is made. Returns counts per status. Ctrl-C stops it, also
    when a library swallowed the KeyboardInterrupt (outputs.interrupts_latched): the item in flight is not
    written."""
    with interrupts_latched() as check_interrupt:
        return _run_items(items, ctx, writer, progress, check_interrupt)


def _run_items(items, ctx, writer, progress, check_interrupt) -> dict:
    counts = {"ok": 0, "failed": 0, "mismatch": 0}
    clock_range: list[int] = []
    for item in items:
        progress(item)
        try:
            row = measure(item, ctx)
        except torch.cuda.OutOfMemoryError as e:
            row = failed_row(item, ctx, f"out of memory: {_first_line(e)}")
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - any kernel error becomes a failed row; the sweep goes on
            check_interrupt()
            row = failed_row(item, ctx, _first_line(e))
            if ctx.device.type == "cuda" and any(s in str(e) for s in STICKY_CUDA_ERRORS):
                writer.add(row)
                raise KernelsightError(
                    f"{item.provider.name} on {item.shape} broke the CUDA context ({row['error']}); the failed "
                    f"row is saved: restart with resume=true to skip it and go on") from None
        check_interrupt()  # a Ctrl-C a library swallowed during this item: stop; resume measures it again
        clock_range += row.pop("_clocks", {}).get("sm_clock_mhz", [])
        extra = {"sm_clock_mhz_range": [min(clock_range), max(clock_range)]} if clock_range else None
        writer.add(row, extra)
        counts[row["status"]] += 1
    return counts
