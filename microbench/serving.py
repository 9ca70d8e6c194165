"""End-to-end serving measurements of a real continuous-batching engine: transformers' continuous batching.

Why: the simulator's scheduler and composition model are validated against vLLM rows whose launch flags
and client settings are unknown (data/validation). A run we make ourselves records everything: the
engine settings, the arrival process, and a timestamp per generated token. transformers 5.x batches
requests continuously over a paged KV cache (paged SDPA or flash attention, chunked prefill, FIFO or
prefill-first scheduling, prefix sharing); its `ContinuousBatchingManager` takes requests while running,
which is what open-loop (Poisson) and closed-loop clients need.

The model is random-initialised from an architecture config shipped in conf/model/hf/ (no download):
the kernels and shapes are the architecture's, the tokens meaningless, so every request generates exactly
`osl` tokens (end-of-sequence disabled). Times come from the engine's own per-token timestamps
(`record_timestamps`, time.perf_counter) against the moment the client handed the request over:
TTFT = first token - send, TPOT = (last - first) / (tokens - 1), as `vllm bench serve` defines them.

The requests are the simulator's own (sim/workload.py, the same seed): `kernelsight bench serve` draws
arrival times, lengths and shared prefixes from `Workload.requests` for ServeWorkload.workload_mapping(),
and every run writes them as a trace (`<workload>_trace.csv`), so
`kernelsight simulate workload=trace workload.trace_file=<that file>` replays exactly what was measured.
Requests are duck-typed here (arrival_time, output_len, segments): this module never imports the simulator.
"""
from __future__ import annotations

import json
import threading
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kernelsight.predictor.errors import KernelsightError, whole_number

ARRIVALS = ("poisson", "closed_loop")
SIZE_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size")  # of an HF config: whole numbers >= 1 where set
DTYPES = ("bf16", "fp16", "fp32")  # of the random-weight model (no fp8: nothing quantizes random weights)


def check_dtype(dtype) -> str:
    """The model dtype of a serving run, checked without importing torch (so a typo fails at once)."""
    if dtype not in DTYPES:
        raise KernelsightError(f"dtype={dtype!r}; choose {', '.join(DTYPES[:-1])} or {DTYPES[-1]}")
    return dtype


@dataclass(frozen=True)
class ServeWorkload:
    """One traffic pattern: Poisson at `rate` req/s, or `concurrency` closed-loop clients; fixed lengths."""

    name: str
    arrival: str
    isl: int
    osl: int
    num_requests: int
    rate: float | None = None
    concurrency: int | None = None
    shared_prefix: int = 0  # leading prompt tokens every request shares (a system prompt: prefix caching)

    @classmethod
    def from_mapping(cls, name: str, data) -> "ServeWorkload":
        where = f"workloads.{name}"
        if not hasattr(data, "get"):
            raise KernelsightError(f"{where}: expected a mapping, got {data!r}")
        unknown = sorted(set(data) - {f for f in cls.__dataclass_fields__ if f != "name"})
        if unknown:
            raise KernelsightError(f"{where}: unknown setting(s) {', '.join(unknown)}")
        arrival = data.get("arrival")
        if arrival not in ARRIVALS:
            raise KernelsightError(f"{where}.arrival: {arrival!r}; choose one of {', '.join(ARRIVALS)}")
        ints = {}
        for key in ("isl", "osl", "num_requests", "shared_prefix", "concurrency"):
            value = data.get(key, 0 if key in ("shared_prefix", "concurrency") else None)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 or \
                    (value == 0 and key in ("isl", "osl", "num_requests")):
                raise KernelsightError(f"{where}.{key}: {value!r}; expected a positive integer")
            ints[key] = value
        rate = data.get("rate")
        if arrival == "poisson" and not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0):
            raise KernelsightError(f"{where}.rate: {rate!r}; a Poisson workload needs a positive rate (requests/s)")
        if arrival == "closed_loop" and ints["concurrency"] < 1:
            raise KernelsightError(f"{where}.concurrency: a closed-loop workload needs at least 1 client")
        if ints["shared_prefix"] >= ints["isl"]:
            raise KernelsightError(f"{where}.shared_prefix: {ints['shared_prefix']} must be below isl ({ints['isl']})")
        return cls(name=name, arrival=arrival, rate=float(rate) if arrival == "poisson" else None,
                   concurrency=ints["concurrency"] if arrival == "closed_loop" else None,
                   isl=ints["isl"], osl=ints["osl"], num_requests=ints["num_requests"],
                   shared_prefix=ints["shared_prefix"])

    def workload_mapping(self) -> dict:
        """The same traffic as a simulator workload (conf/workload schema): Poisson at `rate`, or `concurrency`
        closed-loop clients (request_rate inf + max_concurrency); the shared prefix is one system prompt."""
        closed = self.arrival == "closed_loop"
        return {"name": self.name, "arrival": "poisson", "request_rate": float("inf") if closed else self.rate,
                "max_concurrency": self.concurrency if closed else None,
                "input": {"dist": "fixed", "value": self.isl - self.shared_prefix},
                "output": {"dist": "fixed", "value": self.osl},
                "system_prompts": 1 if self.shared_prefix else 0, "system_prompt_len": self.shared_prefix}


