"""Step prices: GPU time of a step's kernels from the predictor, plus launch and host overheads.

StepPricer(model, hw, engine, parallel, predictor).step_time(batch) must be cheap: the
simulator prices ~20k steps for 10k requests within a few seconds. So the price of a step is
assembled from memoised components, each built with ONE vectorised predictor call per family
from the same graph code that lists a step's kernels (graph.py):
  - token-wise kernels (GEMMs, norms, RoPE, KV write, activation, MoE, collectives): a table over
    every token count 1..max(max_num_batched_tokens, largest CUDA-graph size), exact, priced in blocks
    of TOKEN_BLOCK counts as steps first need them;
  - LM head, logits gather and sampling: a table over the sampled rows 1..max_num_seqs, exact, priced in
    blocks of SAMPLED_BLOCK counts the same way;
  - decode attention of n decodes at mean KV length L: per n, a table over a geometric L grid (16 points
    per octave), interpolated linearly in L, priced an octave at a time for DECODE_GROUP batch sizes at once
    as steps first need it;
  - prefill attention of a chunk (new tokens after a cached prefix): a table over new-token
    counts (the edges and quarters of every 128-query tile, where wave quantisation jumps) x
    prefixes (0 and 8 points per octave), interpolated bilinearly, priced in blocks on first use;
  - flat masked attention (engine attention.layout flat_masked, transformers): per query-token count
    (built on first use), a table over the batch's KV tokens (16 points per octave), interpolated linearly.
Error of the interpolation: below 0.5% of step time (tests/test_graph.py checks random mixed,
prefill-only and decode-only steps of dense, MoE and sliding-window models against pricing every
kernel exactly; `step_time(batch, exact=True)` does that).

All-reduces take the engine profile's flavour (vLLM's measured all-reduce where rows of the GPU or
its die sibling cover the message, sim/vllm_allreduce.py; else its custom kernel below a size limit
per world size and NCCL above it; see engine_profile.AllReduceSettings).

Overheads come from the engine profile: decode-only batches up to the largest capture size
replay one full CUDA graph and run at the padded size; other batches up to that size replay
piecewise graphs (attention and KV write launched eagerly between them); larger batches and
`cuda_graph.enabled: false` launch every kernel. The LM head and sampler always run eagerly.
The GPU then needs max(kernel time, CPU launch time). Host time (scheduling, per-request work,
sampler launches) adds to it, or hides behind it under async scheduling: total = max(gpu, host).
With pp > 1, gpu_s is the time for the batch to pass all stages.

Energy (with a power model, `power`: predictor.energy.KernelPower): every table holds joules beside
seconds, each kernel row priced as power(its roofline shares at its predicted time) x that time, so
breakdown() and decode_run() give joules per family on one GPU at the cost of a second table lookup;
launch waiting is the idle GPU's power times the wait.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import get_family
from kernelsight.predictor.families.attention import Q_TILE
from kernelsight.predictor.predict import column_key

from .batch import StepBatch
from .engine_profile import EngineProfile
from .graph import (GATHERED_FAMILIES, KernelCall, chunk_rows, decode_call, decode_mean_kv, flat_attention_kernels,
                    flat_kv_tokens, gathered_rank_tokens, prefill_call, sampled_kernels, step_kernels, token_kernels)
from .model import AttentionKind, ModelConfig
from .parallel import ParallelConfig, shard
from .vllm_allreduce import MeasuredAllReduce, measured_allreduce

DECODE_POINTS_PER_OCTAVE = 16
PREFIX_POINTS_PER_OCTAVE = 8
FLAT_KV_LIMIT = 1 << 24  # flat masked attention: KV tokens of a whole batch tabulated up to this (exact beyond)
US = 1e-6
TOKEN_BLOCK = 256  # token counts of the token-wise table priced per predictor call
SAMPLED_BLOCK = 64  # sampled-row counts of the LM head and sampler table priced per predictor call
DECODE_BLOCK = 16  # KV-grid points (one octave) of a decode-attention table priced per predictor call
DECODE_GROUP = 8  # consecutive batch sizes whose decode-attention tables are priced together, a block each
PREFILL_BLOCK = 16  # new-token rows of a prefill-attention table priced per predictor call...
PREFIX_BLOCK = 8  # ...times these prefixes (one octave)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one engine step: GPU (kernels or launch-bound), host, and the step as observed."""

    gpu_s: float
    host_s: float
    total_s: float


@dataclass(frozen=True)
class DecodeRun:
    """Prices of consecutive decode-only steps of the same sequences (StepPricer.decode_run), per step.

    The breakdown parts: `families` (family, seconds) is every step's token-wise, LM-head and sampler
    kernels; `attention_s` its decode attention; `launch_s` its GPU time waiting on launches;
    `decode_phase_s` its GPU time, all of it decode phase. With a power model, `energy_families`,
    `attention_j` and `launch_j` are the same parts in joules on one GPU; `attention_family` names the
    decode attention's family.
    """

    gpu_s: np.ndarray
    host_s: float
    families: tuple = ()                 # the breakdown parts: only when asked for
    attention_s: np.ndarray | None = None
    launch_s: np.ndarray | None = None
    decode_phase_s: np.ndarray | None = None
    attention_family: str = "attn_decode"
    energy_families: tuple = ()          # (family, joules): only with a power model and the breakdown
    attention_j: np.ndarray | None = None
    launch_j: np.ndarray | None = None


