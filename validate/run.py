"""Simulating validation rows: one closed-loop run per row, recorded as a re-priceable step log.

Protocol of a row (the benchmark's, see data/validation/README.md): `concurrency`
clients, each sending its next request the moment its previous one finished,
`isl` prompt and `osl` output tokens per request (fixed, or drawn uniformly from
[floor(r * L), L] where the row's benchmark used a range ratio r), unique prompts
(no prefix-cache hits), one replica of tp_size GPUs. Every client sends
warmup_rounds + rounds requests (RunSettings); the warmup rounds are excluded
from the means.

Start (RunSettings.start): `burst` (the benchmarks': a measured phase after a
warmup, if any, has finished) sends every client's first request at t = 0; `staggered`
spreads them evenly over one round, the time one request takes when clients are
out of phase (its prefill alone plus osl decode steps of every client at the
mean context). With fixed lengths a simulated burst locks clients into cohorts
that prefill together for the whole run (deterministic step times never break
them up); random lengths break them up after the first round (the Llama rows'
measured TTFTs follow that).

Step log. With synchronous scheduling (vLLM 0.11-0.12's default), which
requests run in which step is recorded and held fixed; step n then ends at
    T[n] = sum_{i <= n} (idle_i + host_i + gpu_i),
idle_i being time the engine waited for a request (every client in the
frontend). Each request's TTFT and TPOT are sums of step times between its
send, first token and finish steps. The log keeps, per step, the GPU seconds,
the idle time and the inputs of the host model (sim/pricing.py: one step, its
scheduled sequences, whether it samples), and per request those three step
indices. `composition.py` re-prices the whole run for other host parameters
without simulating again: exactly without a frontend delay (every arrival is a
completion event), and with the schedule and idle times held fixed otherwise.
With async scheduling (a row's deployment, or its vLLM release: ASYNC_DEFAULT_SINCE) steps overlap: the host forms step
n + 1 while the GPU runs step n, and a step lasts max(host, GPU). While the GPU
is the longer of the two, the host terms do not move any token: the log keeps
the step end times, and composition.py scores such a row as it ran, with a
check that the host terms stay hidden.
"""
from __future__ import annotations

import math
import os
import signal
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np

from kernelsight.predictor.errors import KernelsightError, check_seed, whole_number
from kernelsight.predictor.hardware import load_hardware
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.engine_profile import EngineProfile
from kernelsight.sim.run import Setup, build_setup
from kernelsight.sim.workload import Workload, WorkloadConfig

from .rows import (AICONFIGURATOR_BUDGET_MARGIN, INFERENCEMAX_BUDGET, INFERENCEMAX_FUSED_NORM_MIB,
                   ValidationRow, parallel_for)

# How the clients' first requests go out (see the module docstring).
START_MODES = ("staggered", "burst")
# Relative tolerance of the step-log checks (a step lasts host + GPU; token events at step ends).
TIME_IDENTITY_RTOL = 1e-9


@dataclass(frozen=True)
class RunSettings:
    """How rows are simulated (the measurement protocol) and with which engine profile mapping.

    Each client sends warmup_rounds + rounds requests; the metrics are means over the requests after
    the warmup. The benchmarks behind the validation data send 10 x concurrency measured requests
    (aiconfigurator's eval runners: aiperf --request-count 10 x concurrency after 2 x concurrency
    warmup requests, bench_serving --num-prompts 10 x concurrency; benchmark_serving in the InferenceMAX
    recipes: --num-prompts 10 x concurrency after --num-warmups 2 x concurrency; aiconfigurator's
    generated bench script sends 50 x concurrency, see data/validation/README.md): a warmup, if any,
    finishes before the measured phase, which therefore starts from an idle engine with all clients at
    once (start='burst', warmup_rounds=0, rounds=10).
    """

    warmup_rounds: int
    rounds: int
    seed: int
    engine: dict
    start: str = "burst"

    @classmethod
    def from_protocol(cls, protocol: dict, seed: int, engine: dict) -> "RunSettings":
        """From the validation config's protocol section (warmup_rounds, rounds, start), checked."""
        for key, low in (("warmup_rounds", 0), ("rounds", 1)):
            whole_number(protocol.get(key), f"protocol.{key}", low)
        if protocol.get("start") not in START_MODES:
            raise KernelsightError(f"protocol.start={protocol.get('start')!r}: choose one of {', '.join(START_MODES)}")
        return cls(protocol["warmup_rounds"], protocol["rounds"], check_seed(seed), engine, protocol["start"])

    def num_requests(self, row: ValidationRow) -> int:
        return (self.warmup_rounds + self.rounds) * row.concurrency