def model_config(hf_config: str | Path, overrides: dict) -> tuple[str, dict]:
    """(model_type, fields) of the architecture in an HF config.json plus overrides, checked without torch or
    transformers (a readable file, a model_type, sizes that are whole numbers >= 1), so a bad file fails at
    once."""
    path = Path(hf_config)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise KernelsightError(f"{path}: not a readable config.json ({e})") from None
    if not isinstance(raw, dict):
        raise KernelsightError(f"{path}: not a config.json (expected an object of settings)")
    raw.pop("quantization_config", None)  # random weights: quantized checkpoints' layout does not apply
    model_type = raw.pop("model_type", None)
    if not model_type:
        raise KernelsightError(f"{path}: no model_type")
    overrides = dict(overrides or {})
    merged = {**raw, **overrides}
    for key in SIZE_FIELDS:
        if merged.get(key) is not None:
            whole_number(merged[key], f"model_overrides.{key}" if key in overrides else f"{path}: {key}")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids beyond an overridden vocabulary
        ids = merged.get(key)
        if ids is not None and any(i >= merged.get("vocab_size", np.inf) for i in np.atleast_1d(ids)):
            merged[key] = None
    return model_type, merged


def build_model(hf_config: str | Path, overrides: dict, dtype: str, device: str, attn_implementation: str,
                seed: int):
    """A random-initialised causal LM of the architecture in an HF config.json (plus overrides), in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, merged = model_config(hf_config, overrides)
    config = AutoConfig.for_model(model_type, **merged)
    from .providers.base import TORCH_DTYPES

    torch_dtype = TORCH_DTYPES[check_dtype(dtype)]
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype, attn_implementation=attn_implementation)
    return model.eval()


def prompt_tokens(request, vocab: int, seed: int) -> list[int]:
    """Token ids of a simulated request's prompt: each content segment (a shared system prompt, a request's
    own text) is random tokens seeded by its content id, so equal segments are equal tokens."""
    out: list[int] = []
    for (kind, content), length in request.segments:
        out += np.random.default_rng([seed, kind, content]).integers(1, vocab, size=length).tolist()
    return out


class _Client:
    """Sends a workload's requests to a running manager and collects one row per finished request."""

    def __init__(self, manager, workload: ServeWorkload, requests: list, vocab: int, seed: int, timeout_s: float):
        self.manager, self.w, self.timeout_s = manager, workload, timeout_s
        self.requests = requests
        self.prompts = [prompt_tokens(r, vocab, seed) for r in requests]
        self.sent: dict[str, tuple[int, float]] = {}
        self.lock = threading.Lock()
        self.t0 = 0.0

    def send(self, i: int) -> None:
        rid = f"{self.w.name}-{i}"
        with self.lock:
            self.sent[rid] = (i, time.perf_counter())
        if self.manager.add_request(self.prompts[i], request_id=rid, max_new_tokens=self.requests[i].output_len,
                                    record_timestamps=True, eos_token_id=-1) is None:
            raise KernelsightError(f"workload {self.w.name}: the engine refused request {i} (stopped or full)")

    def _poisson_sender(self, failure: list) -> None:
        try:
            for i, request in enumerate(self.requests):
                delay = self.t0 + request.arrival_time - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                self.send(i)
        except BaseException as e:  # reported by run() on the main thread
            failure.append(e)

    def run(self) -> list[dict]:
        w, n = self.w, self.w.num_requests
        failure: list = []
        self.t0 = time.perf_counter()
        sender = None
        if w.arrival == "poisson":
            sender = threading.Thread(target=self._poisson_sender, args=(failure,), daemon=True)
            sender.start()
            next_i = n
        else:
            for i in range(min(w.concurrency, n)):
                self.send(i)
            next_i = min(w.concurrency, n)
        rows, last_progress = [], time.perf_counter()
        while len(rows) < n:
            if failure:
                raise failure[0]
            result = self.manager.get_result(timeout=0.5)
            if result is None:
                if time.perf_counter() - last_progress > self.timeout_s:
                    raise KernelsightError(f"workload {w.name}: no request finished for {self.timeout_s:.0f} s "
                                           f"({len(rows)} of {n} done); the engine stalled or is far too slow")
                continue
            if not result.is_finished():
                continue
            last_progress = time.perf_counter()
            rows.append(self._row(result))
            if next_i < n:  # closed loop: the client whose request finished sends its next one
                self.send(next_i)
                next_i += 1
        if sender is not None:
            sender.join()
        return rows

    def _row(self, result) -> dict:
        with self.lock:
            i, sent = self.sent[result.request_id]
        stamps = result.timestamps or []
        if result.error or len(stamps) != len(result.generated_tokens) or not stamps:
            raise KernelsightError(f"workload {self.w.name}: request {i} failed "
                                   f"({result.error or 'no per-token timestamps'})")
        n_out = len(stamps)
        return {"workload": self.w.name, "request": i, "arrival_s": self.requests[i].arrival_time,
                "send_s": sent - self.t0,
                "first_token_s": stamps[0] - self.t0, "finish_s": stamps[-1] - self.t0,
                "ttft_ms": (stamps[0] - sent) * 1e3,
                "tpot_ms": (stamps[-1] - stamps[0]) / (n_out - 1) * 1e3 if n_out > 1 else float("nan"),
                "e2e_ms": (stamps[-1] - sent) * 1e3, "prompt_len": len(self.prompts[i]), "output_len": n_out}


