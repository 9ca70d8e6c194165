"""Deployment planning: which GPU, layout and engine settings serve a load within latency SLOs, and at what cost.

A candidate is one replica's deployment: a catalog GPU, a TP x PP x EP x attention-DP layout and vLLM's
max_num_seqs, max_num_batched_tokens and KV-cache dtype. evaluate() prices it in four steps:

1. before anything is simulated: layouts vLLM refuses (parallel.shard), then memory: vLLM's start-up
   profile (sim.memory, through run.build_setup) and its check that one request of max_model_len fits
   the KV cache;
2. capacity (open-loop load): the request rate one replica serves when 200 requests arrive at once,
   an upper bound of every sustainable rate (a finite burst's tail makes it a conservative one);
3. the highest load that meets the SLOs (search_load): the load is monotone in every latency, so a
   geometric bracket is grown from a first probe and halved until its ends are within `tolerance`;
   the lower end (a load that was simulated and met the SLOs) is the answer;
4. sizing at the target load: replicas = ceil(target / highest load), GPUs, $/hour, $/million output
   tokens and energy per token, from one run of each replica's share of the target load.

The load is what the workload makes variable: the request rate of an open-loop workload, the number of
clients of a closed loop (max_concurrency), or a multiplier of a trace's arrival rate (time_scale).
An open-loop plan needs slo.ttft_ms: past capacity a queue grows without bound while TPOT stays
bounded, so a TPOT-only SLO would accept any overload.

Nothing here reads config files or prints: the CLI (cli/plan.py) composes the inputs and writes tables.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field, replace
from itertools import product
from typing import Any, Callable, Iterable, Mapping

from kernelsight.predictor.errors import KernelsightError, whole_number
from kernelsight.predictor.hardware import Hardware, load_hardware
from kernelsight.predictor.predict import Predictor

from .context import MIN_MAX_MODEL_LEN
from .engine_profile import EngineProfile, vllm_batch_defaults
from .kv_cache import request_blocks
from .model import KV_DTYPES, ModelConfig
from .parallel import ParallelConfig, shard
from .run import Setup, build_setup, check_slo, run
from .workload import Workload, WorkloadConfig

PERCENTILES = ("mean", "median", "p90", "p99")
OBJECTIVES = ("cost", "gpus", "throughput")
LOAD_KINDS = ("request_rate", "max_concurrency", "trace_scale")
GROWTH = 4.0          # factor between probes while the bracket is still open
FLOOR = 1 / 256       # below start x FLOOR an SLO is taken as not reachable at any load
CAPACITY_REQUESTS = 200  # at most this many requests arrive at once for the capacity probe
MAX_PROBES = 24       # a search that has not closed its bracket by then stops


@dataclass(frozen=True)
class Slo:
    """Latency targets in ms at a percentile of the requests, or a goodput fraction: the share of requests
    meeting every target (vLLM bench serve's goodput) must be at least `goodput`."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    percentile: str = "p90"
    goodput: float | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping | None) -> "Slo":
        raw = dict(raw or {})
        percentile = raw.pop("percentile", "p90")
        goodput = raw.pop("goodput", None)
        limits = check_slo(raw)
        if percentile not in PERCENTILES:
            raise KernelsightError(f"slo.percentile={percentile!r}: expected one of {', '.join(PERCENTILES)}")
        if goodput is not None and (isinstance(goodput, bool) or not isinstance(goodput, (int, float))
                                    or not 0 < goodput <= 1):
            raise KernelsightError(f"slo.goodput={goodput!r}: a fraction of requests in (0, 1], or null")
        if not limits:
            raise KernelsightError("plan needs an SLO: set slo.ttft_ms, slo.tpot_ms or slo.e2el_ms (milliseconds)")
        return cls(**limits, percentile=percentile, goodput=None if goodput is None else float(goodput))

    @property
    def limits(self) -> dict:
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2el_ms", self.e2el_ms))
                if v is not None}

    def column(self, metric: str) -> str:
        """The summary key this SLO reads for a latency ('tpot_ms' -> 'p90_tpot_ms')."""
        return f"{self.percentile}_{metric}"

    def met(self, summary: Mapping) -> bool:
        if not summary.get("completed"):
            return False
        if self.goodput is not None:
            return summary["request_goodput"] >= self.goodput * summary["request_throughput"]
        return all(float(summary[self.column(k)]) <= v for k, v in self.limits.items())

    def describe(self) -> str:
        limits = ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in self.limits.items())
        return (f"{self.goodput:.0%} of requests within {limits}" if self.goodput is not None
                else f"{self.percentile} {limits}")


