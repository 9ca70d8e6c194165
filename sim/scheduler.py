"""Continuous-batching scheduler with vLLM v1's policy (vllm/v1/core/sched/scheduler.py).

There is no prefill or decode phase: every request has a number of computed
tokens and a number of known tokens, and each step hands out tokens so the
first catches up with the second, under two limits:

1. Running requests first, in admission order, each getting
   min(outstanding tokens, long_prefill_token_threshold, remaining budget)
   tokens out of max_num_batched_tokens: decodes get 1, an unfinished chunked
   prefill gets its next chunk. When the KV pool cannot hold a request's new
   tokens, the most recently admitted running request is preempted (recompute:
   blocks freed, computed tokens reset, back to the *front* of the waiting
   queue), repeatedly, until the request fits or is itself the victim.
2. Then, only if nothing was preempted this step, the FIFO waiting queue while
   tokens remain and fewer than max_num_seqs requests run: a prefix-cache
   lookup gives the cached tokens, the rest of the prompt (or its first chunk)
   is allocated; the queue stops at the first request that does not fit
   (no skipping ahead). Without chunked prefill a prompt that does not fit
   in the remaining budget also stops the queue.

Computed tokens advance when a step is scheduled, so a pipeline-parallel
engine can schedule the next chunk of a prompt while the previous one is in
flight. Sampled tokens in flight are "placeholders"; with async scheduling
they count as known tokens, so a decode is scheduled again before its previous
token came back (vLLM's AsyncScheduler).

Speed: the running requests' counters live in numpy arrays (one slot per
request, from its first admission to its finish), so one step costs a few
vectorised operations plus Python work only for requests that need the KV
manager (a new block, a block to cache, a prefill chunk) or that finish. The
vectorised pass computes exactly what vLLM's sequential loop computes: the
budget a request sees is the budget minus the tokens of the requests before it,
and preemption victims come from the end of the running list, after every
request still to be handled. When every coming step only decodes one token
per running request (decode_run), the engine applies many steps at once
(advance), as these steps would.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from kernelsight.sim.batch import StepBatch
from kernelsight.sim.kv_cache import KVCacheManager
from kernelsight.sim.request import FINISHED, PREEMPTED, RUNNING, WAITING, Request

_EMPTY = np.zeros(0, np.int64)
FEW_FINISHED = 4   # update(): up to this many finished running requests leave the running list one by one


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler: section of an engine profile (vLLM's SchedulerConfig/CacheConfig names)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0   # 0: no per-request cap on a chunk
    async_scheduling: bool = False

    def __post_init__(self):
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"scheduler.{name} must be >= 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("scheduler.long_prefill_token_threshold must be >= 0")

    @classmethod
    def from_engine(cls, engine) -> "SchedulerConfig":
        """From an engine profile (sim/engine_profile.py): its scheduler section, by name, and host.async_scheduling."""
        s = engine.scheduler
        return cls(**{f: getattr(s, f) for f in cls.__dataclass_fields__ if f != "async_scheduling"},
                   async_scheduling=engine.host.async_scheduling)


class ScheduledStep:
    """What one schedule() call decided: the batch to price and who gets which tokens."""

    __slots__ = ("batch", "prefills", "decode_slots", "sampling", "preempted", "index", "_slot_req")

    def __init__(self, batch: StepBatch, prefills: list, decode_slots: np.ndarray, sampling: np.ndarray,
                 preempted: list, index: int, slot_req: list):
        self.batch = batch
        self.prefills = prefills          # (request, tokens) of the prefill chunks, in batch order
        self.decode_slots = decode_slots  # slots of the requests decoding one token, in batch order
        self.sampling = sampling          # slots of the requests that receive a token when the step completes
        self.preempted = preempted        # requests preempted while forming this step
        self.index = index
        self._slot_req = slot_req

    @property
    def decodes(self) -> list:
        """The decoding requests (valid until the step completes: slots are reused afterwards)."""
        return [self._slot_req[s] for s in self.decode_slots.tolist()]

    @property
    def assignments(self) -> dict:
        """request_id -> tokens scheduled."""
        out = {r.request_id: n for r, n in self.prefills}
        out.update((r.request_id, 1) for r in self.decodes)
        return out


class DecodeRun:
    """Steps that each decode one token for every running request and do nothing else (Scheduler.decode_run).

    Step j decodes request i (slot slots[i], in running order) at KV length comp[i] + 1 + j and samples its
    token; `steps` of them at most: the last one schedules some request's last token.
    """

    __slots__ = ("slots", "comp", "flim", "steps", "requests")

    def __init__(self, slots: np.ndarray, comp: np.ndarray, flim: np.ndarray, steps: int, requests: list):
        self.slots, self.comp, self.flim, self.steps = slots, comp, flim, steps
        self.requests = requests    # the scheduler's request per slot

    def batch(self, step: int) -> StepBatch:
        return StepBatch(decode_ctx=tuple((self.comp + (step + 1)).tolist()))

    def scheduled_step(self, step: int, index: int) -> ScheduledStep:
        """Step `step` of the run as schedule() returns it, numbered `index`."""
        return ScheduledStep(self.batch(step), [], self.slots, self.slots, [], index, self.requests)

    def blocks(self, steps: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(step, index into slots) of every KV block the first `steps` steps take, in the order the scheduler
        takes them (by step, then running order): one whenever a request's token starts a new block."""
        first = self.flim - 1 - self.comp       # the step whose token is the first past a request's blocks
        index = (first < steps).nonzero()[0]
        first = first[index]
        if steps > block_size:   # a request may take more than one block
            count = (steps - 1 - first) // block_size + 1
            if np.count_nonzero(count > 1):
                nth = np.arange(count.sum()) - (count.cumsum() - count).repeat(count)
                index = index.repeat(count)
                first = first.repeat(count) + block_size * nth
        if len(index) < 2:
            return first, index
        order = first.argsort(kind="stable")   # index never decreases: by step, then running order
        return first[order], index[order]


