"""Running the simulator from typed configs: the library entry point behind `kernelsight simulate`.

`simulate(model, hardware, engine, parallel, workload, num_requests=...)`
returns a SimulationResult (summary dict, metrics, per-family breakdown,
per-request table). The steps:

1. build_setup sizes the KV cache the way vLLM does (memory.memory_plan;
   one block is vLLM's null block), puts the GPU on the layout's scale-out
   network and prices steps with StepPricer over the predictor (η bundle, or
   roofline with a warning);
2. run creates `parallel.dp x parallel.attention_dp` replicas (attention
   data-parallel groups schedule their own requests, like replicas, and step
   in lockstep, padded to the largest group's tokens: engine.LockstepGroup;
   their MoE layers run together, which the model graph prices), each with its own
   scheduler and KV pool, behind the router, and streams the workload's requests through them
   (engine.Engine); with out_dir it writes the Parquet tables and trace while
   it runs (report.Recorder).

Nothing here reads a config file or prints: callers (the CLI, validation,
notebooks) pass typed configs and get values back.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kernelsight.predictor.errors import KernelsightError, check_seed, whole_number
from kernelsight.predictor.hardware import Hardware
from kernelsight.predictor.predict import Predictor

from .context import resolve_max_model_len
from .energy import energy_summary, kernel_power
from .engine import Engine, Replica, build_replicas
from .engine_profile import EngineProfile, ServingError, delay_label
from .kv_cache import SlidingGroups
from .memory import memory_plan
from .metrics import grouped
from .model import ModelConfig
from .parallel import ParallelConfig
from .pricing import StepPricer, implausible_families
from .report import REQUEST_COLUMNS, BreakdownAccumulator, Recorder, request_row
from .scheduler import SchedulerConfig
from .workload import Workload, WorkloadConfig

if TYPE_CHECKING:  # pandas is imported where a frame is built: a run needs none
    import pandas as pd

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
# Summary metrics given a range by simulate(intervals=True).
INTERVAL_METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                    "mean_e2el_ms", "request_throughput", "output_throughput", "total_token_throughput")
CHILD_GRACE_S = 10.0  # how long the band run's child may run past this process's own (or twice that, if longer)


@dataclass
class Setup:
    """Everything a run needs, built and validated from typed configs (see build_setup)."""

    model: ModelConfig
    hw: Hardware
    engine: EngineProfile
    parallel: ParallelConfig
    pricer: StepPricer
    scheduler: SchedulerConfig
    num_blocks: int
    max_model_len: int
    workload: Workload
    one_group: bool = False  # simulate one attention group of one replica (its share of the load; validate)
    sliding: SlidingGroups | None = None  # the KV cache's sliding-window groups (memory.kv_groups)

    def replicas(self) -> list[Replica]:
        # Replicas are identical, so they share one pricer (it is a pure function with memo tables).
        if self.one_group:
            return build_replicas(1, self.scheduler, self.num_blocks, lambda: self.pricer, self.parallel.pp,
                                  self.sliding)
        p = self.parallel
        return build_replicas(p.dp * p.attention_dp, self.scheduler, self.num_blocks, lambda: self.pricer, p.pp,
                              self.sliding, lockstep=p.attention_dp)

    def energy(self, engine: Engine, summary: dict) -> dict:
        """The summary's energy fields of a finished run of `engine` (sim/energy.py; NaN without a breakdown)."""
        return energy_summary(engine.breakdown.energy if engine.breakdown is not None else None, self.pricer.power,
                              summary, self.parallel, len(engine.replicas))

    def new_engine(self, seed: int, router: str = "least_outstanding", **kwargs) -> Engine:
        """A fresh Engine over fresh replicas, with this setup's concurrency limit and frontend path."""
        latency_ms, jitter_ms = self.engine.frontend.delay_ms(self.engine.host.async_scheduling)
        kwargs.setdefault("max_concurrency", self.workload.max_concurrency)
        return Engine(self.replicas(), router, max_model_len=self.max_model_len,
                      frontend_latency_s=latency_ms * 1e-3, frontend_jitter_s=jitter_ms * 1e-3,
                      seed=seed, **kwargs)

    def describe(self) -> str:
        p = self.parallel
        layout = f"tp={p.tp} pp={p.pp} ep={p.ep} dp={p.dp}" + (
            f" attention_dp={p.attention_dp}" if p.attention_dp > 1 else "")
        asynchronous = self.engine.host.async_scheduling
        served = f", served in {self.model.served_dtype}" if self.model.served_dtype else ""
        sched = self.engine.scheduler
        return (f"{self.model.name}{served} on {self.hw.name} ({layout}), engine {self.engine.name} "
                f"({sched.max_num_batched_tokens} tokens x {sched.max_num_seqs} seqs per step, "
                f"{'async' if asynchronous else 'sync'} scheduling, frontend "
                f"{delay_label(self.engine.frontend.delay_ms(asynchronous))}), workload {self.workload.config.name}, "
                f"pricing tier {self.pricer.predictor.tier}")