@dataclass(frozen=True)
class Load:
    """The variable of the search and the load the deployment must serve (`target`, in its units)."""

    kind: str
    target: float

    @classmethod
    def of(cls, workload: WorkloadConfig) -> "Load":
        if workload.max_concurrency is not None:
            return cls("max_concurrency", float(workload.max_concurrency))
        if workload.arrival == "trace":
            return cls("trace_scale", 1.0)
        if not math.isfinite(workload.request_rate) or workload.request_rate <= 0:
            raise KernelsightError(f"workload.request_rate={workload.request_rate}: plan sizes a deployment for a "
                                   f"finite request rate (req/s); set one, or a closed loop with max_concurrency")
        return cls("request_rate", float(workload.request_rate))

    @property
    def integer(self) -> bool:
        return self.kind == "max_concurrency"

    def workload(self, base: WorkloadConfig, x: float) -> WorkloadConfig:
        """The workload at load x."""
        if self.kind == "request_rate":
            return replace(base, request_rate=float(x))
        if self.kind == "max_concurrency":
            return replace(base, max_concurrency=int(x))
        return replace(base, time_scale=base.time_scale / float(x))

    def unit(self) -> str:
        return {"request_rate": "req/s", "max_concurrency": "clients", "trace_scale": "x trace rate"}[self.kind]


@dataclass(frozen=True)
class SearchSpace:
    """What plan varies. ep 'auto': 1 and, for a mixture-of-experts model, the whole MoE group (vLLM's
    --enable-expert-parallel); null knobs keep the engine profile's value."""

    gpus: tuple
    tp: tuple = (1, 2, 4, 8)
    pp: tuple = (1,)
    ep: Any = "auto"
    attention_dp: tuple = (1,)
    max_num_seqs: tuple = (None,)
    max_num_batched_tokens: tuple = (None,)
    kv_cache_dtype: tuple = ("auto",)
    max_gpus_per_replica: int = 8

    @classmethod
    def from_mapping(cls, raw: Mapping, gpus: Iterable[str]) -> "SearchSpace":
        raw = dict(raw)
        values = {}
        for key in ("tp", "pp", "attention_dp"):
            values[key] = _whole_list(raw.get(key, getattr(cls, key)), f"search.{key}")
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            given = raw.get(key)
            values[key] = (None,) if given is None or given == [None] else _whole_list(given, f"search.{key}")
        ep = raw.get("ep", "auto")
        values["ep"] = ep if ep == "auto" else _whole_list(ep, "search.ep")
        kv = raw.get("kv_cache_dtype", ("auto",))
        kv = (kv,) if isinstance(kv, str) else tuple(kv)
        for value in kv:
            if value != "auto" and value not in KV_DTYPES:
                raise KernelsightError(f"search.kv_cache_dtype: {value!r} is not one of auto, {', '.join(KV_DTYPES)}")
        values["kv_cache_dtype"] = kv
        limit = raw.get("max_gpus_per_replica", 8)
        values["max_gpus_per_replica"] = _whole_list([limit], "search.max_gpus_per_replica")[0]
        gpus = tuple(gpus)
        if not gpus:
            raise KernelsightError("gpus: no GPU to plan for; name catalog keys (gpus=[h100_sxm,h200_sxm]) or all")
        return cls(gpus=gpus, **values)


def _whole_list(value, setting: str) -> tuple:
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in items):
        raise KernelsightError(f"{setting}={value!r}: expected a list of whole numbers >= 1")
    return tuple(sorted(set(items)))


@dataclass(frozen=True)
class Candidate:
    gpu: str
    tp: int
    pp: int
    ep: int
    attention_dp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def key(self) -> str:
        layout = f"tp{self.tp}" + (f"_pp{self.pp}" if self.pp > 1 else "") + (
            f"_adp{self.attention_dp}" if self.attention_dp > 1 else "") + (f"_ep{self.ep}" if self.ep > 1 else "")
        return (f"{self.gpu}/{layout}/seqs{self.max_num_seqs}_mbt{self.max_num_batched_tokens}"
                f"_kv{self.kv_cache_dtype}")

    def parallel(self, node_gpus: int = 8) -> ParallelConfig:
        group = self.tp * self.attention_dp
        return ParallelConfig(name=self.key, tp=self.tp, pp=self.pp, ep=self.ep, attention_dp=self.attention_dp,
                              node_gpus=node_gpus,
                              pp_link="net" if group * self.pp > node_gpus else "nvlink")


