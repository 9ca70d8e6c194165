"""Engine profiles: what a serving engine schedules, fuses, graphs and spends on the host.

conf/engine/<name>.yaml (Hydra group `engine=`) documents the meaning and unit
of every key; this module is its typed schema. Sections:
  scheduler   token budget, sequence cap, KV page size, memory fraction, prefix
              caching, chunked prefill (read by the scheduler and memory.py)
  kernels     which ops run fused (read by graph.py)
  attention   how a step's attention runs: paged kernels (vLLM) or one flat masked SDPA (transformers)
  cuda_graph  which steps replay a captured graph, at which padded sizes
  host        CPU time per step and whether it overlaps GPU work (pricing.py)
  frontend    time from a client's send to the scheduler, counted in TTFT (engine.py)
  allreduce   which all-reduce implementation runs a TP all-reduce of a given size (pricing.py)
  memory      the non-KV memory terms of vLLM's profile run (memory.py)
  serving_error  the simulator's own error on real runs of this engine, which widens simulated ranges
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families.moe import DISTRIBUTIONS

from .schema import Spec, check, load_config

GRAPH_MODES = ("full_and_piecewise", "full_decode_only", "piecewise")
ATTENTION_LAYOUTS = ("paged", "flat_masked")


def vllm_batch_defaults(hw) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) `vllm serve` picks for a GPU when neither is given
    (EngineArgs.get_batch_defaults, OPENAI_API_SERVER): 8192 and 1024 on GPUs of at least 70 GiB that are
    not A100s (H100, H200, B200, MI300X), 2048 and 256 on the others (A100, L40S, L4, A10: vLLM PR #17885)."""
    if hw.mem_gb >= 70 and "a100" not in f"{hw.key} {hw.name}".lower():
        return 8192, 1024
    return 2048, 256


@dataclass(frozen=True)
class SchedulerSettings:
    """The scheduler: section; max_num_batched_tokens / max_num_seqs None ('auto' in YAML) until
    EngineProfile.on_gpu gives them vLLM's defaults for the GPU."""

    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    block_size: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int
    hybrid_kv_cache: bool = True


@dataclass(frozen=True)
class KernelSettings:
    fused_add_rms_norm: bool
    silu_and_mul: bool
    rope_in_place: bool
    qkv_fused: bool
    gate_up_fused: bool
    moe_routing: str = "power_law_1.01"


@dataclass(frozen=True)
class AttentionSettings:
    """'paged': a varlen prefill kernel over the chunks and a paged decode kernel over the decodes, reading
    the KV cache in place (vLLM). 'flat_masked': per layer, every scheduled request's whole KV history is
    gathered out of the cache and its heads repeated to the query heads, then ONE non-causal SDPA runs all
    the step's query tokens against all gathered keys under a block-diagonal mask (transformers'
    paged|sdpa), so its cost grows with (query tokens) x (KV tokens of the whole batch).

    flat_slowdown: how much longer that SDPA takes than the FlashAttention-class prefill kernel the predictor
    prices: the mask rules the flash backends out, so torch runs its memory-efficient kernel."""

    layout: str
    flat_slowdown: float = 1.0