def build_setup(model: ModelConfig, hardware: Hardware, engine: EngineProfile, parallel: ParallelConfig,
                workload: WorkloadConfig, *, tier: str = "auto", bundle=None,
                max_model_len: int | None = None, allow_long_max_model_len: bool = False, energy=None,
                band: str | None = None, predictor=None) -> Setup:
    """A validated Setup: the GPU on the layout's network, KV blocks, pricer over the predictor's `tier`
    and `bundle` (None: the shipped one) and the power model `energy` (None: the shipped one, a JSON path,
    False: no energy); band: price every kernel at that end of its 80 % interval ('p10', 'p90'; None: the
    central value); predictor: a Predictor of this GPU to price with instead (tier, bundle and band are then
    its own; setups on one GPU may share one). max_model_len None is the model's context length (vLLM's rule,
    context.resolve_max_model_len). Any problem is one KernelsightError line."""
    hw = hardware.on_network(parallel.net_gbs_per_gpu)
    model = model.served_on(hw)  # vLLM's dtype='auto': fp16 (or fp32) where the GPU has no bf16
    engine = engine.on_gpu(hw)   # batch limits left 'auto': vLLM's defaults for the GPU
    memory = memory_plan(model, hw, engine, parallel)  # refuses layouts that do not fit
    blocks = memory.blocks
    if blocks < 2:
        raise KernelsightError(f"model {model.name} on {hw.key}: only {blocks} KV block fits; "
                               f"nothing is left beside vLLM's null block")
    sched = SchedulerConfig.from_engine(engine)
    if predictor is None:
        predictor = Predictor(hw, tier=tier, bundle=bundle, band=band)
    max_len = resolve_max_model_len(model, max_model_len, allow_long_max_model_len)
    pricer = StepPricer(model, hw, engine, parallel, predictor, power=kernel_power(hw, energy), context_limit=max_len)
    if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < max_len:
        raise KernelsightError(f"without chunked prefill a whole prompt must fit one step: "
                               f"scheduler.max_num_batched_tokens={sched.max_num_batched_tokens} < max_model_len="
                               f"{max_len} (vLLM refuses this too); raise it or set max_model_len")
    return Setup(model, hw, engine, parallel, pricer, sched, blocks - 1, max_len, Workload(workload),
                 sliding=memory.sliding)