def candidates(model: ModelConfig, engine: Mapping, space: SearchSpace,
               hardware: Mapping[str, Hardware] | None = None) -> list[Candidate]:
    """Every combination of the space that vLLM would start: layouts the model's heads allow, expert
    parallelism only on a mixture-of-experts model, attention data parallelism only there too (on a dense
    model it is plain replicas), max_num_batched_tokens >= max_num_seqs. Limits the space and the profile
    leave 'auto' take vLLM's defaults on each GPU (hardware: catalog key -> Hardware; None: the catalog's)."""
    sched = engine["scheduler"]
    out = []
    auto_kv = {}   # per GPU: the KV dtype 'auto' serves there (the model's; fp16 / fp32 where the GPU lacks bf16)
    for gpu, tp, pp, adp, seqs, mbt, kv in product(space.gpus, space.tp, space.pp, space.attention_dp,
                                                   space.max_num_seqs, space.max_num_batched_tokens,
                                                   space.kv_cache_dtype):
        hw = hardware[gpu] if hardware else load_hardware(gpu)
        default_mbt, default_seqs = vllm_batch_defaults(hw)
        seqs = seqs or _given(sched["max_num_seqs"]) or default_seqs
        mbt = mbt or _given(sched["max_num_batched_tokens"]) or default_mbt
        if tp * pp * adp > space.max_gpus_per_replica or mbt < seqs or (adp > 1 and model.moe is None):
            continue
        if model.kv_heads % tp and tp % model.kv_heads:
            continue  # vLLM: tp must divide the KV heads or be a multiple of them
        if pp > model.layers:
            continue
        group = tp * adp
        if model.moe is None:
            eps = (1,)
        elif space.ep == "auto":
            eps = (1, group) if group > 1 else (1,)
        else:
            eps = tuple(e for e in space.ep if group % e == 0 and e <= model.moe.experts)
        if kv == "auto":
            if gpu not in auto_kv:
                try:
                    auto_kv[gpu] = model.served_on(hw).kv_dtype
                except KernelsightError:   # not servable there: refused when the candidate is set up
                    auto_kv[gpu] = model.kv_dtype
            kv = auto_kv[gpu]
        out.extend(Candidate(gpu, tp, pp, ep, adp, seqs, mbt, kv) for ep in eps)
    return list(dict.fromkeys(out))


def _given(limit) -> int | None:
    """A profile's batch limit, None where it is 'auto'."""
    return None if limit == "auto" else limit


def engine_for(engine: Mapping, cand: Candidate) -> EngineProfile:
    """The engine profile with the candidate's knobs; CUDA graphs are captured up to
    min(2 x max_num_seqs, 512) tokens, vLLM's default largest capture size."""
    data = copy.deepcopy(dict(engine))
    data["scheduler"]["max_num_seqs"] = cand.max_num_seqs
    data["scheduler"]["max_num_batched_tokens"] = cand.max_num_batched_tokens
    largest = min(2 * cand.max_num_seqs, 512)
    sizes = [s for s in data["cuda_graph"]["capture_sizes"] if s <= largest]
    data["cuda_graph"]["capture_sizes"] = sizes or data["cuda_graph"]["capture_sizes"][:1]
    return EngineProfile.from_mapping(data, f"engine with {cand.key}")


@dataclass
class PlanSettings:
    """Everything a candidate's evaluation needs besides the candidate (sent to worker processes)."""

    model: ModelConfig
    engine: dict
    workload: WorkloadConfig
    slo: Slo
    hardware: dict                 # catalog key -> Hardware
    prices: dict                   # catalog key -> $ per GPU-hour (absent: no price)
    num_requests: int = 300
    tolerance: float = 0.1
    seed: int = 0
    tier: str = "auto"
    bundle: Any = None
    max_model_len: int | None = None   # capped at the model's context (a planner's length limit, not a request)

    def __post_init__(self):
        if not 0 < self.tolerance < 1:
            raise KernelsightError(f"search.tolerance={self.tolerance}: a relative width in (0, 1), e.g. 0.1")
        if isinstance(self.num_requests, bool) or not isinstance(self.num_requests, int) or self.num_requests < 20:
            raise KernelsightError(f"search.num_requests={self.num_requests!r}: at least 20 requests per probe")
        if self.max_model_len is not None:
            whole_number(self.max_model_len, "max_model_len", MIN_MAX_MODEL_LEN, hint="null: the model's context")
            self.max_model_len = min(self.max_model_len, self.model.context_limit)
        self.load = Load.of(self.workload)
        if self.load.kind != "max_concurrency" and self.slo.ttft_ms is None:
            raise KernelsightError("slo.ttft_ms is needed for an open-loop workload: past capacity the queue grows "
                                   "without bound while TPOT stays bounded, so a TPOT-only SLO accepts any overload")