class _DecodeTable:
    """Seconds and joules of one decode-attention launch on the KV grid, as lists (one step's lookups) and as
    one (2, points) array, seconds then joules (a decode run's: both looked up at once), NaN where not priced
    yet; `priced` flags its blocks of DECODE_BLOCK points."""

    __slots__ = ("seconds", "joules", "both", "priced")

    def __init__(self, points: int):
        self.seconds, self.joules = [math.nan] * points, [math.nan] * points
        self.both = np.full((2, points), math.nan)
        self.priced = [False] * -(-points // DECODE_BLOCK)

    def fill(self, start: int, seconds: np.ndarray, joules: np.ndarray) -> None:
        """Points start.. take these prices."""
        stop = start + len(seconds)
        self.both[0, start:stop], self.both[1, start:stop] = seconds, joules
        self.seconds[start:stop], self.joules[start:stop] = seconds.tolist(), joules.tolist()


@dataclass(frozen=True)
class PricedKernel:
    """A kernel call of a step with its predicted time per launch (summed over its rows)."""

    call: KernelCall
    seconds: float

    @property
    def total_s(self) -> float:
        return self.seconds * self.call.count


class StepPricer:
    """Prices StepBatches of one model on one GPU under one engine profile and parallel layout.

    power: None, or a predictor.energy.KernelPower on this GPU: breakdown() then also gives joules."""

    def __init__(self, model: ModelConfig, hw, engine: EngineProfile, parallel: ParallelConfig, predictor,
                 power=None, context_limit: int | None = None):
        engine = engine.on_gpu(hw)
        self.model, self.hw, self.engine, self.parallel, self.predictor = model, hw, engine, parallel, predictor
        self.power = power
        self.shard = shard(model, parallel)
        self.kinds = model.attention_kinds()
        self.measured_allreduce = _measured_allreduce(engine, hw, parallel, getattr(predictor, "tier", "auto"))
        graph = engine.cuda_graph
        self.max_tokens = max(engine.scheduler.max_num_batched_tokens, graph.max_size)
        token_calls = token_kernels(model, parallel, engine, np.arange(1, self.max_tokens + 1), self.shard)
        sampled_calls = sampled_kernels(model, parallel, np.arange(1, engine.scheduler.max_num_seqs + 1), self.shard)
        self.families = list(dict.fromkeys(c.family for c in token_calls + sampled_calls))
        self._gathered_rows = [(name, i) for i, name in enumerate(self.families)
                               if name in GATHERED_FAMILIES and any(c.family == name for c in token_calls)]
        # Token-wise table: priced in blocks of TOKEN_BLOCK token counts as steps first need them (a run
        # touches few sizes; every row is priced on its own, so a block equals that part of the whole table).
        self._tok = np.zeros((len(self.families), self.max_tokens + 1))
        self._tok_j = np.zeros((len(self.families), self.max_tokens + 1))  # joules, beside _tok
        self._tok_total: list = [0.0, *[None] * self.max_tokens]  # None: its block is not priced yet
        # LM head and sampler table: priced in blocks of SAMPLED_BLOCK row counts in the same way
        self._smp = np.zeros((len(self.families), engine.scheduler.max_num_seqs + 1))
        self._smp_j = np.zeros_like(self._smp)
        self._smp_total: list = [0.0, *[None] * engine.scheduler.max_num_seqs]
        self._tok_rows: dict[int, tuple] = {}  # per size: breakdown rows of the tables, built on use
        self._smp_rows: dict[int, tuple] = {}
        self._fixed: dict[tuple, dict] = {}    # (tokens, sampled rows) -> seconds per family, built on use
        self._tok_j_rows: dict[int, tuple] = {}  # the same three in joules
        self._smp_j_rows: dict[int, tuple] = {}
        self._fixed_j: dict[tuple, dict] = {}
        self._decode_steps_j: dict[int, tuple] = {}  # decodes -> (family, joules) of their fixed kernels
        self._decode_steps: dict[int, tuple] = {}  # decodes -> what their decode-only steps share, built on use
        self._smp_launches = len(sampled_kernels(model, parallel, 1, self.shard))
        self._tok_launches = sum(c.count for c in token_kernels(model, parallel, engine, 1, self.shard))
        # KV-length grids of the attention tables: to twice the model's context, or with context_limit (no
        # sequence longer: max_model_len) only its points up to the first one past it (tables cost a predictor
        # row per point; a KV length off the grid is priced exactly)
        self._kv_grid = _grid_past(2 * model.max_position, DECODE_POINTS_PER_OCTAVE, context_limit)
        self._kv_grid_array = np.asarray(self._kv_grid)
        self._decode = [dict() for _ in self.kinds]  # per kind: n -> _DecodeTable on _kv_grid (one launch)
        self._new_grid = _tile_grid(self.max_tokens, Q_TILE)
        self._prefix_grid = [0, *_grid_past(2 * model.max_position, PREFIX_POINTS_PER_OCTAVE, context_limit)]
        # per kind: new x prefix table (one launch), NaN until priced in blocks of PREFILL_BLOCK x PREFIX_BLOCK on use
        self._prefill = [[[math.nan] * len(self._prefix_grid) for _ in self._new_grid] for _ in self.kinds]
        self._prefill_j = [[[math.nan] * len(self._prefix_grid) for _ in self._new_grid] for _ in self.kinds]
        self._prefill_priced: list[set] = [set() for _ in self.kinds]  # (row block, prefix block)
        self.flat = engine.attention.layout == "flat_masked"
        self._flat_grid = _geometric_grid(FLAT_KV_LIMIT, DECODE_POINTS_PER_OCTAVE)
        self._flat: dict[int, tuple] = {}  # query tokens -> KV grid and step seconds, built on use
        self._flat_j: dict[int, tuple] = {}  # the same in joules
        self._flat_launches = sum(c.count for c in flat_attention_kernels(model, self.shard, 1, 1)) if self.flat else 0
        # families that price prefill and decode attention (MLA's modules, or FlashAttention and paged decode)
        self.attention_families = ("attn_prefill", "attn_decode") if self.flat else (
            self._prefill_call(0, [1], [0]).family, self._decode_call(0, 1, 1).family)

    # -- public API ---------------------------------------------------------------------
    def step_time(self, batch: StepBatch, exact: bool = False) -> StepTime:
        """Time of one step; exact=True prices every kernel with the predictor instead of the tables."""
        if not batch.forward_tokens:
            return StepTime(0.0, 0.0, 0.0)
        mode, run_tokens = self._graph_mode(batch)
        if exact:
            kernel_s = sum(k.total_s for k in self.kernels(batch))
        else:
            try:  # the tables end at the scheduler's limits; checked here, off the step loop's path
                kernel_s = self._token_s(run_tokens) + self._sampled_s(batch.num_sampled)
                if batch.moe_tokens:
                    kernel_s += sum(delta for _, delta in self._gathered(batch, run_tokens))
            except IndexError:
                sched = self.engine.scheduler
                raise KernelsightError(f"a step of {batch.num_tokens} tokens and {batch.num_sampled} sampled "
                                       f"sequences exceeds the engine's limits (scheduler.max_num_batched_tokens="
                                       f"{sched.max_num_batched_tokens}, max_num_seqs={sched.max_num_seqs})") from None
            prefill_s, decode_s, _, _ = self._attention(batch)
            kernel_s += prefill_s + decode_s
        return StepTime(*self._finish(batch, mode, kernel_s))

    def prime(self) -> None:
        """Price a one-token prefill step and a one-sequence decode step: every model a step's kernels use is
        loaded and the smallest blocks of every table priced, as the first steps of any run would (the same
        values, earlier), so that processes forked afterwards share them."""
        for batch in (StepBatch((1,), (0,), (), 1), StepBatch(decode_ctx=(1,))):
            self.breakdown(batch)

    def breakdown(self, batch: StepBatch) -> dict:
        """Seconds per kernel family (plus 'launch' when launch bound) and per phase, and the StepTime parts.

        Phase split: attention belongs to its phase; token-wise kernels are shared in proportion to
        the prefill and decode tokens (graph padding counts as decode), LM head and sampling in
        proportion to the sampled rows; launch waiting follows the kernel time split.
        """
        out = {"family": {}, "phase": {"prefill": 0.0, "decode": 0.0}}
        if not batch.forward_tokens:
            return {**out, "gpu_s": 0.0, "host_s": 0.0, "total_s": 0.0}
        mode, run_tokens = self._graph_mode(batch)
        sampled = batch.num_sampled
        prefill_share = batch.num_prefill_tokens / run_tokens
        sampled_share = batch.prefill_sampled / sampled if sampled else 0.0
        family, phase = out["family"], out["phase"]
        tok, smp = self._token_s(run_tokens), self._sampled_s(sampled)
        family.update(self._fixed_families(run_tokens, sampled))
        gathered_j = ()
        if batch.moe_tokens:
            for name, delta in self._gathered(batch, run_tokens):
                family[name] = family.get(name, 0.0) + delta
                tok += delta
            if self.power is not None:
                gathered_j = self._gathered(batch, run_tokens, joules=True)
        phase["prefill"] += tok * prefill_share + smp * sampled_share
        phase["decode"] += tok * (1 - prefill_share) + smp * (1 - sampled_share)
        prefill_s, decode_s, prefill_j, decode_j = self._attention(batch, joules=self.power is not None)
        for name, part, seconds in zip(self.attention_families, ("prefill", "decode"), (prefill_s, decode_s)):
            if seconds:
                family[name] = family.get(name, 0.0) + seconds
                phase[part] += seconds
        kernel_s = sum(family.values())
        gpu_s, host_s, total_s = self._finish(batch, mode, kernel_s)
        launch = gpu_s - kernel_s
        if launch > 0:
            family["launch"] = launch
            for key in phase:
                phase[key] += launch * phase[key] / kernel_s
        if self.power is not None:
            out["energy"] = self._energy(run_tokens, sampled, launch, (prefill_s, decode_s), (prefill_j, decode_j),
                                         gathered_j)
        out["gpu_s"], out["host_s"], out["total_s"] = gpu_s, host_s, total_s
        return out

    def _energy(self, run_tokens: int, sampled: int, launch_s: float, attention_s: tuple,
                attention_j: tuple, gathered_j: tuple = ()) -> dict:
        """Joules per family of a step's kernels on one GPU (breakdown()'s families; attention_s and
        attention_j: its (prefill, decode) attention seconds and joules; gathered_j: _gathered's joules),
        launch waiting at the idle GPU's power."""
        energy = dict(self._fixed_families(run_tokens, sampled, joules=True))
        for name, delta in gathered_j:
            energy[name] = energy.get(name, 0.0) + delta
        for name, seconds, joules in zip(self.attention_families, attention_s, attention_j):
            if seconds:
                energy[name] = energy.get(name, 0.0) + joules
        if launch_s > 0:
            energy["launch"] = launch_s * self.power.idle_w
        return energy

    def kernels(self, batch: StepBatch) -> list[PricedKernel]:
        """Every kernel of the step at the size it runs (graph padding applied), priced exactly."""
        calls = self._step_calls(batch)
        return [PricedKernel(c, float(s.sum())) for c, s in zip(calls, self._price(calls))]

    def _step_calls(self, batch: StepBatch) -> list[KernelCall]:
        """The step's kernel calls at the sizes they run (graph padding applied); none for an empty step."""
        if not batch.forward_tokens:
            return []
        return step_kernels(self.model, batch, self.parallel, self.engine, padded_tokens=self._graph_mode(batch)[1])

    def decode_run(self, decode_ctx: np.ndarray, steps: int, breakdown: bool = False) -> DecodeRun | None:
        """Prices of `steps` decode-only steps of the same sequences, step j decoding each at decode_ctx + j:
        per step what step_time (breakdown=False) or breakdown() (True) gives its batch, to the last bit,
        from the same tables in one vectorised pass (the simulator's fast-forward). None when a step's KV
        length lies beyond the tables (those steps are priced exactly, one by one)."""
        n = len(decode_ctx)
        floor_s, host_s, families, families_s, tables_s = self._decode_fixed(n)
        step = np.arange(steps)
        priced_j = breakdown and self.power is not None  # attention joules too: at the lookups of the seconds
        attention_j = None
        if self.flat:  # one flat attention per step; its KV tokens grow by one per sequence and step
            kv = int(decode_ctx.sum()) + n * step
            if kv[-1] >= self._flat_grid[-1]:
                return None
            grid, values = self._flat_table(n)[2:]
            i, w = _bracket_array(grid, kv)
            attention = _lerp_at(values, i, w)
            if priced_j:
                attention_j = _lerp_at(self._flat_joules(n)[3], i, w)
        else:
            attention = None
            for k, kind in enumerate(self.kinds):
                mean = _decode_mean_kv_run(decode_ctx, kind, step)
                if mean[-1] > self._kv_grid[-1]:
                    return None
                i, w = _bracket_array(self._kv_grid_array, mean)
                # the mean KV length grows step by step, but within chunks it starts again at each chunk's start
                low, high = (int(i.min()), int(i.max())) if kind.chunk else (int(i[0]), int(i[-1]))
                table = self._decode_table(k, n, low, high + 1).both
                if not priced_j:
                    table = table[0]
                lo = table.take(i, axis=-1)   # seconds (and joules) at both ends of each step's grid interval
                both = lo + (table.take(i + 1, axis=-1) - lo) * w
                if kind.count != 1:
                    both *= kind.count
                seconds = both[0] if priced_j else both
                # as step_time and breakdown() add the kinds up from 0.0 (0.0 + x is x)
                attention = seconds if attention is None else attention + seconds
                if priced_j:
                    attention_j = both[1] if attention_j is None else attention_j + both[1]
        # breakdown() sums its family dict; step_time the two table totals, then the attention
        kernel = (families_s if breakdown else tables_s) + attention
        gpu = np.maximum(kernel, floor_s)
        if not breakdown:
            return DecodeRun(gpu, host_s)
        launch = gpu - kernel   # 0 where the kernels take longer than the launches
        phase = tables_s + attention  # breakdown's decode phase: the whole step, launch waiting included
        bound = launch > 0
        if np.count_nonzero(bound):
            phase[bound] += launch[bound] * phase[bound] / kernel[bound]
        if self.power is None:
            return DecodeRun(gpu, host_s, families, attention, launch, phase, self.attention_families[1])
        return DecodeRun(gpu, host_s, families, attention, launch, phase, self.attention_families[1],
                         self._decode_energy(n), attention_j, launch * self.power.idle_w)

    def _decode_energy(self, n: int) -> tuple:
        """(family, joules) of the kernels every decode-only step of n sequences runs but attention; memoised."""
        rows = self._decode_steps_j.get(n)
        if rows is None:
            batch = StepBatch(decode_ctx=(1,) * n)
            rows = self._decode_steps_j[n] = tuple(
                self._fixed_families(self._graph_mode(batch)[1], n, joules=True).items())
        return rows

    def _decode_fixed(self, n: int) -> tuple:
        """What every decode-only step of n sequences shares, whatever their KV lengths: (launch-bound GPU
        seconds, host seconds, breakdown's (family, seconds) rows without attention and their sum, step_time's
        table total); memoised per n."""
        fixed = self._decode_steps.get(n)
        if fixed is None:
            batch = StepBatch(decode_ctx=(1,) * n)
            mode, run_tokens = self._graph_mode(batch)
            floor_s, host_s, _ = self._finish(batch, mode, 0.0)
            families = tuple(self._fixed_families(run_tokens, n).items())
            fixed = self._decode_steps[n] = (floor_s, host_s, families, sum(s for _, s in families),
                                             self._token_s(run_tokens) + self._sampled_s(n))
        return fixed

    # -- assembly -------------------------------------------------------------------------
    def _token_s(self, tokens: int) -> float:
        """Seconds of the token-wise kernels of a step that runs `tokens` tokens (its table block priced
        on first use)."""
        total = self._tok_total[tokens]
        if total is None:
            total = self._price_block(tokens, TOKEN_BLOCK, self._tok, self._tok_j, self._tok_total, lambda sizes:
                                      token_kernels(self.model, self.parallel, self.engine, sizes, self.shard))
        return total

    def _sampled_s(self, sampled: int) -> float:
        """Seconds of the LM head, logits gather and sampler kernels of a step sampling `sampled` rows (its
        table block priced on first use)."""
        total = self._smp_total[sampled]
        if total is None:
            total = self._price_block(sampled, SAMPLED_BLOCK, self._smp, self._smp_j, self._smp_total, lambda sizes:
                                      sampled_kernels(self.model, self.parallel, sizes, self.shard))
        return total

    def _price_block(self, size: int, block: int, seconds_table: np.ndarray, joules_table: np.ndarray,
                     totals: list, kernels) -> float:
        """totals[size] after pricing the block of `block` sizes holding it into the family x size tables
        (kernels(sizes): the block's kernel calls); each size is priced on its own, so a block equals that
        part of the whole table."""
        start = (size - 1) // block * block + 1
        stop = min(start + block, len(totals))
        seconds, joules = self._tables(kernels(np.arange(start, stop)))
        seconds_table[:, start:stop] = seconds[:, 1:]
        joules_table[:, start:stop] = joules[:, 1:]
        totals[start:stop] = seconds[:, 1:].sum(axis=0).tolist()
        return totals[size]

    def _fixed_families(self, run_tokens: int, sampled: int, joules: bool = False) -> dict:
        """Seconds (joules=True: joules) per family of the kernels that depend on the token count and sampled
        rows only, in breakdown()'s order (token-wise families, then the LM head's and sampler's added);
        memoised, not to be changed."""
        memo, tok, tok_rows, smp, smp_rows = (
            (self._fixed_j, self._tok_j, self._tok_j_rows, self._smp_j, self._smp_j_rows) if joules else
            (self._fixed, self._tok, self._tok_rows, self._smp, self._smp_rows))
        family = memo.get((run_tokens, sampled))
        if family is None:
            self._token_s(run_tokens)
            self._sampled_s(sampled)
            family = dict(self._row(tok, tok_rows, run_tokens))
            for name, seconds in self._row(smp, smp_rows, sampled):
                family[name] = family.get(name, 0.0) + seconds
            memo[(run_tokens, sampled)] = family
        return family

    def _row(self, table: np.ndarray, cache: dict, size: int) -> tuple:
        """(family, seconds) of the non-zero entries of one table column, memoised per size."""
        row = cache.get(size)
        if row is None:
            row = cache[size] = tuple((name, float(x)) for name, x in zip(self.families, table[:, size]) if x)
        return row

    def _gathered(self, batch: StepBatch, run_tokens: int, joules: bool = False) -> tuple:
        """(family, seconds or joules to add) of the token table's GATHERED_FAMILIES when the step's MoE layers
        take batch.moe_tokens rather than run_tokens x attention_dp (graph.step_kernels' rule)."""
        tokens = gathered_rank_tokens(batch, self.parallel)
        if not tokens or tokens == run_tokens:
            return ()
        self._token_s(tokens)   # its block priced
        table = self._tok_j if joules else self._tok
        return tuple((name, float(table[i, tokens] - table[i, run_tokens])) for name, i in self._gathered_rows)

    def graphed(self, batch: StepBatch) -> bool:
        """Whether the step runs as a CUDA graph (full or piecewise)."""
        return self._graph_mode(batch)[0] != "eager"

    def _graph_mode(self, batch: StepBatch) -> tuple[str, int]:
        """('full' | 'piecewise' | 'eager', token count the graphed kernels run at)."""
        graph = self.engine.cuda_graph
        tokens = batch.forward_tokens
        if not graph.enabled or tokens > graph.max_size:
            return "eager", tokens
        decode_only = not batch.prefill_new
        if decode_only and graph.mode in ("full_and_piecewise", "full_decode_only"):
            return "full", graph.padded(tokens)
        if graph.mode == "full_decode_only":
            return "eager", tokens
        return "piecewise", graph.padded(tokens)

    def _finish(self, batch: StepBatch, mode: str, kernel_s: float) -> tuple[float, float, float]:
        """StepTime's (gpu_s, host_s, total_s) of a step whose kernels take kernel_s."""
        host = self.engine.host
        if self.flat:
            attention_launches = self._flat_launches
        else:
            attention_launches = (bool(batch.prefill_new) + bool(batch.decode_ctx)) * self.model.layers
        eager = self._smp_launches if batch.num_sampled else 0
        if mode == "full":
            cpu = host.graph_launch_us + eager * host.kernel_launch_us
        elif mode == "piecewise":  # a graph piece between attention layers; attention and KV write run eagerly
            pieces = self.model.layers + 1
            cpu = (pieces + self.model.layers + attention_launches + eager) * host.kernel_launch_us
        else:
            cpu = (self._tok_launches + attention_launches + eager) * host.kernel_launch_us
        gpu = max(kernel_s, cpu * US)
        host_s = (host.step_overhead_us + host.per_request_us * batch.num_seqs
                  + (host.sampler_us if batch.num_sampled else 0.0)) * US
        total = max(gpu, host_s) if host.async_scheduling else gpu + host_s
        return gpu, host_s, total

    def _attention(self, batch: StepBatch, joules: bool = False) -> tuple[float, float, float, float]:
        """(prefill, decode) attention seconds of the step, then the same in joules (0 unless joules=True), from
        the interpolated tables (flat masked attention: one step total, shared by the prefill and decode query
        tokens)."""
        if not batch.num_tokens:   # a data-parallel rank's dummy batch: no sequence attends
            return 0.0, 0.0, 0.0, 0.0
        if self.flat:
            total, total_j = self._flat_prices(batch.num_tokens, flat_kv_tokens(batch), joules)
            share = batch.num_prefill_tokens / batch.num_tokens
            return total * share, total * (1 - share), total_j * share, total_j * (1 - share)
        prefill = decode = prefill_j = decode_j = 0.0
        for i, kind in enumerate(self.kinds):
            if batch.prefill_new:
                rows = [self._prefill_prices(i, n, c, joules) for n, c in
                        zip(*chunk_rows(batch.prefill_new, batch.prefill_ctx, kind.chunk))]
                prefill += kind.count * sum(seconds for seconds, _ in rows)
                if joules:
                    prefill_j += kind.count * sum(row_j for _, row_j in rows)
            if batch.decode_ctx:
                seconds, seconds_j = self._decode_prices(i, len(batch.decode_ctx),
                                                         decode_mean_kv(batch.decode_ctx, kind), joules)
                decode += kind.count * seconds
                if joules:
                    decode_j += kind.count * seconds_j
        return prefill, decode, prefill_j, decode_j

    def _decode_prices(self, kind: int, n: int, mean_kv: int, joules: bool) -> tuple[float, float]:
        """(seconds, joules: 0 unless asked for) of the kind's decode attention of n sequences at mean KV length
        mean_kv: linear in the table between its KV-grid points, exact beyond them."""
        grid = self._kv_grid
        if mean_kv > grid[-1]:
            seconds, seconds_j = self._exact(self._decode_call(kind, n, mean_kv))
            return seconds, seconds_j if joules else 0.0
        i, w = _bracket(grid, mean_kv)
        table = self._decode_table(kind, n, i, i + 1)
        seconds = _lerp_at(table.seconds, i, w)
        return seconds, _lerp_at(table.joules, i, w) if joules else 0.0

    def _decode_table(self, kind: int, n: int, first: int, last: int) -> _DecodeTable:
        """Decode attention of n sequences (one launch) on the KV grid, its points first..last priced: their
        blocks of DECODE_BLOCK points are priced on first use, for n's group of batch sizes in one predictor
        call (a run meets few KV lengths, and batch sizes drift by one; every point is priced on its own, so
        a block equals that part of the whole table)."""
        tables = self._decode[kind]
        table = tables.get(n)
        if table is None:
            for size in self._decode_group(n):
                tables.setdefault(size, _DecodeTable(len(self._kv_grid)))
            table = tables[n]
        low, high = first // DECODE_BLOCK, last // DECODE_BLOCK
        priced = table.priced
        if priced[low] and priced[high] and (high - low < 2 or all(priced[low:high])):
            return table
        for block in range(low, high + 1):
            if not priced[block]:
                sizes = [size for size in self._decode_group(n) if not tables[size].priced[block]]
                start = block * DECODE_BLOCK
                kv = self._kv_grid_array[start:start + DECODE_BLOCK]
                for size, prices in zip(sizes, self._price_j([self._decode_call(kind, size, kv) for size in sizes])):
                    tables[size].fill(start, *prices)
                    tables[size].priced[block] = True
        return table

    def _decode_group(self, n: int) -> range:
        """The batch sizes whose decode tables are priced with n's: its group of DECODE_GROUP, to max_num_seqs."""
        start = (n - 1) // DECODE_GROUP * DECODE_GROUP + 1
        return range(start, max(n + 1, min(start + DECODE_GROUP, self.engine.scheduler.max_num_seqs + 1)))

    def _flat_prices(self, q_tokens: int, kv_tokens: int, joules: bool) -> tuple[float, float]:
        """(seconds, joules: 0 unless asked for) of a step's flat masked attention, all layers: per query-token
        count, a table over KV tokens (>= the query tokens: each query's own key is gathered too), interpolated
        linearly."""
        if kv_tokens >= self._flat_grid[-1]:
            seconds, seconds_j = self._flat_totals(q_tokens, np.asarray([kv_tokens]))
            return float(seconds[0]), float(seconds_j[0]) if joules else 0.0
        grid, values = self._flat_table(q_tokens)[:2]
        i, w = _bracket(grid, kv_tokens)
        seconds = _lerp_at(values, i, w)
        return seconds, _lerp_at(self._flat_joules(q_tokens)[1], i, w) if joules else 0.0

    def _flat_table(self, q_tokens: int) -> tuple:
        """(KV-token grid, step seconds) of flat masked attention over q_tokens query tokens as lists, then as
        arrays; built on first use (its joules too)."""
        table = self._flat.get(q_tokens)
        if table is None:
            grid = np.asarray([q_tokens, *(g for g in self._flat_grid if g > q_tokens)])
            values, joules = self._flat_totals(q_tokens, grid)
            table = self._flat[q_tokens] = (grid.tolist(), values.tolist(), grid, values)
            self._flat_j[q_tokens] = (grid.tolist(), joules.tolist(), grid, joules)
        return table

    def _flat_joules(self, q_tokens: int) -> tuple:
        """_flat_table in joules."""
        self._flat_table(q_tokens)
        return self._flat_j[q_tokens]

    def _flat_totals(self, q_tokens: int, kv_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Seconds and joules of a step's flat masked attention kernels (all layers) per entry of kv_tokens."""
        calls = flat_attention_kernels(self.model, self.shard, q_tokens, kv_tokens,
                                       self.engine.attention.flat_slowdown)
        priced = self._price_j(calls)
        return (sum(c.count * s for c, (s, _) in zip(calls, priced)),
                sum(c.count * j for c, (_, j) in zip(calls, priced)))

    def _decode_call(self, kind: int, n: int, seq_kv) -> KernelCall:
        """One launch (count 1) of the kind's decode attention, as the model's graph runs it."""
        call = decode_call(self.model, self.shard, self.engine, n, seq_kv, self.kinds[kind])
        return KernelCall(call.name, call.family, call.cols, 1)

    def _prefill_call(self, kind: int, new, cached) -> KernelCall:
        """One launch (count 1) of the kind's prefill attention over rows (new, cached)."""
        call = prefill_call(self.model, self.shard, new, cached, self.kinds[kind])
        return KernelCall(call.name, call.family, call.cols, 1)

    def _prefill_prices(self, kind: int, new: int, cached: int, joules: bool) -> tuple[float, float]:
        """(seconds, joules: 0 unless asked for) of one prefill row (a chunked kind's rows are already cut at its
        chunks): bilinear in the table between its grid points, exact beyond them."""
        news, prefixes = self._new_grid, self._prefix_grid
        if new > news[-1] or cached > prefixes[-1]:
            seconds, seconds_j = self._exact(self._prefill_call(kind, [new], [cached]))
            return seconds, seconds_j if joules else 0.0
        i, wi = _bracket(news, new)
        j, wj = _bracket(prefixes, cached)
        table = self._prefill[kind]
        seconds = _bilinear(table[i], table[i + 1], j, wj, wi)
        if seconds != seconds:  # NaN: a block around the point is not priced yet
            for r in (i, i + 1):
                for c in (j, j + 1):
                    self._prefill_block(kind, r, c)
            seconds = _bilinear(table[i], table[i + 1], j, wj, wi)
        if not joules:
            return seconds, 0.0
        table = self._prefill_j[kind]
        return seconds, _bilinear(table[i], table[i + 1], j, wj, wi)

    def _prefill_block(self, kind: int, row: int, column: int) -> None:
        """Price the block of PREFILL_BLOCK new-token rows x PREFIX_BLOCK prefixes of the kind's prefill table
        that holds (row, column) (seconds and joules), unless done: a run touches few prompt sizes and
        prefixes, and every point is priced on its own, so a block equals that part of the whole table."""
        block = (row // PREFILL_BLOCK, column // PREFIX_BLOCK)
        if block in self._prefill_priced[kind]:
            return
        news, prefixes = self._new_grid, self._prefix_grid
        start, first = block[0] * PREFILL_BLOCK, block[1] * PREFIX_BLOCK
        rows, columns = news[start:start + PREFILL_BLOCK], prefixes[first:first + PREFIX_BLOCK]
        call = self._prefill_call(kind, np.repeat(rows, len(columns)), np.tile(columns, len(rows)))
        for table, values in zip((self._prefill[kind], self._prefill_j[kind]), self._price_j([call])[0]):
            for r, priced in enumerate(values.reshape(len(rows), len(columns)).tolist(), start):
                table[r][first:first + len(columns)] = priced
        self._prefill_priced[kind].add(block)

    # -- predictor calls ---------------------------------------------------------------------
    def _price(self, calls: list[KernelCall]) -> list[np.ndarray]:
        """Seconds per row of every call (times its scale): one predictor call per family over all their rows."""
        return [p["seconds"] for p in self._priced(calls)]

    def _price_j(self, calls: list[KernelCall]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(seconds, joules) per row of every call (times its scale); joules 0 without a power model."""
        return [(p["seconds"], p["joules"]) for p in self._priced(calls)]

    def _priced(self, calls: list[KernelCall]) -> list[dict]:
        """Per call: 'seconds', 'joules' (0 without a power model) and roofline 't_roof' per row (times its
        scale) and each row's 'tier', 'model' and 'extrapolated' flag (the engine's all-reduce models show as
        tier 'engine'). With a predictor that carries a `call_memo` (sim/plan.py's SharedPredictor: candidates
        on one GPU rebuild the same kernel tables), calls priced before come from it, read-only."""
        out: list = [None] * len(calls)
        memo = getattr(self.predictor, "call_memo", None)
        keys = [self._call_key(call) for call in calls] if memo is not None else None
        by_family: dict[str, list[int]] = {}
        for i, call in enumerate(calls):
            if keys is not None and keys[i] in memo:
                out[i] = memo[keys[i]]
                continue
            by_family.setdefault(call.family, []).append(i)
        for family, idx in by_family.items():
            parts = [calls[i].columns() for i in idx]
            cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            priced = self.predictor.predict(cols, family=family)
            seconds, tier, model = np.asarray(priced["seconds"], dtype=np.float64), priced["tier"], priced["model"]
            extrapolated, t_roof = priced["extrapolated"], np.asarray(priced["t_roof"], dtype=np.float64)
            if family == "allreduce":
                seconds, engine_model = self._allreduce_flavour(cols, seconds)
                by_engine = engine_model != ""
                tier, model = np.where(by_engine, "engine", tier), np.where(by_engine, engine_model, model)
                extrapolated = extrapolated & ~by_engine
            joules = (self.power.joules(family, priced["t_compute"], priced["t_memory"], seconds)
                      if self.power is not None else np.zeros(len(seconds)))
            start = 0
            for i in idx:
                rows = slice(start, start + calls[i].num_rows)
                out[i] = {"seconds": seconds[rows] * calls[i].scale, "joules": joules[rows] * calls[i].scale,
                          "t_roof": t_roof[rows] * calls[i].scale,
                          "tier": tier[rows], "model": model[rows], "extrapolated": extrapolated[rows]}
                start = rows.stop
                if keys is not None:
                    for value in out[i].values():
                        value.flags.writeable = False
                    memo[keys[i]] = out[i]
        return out

    def _call_key(self, call: KernelCall) -> tuple:
        """What a call's prices depend on besides the predictor and GPU (the memo's owner): its family, shape
        columns and scale, whether joules are priced, and for all-reduces the engine's all-reduce models."""
        cols = tuple(sorted((k, v if np.ndim(v) == 0 else column_key(v)) for k, v in call.cols.items()))
        engine = (repr(self.engine.allreduce), getattr(self.measured_allreduce, "device", None)) \
            if call.family == "allreduce" else ()
        return call.family, call.scale, self.power is not None, cols, engine

    def pricing_sources(self, batches) -> list[dict]:
        """What priced the kernels of these steps, as they run: per family and (tier, model), their kernel
        seconds, the share of the family's kernel time, and the share of that time whose kernels lie
        outside the model's training range (features clamped or unknown: the predictor's 'extrapolated')."""
        calls = [c for b in batches for c in self._step_calls(b)]
        time: dict[tuple, list[float]] = {}
        for call, p in zip(calls, self._priced(calls)):
            seconds, roof = call.count * p["seconds"], call.count * p["t_roof"]
            for tier, model in dict.fromkeys(zip(p["tier"].tolist(), p["model"].tolist())):
                rows = (p["tier"] == tier) & (p["model"] == model)
                acc = time.setdefault((call.family, tier, model), [0.0, 0.0, 0.0])
                acc[0] += float(seconds[rows].sum())
                acc[1] += float(seconds[rows & p["extrapolated"]].sum())
                acc[2] += float(roof[rows].sum())
        family_s: dict[str, float] = {}
        for (family, _, _), (s, _, _) in time.items():
            family_s[family] = family_s.get(family, 0.0) + s
        return [{"family": f, "tier": t, "model": m, "kernel_s": s, "roofline_s": r,
                 "time_share": s / family_s[f] if family_s[f] else 0.0,
                 "outside_training_range": x / s if s else 0.0}
                for (f, t, m), (s, x, r) in sorted(time.items(), key=lambda kv: (kv[0][0], -kv[1][0]))]

    def _allreduce_flavour(self, cols: dict, nccl_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All-reduces over NVLink as vLLM runs them (engine `allreduce` section): its measured all-reduce
        where the rows cover the message, else its custom kernel's latency-bandwidth model below the
        size limit; the rest keep the predictor's (NCCL-fitted) time. Also returns, per row, the engine
        model that replaced the predictor's price ('' where it stands)."""
        settings = self.engine.allreduce
        engine_model = np.full(len(nccl_s), "", dtype=object)
        if not self.hw.nvlink_gbs_per_dir:
            return nccl_s, engine_model
        world = np.asarray(cols["world_size"], dtype=np.int64)
        msg = np.asarray(cols["msg_bytes"], dtype=np.float64)
        nvlink = np.asarray(cols["link"]) == "nvlink"
        out = nccl_s
        if settings.custom:
            limit = np.asarray([settings.custom_max_bytes(w) for w in world.tolist()])
            custom = (msg < limit) & nvlink
            if custom.any():
                bus = get_family("allreduce").cost(cols).bytes
                custom_s = (settings.custom_alpha_us * US
                            + bus / (settings.custom_bus_efficiency * self.hw.link_bw("nvlink")))
                out = np.where(custom, custom_s, out)
                engine_model[custom] = "vLLM custom all-reduce model"
        if self.measured_allreduce is not None:
            measured_s = self.measured_allreduce.seconds(msg, world)
            covered = nvlink & np.isfinite(measured_s)
            out = np.where(covered, measured_s, out)
            engine_model[covered] = f"vLLM all-reduce measured on {self.measured_allreduce.device}"
        return out, engine_model

    def _exact(self, call: KernelCall) -> tuple[float, float]:
        """(seconds, joules) of a call, priced by the predictor."""
        seconds, joules = self._price_j([call])[0]
        return float(seconds.sum()), float(joules.sum())

    def _table(self, calls: list[KernelCall]) -> np.ndarray:
        """families x (0..N) seconds per step: sum of count x per-row time of the calls (rows = sizes)."""
        return self._tables(calls)[0]

    def _tables(self, calls: list[KernelCall]) -> tuple[np.ndarray, np.ndarray]:
        """_table's seconds and the same table in joules."""
        table = np.zeros((len(self.families), calls[0].num_rows + 1))
        energy = np.zeros_like(table)
        for call, (seconds, joules) in zip(calls, self._price_j(calls)):
            row = self.families.index(call.family)
            table[row, 1:] += call.count * seconds
            energy[row, 1:] += call.count * joules
        return table, energy


def _measured_allreduce(engine: EngineProfile, hw, parallel: ParallelConfig, tier: str) -> MeasuredAllReduce | None:
    """The measured vLLM all-reduce that prices this GPU in this predictor tier (vllm_allreduce's rule),
    when the engine profile asks for it and the layout has a tensor-parallel all-reduce."""
    if not engine.allreduce.measured or parallel.tp == 1:
        return None  # no tensor-parallel all-reduce to price: the rows are not even read
    return measured_allreduce(hw, tier)


def _geometric_grid(limit: int, per_octave: int) -> list[int]:
    """Integers 1..limit: every integer up to per_octave, then per_octave points per doubling."""
    points = set(range(1, per_octave + 1))
    steps = math.ceil(math.log2(limit) * per_octave)
    points.update(min(limit, round(2 ** (i / per_octave))) for i in range(steps + 1))
    points.add(limit)
    return sorted(points)


def _grid_past(limit: int, per_octave: int, context: int | None) -> list[int]:
    """_geometric_grid(limit, per_octave), or with `context` its points up to the first one above it: the same
    points (so the same interpolation) for every length up to context."""
    grid = _geometric_grid(limit, per_octave)
    if context is None:
        return grid
    return grid[:bisect.bisect_right(grid, context) + 1]


def _tile_grid(limit: int, tile: int) -> list[int]:
    """New-token counts: the first and last of every `tile`-query block and its quarters, plus small counts."""
    points = {1, 2, 4, 8, 16, limit}
    for start in range(0, limit, tile):
        points.update(start + x for x in (1, tile // 4, tile // 2, 3 * tile // 4, tile))
    return sorted(p for p in points if 1 <= p <= limit)


def _bracket(grid: list[int], x: int) -> tuple[int, float]:
    """Index i and weight w with x = grid[i] + w * (grid[i+1] - grid[i])."""
    i = min(max(bisect.bisect_right(grid, x) - 1, 0), len(grid) - 2)
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


def _bilinear(row0: list[float], row1: list[float], j: int, wj: float, wi: float) -> float:
    """Between rows row0 and row1 (weight wi), each between its columns j and j + 1 (weight wj)."""
    low = row0[j] + (row0[j + 1] - row0[j]) * wj
    high = row1[j] + (row1[j + 1] - row1[j]) * wj
    return low + (high - low) * wi


def _bracket_array(g: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_bracket at every entry of x (grid g as an array), with the same floating-point operations."""
    i = g.searchsorted(x, side="right")
    i -= 1
    np.maximum(i, 0, out=i)
    np.minimum(i, len(g) - 2, out=i)
    low = g.take(i)
    return i, (x - low) / (g.take(i + 1) - low)


def _lerp_at(v, i, w):
    """Values v (a list or an array on a grid) linear between the grid points, at the index and weight from
    _bracket (a scalar) or _bracket_array (arrays): one step's lookup and a decode run's do the same
    floating-point operations; tables on one grid share one bracketing."""
    return v[i] + (v[i + 1] - v[i]) * w


def _decode_mean_kv_run(decode_ctx: np.ndarray, kind: AttentionKind, step: np.ndarray) -> np.ndarray:
    """graph.decode_mean_kv of the batches decode_ctx + j for each j of step (exact integer sums)."""
    n, window = len(decode_ctx), kind.window
    if kind.chunk:  # each sequence's position in its chunk, per step
        total = ((decode_ctx[None, :] - 1 + step[:, None]) % kind.chunk + 1).sum(axis=1)
    elif window:  # sum of min(c + j, window): the sequences below the window grow, the others stay at it
        ctx = np.sort(decode_ctx)
        below = np.searchsorted(ctx, window - step)
        total = np.concatenate([[0], np.cumsum(ctx)])[below] + step * below + window * (n - below)
    else:
        total = int(decode_ctx.sum()) + n * step
    # every KV length is >= 1, so the rounded mean is too (graph.decode_mean_kv's floor at 1 holds by itself);
    # whole numbers as floats bracket and interpolate as the integers do
    return np.rint(total / n)


# A family is implausible when it takes most of the step's priced kernel time at an effective η (kernel time
# over roofline time) this many times the rest of the step's: no family of a dense step comes close, and an η
# model pricing kernels unlike those it was fitted on (MoE from a per-expert loop) does exactly that.
IMPLAUSIBLE_SHARE = 0.5
IMPLAUSIBLE_ETA_RATIO = 4.0


def implausible_families(sources: list[dict]) -> list[dict]:
    """Families of pricing_sources() whose share of kernel time is out of proportion to their roofline share:
    [{family, share, roofline_share, eta, rest_eta}], for a warning that the figure is not to be trusted."""
    kernel, roof = {}, {}
    for s in sources:
        kernel[s["family"]] = kernel.get(s["family"], 0.0) + s["kernel_s"]
        roof[s["family"]] = roof.get(s["family"], 0.0) + s["roofline_s"]
    total_k, total_r = sum(kernel.values()), sum(roof.values())
    found = []
    for family, k in kernel.items():
        rest_k, rest_r = total_k - k, total_r - roof[family]
        if not (total_k > 0 and roof[family] > 0 and rest_k > 0 and rest_r > 0):
            continue
        eta, rest_eta = k / roof[family], rest_k / rest_r
        if k / total_k >= IMPLAUSIBLE_SHARE and eta >= IMPLAUSIBLE_ETA_RATIO * rest_eta:
            found.append({"family": family, "share": k / total_k, "roofline_share": roof[family] / total_r,
                          "eta": eta, "rest_eta": rest_eta})
    return found