def check_slo(slo: dict | None) -> dict:
    """SLO thresholds in ms ({ttft_ms, tpot_ms, e2el_ms}; null entries dropped), checked."""
    slo = slo or {}
    for key, value in slo.items():
        if key not in SLO_KEYS:
            raise KernelsightError(f"slo.{key}: unknown SLO; known: {', '.join(SLO_KEYS)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise KernelsightError(f"slo.{key}={value!r}: must be a positive number of milliseconds or null")
    return {k: float(v) for k, v in slo.items() if v is not None}


class _RequestRows:
    """Engine recorder that keeps the per-request columns of requests.parquet in memory."""

    def __init__(self, inner: Recorder | None = None):
        self.inner = inner
        self.rows: list[tuple] = []

    def step(self, *args) -> None:
        if self.inner is not None:
            self.inner.step(*args)

    def request(self, req, latencies) -> None:
        self.rows.append(request_row(req, latencies))
        if self.inner is not None:
            self.inner.request(req, latencies)


@dataclass
class SimulationResult:
    """One finished run: the `vllm bench serve`-style summary, the engine (metrics, breakdown) and its setup.

    summary: the flat dict `kernelsight simulate` prints and writes (summary.json); metrics: its serving
    metrics grouped by latency (metrics['ttft_ms']['p50']); breakdown: GPU time per kernel family; requests:
    one row per request. The engine keeps the raw accumulators (engine.metrics, engine.breakdown).
    """

    summary: dict
    setup: Setup
    engine: Engine
    out_dir: Path | None = None
    request_rows: list | None = field(default=None, repr=False)  # kept with keep_requests=True
    _sources: list | None = field(default=None, repr=False)

    @property
    def metrics(self) -> dict:
        """vllm bench serve's metrics: per latency ('ttft_ms', 'tpot_ms', 'itl_ms', 'e2el_ms') a dict of mean,
        std, median (= p50), p90, p99 in ms; then counts, duration and throughputs (metrics.grouped)."""
        return grouped(self.summary)

    @property
    def breakdown(self) -> pd.DataFrame | None:
        """GPU seconds per kernel family (rows) by step kind, total_s and share (None: no breakdown kept)."""
        return self.engine.breakdown.table() if self.engine.breakdown is not None else None

    @property
    def requests(self) -> pd.DataFrame | None:
        """One row per finished request (requests.parquet's columns): kept in memory with
        keep_requests=True, read back from out_dir otherwise; None when neither."""
        import pandas as pd

        if self.request_rows is not None:
            return pd.DataFrame(self.request_rows, columns=list(REQUEST_COLUMNS))
        if self.out_dir is not None:
            return pd.read_parquet(self.out_dir / "requests.parquet")
        return None

    def pricing_sources(self) -> list[dict]:
        """What priced each kernel family (tier, model, extrapolation), from the breakdown's sampled steps
        (re-priced kernel by kernel once, then kept)."""
        if self._sources is None:
            sample = self.engine.breakdown.sample if self.engine.breakdown is not None else []
            self._sources = self.setup.pricer.pricing_sources(sample) if sample else []
        return self._sources

    def implausible_families(self) -> list[dict]:
        """Families taking most of the kernel time at an η far above the rest of the step's (sim.pricing):
        a figure not to be trusted."""
        return implausible_families(self.pricing_sources())


def run(setup: Setup, num_requests: int | None, seed: int, router: str = "least_outstanding",
        slo_ms: dict | None = None, out_dir: Path | None = None, trace_steps: int = 2000,
        trace_kernel_steps: int = 20, breakdown: bool = True, keep_requests: bool = False,
        progress=None, fast_forward: bool = True, itl: bool = True) -> SimulationResult:
    """Stream `num_requests` of the setup's workload (None: a whole trace) through fresh replicas.

    progress: None, or a tqdm-like factory; progress(total=..., desc=..., unit=...) must return an object
    with update(n) and close(). It is told of every finished request (completed or failed), once per step
    that finishes some, so a bar costs nothing measurable. The caller decides whether and where it shows.
    fast_forward: advance runs of identical decode steps at once (engine.Engine; the same result as
    simulating them step by step, which False does). itl=False: no inter-token gaps kept (the summary's ITL
    fields NaN), for runs that report only request latencies and throughputs."""
    recorder = Recorder(out_dir, trace_steps, trace_kernel_steps) if out_dir is not None else None
    kept = _RequestRows(recorder) if keep_requests else None
    bar = progress(total=setup.workload.count(num_requests), desc="simulate", unit="req") if progress else None
    engine = setup.new_engine(seed, router, slo_ms=slo_ms, recorder=kept or recorder,
                              breakdown=BreakdownAccumulator() if breakdown else None,
                              progress=bar.update if bar is not None else None, fast_forward=fast_forward, itl=itl)
    start = time.perf_counter()
    try:
        summary = engine.run(setup.workload.requests(num_requests, seed))
    finally:
        if bar is not None:
            bar.close()
    summary.update(setup.energy(engine, summary))
    summary["wall_s"] = time.perf_counter() - start
    if recorder is not None:
        recorder.close(len(engine.replicas))
    return SimulationResult(summary, setup, engine, Path(out_dir) if out_dir is not None else None,
                            kept.rows if kept is not None else None)


def simulate(model: ModelConfig, hardware: Hardware, engine: EngineProfile, parallel: ParallelConfig,
             workload: WorkloadConfig, *, num_requests: int | None, seed: int = 0,
             router: str = "least_outstanding", tier: str = "auto", bundle=None, max_model_len: int | None = None,
             allow_long_max_model_len: bool = False,
             slo: dict | None = None, out_dir: Path | None = None, trace_steps: int = 2000,
             trace_kernel_steps: int = 20, breakdown: bool = True, keep_requests: bool = False,
             progress=None, fast_forward: bool = True, energy=None, intervals: bool = False,
             parallel_bands: bool | None = None) -> SimulationResult:
    """Simulate `num_requests` requests of `workload` (None: every row of a trace) on `parallel.dp` replicas
    of `model` on `hardware` under `engine`; kernels priced in predictor `tier` from `bundle`, energy with the
    power model `energy` (None: the shipped one; a JSON path; False: none; the breakdown carries it, so
    breakdown=False prices none).

    slo: {ttft_ms, tpot_ms, e2el_ms} thresholds for goodput. out_dir: also write requests.parquet,
    steps.parquet and trace.json there. keep_requests: keep the per-request table in memory. progress: a
    tqdm-like factory for a bar over finished requests (see run). fast_forward=False: simulate every
    engine step one by one (same result, slower; see run). intervals: run again with every kernel priced at
    the low and the high end of its 80 % interval (predictor/predict.py; errors of kernels moving together)
    and put each metric's range in summary['intervals'], widened to the engine profile's serving error
    (engine_profile.ServingError: what kernel intervals leave out). parallel_bands: run each end in a forked
    child beside the central run (None: where os.fork exists and 2 CPUs are usable; see interval_ends).
    """
    if num_requests is not None:
        whole_number(num_requests, "num_requests", hint="null: every row of a trace")
    check_seed(seed)
    whole_number(trace_steps, "trace_steps", 0, hint="steps in trace.json")
    whole_number(trace_kernel_steps, "trace_kernel_steps", 0, hint="of which the first show their kernels")
    intervals = intervals and tier != "roofline"
    # with intervals, one predictor keeps its predictions (the runs at both ends reuse the central run's where
    # they run after it in this process)
    predictor = Predictor(hardware.on_network(parallel.net_gbs_per_gpu), tier=tier, bundle=bundle,
                          memo=True) if intervals else None
    setup = build_setup(model, hardware, engine, parallel, workload, tier=tier, bundle=bundle,
                        max_model_len=max_model_len, allow_long_max_model_len=allow_long_max_model_len,
                        energy=energy, predictor=predictor)
    slo_ms = check_slo(slo)
    if num_requests is None and setup.workload.trace is None:
        raise KernelsightError("num_requests=null only replays a whole trace; synthetic workloads need a count")

    def central():
        return run(setup, num_requests, seed, router, slo_ms, out_dir, trace_steps, trace_kernel_steps, breakdown,
                   keep_requests, progress, fast_forward)

    if not intervals:
        return central()

    def band_run(band: str):
        band_setup = build_setup(model, hardware, engine, parallel, workload, max_model_len=max_model_len,
                                 allow_long_max_model_len=allow_long_max_model_len, energy=False,
                                 predictor=predictor.with_band(band))
        return lambda: run(band_setup, num_requests, seed, router, slo_ms, breakdown=False,
                           fast_forward=fast_forward, itl=False).summary   # INTERVAL_METRICS need no ITL

    start = time.perf_counter()
    setup.pricer.prime()   # before the ends fork: they inherit the loaded models and the shared predictions
    result, ends = interval_ends(central, [band_run("p10"), band_run("p90")], parallel_bands)
    result.summary["wall_s"] = time.perf_counter() - start   # the three runs' (central, both ends)
    error = setup.engine.serving_error
    if setup.workload.max_concurrency is None:  # open loop: the arrival rate, not the simulator, sets throughput
        error = replace(error, throughput=None)
    result.summary["intervals"] = {key: list(error.widen(key, float(result.summary[key]),
                                                          *sorted(end[key] for end in ends)))
                                   for key in INTERVAL_METRICS}
    result.summary["intervals_serving_error"] = error != ServingError()
    return result


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _ends(summary: dict) -> dict:
    return {key: float(summary[key]) for key in INTERVAL_METRICS}


def interval_ends(central, runs, parallel: bool | None = None) -> tuple:
    """Run `central` here and the two runs at the ends of the kernel intervals (`runs`: two callables, each
    running one and returning its summary); returns (what central returned, the INTERVAL_METRICS of each end
    in order).

    Why children: the three runs are independent, so where os.fork exists and 2 CPUs are usable (parallel
    None) each end runs in a forked child started before the central run, all three side by side. A child
    sends back its metrics (and warnings) as JSON over a pipe: the same numbers as one run after the other
    (JSON gives floats back exactly). A child that fails, sends garbage or runs long has its run redone here;
    an exception here (Ctrl-C) kills and reaps the children before it propagates.
    """
    if parallel is None:
        parallel = hasattr(os, "fork") and usable_cpus() >= 2
    children: list = []   # filled inside the try: a Ctrl-C between two forks still reaps the first
    messages: list = [None] * len(runs)
    statuses: list = [None] * len(runs)
    try:
        children.extend(_fork(band) if parallel else None for band in runs)
        start = time.monotonic()
        result = central()
        deadline = time.monotonic() + max(CHILD_GRACE_S, 2 * (time.monotonic() - start))
        for i, child in enumerate(children):
            if child is not None:
                messages[i] = _read(child[1], deadline)
    finally:
        for i, child in enumerate(children):
            if child is not None:
                pid, read_fd = child
                os.close(read_fd)
                if messages[i] is None:  # an exception here, or the child failed or outlived its grace
                    os.kill(pid, signal.SIGKILL)  # not yet reaped: the pid is still this child's
                statuses[i] = os.waitpid(pid, 0)[1]
    ends = []
    for band, child, message, status in zip(runs, children, messages, statuses):
        got = _received(message, status) if child is not None else None
        ends.append(got if got is not None else _ends(band()))
    return result, ends


def _fork(band) -> tuple[int, int] | None:
    """(pid, read end of its pipe) of a child process running `band` and writing its metrics as JSON (None:
    no process could be started). The child prints nothing and never returns: it leaves by os._exit, so
    none of this process's clean-up (atexit, buffered output, open files) runs twice."""
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        return None
    try:
        with warnings.catch_warnings():  # Python >= 3.12 warns of a fork where threads run (numpy's, OpenMP's)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid:
        os.close(write_fd)
        return pid, read_fd
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it outright; the parent reaps it
        os.close(read_fd)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ends = _ends(band())
        data = json.dumps({"ends": ends, "warnings": [str(w.message) for w in caught]}).encode()
        while data:
            data = data[os.write(write_fd, data):]
        code = 0
    finally:
        os._exit(code)


def _read(fd: int, deadline: float) -> bytes | None:
    """Everything written to the pipe `fd` until its writer closes it; None at `deadline` first."""
    chunks = []
    with selectors.DefaultSelector() as ready:
        ready.register(fd, selectors.EVENT_READ)
        while (wait := deadline - time.monotonic()) > 0 and ready.select(wait):
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    return None


def _received(message: bytes | None, status: int) -> dict | None:
    """The child's metrics, its warnings given again here; None unless it exited cleanly with a whole message."""
    if message is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:
        got = json.loads(message)
        ends = {key: got["ends"][key] for key in INTERVAL_METRICS}
        notes = [note for note in got["warnings"] if isinstance(note, str)]
    except (ValueError, KeyError, TypeError):
        return None
    if not all(type(value) is float for value in ends.values()):
        return None
    for note in notes:
        warnings.warn(note, stacklevel=3)
    return ends