@dataclass
class Probe:
    load: float
    met: bool
    summary: dict = field(repr=False)


def search_load(measure: Callable[[float], dict], slo: Slo, start: float, tolerance: float,
                upper: float | None = None, integer: bool = False, step: float = GROWTH) -> tuple[float, list[Probe]]:
    """The highest load meeting `slo`, between start x FLOOR and `upper` (a bound not itself met).

    measure(load) -> summary of a run at that load. From `start` the bracket is opened by a first step of
    `step` (GROWTH from a blind start; 1 + tolerance from the answer of a similar candidate), each further
    step by GROWTH, until a probe fails (going up) or passes (going down); then its
    geometric middle is probed until hi / lo <= 1 + tolerance (or, for whole-number loads, until they are
    adjacent). Returns (0, probes) when no load down to the floor meets the SLO."""
    probes: list[Probe] = []

    def probe(x: float) -> bool:
        summary = measure(x)
        probes.append(Probe(x, slo.met(summary), summary))
        return probes[-1].met

    def snap(x: float) -> float:
        return float(max(1, round(x))) if integer else x

    x = snap(start if upper is None else min(start, upper / step))
    floor = x * FLOOR
    lo, hi = (x, None) if probe(x) else (None, x)
    while lo is None or hi is None:
        if len(probes) >= MAX_PROBES:  # the bracket did not close: the last load that met the SLO, if any
            return (lo or 0.0), probes
        if hi is None:  # going up from lo
            nxt = max(snap(lo * step), lo + 1) if integer else lo * step
            if upper is not None and nxt * (1 + tolerance) > upper:  # no probe within a tolerance of the bound
                hi = upper
            elif probe(nxt):
                lo = nxt
            else:
                hi = nxt
        else:  # going down from hi
            nxt = min(snap(hi / step), hi - 1) if integer else hi / step
            if nxt < (1 if integer else floor):
                return 0.0, probes
            if probe(nxt):
                lo = nxt
            else:
                hi = nxt
        step = GROWTH
    while hi / lo > 1 + tolerance and not (integer and hi - lo <= 1):
        mid = snap(math.sqrt(lo * hi))
        if mid <= lo or mid >= hi:
            break
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


class SharedPredictor:
    """A Predictor shared by the candidates on one GPU in one process, carrying the memo its pricers keep of
    whole kernel calls (sim/pricing.py StepPricer._priced): candidates that differ in engine knobs or layout
    price many identical kernel tables."""

    def __init__(self, predictor: Predictor):
        self.inner = predictor
        self.call_memo: dict = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)


_PREDICTORS: dict = {}  # (GPU key, tier, bundle, band) -> SharedPredictor, in this process


def shared_predictor(hw: Hardware, tier: str, bundle, band: str | None) -> SharedPredictor:
    key = (hw.key, hw.net_gbs_per_gpu, tier, str(bundle), band)
    if key not in _PREDICTORS:
        if len(_PREDICTORS) >= 4:  # candidates arrive grouped by GPU: keep the memo of the last few
            _PREDICTORS.pop(next(iter(_PREDICTORS)))
        _PREDICTORS[key] = SharedPredictor(Predictor(hw, tier=tier, bundle=bundle, band=band))
    return _PREDICTORS[key]


def _setup(settings: PlanSettings, cand: Candidate, band: str | None = None, energy=None) -> Setup:
    model = settings.model if cand.kv_cache_dtype == settings.model.kv_dtype else replace(
        settings.model, kv_dtype=cand.kv_cache_dtype)
    parallel = cand.parallel()
    hw = settings.hardware[cand.gpu].on_network(parallel.net_gbs_per_gpu)
    setup = build_setup(model, hw, engine_for(settings.engine, cand), parallel, settings.workload,
                        max_model_len=settings.max_model_len, energy=energy,
                        predictor=shared_predictor(hw, settings.tier, settings.bundle, band))
    needed = request_blocks(setup.max_model_len, setup.scheduler.block_size, setup.sliding)
    if needed > setup.num_blocks:
        raise KernelsightError(f"the KV cache holds {setup.num_blocks} blocks, fewer than max_model_len="
                               f"{setup.max_model_len} needs ({needed}; vLLM refuses to start; lower max_model_len)")
    return setup