@dataclass(frozen=True)
class CudaGraphSettings:
    enabled: bool
    mode: str
    capture_sizes: tuple

    @property
    def max_size(self) -> int:
        return self.capture_sizes[-1] if self.enabled else 0

    def padded(self, tokens: int) -> int:
        """The capture size a batch of `tokens` is padded up to (tokens itself when none is large enough)."""
        i = bisect.bisect_left(self.capture_sizes, tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else tokens


@dataclass(frozen=True)
class HostSettings:
    async_scheduling: bool
    step_overhead_us: float
    per_request_us: float
    sampler_us: float
    kernel_launch_us: float
    graph_launch_us: float


def delay_label(delay: tuple) -> str:
    """'<latency>+<jitter> ms' of a (latency_ms, jitter_ms) frontend delay."""
    return f"{delay[0]:g}+{delay[1]:g} ms"


@dataclass(frozen=True)
class FrontendSettings:
    """Client <-> scheduler path of a served engine (sim/engine.py): a sent request reaches the
    scheduler latency_ms plus an exponential jitter of mean jitter_ms later, counted in TTFT. An engine
    with async scheduling uses async_latency_ms and async_jitter_ms instead (None: the same values): the two
    loops form steps at different moments, so the delay that reproduces measured TTFT differs."""

    latency_ms: float
    jitter_ms: float
    async_latency_ms: float | None = None
    async_jitter_ms: float | None = None

    def delay_ms(self, async_scheduling: bool) -> tuple[float, float]:
        """(latency, mean jitter) in ms for an engine that schedules asynchronously or not."""
        if not async_scheduling:
            return self.latency_ms, self.jitter_ms
        return (self.latency_ms if self.async_latency_ms is None else self.async_latency_ms,
                self.jitter_ms if self.async_jitter_ms is None else self.async_jitter_ms)


@dataclass(frozen=True)
class AllReduceSettings:
    """vLLM's all-reduce flavour by message size: with `measured`, vLLM's own all-reduce as timed on the
    GPU or its die sibling (sim/vllm_allreduce.py) where those rows cover the message; otherwise its
    custom kernel below custom_max_mib[world size] on NVLink, NCCL (the predictor's allreduce model)
    above; the custom kernel's latency is custom_alpha_us + bus bytes / (custom_bus_efficiency x NVLink
    bandwidth)."""

    measured: bool
    custom: bool
    custom_max_mib: dict
    custom_alpha_us: float
    custom_bus_efficiency: float
    fuse_rms_norm_max_mib: dict

    def custom_max_bytes(self, world_size: int) -> float:
        """Largest message (bytes, exclusive) the custom kernel takes at this world size; 0 = never."""
        if not self.custom:
            return 0.0
        return self.custom_max_mib.get(f"tp{int(world_size)}", 0.0) * 2.0**20

    def fused_norm_max_bytes(self, world_size: int) -> float:
        """Largest message (bytes, inclusive) whose all-reduce also does the residual add and RMSNorm
        after it (one FlashInfer kernel); 0 = never."""
        return self.fuse_rms_norm_max_mib.get(f"tp{int(world_size)}", 0.0) * 2.0**20


@dataclass(frozen=True)
class MemorySettings:
    total_reserved_fraction: float
    non_torch_gib: float
    collective_buffers_gib: float
    cuda_graph_gib: float


SERVING_METRICS = ("ttft", "tpot", "throughput")


@dataclass(frozen=True)
class ServingError:
    """The simulator's own error on real serving runs of this engine, per measured metric: (p10, p90) of
    log(measured / simulated) over validation rows, with the model as the unit (`kernelsight validate`
    reports them and their held-out coverage); None: not measured. A kernel's interval leaves this error
    out (host terms, frontend, scheduling), so a simulated figure's 80 % range is the wider of its kernels'
    range and [figure x exp(p10), figure x exp(p90)]."""

    ttft: tuple | None = None
    tpot: tuple | None = None
    throughput: tuple | None = None

    @staticmethod
    def metric_of(key: str) -> str | None:
        """The measured metric that stands for a summary key: TTFT, TPOT for TPOT, ITL and end-to-end latency
        (decode time), throughput for the throughputs; None for anything else."""
        if "ttft" in key:
            return "ttft"
        if any(part in key for part in ("tpot", "itl", "e2el")):
            return "tpot"
        return "throughput" if "throughput" in key else None

    def widen(self, key: str, center: float, low: float, high: float) -> tuple[float, float]:
        """(low, high) of a figure's kernel range widened to cover its serving error."""
        metric = self.metric_of(key)
        q = getattr(self, metric) if metric is not None else None
        if q is None:
            return low, high
        return min(low, center * math.exp(q[0])), max(high, center * math.exp(q[1]))


@dataclass(frozen=True)
class EngineProfile:
    name: str
    engine: str
    scheduler: SchedulerSettings
    kernels: KernelSettings
    attention: AttentionSettings
    cuda_graph: CudaGraphSettings
    host: HostSettings
    frontend: FrontendSettings
    allreduce: AllReduceSettings
    memory: MemorySettings
    # how far the simulation is from real runs, not how it runs: left out of repr and equality (the keys
    # of cached simulations)
    serving_error: ServingError = field(default=ServingError(), repr=False, compare=False)
    source: str = ""

    def on_gpu(self, hw) -> "EngineProfile":
        """This profile with the batch limits left 'auto' set as vLLM sets them on `hw` (vllm_batch_defaults);
        a limit given keeps its value. The same profile when both are given."""
        s = self.scheduler
        if s.max_num_batched_tokens is not None and s.max_num_seqs is not None:
            return self
        tokens, seqs = vllm_batch_defaults(hw)
        tokens = s.max_num_batched_tokens or tokens
        seqs = s.max_num_seqs or seqs
        if tokens < seqs:
            raise KernelsightError(f"{self.source or self.name}: scheduler.max_num_batched_tokens = {tokens} (vLLM's "
                                   f"default on {hw.key}) must be >= scheduler.max_num_seqs = {seqs}; set both")
        return replace(self, scheduler=replace(s, max_num_batched_tokens=tokens, max_num_seqs=seqs))

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<mapping>") -> "EngineProfile":
        v = check(data, _FIELDS, source)
        graph = v["cuda_graph"]
        sizes = graph["capture_sizes"]
        if list(sizes) != sorted(set(sizes)):
            raise KernelsightError(f"{source}: field 'cuda_graph.capture_sizes' must be strictly increasing")
        sched = v["scheduler"]
        if None not in (sched["max_num_batched_tokens"], sched["max_num_seqs"]) and \
                sched["max_num_batched_tokens"] < sched["max_num_seqs"]:
            raise KernelsightError(f"{source}: field 'scheduler.max_num_batched_tokens' = "
                                   f"{sched['max_num_batched_tokens']} must be >= scheduler.max_num_seqs = "
                                   f"{sched['max_num_seqs']} (vLLM refuses this too)")
        error = {m: q if q is None else (q["p10"], q["p90"]) for m, q in v["serving_error"].items()}
        for m, q in error.items():
            if q is not None and q[0] > q[1]:
                raise KernelsightError(f"{source}: field 'serving_error.{m}': p10 = {q[0]} must be <= p90 = {q[1]}")
        return cls(name=v["name"], engine=v["engine"], scheduler=SchedulerSettings(**sched),
                   kernels=KernelSettings(**v["kernels"]), attention=AttentionSettings(**v["attention"]),
                   cuda_graph=CudaGraphSettings(**graph),
                   host=HostSettings(**v["host"]), frontend=FrontendSettings(**v["frontend"]),
                   allreduce=AllReduceSettings(**v["allreduce"]),
                   memory=MemorySettings(**v["memory"]), serving_error=ServingError(**error), source=source)


_FIELDS = {
    "name": Spec("str"),
    "engine": Spec("str"),
    "scheduler": Spec("section", fields={
        "max_num_batched_tokens": Spec("pos_or_auto"),
        "max_num_seqs": Spec("pos_or_auto"),
        "block_size": Spec("pos"),
        "gpu_memory_utilization": Spec("fraction"),
        "enable_prefix_caching": Spec("bool"),
        "enable_chunked_prefill": Spec("bool"),
        "long_prefill_token_threshold": Spec("nonneg"),
        "hybrid_kv_cache": Spec("bool", default=True),
    }),
    "kernels": Spec("section", fields={
        "fused_add_rms_norm": Spec("bool"),
        "silu_and_mul": Spec("bool"),
        "rope_in_place": Spec("bool"),
        "qkv_fused": Spec("bool"),
        "gate_up_fused": Spec("bool"),
        "moe_routing": Spec("choice", choices=DISTRIBUTIONS, default="power_law_1.01"),
    }),
    "attention": Spec("section", fields={
        "layout": Spec("choice", choices=ATTENTION_LAYOUTS),
        "flat_slowdown": Spec("positive", default=1.0),
    }),
    "cuda_graph": Spec("section", fields={
        "enabled": Spec("bool"),
        "mode": Spec("choice", choices=GRAPH_MODES),
        "capture_sizes": Spec("ints"),
    }),
    "host": Spec("section", fields={
        "async_scheduling": Spec("bool"),
        "step_overhead_us": Spec("number"),
        "per_request_us": Spec("number"),
        "sampler_us": Spec("number"),
        "kernel_launch_us": Spec("number"),
        "graph_launch_us": Spec("number"),
    }),
    "frontend": Spec("section", fields={
        "latency_ms": Spec("nonneg"),
        "jitter_ms": Spec("nonneg"),
        "async_latency_ms": Spec("nonneg", default=None, nullable=True),
        "async_jitter_ms": Spec("nonneg", default=None, nullable=True),
    }),
    "allreduce": Spec("section", fields={
        "measured": Spec("bool"),
        "custom": Spec("bool"),
        # vLLM's custom all-reduce supports world sizes 2, 4, 6 and 8 (CustomAllreduce._SUPPORTED_WORLD_SIZES)
        "custom_max_mib": Spec("section", fields={f"tp{n}": Spec("number") for n in (2, 4, 6, 8)}),
        "custom_alpha_us": Spec("number"),
        "custom_bus_efficiency": Spec("fraction"),
        "fuse_rms_norm_max_mib": Spec("section", default={},
                                      fields={f"tp{n}": Spec("number", default=0.0) for n in (2, 4, 6, 8)}),
    }),
    "memory": Spec("section", fields={
        "total_reserved_fraction": Spec("number"),
        "non_torch_gib": Spec("number"),
        "collective_buffers_gib": Spec("number"),
        "cuda_graph_gib": Spec("number"),
    }),
    "serving_error": Spec("section", default={}, fields={
        m: Spec("optional_section", default=None, fields={"p10": Spec("real"), "p90": Spec("real")})
        for m in SERVING_METRICS}),
}


def load_engine(name_or_mapping: str | Path | Mapping) -> EngineProfile:
    """An engine profile by shipped name (conf/engine/<name>.yaml), .yaml path, or composed mapping."""
    return load_config(EngineProfile, "engine", "engine profile", name_or_mapping)
