"""Kernel timing: warm-up, repetitions to a time or count budget, robust statistics.

On a GPU every repetition is bracketed by CUDA events on the stream, after an
L2 flush (reading a buffer of 4x the L2, at least 256 MiB) in 'cold' mode, so
each call starts with cold caches as in a real layer sequence; 'hot' skips the
flush. The flush reads rather than writes: a written buffer leaves the L2 full
of dirty lines that the timed call must write back as it evicts them, up to
L2 / HBM bandwidth (about 17 us on an H100) of time no serving step pays; the
first H100 sweep (data/sweeps/h100_sxm/full-1, written-buffer flush) shows an
excess of that size over aiconfigurator's cuBLAS timings of the same GEMMs.
Calls shorter than `graph_below_us` are replayed from a CUDA graph so
launch gaps are not timed (recorded per row); a provider whose host work outlasts
small kernels (Provider.always_graph: a torch.compile'd call) is replayed at every
size. On a CPU the same loop runs with
time.perf_counter_ns and a last-level-cache flush buffer.

Energy (NVML) is a separate loop of back-to-back calls lasting at least
`min_seconds`, because the counter updates only every few tens of ms.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .grid import FLUSH_L2_MULTIPLE, FLUSH_MIN_BYTES, TimingConfig


@dataclass(frozen=True)
class Stats:
    median_ms: float
    p10_ms: float
    p90_ms: float
    samples: int
    cuda_graph: bool


def stats(samples_ms, cuda_graph: bool = False) -> Stats:
    s = np.asarray(samples_ms, dtype=np.float64)
    p10, med, p90 = np.percentile(s, [10, 50, 90])
    return Stats(float(med), float(p10), float(p90), int(s.size), cuda_graph)


class Clock:
    """Times calls on one device; owns its cache-flush buffer."""

    def __init__(self, device: torch.device, cfg: TimingConfig):
        self.device, self.cfg = device, cfg
        self.cuda = device.type == "cuda"
        if self.cuda:
            l2 = torch.cuda.get_device_properties(device).L2_cache_size
            size = max(FLUSH_L2_MULTIPLE * l2, FLUSH_MIN_BYTES)
        else:
            size = cfg.cpu_flush_mb << 20
        self._flush_buf = torch.ones(size, dtype=torch.uint8, device=device) if cfg.l2 == "cold" else None

    def flush(self) -> None:
        """Evict the cache by reading the flush buffer (clean lines: nothing to write back later)."""
        if self._flush_buf is not None:
            self._flush_buf.max()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time_calls(self, fn: Callable[[], Any], n: int) -> list[float]:
        """n timed calls, each after a flush; milliseconds."""
        if self.cuda:
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for start, end in events:
                self.flush()
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize(self.device)
            return [start.elapsed_time(end) for start, end in events]
        out = []
        for _ in range(n):
            self.flush()
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    def _graph(self, fn: Callable[[], Any]) -> Callable[[], Any] | None:
        """fn captured in a CUDA graph (its replay), or None when capture fails."""
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            return graph.replay
        except RuntimeError:
            torch.cuda.synchronize(self.device)
            return None

    def measure(self, fn: Callable[[], Any], graphable: bool = True,
                always_graph: bool = False) -> tuple[Stats, Callable[[], Any]]:
        """Statistics of fn and the callable that was timed (eager fn or its graph replay); always_graph: replay
        from a graph in 'auto' mode whatever the call's length."""
        cfg = self.cfg
        warm = self.time_calls(fn, max(cfg.warmup, 1))
        runner, graphed = fn, False
        auto = always_graph or min(warm) * 1e3 < cfg.graph_below_us
        if self.cuda and graphable and (cfg.cuda_graph == "on" or (cfg.cuda_graph == "auto" and auto)):
            replay = self._graph(fn)
            if replay is not None:
                runner, graphed = replay, True
                self.time_calls(runner, max(cfg.warmup, 1))
        samples: list[float] = []
        per_call = max(min(warm), 1e-4)
        while len(samples) < cfg.max_reps and (len(samples) < cfg.min_reps or sum(samples) < cfg.budget_ms):
            left_ms = max(cfg.budget_ms - sum(samples), 0.0)
            batch = min(cfg.max_reps - len(samples), max(cfg.min_reps - len(samples), 1,
                                                         math.ceil(left_ms / per_call)))
            samples += self.time_calls(runner, batch)
        return stats(samples, graphed), runner


def measure_energy(runner: Callable[[], Any], clock: Clock, monitor, per_call_ms: float,
                   min_seconds: float) -> tuple[float, float]:
    """(joules per call, mean watts) over back-to-back calls lasting >= min_seconds."""
    calls = max(1, math.ceil(min_seconds * 1e3 / max(per_call_ms, 1e-4)))
    clock.sync()
    e0, t0 = monitor.energy_mj(), time.perf_counter()
    for _ in range(calls):
        runner()
    clock.sync()
    e1, t1 = monitor.energy_mj(), time.perf_counter()
    joules = (e1 - e0) / 1e3
    return joules / calls, joules / (t1 - t0)