def _bounds(setup: Setup, settings: PlanSettings, cand: Candidate) -> tuple[float, float, float]:
    """(upper bound of the load, where the search starts, its first step): an open loop and a trace are
    bounded by the rate served when their requests arrive at once (a trace as a multiple of its own rate),
    a closed loop by num_requests clients (more would never be in flight)."""
    load, n = settings.load, settings.num_requests
    if load.kind == "max_concurrency":
        return n + 1.0, float(min(load.target, cand.max_num_seqs, n)), GROWTH
    at_once = 1e12 if load.kind == "trace_scale" else math.inf
    summary = run(replace(setup, workload=Workload(load.workload(settings.workload, at_once))),
                  min(n, CAPACITY_REQUESTS), settings.seed, breakdown=False).summary
    capacity = float(summary["request_throughput"])
    upper = capacity if load.kind == "request_rate" else capacity / _trace_rate(setup, settings)
    return upper, (upper / GROWTH if load.kind == "request_rate" else min(1.0, upper / GROWTH)), GROWTH


def _trace_rate(setup: Setup, settings: PlanSettings) -> float:
    """Requests/s of a trace's first num_requests rows as given."""
    last = 0.0
    for req in setup.workload.requests(settings.num_requests, settings.seed):
        last = req.arrival_time
    return settings.num_requests / last if last > 0 else math.inf


def _measure(setup: Setup, settings: PlanSettings, load: float, breakdown: bool = False) -> dict:
    workload = settings.load.workload(settings.workload, load)
    probe = replace(setup, workload=Workload(workload))
    return run(probe, settings.num_requests, settings.seed, slo_ms=settings.slo.limits, breakdown=breakdown).summary


def _tier(setup: Setup) -> str:
    predictor = setup.pricer.predictor
    if predictor.tier != "auto" or predictor.bundle is None:
        return predictor.tier if predictor.bundle is not None else "roofline"
    return "target" if setup.hw.key in predictor.bundle.target_devices("gemm") else "cross"


def evaluate(settings: PlanSettings, cand: Candidate, hint: float | None = None) -> tuple[dict, list[dict]]:
    """(result row, probe rows) of one candidate; a candidate that cannot run is a row with its reason.
    hint: the highest load of a similar candidate (same GPU and layout): the search starts there and
    usually needs two probes."""
    start = time.perf_counter()
    row = {"key": cand.key, **asdict(cand), "gpus_per_replica": cand.gpus_per_replica,
           "usd_per_gpu_hour": settings.prices.get(cand.gpu, math.nan)}
    for status, check in (("refused", lambda: shard(settings.model, cand.parallel())),
                          ("does not fit", lambda: _setup(settings, cand))):
        try:
            setup = check()
        except KernelsightError as e:
            return {**row, "status": status, "reason": str(e), "wall_s": time.perf_counter() - start}, []
    row.update(tier=_tier(setup), kv_blocks=setup.num_blocks)
    load = settings.load
    upper, first, step = _bounds(setup, settings, cand)
    if upper is not None and load.kind != "max_concurrency":
        row["capacity_req_s"] = upper * (1.0 if load.kind == "request_rate" else _trace_rate(setup, settings))
    if hint:
        first, step = min(hint, upper / (1 + settings.tolerance)), 1 + 0.999 * settings.tolerance
    best, probes = search_load(lambda x: _measure(setup, settings, x), settings.slo, first, settings.tolerance,
                               upper, load.integer, step)
    probe_rows = [{"key": cand.key, "load": p.load, "slo_met": p.met, **_latencies(p.summary, settings),
                   "output_tok_s_per_gpu": _output_rate(p.summary, load, p.load) / cand.gpus_per_replica}
                  for p in probes]
    row.update(probes=len(probes), max_load=best)
    if best <= 0:
        return {**row, "status": "slo not met", "reason": f"no load down to the search floor meets {settings.slo.describe()}",
                "wall_s": time.perf_counter() - start}, probe_rows
    at_best = next(p.summary for p in probes if p.load == best)
    replicas = max(1, math.ceil(load.target / best - 1e-9))
    operating = _measure(setup, settings, load.target / replicas if not load.integer
                         else math.ceil(load.target / replicas), breakdown=True)
    gpus = replicas * cand.gpus_per_replica
    served = _output_rate(operating, load, load.target / replicas) * replicas  # output tokens/s at the target
    usd_hour = gpus * row["usd_per_gpu_hour"]
    row.update(status="ok", reason="", replicas=replicas, gpus=gpus,
               req_s_per_gpu=_request_rate(at_best, load, best) / cand.gpus_per_replica,
               output_tok_s_per_gpu=_output_rate(at_best, load, best) / cand.gpus_per_replica,
               usd_per_hour=usd_hour, usd_per_mtok=usd_hour / (served * 3600) * 1e6 if served > 0 else math.nan,
               j_per_output_token=operating.get("energy_per_output_token_j", math.nan),
               mean_power_w_per_gpu=operating.get("mean_power_w_per_gpu", math.nan),
               peak_power_w_per_gpu=operating.get("peak_power_w_per_gpu", math.nan),
               **_latencies(operating, settings), wall_s=time.perf_counter() - start)
    return row, probe_rows


