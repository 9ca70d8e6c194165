"""Serving metrics with `vllm bench serve`'s names, computed in constant memory.

A run of a million requests must not keep a million request objects or a
billion inter-token gaps, so every latency distribution is a streaming
log-binned histogram: exact count, mean, standard deviation, min and max, and
quantiles within 0.05% relative error (bin ratio 1.001; a quantile is the
geometric centre of its bin). Percentiles match vLLM's definitions:

- TTFT: arrival to first token; TPOT: (E2E - TTFT) / (output tokens - 1), only
  for requests with more than one output token; ITL: every gap between two
  consecutive tokens of a request; E2EL: arrival to last token.
- throughputs divide by the benchmark duration, first arrival to last finish.
- goodput: requests per second meeting every SLO given (TTFT, TPOT, E2EL in ms).
"""
from __future__ import annotations

import math

import numpy as np

PERCENTILES = (90, 99)   # besides the median
LATENCIES = ("ttft", "tpot", "itl", "e2el")
# summary()'s keys besides the latency statistics, in its order
TOTALS = ("completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens", "request_throughput",
          "output_throughput", "total_token_throughput", "request_goodput", "mean_queue_ms",
          "prefix_cached_token_fraction", "preempted_requests")


class StreamingDistribution:
    """Histogram of positive values on log-spaced bins, fed in batches.

    Values are added in seconds and kept as seconds * scale (milliseconds by default).
    """

    RATIO = 1.001
    LOW = 1e-6          # values below land in the first bin
    NUM_BINS = 35_000   # up to LOW * RATIO**NUM_BINS ~ 1.5e9

    def __init__(self, scale: float = 1e3):
        self.scale = scale
        self.counts = np.zeros(self.NUM_BINS, dtype=np.int64)
        self._count = 0
        self.total = 0.0
        self.total_sq = 0.0
        self.min = math.inf
        self.max = -math.inf
        self._values: list[float] = []
        self._arrays: list[np.ndarray] = []
        self._repeated: list[tuple[np.ndarray, int]] = []
        self._pending = 0

    def add(self, value: float) -> None:
        self._values.append(value)
        self._pending += 1
        if self._pending >= 65_536:
            self.flush()

    def add_array(self, values: np.ndarray) -> None:
        if len(values):
            self._arrays.append(values)
            self._pending += len(values)
            if self._pending >= 65_536:
                self.flush()

    def add_repeated(self, values: np.ndarray, times: int) -> None:
        """Add each of `values` `times` times (the gaps many requests share), without the copies."""
        if len(values) and times:
            self._repeated.append((values, times))
            self._pending += len(values)
            if self._pending >= 65_536:
                self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        v = np.concatenate([np.asarray(self._values, dtype=np.float64), *self._arrays,
                            *(r for r, _ in self._repeated)]) * self.scale
        w = None  # how many times each value counts (None: once)
        if self._repeated:
            w = np.ones(len(v), dtype=np.int64)
            w[len(v) - sum(len(r) for r, _ in self._repeated):] = np.concatenate(
                [np.full(len(r), k, dtype=np.int64) for r, k in self._repeated])
        self._values, self._arrays, self._repeated, self._pending = [], [], [], 0
        self._count += v.size if w is None else int(w.sum())
        self.total += float(v.sum() if w is None else (v * w).sum())
        self.total_sq += float((v * v).sum() if w is None else (v * v * w).sum())   # not np.dot: BLAS would spin
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))
        idx = np.floor(np.log(np.maximum(v, self.LOW) / self.LOW) / math.log(self.RATIO)).astype(np.int64)
        self.counts += np.bincount(np.clip(idx, 0, self.NUM_BINS - 1), w, minlength=self.NUM_BINS).astype(np.int64)

    @property
    def count(self) -> int:
        self.flush()
        return self._count

    @property
    def mean(self) -> float:
        self.flush()
        return self.total / self.count if self.count else float("nan")

    @property
    def std(self) -> float:
        self.flush()
        if not self.count:
            return float("nan")
        return math.sqrt(max(self.total_sq / self.count - (self.total / self.count) ** 2, 0.0))

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1), clamped to the exact min and max."""
        self.flush()
        if not self.count:
            return float("nan")
        rank = q * (self.count - 1)
        cum = np.cumsum(self.counts)
        b = int(np.searchsorted(cum, rank, side="right"))
        centre = self.LOW * self.RATIO ** (b + 0.5)
        return min(max(centre, self.min), self.max)

    def cdf_points(self) -> tuple[np.ndarray, np.ndarray]:
        """(value, cumulative fraction) at each non-empty bin, for plots."""
        self.flush()
        nz = np.nonzero(self.counts)[0]
        values = np.clip(self.LOW * self.RATIO ** (nz + 0.5), self.min, self.max)
        return values, np.cumsum(self.counts[nz]) / max(self.count, 1)


class ServingMetrics:
    """Accumulates per-request and per-token latencies; `summary()` gives vLLM's metric names."""

    def __init__(self, slo_ms: dict | None = None, itl: bool = True):
        # itl=False keeps no inter-token gaps (the summary's ITL fields are NaN): runs that report only request
        # latencies and throughputs (the interval ends) skip one histogram update per step
        self.dist = {name: StreamingDistribution() for name in LATENCIES if itl or name != "itl"}
        self.itl = self.dist.get("itl")   # what the scheduler feeds each inter-token gap (None: none kept)
        self.slo_ms = {k: v for k, v in (slo_ms or {}).items() if v is not None}
        self.completed = 0
        self.failed = 0
        self.good = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.preempted_requests = 0
        self.queue_time_s = 0.0
        self.first_arrival = math.inf
        self.last_finish = 0.0

    def record_request(self, req) -> tuple[float, float, float]:
        """Fold in one finished request; returns its (ttft, tpot, e2el) in seconds."""
        ttft = req.first_token_time - req.arrival_time
        e2el = req.finish_time - req.arrival_time
        tpot = (e2el - ttft) / (req.output_len - 1) if req.output_len > 1 else float("nan")
        self.dist["ttft"].add(ttft)
        self.dist["e2el"].add(e2el)
        if req.output_len > 1:
            self.dist["tpot"].add(tpot)
        self.completed += 1
        self.input_tokens += req.prompt_len
        self.output_tokens += req.output_len
        self.cached_tokens += max(req.num_cached_tokens, 0)
        self.preempted_requests += req.num_preemptions > 0
        self.queue_time_s += req.queue_time
        self.last_finish = max(self.last_finish, req.finish_time)
        slo = self.slo_ms
        if slo and (ttft * 1e3 <= slo.get("ttft_ms", math.inf) and e2el * 1e3 <= slo.get("e2el_ms", math.inf)
                    and (req.output_len <= 1 or tpot * 1e3 <= slo.get("tpot_ms", math.inf))):
            self.good += 1
        return ttft, tpot, e2el

    def record_arrival(self, t: float) -> None:
        if t < self.first_arrival:
            self.first_arrival = t

    @property
    def duration(self) -> float:
        return self.last_finish - self.first_arrival if self.completed else 0.0

    def summary(self) -> dict:
        """One flat dict: vLLM bench serve's result keys (latencies in ms, throughputs per second)."""
        d = self.duration
        per_s = (lambda x: x / d) if d > 0 else (lambda x: float("nan"))
        out = {
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": d,
            "total_input_tokens": self.input_tokens,
            "total_output_tokens": self.output_tokens,
            "request_throughput": per_s(self.completed),
            "output_throughput": per_s(self.output_tokens),
            "total_token_throughput": per_s(self.input_tokens + self.output_tokens),
            "request_goodput": per_s(self.good) if self.slo_ms else float("nan"),
        }
        for name in LATENCIES:
            dist = self.dist[name] if name in self.dist else StreamingDistribution()   # not kept: NaN
            out[f"mean_{name}_ms"] = dist.mean
            out[f"std_{name}_ms"] = dist.std
            out[f"median_{name}_ms"] = dist.quantile(0.5)
            for p in PERCENTILES:
                out[f"p{p}_{name}_ms"] = dist.quantile(p / 100)
        out["mean_queue_ms"] = self.queue_time_s / self.completed * 1e3 if self.completed else float("nan")
        out["prefix_cached_token_fraction"] = self.cached_tokens / self.input_tokens if self.input_tokens else 0.0
        out["preempted_requests"] = self.preempted_requests
        return out


def grouped(summary: dict) -> dict:
    """A summary's serving metrics grouped by latency: {'ttft_ms': {'mean', 'std', 'median', 'p50', 'p90',
    'p99'}, 'tpot_ms': ..., 'itl_ms': ..., 'e2el_ms': ..., then TOTALS (counts, duration, throughputs)};
    p50 is the median under the name notebooks reach for. Values in ms, per second, or counts."""
    out: dict = {}
    for name in LATENCIES:
        median = summary[f"median_{name}_ms"]
        out[f"{name}_ms"] = {"mean": summary[f"mean_{name}_ms"], "std": summary[f"std_{name}_ms"], "median": median,
                             "p50": median, **{f"p{p}": summary[f"p{p}_{name}_ms"] for p in PERCENTILES}}
    out.update({key: summary[key] for key in TOTALS if key in summary})
    return out