def run_workload(manager, workload: ServeWorkload, requests: list, vocab: int, seed: int,
                 timeout_s: float = 600.0) -> list[dict]:
    """Drive one workload's requests (ServeWorkload.requests) through a started ContinuousBatchingManager;
    one row per request, in finish order."""
    return _Client(manager, workload, requests, vocab, seed, timeout_s).run()


def summarize(rows: list[dict], workloads: list[ServeWorkload], energy: dict | None = None) -> list[dict]:
    """Per workload: the settings, request count, TTFT/TPOT means and medians, output tokens per second,
    and where `energy` (workload name -> PowerMeter reading) has it, the GPU's joules, joules per output
    token and power."""
    import pandas as pd

    df = pd.DataFrame(rows)
    out = []
    for w in workloads:
        part = df[df["workload"] == w.name]
        if part.empty:
            continue
        span = part["finish_s"].max() - part["send_s"].min()
        out.append({**asdict(w), "requests": len(part),
                    "ttft_ms": part["ttft_ms"].mean(), "ttft_median_ms": part["ttft_ms"].median(),
                    "tpot_ms": part["tpot_ms"].mean(), "tpot_median_ms": part["tpot_ms"].median(),
                    "output_tokens_per_s": part["output_len"].sum() / span if span > 0 else float("nan")})
        reading = (energy or {}).get(w.name)
        if reading:
            out[-1].update({"energy_j": reading["energy_j"],
                            "energy_per_output_token_j": reading["energy_j"] / part["output_len"].sum(),
                            "mean_power_w": reading["mean_power_w"], "peak_power_w": reading["peak_power_w"],
                            "idle_power_w": reading.get("idle_power_w")})
    return out


def read_measured(run_dir: Path) -> dict:
    """workloads.json of a run: per measured workload its settings, seed, engine settings and start time."""
    path = run_dir / "workloads.json"
    if not path.is_file():
        return {}
    try:
        measured = json.loads(path.read_text(encoding="utf-8"))
        for name, m in measured.items():
            ServeWorkload.from_mapping(name, m["workload"])
        return measured
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, KernelsightError) as e:
        raise KernelsightError(f"{path}: not a workloads record of bench serve ({e})") from None


def workload_seed(seed: int, name: str) -> int:
    """A workload's own seed (its requests do not change when other workloads are added or skipped)."""
    return seed * 1_000_003 + zlib.crc32(name.encode())