def evaluate_many(settings: PlanSettings, cands: list[Candidate]) -> list[tuple[dict, list[dict]]]:
    """evaluate() of candidates in turn, in one process: those on one GPU share its memoised predictor, and
    each search starts from the answer of the one before (batches() groups them by GPU and layout)."""
    out, hint = [], None
    for c in cands:
        out.append(evaluate(settings, c, hint))
        hint = out[-1][0].get("max_load") or hint
    return out


def batches(cands: list[Candidate], size: int = 8) -> list[list[Candidate]]:
    """Candidates in groups of at most `size` that share a GPU and a layout (and so most kernel tables)."""
    groups: dict = {}
    for c in cands:
        groups.setdefault((c.gpu, c.tp, c.pp, c.ep, c.attention_dp), []).append(c)
    return [g[i:i + size] for g in groups.values() for i in range(0, len(g), size)]


def _latencies(summary: Mapping, settings: PlanSettings) -> dict:
    col = settings.slo.column
    return {"ttft_ms": float(summary[col("ttft_ms")]), "tpot_ms": float(summary[col("tpot_ms")]),
            "e2el_ms": float(summary[col("e2el_ms")]), "median_tpot_ms": float(summary["median_tpot_ms"])}


def _request_rate(summary: Mapping, load: Load, x: float) -> float:
    """Requests/s served at load x: the offered rate of an open loop (a finite run's own throughput counts
    its drain), the measured throughput otherwise."""
    return x if load.kind == "request_rate" else float(summary["request_throughput"])


def _output_rate(summary: Mapping, load: Load, x: float) -> float:
    if load.kind != "request_rate":
        return float(summary["output_throughput"])
    completed = summary.get("completed") or 0
    return x * summary["total_output_tokens"] / completed if completed else 0.0


def interval(settings: PlanSettings, cand: Candidate, replicas: int) -> dict:
    """The operating point's SLO latencies and output throughput per GPU with every kernel at the p10 and
    the p90 end of its 80 % interval: {'ttft_ms': (low, high), ...}."""
    load = settings.load
    x = load.target / replicas if not load.integer else math.ceil(load.target / replicas)
    ends = [_measure(_setup(settings, cand, band=band, energy=False), settings, x) for band in ("p10", "p90")]
    out = {}
    for metric in ("ttft_ms", "tpot_ms"):
        values = sorted(float(e[settings.slo.column(metric)]) for e in ends)
        out[metric] = tuple(values)
    return out


def rank(rows: list[dict], objective: str = "cost") -> list[dict]:
    """Feasible rows best first: cost = $ per million output tokens at the target load (unpriced GPUs after
    priced ones), then fewer GPUs; gpus = fewest GPUs, then cost; ties go to the higher sustainable load per
    GPU (headroom); throughput = output tokens/s per GPU at the highest load meeting the SLOs."""
    if objective not in OBJECTIVES:
        raise KernelsightError(f"objective={objective!r}: expected one of {', '.join(OBJECTIVES)}")
    ok = [r for r in rows if r.get("status") == "ok"]

    def cost(r):
        return r["usd_per_mtok"] if math.isfinite(r["usd_per_mtok"]) else math.inf

    keys = {"cost": lambda r: (cost(r), r["gpus"], -r["req_s_per_gpu"], r["tpot_ms"], r["key"]),
            "gpus": lambda r: (r["gpus"], cost(r), -r["req_s_per_gpu"], r["tpot_ms"], r["key"]),
            "throughput": lambda r: (-r["output_tok_s_per_gpu"], cost(r), r["key"])}
    return sorted(ok, key=keys[objective])


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (latency, throughput) no other point beats on both: lower latency and higher
    throughput, in order of latency."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front