@dataclass(frozen=True)
class Tier:
    """An η tier of the validation: the predictor tier and bundle the simulator prices kernels with.

    bundle may name one bundle per validated GPU with '{device}' (its catalog key): on(device) is the tier
    of that GPU's rows. band: every kernel priced at that end of its 80 % interval ('p10', 'p90'; None: the
    central value), at_band(band) the tier so priced."""

    name: str
    predictor_tier: str
    bundle: str | None
    band: str | None = None

    def on(self, device: str) -> "Tier":
        if self.bundle is None or "{device}" not in self.bundle:
            return self
        from .cross_bundle import resolve_bundle

        return Tier(self.name, self.predictor_tier, resolve_bundle(self.bundle.replace("{device}", device)),
                    self.band)

    def at_band(self, band: str) -> "Tier":
        """This tier with every kernel at the `band` end of its interval (its own name: rows kept apart)."""
        return Tier(f"{self.name}-{band}", self.predictor_tier, self.bundle, band)


@dataclass
class StepLog:
    """One simulated row, re-priceable (see the module docstring).

    Per step: gpu_s, host_s (as simulated), idle_s (the engine's wait before forming it), seqs
    (scheduled sequences), samples (1 if the step samples a token): the inputs of the host model.
    Per request: send = index of the last step ending at or before its send time (-1: none) and
    send_offset_s = the time past that end;
    first, finish = index of the step whose end is its first and last token; output_len; request_id
    (the clients' send order).
    """

    gpu_s: np.ndarray
    host_s: np.ndarray
    idle_s: np.ndarray
    seqs: np.ndarray
    samples: np.ndarray
    send: np.ndarray
    send_offset_s: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    output_len: np.ndarray
    request_id: np.ndarray
    summary: dict
    kv_blocks: int
    wall_s: float
    t_end: np.ndarray               # seconds, per step: when its tokens reached the clients
    asynchronous: bool = False      # steps overlap (async scheduling): not re-priceable by host terms
    warnings: tuple = ()


class Recorder:
    """Engine recorder that keeps the step log's columns (the Engine calls step() and request())."""
    # Request ids of a synthetic stream are its send order (closed loop: clients send in stream order).

    def __init__(self):
        self.steps: list[tuple] = []
        self.requests: list[tuple] = []

    def step(self, replica, step, t_schedule, t_launch, t_end, gpu_s, host_s) -> None:
        b = step.batch
        self.steps.append((t_schedule, t_end, gpu_s, host_s, b.num_seqs, b.num_sampled > 0))

    def request(self, req, latencies) -> None:
        self.requests.append((req.arrival_time, req.first_token_time, req.finish_time, req.output_len,
                              req.request_id))


def _lengths(length: int, range_ratio: float) -> dict:
    """benchmark_serving's random lengths: uniform integers in [floor(r * L), L]; fixed for r = 1."""
    low = max(1, math.floor(range_ratio * length))
    return {"dist": "fixed", "value": length} if low >= length else {"dist": "uniform", "low": low, "high": length}


def _workload(row: ValidationRow, ramp_up_s: float = 0.0) -> dict:
    """The benchmark's closed loop: the row's lengths (fixed, or drawn by its range ratio), unique
    prompts, clients started over ramp_up_s."""
    return {"name": "closed_loop", "arrival": "poisson", "request_rate": float("inf"),
            "max_concurrency": row.concurrency, "ramp_up_s": ramp_up_s,
            "input": _lengths(row.isl, row.range_ratio), "output": _lengths(row.osl, row.range_ratio)}


