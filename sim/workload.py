"""Serving workloads: arrivals, request lengths and shared prefixes, as a seeded request stream.

A workload config (conf/workload/*.yaml) is checked into a typed
`WorkloadConfig`; `Workload.requests(num_requests, seed)` then yields
`Request`s in arrival order, lazily, in chunks, so a million-request run never
holds the whole stream.

- Arrivals: `poisson`, or `gamma` with shape `burstiness` and mean 1/rate
  (vllm bench serve's --burstiness; 1.0 is Poisson), at `request_rate`
  requests/s (`.inf`: all at t = 0); `trace`: times and lengths replayed from
  a CSV/JSONL file. `max_concurrency` makes it closed loop (vllm bench serve
  --max-concurrency): with request_rate .inf, N clients each send their next
  request as soon as their previous one finishes. `ramp_up_s` starts those N
  clients evenly over that many seconds (client k at k * ramp_up_s / N) instead
  of all at t = 0: clients out of phase, as in a loop that has run for a while.
- Lengths (`input`, `output`): fixed, uniform (inclusive), lognormal (by its
  mean in tokens and sigma of log-length), or empirical rows of a trace in
  data/traces/ (input and output drawn from the *same* row when both name the
  same trace). Lengths are clipped to [min, max].
- Shared prefixes: `system_prompts` distinct system prompts of
  `system_prompt_len` tokens, one picked uniformly per conversation; `turns` > 1
  makes multi-turn chats whose turn k prompt is the whole previous conversation
  (system prompt, every earlier user message and answer) plus a new user
  message; turn k + 1 is sent think_time_s (exponential mean) after turn k
  finished. `request_rate` is then the rate of new conversations and
  num_requests counts turns.

Independent random streams (arrivals, input, output, prompt choice, think
times) are spawned from the seed, so sweeping request_rate keeps the same
lengths and prompts: only the arrival times change.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np

from kernelsight.predictor.errors import KernelsightError, check_seed, did_you_mean, whole_number
from kernelsight.predictor.paths import data_dir
from kernelsight.sim.request import OUTPUT, SHARED_PREFIX, TRACE_HASH, UNIQUE, Request

if TYPE_CHECKING:  # pandas is imported where a trace is read: a synthetic workload needs none
    import pandas as pd

ARRIVALS = ("poisson", "gamma", "trace")
DISTS = ("fixed", "uniform", "lognormal", "empirical")
CHUNK = 4096

# Column spellings accepted in trace files (vidur/splitwise processed traces use the right-hand names).
TRACE_ALIASES = {
    "arrival_time": ("arrival_time", "arrived_at", "timestamp"),
    "input_len": ("input_len", "num_prefill_tokens", "input_length", "prompt_len"),
    "output_len": ("output_len", "num_decode_tokens", "output_length"),
}


def traces_dir() -> Path:
    return data_dir() / "traces"


def resolve_trace(name: str) -> Path:
    """A trace path, or a trace name in data/traces/ (file stem, or a unique stem prefix)."""
    path = Path(str(name)).expanduser()
    if path.suffix in (".csv", ".jsonl", ".json") and path.is_file():
        return path
    if path.suffix in (".csv", ".jsonl", ".json"):
        raise KernelsightError(f"trace file {path} does not exist")
    folder = traces_dir()
    found = sorted(p for p in folder.glob("*") if p.suffix in (".csv", ".jsonl"))
    exact = [p for p in found if p.stem == name]
    prefixed = [p for p in found if p.stem.startswith(str(name))]
    if exact:
        return exact[0]
    if len(prefixed) == 1:
        return prefixed[0]
    stems = [p.stem for p in found]
    if len(prefixed) > 1:
        raise KernelsightError(f"trace {name!r} is ambiguous in {folder}: {', '.join(p.stem for p in prefixed)}")
    raise KernelsightError(f"trace {name!r}: no such file in {folder}{did_you_mean(name, stems)}; "
                           f"available: {', '.join(stems) or 'none'}")


_TYPES = {"int": ((int,), "an integer"), "float": ((int, float), "a number"), "str": ((str,), "a string")}


def _check_fields(cls, raw: Mapping, where: str) -> dict:
    """Reject unknown keys and values of the wrong type (bool is not a number), one line each."""
    known = {f.name: str(f.type) for f in fields(cls)}
    for key, value in raw.items():
        if key not in known:
            raise KernelsightError(f"{where}.{key}: unknown field{did_you_mean(key, known)}; "
                                   f"known: {', '.join(known)}")
        kind = known[key].split(" | ")[0]
        if kind in _TYPES and value is not None and (
                isinstance(value, bool) or not isinstance(value, _TYPES[kind][0])):
            hint = " (infinity is inf on the command line, .inf in YAML)" if kind == "float" else ""
            raise KernelsightError(f"{where}.{key}={value!r}: must be {_TYPES[kind][1]}{hint}")
    return dict(raw)


@dataclass(frozen=True)
class LengthSpec:
    """One length distribution in tokens."""

    dist: str = "fixed"
    value: int | None = None      # fixed
    low: int | None = None        # uniform (inclusive)
    high: int | None = None
    mean: float | None = None     # lognormal: mean in tokens
    sigma: float | None = None    # lognormal: standard deviation of log(length)
    trace: str | None = None      # empirical: trace name in data/traces/ or a path
    min: int = 1
    max: int | None = None

    @classmethod
    def from_config(cls, raw, where: str) -> "LengthSpec":
        if raw is None:
            raise KernelsightError(f"{where}: missing length distribution (dist: fixed|uniform|lognormal|empirical)")
        spec = cls(**_check_fields(cls, raw, where))
        spec.validate(where)
        return spec

    def validate(self, where: str) -> None:
        if self.dist not in DISTS:
            raise KernelsightError(f"{where}.dist={self.dist!r}: unknown distribution{did_you_mean(self.dist, DISTS)}; "
                                   f"choose one of {', '.join(DISTS)}")
        need = {"fixed": ("value",), "uniform": ("low", "high"), "lognormal": ("mean", "sigma"),
                "empirical": ("trace",)}[self.dist]
        for name in need:
            if getattr(self, name) is None:
                raise KernelsightError(f"{where}: dist {self.dist} needs {name}")
        if self.dist == "fixed" and self.value < 1:
            raise KernelsightError(f"{where}.value={self.value}: a length must be >= 1")
        if self.dist == "uniform" and not 1 <= self.low <= self.high:
            raise KernelsightError(f"{where}: uniform needs 1 <= low <= high (got low={self.low}, high={self.high})")
        if self.dist == "lognormal" and (self.mean <= 0 or self.sigma < 0):
            raise KernelsightError(f"{where}: lognormal needs mean > 0 and sigma >= 0 "
                                   f"(got mean={self.mean}, sigma={self.sigma})")
        if self.min < 1 or (self.max is not None and self.max < self.min):
            raise KernelsightError(f"{where}: needs 1 <= min <= max (got min={self.min}, max={self.max})")


@dataclass(frozen=True)
class WorkloadConfig:
    """Typed conf/workload/*.yaml."""

    name: str = "workload"
    arrival: str = "poisson"
    request_rate: float = 1.0
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ramp_up_s: float = 0.0
    input: LengthSpec | None = field(default_factory=lambda: LengthSpec(value=1024))
    output: LengthSpec | None = field(default_factory=lambda: LengthSpec(value=128))
    system_prompts: int = 0
    system_prompt_len: int = 0
    turns: int = 1
    think_time_s: float = 0.0
    trace_file: str | None = None
    time_scale: float = 1.0
    hash_block_size: int = 512

    @classmethod
    def from_config(cls, raw: Mapping) -> "WorkloadConfig":
        """From the composed `workload:` section; every problem is one KernelsightError line."""
        raw = _check_fields(cls, raw, "workload")
        replay = raw.get("arrival") == "trace"
        for key in ("input", "output"):
            if key in raw and not (replay and raw[key] is None):
                raw[key] = LengthSpec.from_config(raw[key], f"workload.{key}")
        try:
            cfg = cls(**raw)
        except TypeError as e:
            raise KernelsightError(f"workload: {e}") from None
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.arrival not in ARRIVALS:
            raise KernelsightError(f"workload.arrival={self.arrival!r}: unknown arrival process"
                                   f"{did_you_mean(self.arrival, ARRIVALS)}; choose one of {', '.join(ARRIVALS)}")
        if self.arrival != "trace" and not self.request_rate > 0:
            raise KernelsightError(f"workload.request_rate={self.request_rate}: must be > 0 (.inf sends all at once)")
        if not self.burstiness > 0:
            raise KernelsightError(f"workload.burstiness={self.burstiness}: the gamma shape must be > 0")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise KernelsightError(f"workload.max_concurrency={self.max_concurrency}: must be >= 1 (null: open loop)")
        if self.turns < 1:
            raise KernelsightError(f"workload.turns={self.turns}: must be >= 1")
        if not self.ramp_up_s >= 0 or (self.ramp_up_s > 0 and not (self.max_concurrency and
                                                                   math.isinf(self.request_rate))):
            raise KernelsightError(f"workload.ramp_up_s={self.ramp_up_s}: must be >= 0, and > 0 only for a closed "
                                   f"loop (max_concurrency set, request_rate .inf)")
        if self.system_prompts < 0 or self.system_prompt_len < 0 or \
                (self.system_prompts > 0) != (self.system_prompt_len > 0):
            raise KernelsightError("workload: system_prompts and system_prompt_len must both be > 0 "
                                   f"(or both 0); got {self.system_prompts} and {self.system_prompt_len}")
        if self.think_time_s < 0 or self.time_scale <= 0 or self.hash_block_size < 1:
            raise KernelsightError("workload: think_time_s >= 0, time_scale > 0 and hash_block_size >= 1 required")
        if self.arrival == "trace":
            if not self.trace_file:
                raise KernelsightError("workload.arrival=trace needs workload.trace_file (a CSV/JSONL path or "
                                       "a trace name in data/traces/)")
            if self.turns > 1 or self.system_prompts:
                raise KernelsightError("workload: trace replay takes prefixes from the trace (prefix_group, "
                                       "hash_ids); turns and system_prompts must stay at 1 and 0")


# ----- length sampling -----

class _Lengths:
    """Draws lengths for one LengthSpec; empirical specs share row draws through `rows`."""

    def __init__(self, spec: LengthSpec, column: str, rng: np.random.Generator):
        self.spec = spec
        self.rng = rng
        self.values = None
        if spec.dist == "empirical":
            self.values = load_trace(resolve_trace(spec.trace), need_arrivals=False)[column].to_numpy()

    def draw(self, n: int, rows: np.ndarray | None = None) -> np.ndarray:
        s = self.spec
        if s.dist == "fixed":
            out = np.full(n, s.value, dtype=np.int64)
        elif s.dist == "uniform":
            out = self.rng.integers(s.low, s.high + 1, size=n)
        elif s.dist == "lognormal":
            mu = math.log(s.mean) - s.sigma ** 2 / 2     # so that E[length] = mean
            out = np.rint(self.rng.lognormal(mu, s.sigma, size=n)).astype(np.int64)
        else:
            if rows is None:
                rows = self.rng.integers(0, len(self.values), size=n)
            out = self.values[rows].astype(np.int64)
        return np.clip(out, s.min, s.max if s.max is not None else None)


# ----- trace files -----

def _parse_hash_ids(value, where: str) -> tuple:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ()
    if isinstance(value, str):
        text = value.strip().strip("[]")
        parts = [p for p in text.replace(",", " ").replace(";", " ").split() if p]
    else:
        parts = list(value)
    try:
        return tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise KernelsightError(f"{where}: hash_ids must be a list of integers, got {value!r}") from None


def _show(value) -> str:
    """A cell value as the user wrote it: numbers plainly, anything else quoted."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return f"{value:g}"
    return repr(value if not isinstance(value, np.generic) else value.item())


def trace_rows(requests: list) -> list[dict]:
    """Requests as rows of a trace that load_trace reads back (a shared system prompt: prefix group 0)."""
    rows = []
    for r in requests:
        shared = [length for (kind, _), length in r.segments if kind == SHARED_PREFIX]
        rows.append({"arrival_time": r.arrival_time, "input_len": r.prompt_len, "output_len": r.output_len,
                     "prefix_group": 0 if shared else None, "prefix_len": shared[0] if shared else 0})
    return rows


def load_trace(path: Path, need_arrivals: bool = True) -> pd.DataFrame:
    """Read and validate a request trace; any bad row is reported as 'file: row N: problem'.

    Rows are numbered as lines of the file (CSV header = line 1). Columns:
    arrival_time (s, non-decreasing), input_len, output_len (>= 1), and
    optionally prefix_group with prefix_len, or hash_ids (one id per
    hash_block_size tokens, as in Mooncake traces).
    """
    import pandas as pd

    path = Path(path)
    if path.suffix == ".csv":
        try:
            df = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise KernelsightError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
        first_line = 2
    elif path.suffix in (".jsonl", ".json"):
        records = []
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise KernelsightError(f"{path}: row {lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(records[-1], dict):
                    raise KernelsightError(f"{path}: row {lineno}: expected a JSON object")
        df = pd.DataFrame.from_records(records)
        first_line = 1
    else:
        raise KernelsightError(f"{path}: unknown trace format (use .csv or .jsonl)")
    rename = {}
    for canon, spellings in TRACE_ALIASES.items():
        present = [c for c in spellings if c in df.columns]
        if present:
            rename[present[0]] = canon
    df = df.rename(columns=rename)
    required = ("arrival_time", "input_len", "output_len") if need_arrivals else ("input_len", "output_len")
    for col in required:
        if col not in df.columns:
            raise KernelsightError(f"{path}: missing column {col!r} (has: {', '.join(map(str, df.columns))})")
    if df.empty:
        raise KernelsightError(f"{path}: no rows")
    line = np.arange(len(df)) + first_line

    def bad(mask, message):
        i = int(np.argmax(mask))
        raise KernelsightError(f"{path}: row {line[i]}: {message(i)}")

    for col in [c for c in ("arrival_time", "input_len", "output_len") if c in df.columns]:
        values = pd.to_numeric(df[col], errors="coerce")
        missing = values.isna().to_numpy()
        if missing.any():
            bad(missing, lambda i: f"{col} = {_show(df[col].iloc[i])} is not a number")
        df[col] = values
    for col in ("input_len", "output_len"):
        v = df[col].to_numpy()
        if (v < 0).any():
            bad(v < 0, lambda i: f"{col} = {v[i]:g} is negative")
        if (v < 1).any():
            bad(v < 1, lambda i: f"{col} = {v[i]:g}: a request needs at least 1 token")
        if (v != np.floor(v)).any():
            bad(v != np.floor(v), lambda i: f"{col} = {v[i]:g} is not a whole number of tokens")
        df[col] = v.astype(np.int64)
    if "arrival_time" in df.columns:
        t = df["arrival_time"].to_numpy(dtype=float)
        if not np.isfinite(t).all() or (t < 0).any():
            bad(~np.isfinite(t) | (t < 0), lambda i: f"arrival_time = {t[i]} must be a finite time >= 0")
        back = np.r_[False, np.diff(t) < 0]
        if back.any():
            bad(back, lambda i: f"arrival_time = {t[i]:g} is earlier than the previous row's {t[i - 1]:g} "
                                f"(times must not decrease)")
    if "prefix_group" in df.columns:
        if "prefix_len" not in df.columns:
            raise KernelsightError(f"{path}: column prefix_group needs a prefix_len column (shared tokens)")
        grouped = df["prefix_group"].notna().to_numpy()
        plen = pd.to_numeric(df["prefix_len"], errors="coerce").to_numpy()
        wrong = grouped & ~((plen >= 0) & (plen <= df["input_len"].to_numpy()) & (plen == np.floor(plen)))
        if wrong.any():
            bad(wrong, lambda i: f"prefix_len = {_show(df['prefix_len'].iloc[i])} must be a whole number between 0 "
                                 f"and input_len = {df['input_len'].iloc[i]}")
        df["prefix_len"] = plen
    if "hash_ids" in df.columns:
        df["hash_ids"] = [_parse_hash_ids(v, f"{path}: row {line[i]}") for i, v in enumerate(df["hash_ids"])]
    return df.reset_index(drop=True)


# ----- the request stream -----

class Workload:
    """A seeded request stream built from a WorkloadConfig."""

    def __init__(self, config: WorkloadConfig):
        self.config = config
        if config.arrival == "trace":
            self.trace = load_trace(resolve_trace(config.trace_file))
        else:
            self.trace = None
            # Fail early on a missing empirical trace, before any simulation starts.
            for spec in (config.input, config.output):
                if spec is None:
                    raise KernelsightError("workload: input and output length distributions are required "
                                           "unless arrival is trace")
                if spec.dist == "empirical":
                    resolve_trace(spec.trace)

    @property
    def max_concurrency(self) -> int | None:
        return self.config.max_concurrency

    def count(self, num_requests: int | None) -> int | None:
        """How many requests requests(num_requests, ...) yields, follow-up turns included (a progress total)."""
        if self.trace is not None:
            return min(num_requests, len(self.trace)) if num_requests else len(self.trace)
        return num_requests

    def requests(self, num_requests: int | None, seed: int) -> Iterator[Request]:
        """Requests in arrival order (follow-up turns are attached to their previous turn).

        seed: an integer >= 0, checked here (before the lazy stream starts) whether or not the
        workload draws from it (a trace replay does not), so a bad seed fails the same either way."""
        check_seed(seed)
        if self.trace is not None:
            if num_requests is not None:
                whole_number(num_requests, "num_requests", hint="null: every row of the trace")
            return self._replay(num_requests)
        return self._synthetic(whole_number(num_requests, "num_requests",
                                            hint="null replays a whole trace; this workload draws requests"), seed)

    def _replay(self, num_requests: int | None) -> Iterator[Request]:
        import pandas as pd

        df = self.trace if not num_requests else self.trace.iloc[:num_requests]
        scale = self.config.time_scale
        t0 = float(df["arrival_time"].iloc[0])
        groups = df["prefix_group"].to_numpy() if "prefix_group" in df.columns else None
        hash_ids = df["hash_ids"].to_numpy() if "hash_ids" in df.columns else None
        hbs = self.config.hash_block_size
        group_ids: dict = {}
        for i, (t, n_in, n_out) in enumerate(zip(df["arrival_time"].to_numpy(), df["input_len"].to_numpy(),
                                                 df["output_len"].to_numpy())):
            n_in, n_out = int(n_in), int(n_out)
            segments = ()
            if hash_ids is not None and hash_ids[i]:
                segments = _hash_segments(hash_ids[i], hbs, n_in, i)
            elif groups is not None and not pd.isna(groups[i]):
                p = int(df["prefix_len"].iat[i])
                gid = group_ids.setdefault(groups[i], len(group_ids))
                segments = tuple(s for s in (((SHARED_PREFIX, gid), p), ((UNIQUE, i), n_in - p)) if s[1] > 0)
            yield Request(i, (float(t) - t0) * scale, n_in, n_out, segments)

    def _synthetic(self, num_requests: int, seed: int) -> Iterator[Request]:
        cfg = self.config
        streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)]
        arrival_rng, input_rng, output_rng, prompt_rng, think_rng = streams
        in_len = _Lengths(cfg.input, "input_len", input_rng)
        out_len = _Lengths(cfg.output, "output_len", output_rng)
        joint = (cfg.input.dist == cfg.output.dist == "empirical" and cfg.input.trace == cfg.output.trace)
        rate = cfg.request_rate
        shape = cfg.burstiness
        t = 0.0
        next_id = 0
        made = 0
        first = True
        ramp = cfg.ramp_up_s / cfg.max_concurrency if cfg.ramp_up_s > 0 else 0.0
        started = 0     # conversations sent so far (ramp-up: the first max_concurrency are staggered)
        while made < num_requests:
            n_conv = min(CHUNK, -(-(num_requests - made) // cfg.turns))
            if math.isinf(rate):
                gaps = np.zeros(n_conv)
            elif cfg.arrival == "poisson":
                gaps = arrival_rng.exponential(1.0 / rate, size=n_conv)
            else:   # gamma with mean 1 / rate, as vllm bench serve
                gaps = arrival_rng.gamma(shape, 1.0 / (rate * shape), size=n_conv)
            n_turns = n_conv * cfg.turns
            rows = input_rng.integers(0, len(in_len.values), size=n_turns) if joint else None
            inputs = in_len.draw(n_turns, rows)
            outputs = out_len.draw(n_turns, rows)
            prompts = prompt_rng.integers(0, cfg.system_prompts, size=n_conv) if cfg.system_prompts else None
            thinks = (think_rng.exponential(cfg.think_time_s, size=n_turns) if cfg.think_time_s > 0
                      else np.zeros(n_turns))
            for c in range(n_conv):
                if made >= num_requests:
                    return
                if not first:
                    t += float(gaps[c])
                first = False
                if ramp:
                    t = ramp * started if started < cfg.max_concurrency else 0.0
                started += 1
                history: tuple = ()
                if prompts is not None:
                    history = (((SHARED_PREFIX, int(prompts[c])), cfg.system_prompt_len),)
                turns = min(cfg.turns, num_requests - made)
                chain = []
                for k in range(turns):
                    j = c * cfg.turns + k
                    rid = next_id
                    next_id += 1
                    n_in, n_out = int(inputs[j]), int(outputs[j])
                    segments = history + (((UNIQUE, rid), n_in),)
                    prompt_len = sum(length for _, length in segments)
                    chain.append((Request(rid, t, prompt_len, n_out, segments), float(thinks[j])))
                    history = segments + (((OUTPUT, rid), n_out),)
                for (req, _), (nxt, think) in zip(chain, chain[1:]):
                    req.followup = (think, nxt)
                made += turns
                yield chain[0][0]


def _hash_segments(ids: tuple, block: int, prompt_len: int, row: int) -> tuple:
    """Segments of a prompt described by trace hash ids (one per `block` tokens)."""
    segments, pos = [], 0
    for h in ids:
        if pos >= prompt_len:
            break
        length = min(block, prompt_len - pos)
        segments.append(((TRACE_HASH, h), length))
        pos += length
    if pos < prompt_len:
        segments.append(((UNIQUE, row), prompt_len - pos))
    return tuple(segments)