class Scheduler:
    """One engine's scheduler: waiting queue, running list, and the KV manager it allocates from."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        if kv.block_size != config.block_size:
            raise ValueError(f"KV manager block size {kv.block_size} != scheduler block size {config.block_size}")
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_steps = 0
        self.num_preemptions = 0
        # Per-slot counters of admitted, unfinished requests.
        self._slot_req: list[Request | None] = []
        self._free_slots: list[int] = []
        self._prompt = self._olen = self._out = self._ph = self._comp = self._flim = np.zeros(0, np.int64)
        self._last = self._first = np.zeros(0)
        self._grow(64)
        self._order = np.zeros(0, np.int64)   # slots of `running`, in order

    # ----- slots -----
    def _grow(self, capacity: int) -> None:
        old = len(self._slot_req)
        for name in ("_prompt", "_olen", "_out", "_ph", "_comp", "_flim", "_last", "_first"):
            arr = getattr(self, name)
            new = np.zeros(capacity, arr.dtype)
            new[:old] = arr
            setattr(self, name, new)
        self._slot_req.extend([None] * (capacity - old))
        self._free_slots.extend(range(capacity - 1, old - 1, -1))

    def _take_slot(self, req: Request) -> int:
        if not self._free_slots:
            self._grow(2 * len(self._slot_req))
        s = self._free_slots.pop()
        req.slot = s
        self._slot_req[s] = req
        self._prompt[s] = req.prompt_len
        self._olen[s] = req.output_len
        self._out[s] = self._ph[s] = self._comp[s] = self._flim[s] = 0
        self._last[s] = self._first[s] = -1.0
        return s

    def progress(self, req: Request) -> tuple[int, int, int]:
        """(computed tokens, output tokens returned, sampled tokens in flight) of a request."""
        s = req.slot
        if s < 0:
            return 0, req.num_output_tokens, 0
        return int(self._comp[s]), int(self._out[s]), int(self._ph[s])

    # ----- queue -----
    def add_request(self, request: Request) -> None:
        request.status = WAITING
        request.queued_since = request.arrival_time
        self.waiting.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self, now: float = 0.0) -> ScheduledStep | None:
        """Form the next step at time `now`; None when no request can get a token."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        running = self.running
        prefills: list = []             # (request, tokens), running chunks first, then admissions
        prefill_ctx: list = []
        sampled: list = []              # slots of the prefill chunks that sample
        decode_slots, decode_ctx, preempted = _EMPTY, [], []
        if running:
            decode_slots, decode_ctx, budget = self._schedule_running(now, budget, prefills, prefill_ctx, sampled,
                                                                      preempted)
        admitted: list = []
        if not preempted:
            admitted = self._admit(now, budget, prefills, prefill_ctx, decode_ctx, sampled)
        if not prefills and not decode_ctx:
            return None
        if admitted:
            decode_slots = np.concatenate([decode_slots, np.array(admitted, np.int64)])
        sampling = np.concatenate([decode_slots, np.array(sampled, np.int64)]) if sampled else decode_slots
        batch = StepBatch(tuple(n for _, n in prefills), tuple(prefill_ctx), tuple(decode_ctx), len(sampled))
        self.num_steps += 1
        return ScheduledStep(batch, prefills, decode_slots, sampling, preempted, self.num_steps - 1,
                             self._slot_req)

    def decode_run(self) -> DecodeRun | None:
        """The steps from now on, when each decodes one token for every running request and nothing else (no
        admission, prefill chunk or preemption) until one schedules some request's last token, KV blocks
        allowing; None otherwise. The engine advances such runs at once (advance())."""
        if not self.may_decode_run():
            return None
        o = self._order
        cfg = self.config
        out, ph, comp, prompt, flim = self._out[o], self._ph[o], self._comp[o], self._prompt[o], self._flim[o]
        left = self._olen[o] - out - ph     # tokens not scheduled yet
        target = prompt + out + ph if cfg.async_scheduling else prompt + out   # as in _schedule_running
        # one token each: not a prefill chunk, not waiting for a token in flight (pipeline), no KV call due
        if np.count_nonzero((target - comp != 1) | (comp < prompt) | (comp >= flim) | (left < 1)):
            return None
        return DecodeRun(o, comp, flim, int(left.min()), self._slot_req)

    def may_decode_run(self) -> bool:
        """False when decode_run() is None whatever the counters say: nothing runs, the budget cuts a step, or
        an admission could come (a cheap check, made before the engine looks for a horizon)."""
        n = len(self._order)
        cfg = self.config
        return bool(n) and n <= cfg.max_num_batched_tokens and not (
            self.waiting and n < cfg.max_num_seqs and n < cfg.max_num_batched_tokens)

    def finishes(self, step: ScheduledStep) -> bool:
        """Whether the step's completion finishes a request."""
        s = step.sampling
        return bool(np.count_nonzero(self._out[s] + 1 >= self._olen[s]))

    def advance(self, run: DecodeRun, scheduled: int, done: np.ndarray, grown: list, itl=None) -> None:
        """Apply the first `scheduled` steps of a run as schedule() would, and the completions of its first
        len(done) steps at times `done` as update() would (itl receives the inter-token gaps). The caller
        has given the requests their new KV blocks (run.blocks): `grown` lists the slots of those that took
        any."""
        o = run.slots
        self._comp[o] = run.comp + scheduled
        if grown:
            self._flim[grown] = [self._slot_req[s].fast_limit for s in grown]
        self.num_steps += scheduled
        c = len(done)
        if scheduled > c:
            self._ph[o] += scheduled - c
        if not c:
            return
        self._out[o] += c
        last = self._last[o]
        had = last >= 0
        every = np.count_nonzero(had) == len(o)   # every request had a token before
        if itl is not None:
            itl.add_array(done[0] - (last if every else last[had]))
            itl.add_repeated(done[1:] - done[:-1], len(o))
        if not every:
            self._first[o[~had]] = done[0]
        self._last[o] = done[-1]

    def _schedule_running(self, now, budget, prefills, prefill_ctx, sampled, preempted):
        """vLLM's loop over the running requests, vectorised; returns (decode slots, decode ctx, budget left)."""
        cfg = self.config
        kv = self.kv
        running = self.running
        comp_arr, ph_arr = self._comp, self._ph
        o = self._order
        out, ph, comp, prompt = self._out[o], ph_arr[o], comp_arr[o], self._prompt[o]
        known = prompt + out
        target = known + ph if cfg.async_scheduling else known
        n = target - comp
        n[out + ph >= self._olen[o]] = 0    # every remaining token is already in flight
        np.maximum(n, 0, out=n)             # tokens in flight (pipeline parallel, no async): wait
        if cfg.long_prefill_token_threshold:
            np.minimum(n, cfg.long_prefill_token_threshold, out=n)
        total = int(n.sum())
        if total > budget:
            # In running order, each request gets at most the budget left by the ones before it.
            n = np.minimum(n, np.maximum(budget - (np.cumsum(n) - n), 0))
            total = int(n.sum())
        new_comp = comp + n
        # KV-manager work: any chunk of more than one token, and decodes reaching fast_limit.
        flim = self._flim[o]
        slow_at = (n > (new_comp < flim)).nonzero()[0]
        m = len(o)
        # Only decodes past their prompt whose token starts a new block (at the fast limit, blocks x block size
        # + 1), and blocks for all of them: the loop below in one KV call, each fast limit one block further.
        if len(slow_at) and not np.count_nonzero((n[slow_at] != 1) | (comp[slow_at] < prompt[slow_at]) |
                                                 (new_comp[slow_at] != flim[slow_at])) and \
                kv.append_blocks([running[i] for i in slow_at.tolist()]):
            self._flim[o[slow_at]] += kv.block_size
        elif len(slow_at):
            # the slow requests' positions and counters as lists (only theirs: a running list can be long)
            slow, comp_l, known_l, n_l, target_l = (slow_at.tolist(), comp[slow_at].tolist(), known[slow_at].tolist(),
                                                    n[slow_at].tolist(), target[slow_at].tolist())
            limits, chunks = [], []
            for k, i in enumerate(slow):
                if i >= len(running):
                    break       # preempted as a victim of an earlier request
                req = running[i]
                decode = n_l[k] == 1 and comp_l[k] >= req.prompt_len   # an output token: its block, uncached
                while not (kv.append_block(req, comp_l[k]) if decode else
                           kv.allocate_slots(req, comp_l[k], known_l[k], n_l[k])):
                    victim = running.pop()
                    self._preempt(victim, now)
                    preempted.append(victim)
                    if victim is req:
                        break
                else:
                    limits.append(req.fast_limit)
                    if n_l[k] > 1:  # one token always samples: it is a decode, the rest are chunks
                        chunks.append(k)
                    continue
                break           # the request preempted itself: nothing after it runs
            self._flim[o[slow[:len(limits)]]] = limits
            for k in chunks:
                prefills.append((running[slow[k]], n_l[k]))
                prefill_ctx.append(comp_l[k])
                if comp_l[k] + n_l[k] == target_l[k]:
                    sampled.append(int(o[slow[k]]))
            if preempted:
                m = len(running)
                total -= int(n[m:].sum())
                n[m:] = 0
                self._order = o[:m]
        samples = (new_comp == target) & (n > 0)
        dec = samples & (n == 1)
        if m == len(o):
            comp_arr[o] = new_comp
            ph_arr[o] += samples
        else:
            comp_arr[o[:m]] = new_comp[:m]
            ph_arr[o[:m]] += samples[:m]
        return o[dec], new_comp[dec].tolist(), budget - total

    def _admit(self, now: float, budget: int, prefills: list, prefill_ctx: list, decode_ctx: list,
               sampled: list) -> list:
        """Admit waiting requests in FIFO order while budget, sequences and KV blocks allow.

        Appends their chunks to prefills/prefill_ctx (and sampled), or to
        decode_ctx for a one-token remainder; returns the slots of those decodes.
        """
        cfg = self.config
        kv = self.kv
        bs = kv.block_size
        threshold = cfg.long_prefill_token_threshold
        running = self.running
        waiting = self.waiting
        decodes, admitted = [], []
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            s = req.slot
            if s >= 0 and self._ph[s]:
                break       # preempted with a token still in flight: resume once it arrived
            known = req.prompt_len + (int(self._out[s]) if s >= 0 else 0)
            hits = kv.get_computed_blocks(req, known)
            num_hit = len(hits) * bs
            n = known - num_hit
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                if not cfg.enable_chunked_prefill:
                    break
                n = budget
            if not kv.allocate_slots(req, 0, known, n, hits):
                break
            waiting.popleft()
            if s < 0:
                s = self._take_slot(req)
            self._flim[s] = req.fast_limit
            kv.record_lookup(known, num_hit)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
                req.first_scheduled_time = now
            req.queue_time += now - req.queued_since
            req.status = RUNNING
            running.append(req)
            admitted.append(s)
            if num_hit + n == known:     # reaches the end of the known tokens: samples
                self._ph[s] += 1
                if n == 1:
                    decodes.append(s)
                    decode_ctx.append(num_hit + 1)
                    self._comp[s] = num_hit + 1
                    budget -= 1
                    continue
                sampled.append(s)
            prefills.append((req, n))
            prefill_ctx.append(num_hit)
            self._comp[s] = num_hit + n
            budget -= n
        if admitted:
            self._order = np.concatenate([self._order, np.array(admitted, np.int64)])
        return decodes

    def _preempt(self, req: Request, now: float) -> None:
        """Preemption by recompute: drop the KV cache, go back to the head of the waiting queue."""
        s = req.slot
        self.kv.free(req, min(int(self._comp[s]), int(self._prompt[s] + self._out[s])))
        self._comp[s] = 0
        self._flim[s] = 0
        req.status = PREEMPTED
        req.num_preemptions += 1
        req.queued_since = now
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update(self, step: ScheduledStep, now: float, itl=None) -> list[Request]:
        """Apply a completed step at time `now`: sampled tokens arrive, finished requests free their blocks.

        itl: a StreamingDistribution (or None) receiving every inter-token gap
        in seconds. Returns the requests that finished.
        """
        s = step.sampling
        if not len(s):
            return []
        self._ph[s] -= 1
        out = self._out[s] + 1
        self._out[s] = out
        last = self._last[s]
        had = last >= 0
        every = np.count_nonzero(had) == len(s)   # every sampling request had a token before
        if itl is not None:
            itl.add_array(now - (last if every else last[had]))
        if not every:
            self._first[s[~had]] = now
        self._last[s] = now
        done = s[out >= self._olen[s]]
        if not len(done):
            return []
        finished, left = [], []   # left: those of them that were running
        for slot in done.tolist():
            req = self._slot_req[slot]
            if req.status == RUNNING:
                left.append(req)
            else:       # preempted while its last token was in flight
                self.waiting.remove(req)
            req.status = FINISHED
            req.num_output_tokens = req.output_len
            req.first_token_time = float(self._first[slot])
            req.last_token_time = req.finish_time = now
            self.kv.free(req, int(min(self._comp[slot], self._prompt[slot] + self._out[slot])))
            self._slot_req[slot] = None
            self._free_slots.append(slot)
            req.slot = -1
            finished.append(req)
        if left:
            if len(left) <= FEW_FINISHED:   # list.remove scans in C: cheaper than rebuilding the list for a few
                for req in left:
                    self.running.remove(req)
            else:
                self.running = [r for r in self.running if r.status != FINISHED]
            o = self._order
            self._order = o[self._out[o] < self._olen[o]]
        return finished