def round_s(pricer, row: ValidationRow) -> float:
    """Seconds one request takes when clients are out of phase: its prompt prefilled alone (in chunks
    of the step budget), then osl decode steps of every client at the mean context isl + osl / 2 (the
    staggered start's spread)."""
    budget = pricer.engine.scheduler.max_num_batched_tokens
    prefill = sum(pricer.step_time(StepBatch(prefill_new=(min(budget, row.isl - done),), prefill_ctx=(done,),
                                             prefill_sampled=int(done + budget >= row.isl))).total_s
                  for done in range(0, row.isl, budget))
    decode = pricer.step_time(StepBatch(decode_ctx=(row.isl + row.osl // 2,) * row.concurrency)).total_s
    return prefill + row.osl * decode


# The `backend` values whose runs the engine profiles simulate ('': the CSV does not say; vLLM is assumed).
SIMULATED_BACKENDS = ("", "vllm")

# vLLM schedules asynchronously by default from this release on (vllm-project/vllm#27614, in v0.14.0): the host
# forms step n + 1 while the GPU runs step n. Rows of earlier releases ran synchronously unless their
# deployment asked for it (InferenceMAX's --async-scheduling).
ASYNC_DEFAULT_SINCE = (0, 14, 0)
# From this release on, vLLM's default -O2 fuses each tensor-parallel all-reduce with the residual add and
# RMSNorm after it (FlashInfer's kernel; vllm/config/vllm.py enable_allreduce_rms_fusion) on Hopper and Blackwell
# GPUs with TP > 1, without pipeline or data parallelism; 0.14's OPTIMIZATION_LEVEL_02 still had it off.
FUSED_NORM_DEFAULT_SINCE = (0, 16, 0)
# vLLM 0.16's FI_ALLREDUCE_FUSION_MAX_SIZE_MB (compilation/passes/fusion/allreduce_rms_fusion.py) per CUDA
# major version: the largest fused message, MiB, per TP size (larger ones run the unfused all-reduce).
FUSED_NORM_MAX_MIB = {"9": {"tp2": 64, "tp4": 2, "tp8": 0.5}, "10": {"tp2": 64, "tp4": 32, "tp8": 1}}


def release_engine(engine: dict, row: ValidationRow) -> dict:
    """The engine profile (mapping) under the defaults of the row's vLLM release (rows without one: as it is)."""
    if not row.backend_version:
        return engine
    if row.backend_version >= ASYNC_DEFAULT_SINCE:
        engine = {**engine, "host": {**engine["host"], "async_scheduling": True}}
    major = str(load_hardware(row.device).compute_capability or "").split(".")[0]
    if (row.backend_version >= FUSED_NORM_DEFAULT_SINCE and major in FUSED_NORM_MAX_MIB and row.tp > 1
            and row.pp == 1 and row.attention_dp == 1):
        engine = {**engine, "allreduce": {**engine["allreduce"], "fuse_rms_norm_max_mib": FUSED_NORM_MAX_MIB[major]}}
    return engine


def deployment_engine(engine: dict, row: ValidationRow) -> dict:
    """The engine profile (mapping) of a row's deployment (rows.DEPLOYMENTS) under its vLLM release's defaults."""
    engine = release_engine(engine, row)
    if row.deployment == "engine":
        return engine
    if row.deployment == "inferencemax":
        scheduler = {**engine["scheduler"], "max_num_batched_tokens": INFERENCEMAX_BUDGET,
                     "max_num_seqs": row.concurrency, "enable_prefix_caching": False}
        return {**engine, "scheduler": scheduler, "host": {**engine["host"], "async_scheduling": True},
                "allreduce": {**engine["allreduce"], "fuse_rms_norm_max_mib": INFERENCEMAX_FUSED_NORM_MIB}}
    budget = row.concurrency + row.isl + AICONFIGURATOR_BUDGET_MARGIN
    scheduler = {**engine["scheduler"], "max_num_batched_tokens": budget,
                 "max_num_seqs": row.concurrency}
    graphs = {**engine["cuda_graph"], "capture_sizes": list(range(1, row.concurrency + 1))}
    return {**engine, "scheduler": scheduler, "cuda_graph": graphs}


def row_setup(row: ValidationRow, model, tier: Tier, engine: dict) -> Setup:
    """The simulator setup of one row: its GPU, layout, closed-loop workload and engine profile mapping. With
    attention data parallelism one attention group is simulated (group_row): the groups run in lockstep
    with equal shares of the clients, and its MoE layers see every group's tokens (the model graph)."""
    setup = build_setup(model, load_hardware(row.device), EngineProfile.from_mapping(engine, "engine config"),
                        parallel_for(row, model), WorkloadConfig.from_config(_workload(group_row(row))),
                        tier=tier.predictor_tier, bundle=tier.bundle, band=tier.band)
    setup.one_group = True
    return setup


def group_row(row: ValidationRow) -> ValidationRow:
    """The row as one attention group sees it: its share of the clients (the router spreads them evenly)."""
    if row.attention_dp == 1:
        return row
    return replace(row, concurrency=-(-row.concurrency // row.attention_dp))


def refusals(rows: list[ValidationRow], models: list, engine: dict) -> dict[int, str]:
    """Why each row that cannot be simulated cannot (its key -> the reason): another serving engine than
    vLLM, a layout the model's heads or the GPU's memory do not allow, a dtype the GPU has no peak for, ...
    Checked before any row runs, by building each distinct (GPU, layout, model, deployment)'s setup with
    roofline pricing (no η bundle)."""
    checked: dict[tuple, str | None] = {}
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row, model in zip(rows, models):
            if row.backend not in SIMULATED_BACKENDS:
                out[row.key] = (f"backend {row.backend!r}: kernelsight simulates vLLM engines (engine profiles "
                                f"of conf/engine), not this engine's scheduler and kernels")
                continue
            key = (row.device, row.tp, row.pp, row.attention_dp, row.moe_tp, row.moe_ep, model, row.deployment)
            if key not in checked:
                try:
                    setup = row_setup(row, model, Tier("check", "roofline", None),
                                      deployment_engine(engine, group_row(row)))
                    # price a step of each kind: tables fill lazily, so a dtype without a peak shows here
                    setup.pricer.step_time(StepBatch(prefill_new=(row.isl,), prefill_ctx=(0,), decode_ctx=(row.isl,)))
                    checked[key] = None
                except KernelsightError as e:
                    checked[key] = str(e)
            if checked[key] is not None:
                out[row.key] = checked[key]
    return out


# Per process: (row layout, model, tier, engine) -> Setup, so pricer tables are built once per layout;
# the workload (concurrency, lengths) differs per row and is built for each run.
_SETUPS: dict = {}


def simulate_row(row: ValidationRow, model, tier: Tier, settings: RunSettings,
                 num_requests: int | None = None) -> StepLog:
    """Simulate one row and return its step log (the predictor's warnings travel in log.warnings,
    for the caller to report once per tier)."""
    engine = deployment_engine(settings.engine, group_row(row))
    key = (row.device, row.tp, row.pp, row.attention_dp, row.moe_tp, row.moe_ep, model, tier, repr(engine))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        setup = _SETUPS.get(key)
        if setup is None:
            setup = _SETUPS[key] = row_setup(row, model, tier, engine)
        group = group_row(row)
        n = -(-(num_requests or settings.num_requests(row)) // row.attention_dp)
        recorder = Recorder()
        ramp = round_s(setup.pricer, group) if settings.start == "staggered" else 0.0
        workload = Workload(WorkloadConfig.from_config(_workload(group, ramp)))
        engine = setup.new_engine(settings.seed, max_concurrency=group.concurrency, recorder=recorder)
        start = time.perf_counter()
        summary = engine.run(workload.requests(n, settings.seed))
        wall = time.perf_counter() - start
    if summary["failed"]:
        raise KernelsightError(f"{row.where} ({row.row_id}): {summary['failed']} requests of isl {row.isl} + "
                               f"osl {row.osl} do not fit the simulated KV cache ({setup.num_blocks} blocks)")
    log = step_log(recorder, summary, setup.num_blocks, wall, f"{row.where} ({row.row_id})",
                   asynchronous=setup.engine.host.async_scheduling)
    log.warnings = tuple(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))
    return log


def step_log(rec: "Recorder", summary: dict, kv_blocks: int, wall: float, where: str,
             asynchronous: bool = False) -> StepLog:
    """The step log of a finished run (KernelsightError where a synchronous run's steps overlap)."""
    steps = np.asarray(rec.steps, dtype=np.float64).reshape(-1, 6)
    t_schedule, t_end, gpu, host = steps[:, 0], steps[:, 1], steps[:, 2], steps[:, 3]
    idle = t_schedule - np.concatenate([[0.0], t_end[:-1]])
    # Synchronous: each step is formed after the previous one ended and lasts exactly host + gpu.
    serial = (idle >= -1e-12) & np.isclose(t_end - t_schedule, gpu + host, rtol=TIME_IDENTITY_RTOL, atol=1e-12)
    if not asynchronous and not serial.all():
        bad = int(np.argmin(serial))
        raise KernelsightError(f"{where}: step {bad} runs from {t_schedule[bad]:.6f} s to {t_end[bad]:.6f} s, "
                               f"not host + GPU time after the previous step's end: steps overlap "
                               f"(an asynchronous engine), so the step log cannot re-price this run")
    reqs = np.asarray(rec.requests, dtype=np.float64).reshape(-1, 5)

    def index(times: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(t_end, times, side="left")
        found = t_end[np.clip(idx, 0, len(t_end) - 1)]
        if not np.allclose(found, times, rtol=TIME_IDENTITY_RTOL, atol=1e-12):
            raise KernelsightError(f"{where}: a token event falls between step ends; "
                                   f"the step log cannot re-price this run")
        return idx.astype(np.int64)

    # A send is a step end (a closed-loop client's previous request finished) or any earlier time (a
    # start-up send, an open-loop arrival): the last step end at or before it, plus the offset past it.
    send_time = reqs[:, 0]
    send = np.searchsorted(t_end, send_time * (1 + TIME_IDENTITY_RTOL) + 1e-12, side="right") - 1
    offset = send_time - np.where(send >= 0, t_end[np.maximum(send, 0)], 0.0)
    return StepLog(gpu_s=gpu, host_s=host, idle_s=np.maximum(idle, 0.0), seqs=steps[:, 4], samples=steps[:, 5],
                   send=send.astype(np.int64), send_offset_s=np.maximum(offset, 0.0), first=index(reqs[:, 1]),
                   finish=index(reqs[:, 2]), output_len=reqs[:, 3], request_id=reqs[:, 4].astype(np.int64),
                   summary=summary, kv_blocks=kv_blocks, wall_s=wall, t_end=t_end, asynchronous=asynchronous)


def simulate_rows(jobs: list[tuple], processes: int, progress=None, desc: str = "validate",
                  store=None) -> list[StepLog]:
    """simulate_row over (row, model, tier, settings, num_requests) tuples, in `processes` worker processes.

    Jobs are sorted so that one worker gets the rows of one layout in sequence (its pricer tables
    are built once); results come back in the order of `jobs`. progress: a tqdm-like factory for a bar
    over the rows as they finish, or None. store: a store.RowStore; a row it holds under the job's key is
    reused, every other row is kept in it the moment it finishes (an interrupted run loses no finished row).
    """
    results = {}
    for i, job in enumerate(jobs if store is not None else ()):
        if (log := store.get(job)) is not None:
            results[i] = log
    order = sorted((i for i in range(len(jobs)) if i not in results),
                   key=lambda i: (jobs[i][2].name, jobs[i][0].model_path, jobs[i][0].precision, jobs[i][0].tp,
                                  -jobs[i][0].osl * jobs[i][0].concurrency))
    processes = max(1, min(processes, len(order), os.cpu_count() or 1))

    def track(finished):
        return progress(finished, total=len(order), desc=desc, unit="row") if progress and order else finished

    def collect(finished) -> None:
        for i, log in track(finished):
            results[i] = log
            if store is not None:
                store.put(jobs[i], log)

    if processes == 1:
        collect(_simulate_job((i, jobs[i])) for i in order)
    else:
        import multiprocessing as mp

        # Workers ignore Ctrl-C: the parent stops them and says once what was kept (no traceback per worker).
        with mp.get_context("fork").Pool(processes, signal.signal, (signal.SIGINT, signal.SIG_IGN)) as pool:
            collect(pool.imap_unordered(_simulate_job, [(i, jobs[i]) for i in order], chunksize=1))
    return [results[i] for i in range(len(jobs))]


def _simulate_job(indexed: tuple) -> tuple[int, StepLog]:
    """(index, simulate_row(*job)) of an (index, job) pair, for Pool.imap_unordered (one argument, any order)."""
    i, job = indexed
    return i, simulate_row(*job)


def first_token_group(log: StepLog, measured: np.ndarray) -> float:
    """Mean number of measured requests that get their first token in the same step as a given one:
    how many prompts a closed loop prefills together (1 = perfectly staggered arrivals)."""
    first = log.first[measured]
    if not len(first):
        return float("nan")
    _, inverse, counts = np.unique(first, return_inverse=True, return_counts=True)
    return float(counts[inverse].mean())

