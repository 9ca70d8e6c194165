"""Discrete-event serving loop: arrivals, step launches and completions on data-parallel replicas.

Time model of one replica (one engine: its own scheduler, KV pool and pricer):

- Forming a step costs the host `host_s` (scheduling, input preparation,
  output processing: the pricer's StepTime.host_s); the GPU then runs it for
  `gpu_s`. Host work is serial, and the scheduler sees exactly the requests
  that arrived before it starts forming the step.
- Up to `depth` steps are in flight: 1 for a synchronous engine (a step's host
  work waits for the previous step's output, period host + gpu); 2 with async
  scheduling (vLLM's batch queue: the host forms step n+1 while the GPU runs
  step n, period max(host, gpu)); `pp` with pipeline parallelism.
- Pipeline parallelism (PP = p): the pricer prices the whole step (all
  stages); stages are assumed balanced, so a step occupies each stage for
  gpu_s / p, a new step can enter the first stage every gpu_s / p, and a step
  completes gpu_s after it entered (completions stay in order). A request's
  next token can only be scheduled once its previous step completed (unless
  async scheduling uses placeholders), which is why PP needs several requests'
  micro-batches in flight to fill the pipe, as in vLLM.
- Sampled tokens reach the client when their step completes; a finished
  request frees its KV blocks then.

Clients: open loop (requests sent at their arrival times) or, with
max_concurrency, a semaphore as in `vllm bench serve --max-concurrency`: a
request is sent at max(its arrival time, the moment a previous request
finished), and its latencies count from that send time. A conversation's next
turn is sent `think_time` after the previous turn finished.

Memory is flat in the number of requests: the arrival stream is pulled one
request at a time, and finished requests are folded into the metrics (and
optionally handed to a recorder) and dropped.

Fast-forward (fast_forward=True, the default; pipeline parallelism and lockstep groups excluded):
most steps decode one token for every running request and nothing else. When
the scheduler says the coming steps are all such steps (scheduler.DecodeRun:
no admission, chunk or preemption until a request's last token, KV blocks
allowing), the engine advances them at once, up to the horizon: the first
time another event could reach this scheduler (any other event; when the
router reads no KV state, arrivals and follow-ups count from when they can
reach a scheduler: one frontend latency later, or, with the next arrival the
only send pending, from its delivery, its jitter drawn ahead). The pricer prices
the run's steps in one vectorised pass, each exactly as step_time would (the
mean KV length grows by one per step), and the step times come from the
event loop's own additions (one cumulative sum for a synchronous engine; a
replay of this replica's WAKE and COMPLETE events under async scheduling), so
every token time, metric and output row equals step-by-step simulation's to
the last bit; only sums over steps may differ in their last digits. The
run's new KV blocks, inter-token gaps, KV usage, breakdown and recorder rows
are applied in step order, and its last steps stay in flight as real steps.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import replace
from typing import Iterable

import numpy as np

from kernelsight.predictor.errors import KernelsightError, check_seed, did_you_mean
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.context import exceeds_max_model_len
from kernelsight.sim.kv_cache import KVCacheManager, SlidingGroups
from kernelsight.sim.metrics import ServingMetrics
from kernelsight.sim.request import Request
from kernelsight.sim.scheduler import Scheduler, SchedulerConfig

# Event kinds, in the order they are handled at equal times.
COMPLETE, ARRIVAL, FOLLOWUP, DELIVER, WAKE = 0, 1, 2, 3, 4

ROUTERS = ("round_robin", "least_outstanding", "prefix_aware")
JITTER_BLOCK = 256      # frontend jitter draws taken from the generator at a time
JITTER_AHEAD = 4        # requests the horizon looks ahead at (their arrival times and frontend jitter)


class Replica:
    """One data-parallel engine: scheduler, KV pool, pricer and its step pipeline.

    pricer: sim/pricing.py's StepPricer or anything with step_time(batch) -> .gpu_s, .host_s;
    with a breakdown accumulator the engine calls breakdown(batch) instead, which also
    carries "gpu_s" and "host_s". Runs of decode steps are fast-forwarded with a pricer that
    also has decode_run (StepPricer).
    """

    def __init__(self, index: int, scheduler: Scheduler, pricer, pipeline_parallel_size: int = 1):
        self.index = index
        self.scheduler = scheduler
        self.kv = scheduler.kv
        self.pricer = pricer
        self.pp = pipeline_parallel_size
        self.depth = self.pp if self.pp > 1 else (2 if scheduler.config.async_scheduling else 1)
        self.inflight: deque = deque()
        self.host_free = 0.0      # when the host can form the next step
        self.stage_free = 0.0     # when the first pipeline stage (the GPU for PP = 1) is free
        self.last_complete = 0.0
        self.wake_pending = False
        self.busy_s = 0.0         # GPU time of the steps launched (first stage for PP)
        self.in_frontend = 0      # routed here, not yet delivered to the scheduler
        self.period = 0.0         # host + GPU time of the last decode-only step (sizes fast-forward runs)
        self.group = None         # its LockstepGroup, if attention data-parallel ranks step together

    @property
    def outstanding(self) -> int:
        return self.scheduler.num_unfinished + self.in_frontend


class LockstepGroup:
    """Attention data-parallel ranks of one replica (vLLM's --data-parallel-size on a MoE model): each has its
    own scheduler and KV pool, and all run every step together, because each MoE layer gathers every rank's
    tokens; a rank with nothing scheduled runs a dummy batch while any rank has work. When every rank's batch
    fits a CUDA graph, vLLM pads each rank's forward pass to the largest rank's token count; otherwise all run
    eagerly, each its own tokens, and each MoE layer takes the sum of the ranks' (StepBatch.moe_tokens).
    The step ends with the slowest rank's.
    The group keeps the one step pipeline its ranks share (Replica's host, stage and in-flight fields)."""

    def __init__(self, members: list[Replica]):
        self.members = members
        self.pricer = members[0].pricer
        self.pp = members[0].pp
        self.depth = members[0].depth
        self.inflight: deque = deque()   # per step: each member's ScheduledStep, None for a dummy batch
        self.host_free = 0.0
        self.stage_free = 0.0
        self.last_complete = 0.0
        self.wake_pending = False
        for m in members:
            m.group = self


class Router:
    """Picks the replica for each new request (data parallelism behind one endpoint)."""

    def __init__(self, policy: str, replicas: list[Replica]):
        if policy not in ROUTERS:
            raise KernelsightError(f"router={policy!r}: unknown router{did_you_mean(policy, ROUTERS)}; "
                                   f"choose one of {', '.join(ROUTERS)}")
        self.policy = policy
        self.replicas = replicas
        self._next = 0

    def route(self, req: Request) -> Replica:
        replicas = self.replicas
        if len(replicas) == 1:
            return replicas[0]
        if self.policy == "round_robin":
            r = replicas[self._next]
            self._next = (self._next + 1) % len(replicas)
            return r
        if self.policy == "least_outstanding":
            return min(replicas, key=lambda r: (r.outstanding, r.index))
        # prefix_aware: longest cached prefix, ties to the least outstanding
        return min(replicas, key=lambda r: (-r.kv.num_cached_prefix_blocks(req, req.prompt_len), r.outstanding,
                                            r.index))


class Engine:
    """Runs a request stream through replicas; returns the metrics (see run())."""

    def __init__(self, replicas: list[Replica], router: str = "least_outstanding",
                 max_model_len: int | None = None, max_concurrency: int | None = None,
                 slo_ms: dict | None = None, recorder=None, breakdown=None,
                 frontend_latency_s: float = 0.0, frontend_jitter_s: float = 0.0, seed: int = 0, progress=None,
                 fast_forward: bool = True, itl: bool = True):
        if frontend_latency_s < 0 or frontend_jitter_s < 0:
            raise KernelsightError(f"frontend latency {frontend_latency_s} s and jitter {frontend_jitter_s} s "
                                   f"must be >= 0")
        self.replicas = replicas
        self.frontend_latency_s = frontend_latency_s
        self.frontend_jitter_s = frontend_jitter_s
        self._frontend_rng = np.random.default_rng(check_seed(seed))
        self._jitter: list[float] = []   # the frontend jitter of the coming sends, drawn ahead (_jitter_ahead)
        self._jitter_next = 0
        self.router = Router(router, replicas)
        self.max_model_len = max_model_len
        self.max_concurrency = max_concurrency if max_concurrency else math.inf
        self.metrics = ServingMetrics(slo_ms, itl)   # itl=False: no inter-token gaps kept (ServingMetrics)
        self.recorder = recorder            # report.Recorder: per-step and per-request outputs
        self.breakdown = breakdown          # report.BreakdownAccumulator: GPU time per kernel family
        self.progress = progress            # called with the number of requests that just finished (or failed)
        self.fast_forward = fast_forward    # advance runs of decode steps at once (_fast_forward)
        self.fast_forwarded_steps = 0       # steps advanced that way
        self.in_system = 0          # sent and not finished
        self.max_in_system = 0
        self.area_in_system = 0.0   # integral of in_system over time
        self.area_waiting = 0.0     # integral of the waiting-queue length over time
        self.kv_usage_sum = 0.0
        self.kv_usage_max = 0.0
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self._blocked: deque = deque()
        self._sends_pending = 0     # ARRIVAL and FOLLOWUP events in the heap
        self._stream = None
        self._stream_pending = False
        self._ahead: deque = deque()   # requests read from the stream before their turn (_send_bound)

    # ----- events -----
    def _push(self, t: float, kind: int, payload, replica=None) -> None:
        self._seq += 1
        if kind == ARRIVAL or kind == FOLLOWUP:
            self._sends_pending += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload, replica))

    def _jitter_ahead(self, count: int) -> list[float]:
        """The frontend jitter of the next `count` sends, without taking them. Drawn in blocks: a block of n
        exponential draws is the generator's n single draws, bit for bit, so the k-th send's jitter is the
        k-th draw however far ahead it was read."""
        need = self._jitter_next + count - len(self._jitter)
        if need > 0:
            del self._jitter[:self._jitter_next]
            self._jitter_next = 0
            self._jitter.extend(self._frontend_rng.exponential(self.frontend_jitter_s,
                                                               max(need, JITTER_BLOCK)).tolist())
        return self._jitter[self._jitter_next:self._jitter_next + count]

    def _pull_stream(self) -> None:
        req = self._ahead.popleft() if self._ahead else next(self._stream, None)
        if req is None:
            self._stream_pending = False
            return
        self._stream_pending = True
        self._push(max(req.arrival_time, self.now), ARRIVAL, req)

    def run(self, requests: Iterable[Request]) -> dict:
        """Simulate until every request finished; returns metrics.summary() plus engine statistics."""
        self._stream = iter(requests)
        self._pull_stream()
        heap = self._heap
        pop = heapq.heappop
        queues = [r.scheduler.waiting for r in self.replicas]
        last_t = None
        while heap:
            t, kind, _, payload, replica = pop(heap)
            if kind == ARRIVAL or kind == FOLLOWUP:
                self._sends_pending -= 1
            if last_t is not None and t > last_t:
                dt = t - last_t
                self.area_in_system += self.in_system * dt
                self.area_waiting += sum(map(len, queues)) * dt
            last_t = t
            self.now = t
            if kind == COMPLETE:
                self._complete(replica, t)
            elif kind == ARRIVAL:
                self._stream_pending = False
                self._blocked.append(payload)
                self._drain(t)
                if not self._blocked:
                    self._pull_stream()
            elif kind == FOLLOWUP:
                self._blocked.append(payload)
                self._drain(t)
            elif kind == DELIVER:
                replica.in_frontend -= 1
                self._deliver(replica, payload, t)
            else:
                replica.wake_pending = False
                if replica.__class__ is LockstepGroup:
                    self._step_group(replica, t)
                else:
                    self._try_schedule(replica, t)
        return self.summary()

    def _drain(self, t: float) -> None:
        """Send queued client requests while the concurrency limit allows."""
        blocked = self._blocked
        while blocked and self.in_system < self.max_concurrency:
            self._send(blocked.popleft(), t)

    def _send(self, req: Request, t: float) -> None:
        req.arrival_time = t
        self.metrics.record_arrival(t)
        replica = self.router.route(req)
        total = req.prompt_len + req.output_len
        if exceeds_max_model_len(req.prompt_len, req.output_len, self.max_model_len) or \
                replica.kv.blocks_needed(total) > replica.kv.num_blocks:
            # vLLM rejects what cannot fit its context (context.py) or its KV cache; the conversation ends there.
            failed = 0
            while req is not None:
                failed += 1
                req = req.followup[1] if req.followup else None
            self.metrics.failed += failed
            if self.progress is not None:
                self.progress(failed)
            return
        req.replica = replica.index
        self.in_system += 1
        if self.in_system > self.max_in_system:
            self.max_in_system = self.in_system
        delay = self.frontend_latency_s
        if self.frontend_jitter_s > 0:
            delay += self._jitter_ahead(1)[0]
            self._jitter_next += 1
        if delay > 0:
            replica.in_frontend += 1
            self._push(t + delay, DELIVER, req, replica)
        else:
            self._deliver(replica, req, t)

    def _deliver(self, replica: Replica, req: Request, t: float) -> None:
        """The request reaches the replica's scheduler (after the frontend path, if any)."""
        replica.scheduler.add_request(req)
        self._wake(replica.group or replica, t)

    def _wake(self, replica: Replica, t: float) -> None:
        """Let the replica schedule at t, after every other event at t (all simultaneous arrivals)."""
        if not replica.wake_pending:
            replica.wake_pending = True
            self._push(t, WAKE, None, replica)

    def _try_schedule(self, replica: Replica, t: float) -> None:
        if len(replica.inflight) >= replica.depth:
            return      # a completion will call again
        if replica.host_free > t:
            self._wake(replica, replica.host_free)
            return
        if self.fast_forward and replica.pp == 1 and hasattr(replica.pricer, "decode_run") and \
                self._fast_forward(replica, t):
            return
        step = replica.scheduler.schedule(t)
        if step is None:
            return
        if self.breakdown is not None:   # the breakdown carries the step time too: price once
            parts = replica.pricer.breakdown(step.batch)
            self.breakdown.add(step.batch, parts)
            gpu, host = parts["gpu_s"], parts["host_s"]
        else:
            st = replica.pricer.step_time(step.batch)
            gpu, host = st.gpu_s, st.host_s
        launch, end = self._launch(replica, t, gpu, host, step)
        replica.busy_s += gpu / replica.pp
        if not step.prefills:
            replica.period = host + gpu
        self._stepped(replica, step, t, launch, end, gpu, host)

    def _launch(self, unit, t: float, gpu: float, host: float, payload) -> tuple[float, float]:
        """Put a step formed at t on the pipeline of `unit` (a Replica or LockstepGroup): its host work, then
        its GPU time on each stage, completing in order; returns its launch and completion times."""
        ready = t + host
        launch = max(ready, unit.stage_free)
        stage = gpu / unit.pp
        unit.stage_free = launch + stage
        end = max(launch + gpu, unit.last_complete + stage)
        unit.last_complete = end
        unit.host_free = ready
        unit.inflight.append(payload)
        self._push(end, COMPLETE, payload, unit)
        if len(unit.inflight) < unit.depth:
            self._wake(unit, ready)
        return launch, end

    def _stepped(self, replica: Replica, step, t: float, launch: float, end: float, gpu: float, host: float):
        """KV usage statistics and the recorder's row of a step just launched on `replica`."""
        usage = replica.kv.usage
        self.kv_usage_sum += usage
        if usage > self.kv_usage_max:
            self.kv_usage_max = usage
        if self.recorder is not None:
            self.recorder.step(replica, step, t, launch, end, gpu, host)

    def _step_group(self, group: LockstepGroup, t: float) -> None:
        """One lockstep step of the group's ranks (LockstepGroup): each schedules its own batch, all run at the
        largest one's token count where CUDA graphs run it, and the step takes the slowest rank's host and GPU
        time. Not fast-forwarded."""
        if len(group.inflight) >= group.depth:
            return
        if group.host_free > t:
            self._wake(group, group.host_free)
            return
        steps = [m.scheduler.schedule(t) for m in group.members]
        tokens = max((s.batch.num_tokens for s in steps if s is not None), default=0)
        if not tokens:
            return
        pricer, acc = group.pricer, self.breakdown
        # vLLM (v1 worker dp_utils): the ranks agree on the least CUDA-graph mode any of them can run; with
        # graphs every rank is padded to the largest token count, eagerly each runs its own (a dummy: 1 token)
        own = [s.batch if s is not None else StepBatch(dp_tokens=1) for s in steps]
        if all(pricer.graphed(b) for b in own):
            batches = [replace(b, dp_tokens=tokens) for b in own]
        else:  # each MoE layer gathers what the ranks run
            gathered = sum(b.forward_tokens for b in own)
            batches = [replace(b, moe_tokens=gathered) for b in own]
        if acc is not None:
            parts = [pricer.breakdown(b) for b in batches]
            times = [(p["gpu_s"], p["host_s"]) for p in parts]
        else:
            times = [(st.gpu_s, st.host_s) for st in map(pricer.step_time, batches)]
        gpu = max(g for g, _ in times)
        host = max(h for _, h in times)
        launch, end = self._launch(group, t, gpu, host, steps)
        for i, (m, step) in enumerate(zip(group.members, steps)):
            m.busy_s += gpu / group.pp   # a rank that finishes first waits at the next MoE layer's gather
            if acc is not None:
                wait = gpu - times[i][0]
                if wait > 0:
                    parts[i]["family"]["dp_wait"] = wait
                acc.add(batches[i], parts[i])
            if step is not None:
                self._stepped(m, step, t, launch, end, gpu, host)

    # ----- fast-forward -----
    def _fast_forward(self, replica: Replica, t: float) -> bool:
        """Advance a run of decode-only steps at once (scheduler.DecodeRun): the running requests decode one
        token each per step, and nothing can change that before the run ends or before the horizon (the
        earliest time another event could reach this scheduler). Every step is priced with
        pricer.decode_run and timed by the event loop's own arithmetic, so the result is step-by-step
        simulation's to the last bit; the steps still in flight at the end stay in flight as real steps.
        Returns False (nothing changed) when no run of two or more steps can be advanced."""
        if not replica.scheduler.may_decode_run():
            return False    # an admission could come (most arrivals): no horizon to look for
        horizon = self._horizon(replica)
        if horizon - t <= 2 * replica.period:
            return False    # at most about two steps fit: a run that short saves less than it costs
        sched, kv = replica.scheduler, replica.kv
        run = sched.decode_run()
        if run is None:
            return False
        pre = replica.inflight[0] if replica.inflight else None  # async scheduling: the step on the GPU now
        if pre is not None and sched.finishes(pre):
            return False
        steps = run.steps
        if steps < 2:
            return False
        block_step, block_index = run.blocks(steps, kv.block_size)
        per_block = 1 + kv.sliding_groups   # a block in the full group and one in each sliding group
        if len(block_step) * per_block > kv.num_free:   # from the step that could find no free block: step by step
            steps = int(block_step[kv.num_free // per_block])
            if steps < 2:
                return False
        guess = steps if replica.period <= 0 or math.isinf(horizon) else \
            min(steps, int((horizon - t) / replica.period) + 2)
        prices = replica.pricer.decode_run(run.comp + 1, guess, self.breakdown is not None)
        if prices is None:
            return False
        if replica.depth == 1:
            timeline = _sync_timeline(t, prices.host_s, prices.gpu_s, horizon)
            if timeline[0] == guess < steps:     # the guess was short: price the whole run
                prices = replica.pricer.decode_run(run.comp + 1, steps, self.breakdown is not None)
                if prices is None:
                    return False
                timeline = _sync_timeline(t, prices.host_s, prices.gpu_s, horizon)
            scheduled, start, launch, end = timeline
            if scheduled < 2:
                return False
            done = end[:scheduled - 1]
            inflight = [scheduled - 1]
            replica.host_free = launch[-1]
            replica.stage_free = replica.last_complete = end[-1]
            pending_wake = None
        else:
            scheduled, start, launch, end, done, inflight, pending_wake, prices = \
                self._async_timeline(replica, run, pre, t, horizon, steps, prices)
        self._apply_run(replica, run, prices, scheduled, start, launch, end, done, block_step, block_index)
        for j in inflight:
            step = run.scheduled_step(j, sched.num_steps - scheduled + j)
            replica.inflight.append(step)
            self._push(end[j], COMPLETE, step, replica)
        replica.period = prices.host_s + prices.gpu_s[scheduled - 1]
        if pending_wake is not None:
            self._wake(replica, pending_wake)
        return True

    def _async_timeline(self, replica: Replica, run, pre, t: float, horizon: float, steps: int, prices):
        """The event loop's handling of this replica's WAKE and COMPLETE events under async scheduling (up
        to two steps in flight), replayed over the run's steps until the horizon, the end of the run, or the
        completion that finishes a request. The step in flight before the run (pre) completes as a real
        step. Returns (steps scheduled, their schedule, launch and end times, completion times of the run's
        completed steps, indices of its steps still in flight, the pending wake time or None, the prices);
        the replica's host, stage and completion times are left as after them."""
        pre_entry = None
        if pre is not None:  # its COMPLETE event leaves the heap; it is put back if the replay ends first
            heap = self._heap
            i = next(i for i, e in enumerate(heap) if e[3] is pre)
            pre_entry = heap[i]
            heap[i] = heap[-1]
            heap.pop()
            heapq.heapify(heap)
        h, gpu = prices.host_s, prices.gpu_s.tolist()
        host_free, stage_free, last_complete = replica.host_free, replica.stage_free, replica.last_complete
        depth = replica.depth
        finishing = run.steps - 1   # the step whose completion finishes requests (if scheduled)
        inflight: deque = deque([(pre_entry[0], -1)] if pre is not None else [])
        start, launch, end, done = [], [], [], []
        wake = t     # the WAKE being handled
        itl = self.metrics.itl
        while True:
            complete_at = inflight[0][0] if inflight else math.inf
            if wake is not None and wake < complete_at:   # at equal times a COMPLETE goes first
                now = wake
                if now >= horizon:
                    break
                if len(inflight) >= depth:
                    wake = None
                    continue
                if host_free > now:
                    wake = host_free
                    continue
                j = len(start)
                if j == steps:
                    break
                if j == len(gpu):  # price the rest of the run
                    more = replica.pricer.decode_run(run.comp + 1, steps, self.breakdown is not None)
                    if more is None:
                        break
                    prices, gpu = more, more.gpu_s.tolist()
                g = gpu[j]
                ready = now + h
                go = max(ready, stage_free)
                stage_free = go + g
                finish = max(go + g, last_complete + g)
                last_complete = finish
                host_free = ready
                start.append(now)
                launch.append(go)
                end.append(finish)
                inflight.append((finish, j))
                wake = ready if len(inflight) < depth else None
            else:
                now, j = inflight[0]
                if now >= horizon or j == finishing:
                    break
                inflight.popleft()
                if j < 0:
                    replica.scheduler.update(pre, now, itl)   # finishes nothing (checked)
                    replica.inflight.popleft()
                else:
                    done.append(now)
                if wake is None:
                    wake = now
        if pre_entry is not None and replica.inflight:  # still in flight
            heapq.heappush(self._heap, pre_entry)
        replica.host_free, replica.stage_free, replica.last_complete = host_free, stage_free, last_complete
        return len(start), start, launch, end, done, [j for _, j in inflight if j >= 0], wake, prices

    def _apply_run(self, replica: Replica, run, prices, scheduled: int, start, launch, end, done,
                   block_step: np.ndarray, block_index: np.ndarray) -> None:
        """The state step-by-step simulation leaves after the run's first `scheduled` steps and the
        completions at `done`: KV blocks, scheduler counters and token times, KV usage statistics, GPU
        busy time, breakdown and recorder rows."""
        sched, kv = replica.scheduler, replica.kv
        self.fast_forwarded_steps += scheduled
        taken = int(block_step.searchsorted(scheduled))   # blocks of the steps scheduled
        reqs = run.requests
        block_slots = run.slots[block_index[:taken]].tolist()
        used_before = kv.num_used
        event_used = [] if kv.sliding_groups else None   # blocks in use after each block taken (the sliding groups
        gpu = prices.gpu_s[:scheduled].tolist()   # give some back as they take)
        if self.recorder is None:
            kv.append_blocks([reqs[slot] for slot in block_slots], event_used)   # free blocks for all: checked
        else:  # rows see each step's KV usage, as schedule() leaves it
            block_comp = (run.comp[block_index[:taken]] + block_step[:taken]).tolist()   # computed tokens then
            first = sched.num_steps
            b = 0
            for j in range(scheduled):
                while b < taken and block_step[b] == j:
                    kv.append_block(reqs[block_slots[b]], block_comp[b])
                    if event_used is not None:
                        event_used.append(kv.num_used)
                    b += 1
                self.recorder.step(replica, run.scheduled_step(j, first + j), start[j], launch[j], end[j], gpu[j],
                                   prices.host_s)
        sched.advance(run, scheduled, np.asarray(done, dtype=np.float64), list(dict.fromkeys(block_slots)),
                      self.metrics.itl)
        if taken:   # blocks in use after each step: after its last block taken (less those given back)
            events = block_step[:taken].searchsorted(np.arange(scheduled), side="right")
            used = used_before + events if event_used is None else np.asarray([used_before, *event_used])[events]
            usage = (used / kv.num_blocks).tolist()
        else:
            usage = [kv.usage] * scheduled
        total = self.kv_usage_sum
        for u in usage:
            total += u
        self.kv_usage_sum = total
        self.kv_usage_max = max(self.kv_usage_max, usage[-1] if event_used is None else max(usage))
        busy = replica.busy_s
        for g in gpu:
            busy += g
        replica.busy_s = busy
        if self.breakdown is not None:
            self.breakdown.add_run(prices, scheduled, run.batch)

    def _horizon(self, replica: Replica) -> float:
        """The earliest time another event could change what `replica` schedules: the time of any event
        but its own completions. Arrivals and follow-ups reach a scheduler only after the frontend path, when
        the router reads no KV state: from one frontend latency later, or, where the next arrival is the only
        send pending, from the earliest delivery of it and the requests after it (_send_bound)."""
        lead, exact = 0.0, False
        if len(self.replicas) == 1 or self.router.policy != "prefix_aware":
            lead = self.frontend_latency_s
            exact = self.frontend_jitter_s > 0 and self._sends_pending == 1 and not self._blocked
        heap = self._heap
        best = math.inf
        stack = [0] if heap else []
        while stack:  # the heap's nodes below `best`, pruned at the first one that is not
            i = stack.pop()
            t, kind, _, _, r = heap[i]
            if t >= best:
                continue
            if kind == ARRIVAL or kind == FOLLOWUP:
                best = min(best, self._send_bound(t) if exact and kind == ARRIVAL else t + lead)
            elif not (kind == COMPLETE and r is replica):
                best = t
            stack.extend(c for c in (2 * i + 1, 2 * i + 2) if c < len(heap))
        return best

    def _send_bound(self, t: float) -> float:
        """The earliest delivery of the pending arrival (sent at t) or of any request the stream holds after
        it, when nothing else can be sent first: the k-th of them is sent no earlier than its arrival time
        (non-decreasing along the stream) and, as requests refused at the door draw no jitter, takes one of
        the next k jitter draws; requests past the look-ahead arrive no earlier than the last one read."""
        jitter = self._jitter_ahead(JITTER_AHEAD)
        least = jitter[0]
        bound = t + least
        ahead = self._ahead
        for k in range(1, JITTER_AHEAD):
            if k > len(ahead):
                req = next(self._stream, None)
                if req is None:
                    break
                ahead.append(req)
            arrival = ahead[k - 1].arrival_time
            if arrival >= bound:
                break
            least = min(least, jitter[k])
            bound = min(bound, arrival + least)
        else:   # the requests after the look-ahead arrive no earlier than the last one read
            bound = min(bound, arrival)
        return self.frontend_latency_s + bound

    def _complete(self, replica, t: float) -> None:
        """The oldest step in flight on `replica` (a Replica or LockstepGroup) completes at t."""
        step = replica.inflight.popleft()
        metrics = self.metrics
        if replica.__class__ is LockstepGroup:
            finished = [req for m, s in zip(replica.members, step) if s is not None
                        for req in m.scheduler.update(s, t, metrics.itl)]
        else:
            finished = replica.scheduler.update(step, t, metrics.itl)
        for req in finished:
            latencies = metrics.record_request(req)
            if self.recorder is not None:
                self.recorder.request(req, latencies)
            self.in_system -= 1
            if req.followup is not None:
                think_s, nxt = req.followup
                self._push(t + think_s, FOLLOWUP, nxt)
        if finished:
            if self.progress is not None:
                self.progress(len(finished))
            self._drain(t)
            if not self._blocked and not self._stream_pending:
                self._pull_stream()
        self._wake(replica, t)

    # ----- results -----
    def summary(self) -> dict:
        out = self.metrics.summary()
        num_steps = sum(r.scheduler.num_steps for r in self.replicas)
        m = self.metrics
        d = m.duration
        kvs = [r.kv for r in self.replicas]
        queries = sum(kv.prefix_queries for kv in kvs)
        out.update({
            "num_steps": num_steps,
            "preemptions": sum(r.scheduler.num_preemptions for r in self.replicas),
            "prefix_cache_hit_rate": sum(kv.prefix_hits for kv in kvs) / queries if queries else 0.0,
            "kv_usage_mean": self.kv_usage_sum / num_steps if num_steps else 0.0,
            "kv_usage_max": self.kv_usage_max,
            "kv_blocks_per_replica": kvs[0].num_blocks,
            "max_concurrent_requests": self.max_in_system,
            "mean_requests_in_system": self.area_in_system / d if d > 0 else float("nan"),
            "mean_requests_waiting": self.area_waiting / d if d > 0 else float("nan"),
            "gpu_busy_fraction": sum(r.busy_s for r in self.replicas) / (d * len(self.replicas)) if d > 0 else 0.0,
        })
        return out


def _sync_timeline(t: float, host: float, gpu: np.ndarray, horizon: float) -> tuple:
    """Steps of a synchronous engine back to back from t (each formed when the last completes: launch =
    schedule + host, end = launch + GPU), with the event loop's additions in its order (one cumulative
    sum), up to the last step formed before the horizon: (count, schedule, launch and end times)."""
    k = len(gpu)
    terms = np.empty(2 * k + 1)
    terms[0], terms[1::2], terms[2::2] = t, host, gpu
    times = terms.cumsum()
    start = times[0::2][:k]
    count = int(start.searchsorted(horizon))
    return count, start[:count].tolist(), times[1::2][:count].tolist(), times[2::2][:count].tolist()


def build_replicas(num_replicas: int, sched_config: SchedulerConfig, num_blocks: int, make_pricer,
                   pipeline_parallel_size: int = 1, sliding: SlidingGroups | None = None,
                   lockstep: int = 1) -> list[Replica]:
    """Identical replicas, each with its own KV pool (num_blocks usable blocks, shared with the sliding-window
    groups `sliding` if any) and pricer; lockstep > 1: each run of that many consecutive replicas is one
    LockstepGroup (attention data-parallel ranks, priced by the first one's pricer)."""
    if lockstep < 1 or num_replicas % lockstep:
        raise KernelsightError(f"{num_replicas} replicas do not form lockstep groups of {lockstep}")
    replicas = []
    for i in range(num_replicas):
        kv = KVCacheManager(num_blocks, sched_config.block_size, sched_config.enable_prefix_caching, sliding)
        replicas.append(Replica(i, Scheduler(sched_config, kv), make_pricer(), pipeline_parallel_size))
    if lockstep > 1:
        for i in range(0, num_replicas, lockstep):
            LockstepGroup(replicas[i:i + lockstep])
    return replicas
