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
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Iterable

import numpy as np

from kernelsight.predictor.errors import KernelsightError, check_seed, did_you_mean
from kernelsight.sim.context import exceeds_max_model_len
from kernelsight.sim.kv_cache import KVCacheManager
from kernelsight.sim.metrics import ServingMetrics
from kernelsight.sim.request import Request
from kernelsight.sim.scheduler import ScheduledStep, Scheduler, SchedulerConfig

# Event kinds, in the order they are handled at equal times.
COMPLETE, ARRIVAL, FOLLOWUP, DELIVER, WAKE = 0, 1, 2, 3, 4

ROUTERS = ("round_robin", "least_outstanding", "prefix_aware")


class Replica:
    """One data-parallel engine: scheduler, KV pool, pricer and its step pipeline.

    pricer: sim/pricing.py's StepPricer or anything with step_time(batch) -> .gpu_s, .host_s;
    with a breakdown accumulator the engine calls breakdown(batch) instead, which also
    carries "gpu_s" and "host_s".
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

    @property
    def outstanding(self) -> int:
        return self.scheduler.num_unfinished + self.in_frontend


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
                 frontend_latency_s: float = 0.0, frontend_jitter_s: float = 0.0, seed: int = 0, progress=None):
        if frontend_latency_s < 0 or frontend_jitter_s < 0:
            raise KernelsightError(f"frontend latency {frontend_latency_s} s and jitter {frontend_jitter_s} s "
                                   f"must be >= 0")
        self.replicas = replicas
        self.frontend_latency_s = frontend_latency_s
        self.frontend_jitter_s = frontend_jitter_s
        self._frontend_rng = np.random.default_rng(check_seed(seed))
        self.router = Router(router, replicas)
        self.max_model_len = max_model_len
        self.max_concurrency = max_concurrency if max_concurrency else math.inf
        self.metrics = ServingMetrics(slo_ms)
        self.recorder = recorder            # report.Recorder: per-step and per-request outputs
        self.breakdown = breakdown          # report.BreakdownAccumulator: GPU time per kernel family
        self.progress = progress            # called with the number of requests that just finished (or failed)
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
        self._stream = None
        self._stream_pending = False

    # ----- events -----
    def _push(self, t: float, kind: int, payload, replica=None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload, replica))

    def _pull_stream(self) -> None:
        req = next(self._stream, None)
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
            delay += self._frontend_rng.exponential(self.frontend_jitter_s)
        if delay > 0:
            replica.in_frontend += 1
            self._push(t + delay, DELIVER, req, replica)
        else:
            self._deliver(replica, req, t)

    def _deliver(self, replica: Replica, req: Request, t: float) -> None:
        """The request reaches the replica's scheduler (after the frontend path, if any)."""
        replica.scheduler.add_request(req)
        self._wake(replica, t)

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
        ready = t + host
        launch = max(ready, replica.stage_free)
        stage = gpu / replica.pp
        replica.stage_free = launch + stage
        end = max(launch + gpu, replica.last_complete + stage)
        replica.last_complete = end
        replica.host_free = ready
        replica.busy_s += stage
        replica.inflight.append(step)
        self._push(end, COMPLETE, step, replica)
        if len(replica.inflight) < replica.depth:
            self._wake(replica, ready)
        usage = replica.kv.usage
        self.kv_usage_sum += usage
        if usage > self.kv_usage_max:
            self.kv_usage_max = usage
        if self.recorder is not None:
            self.recorder.step(replica, step, t, launch, end, gpu, host)

    def _complete(self, replica: Replica, t: float) -> None:
        step: ScheduledStep = replica.inflight.popleft()
        metrics = self.metrics
        finished = replica.scheduler.update(step, t, metrics.dist["itl"])
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


def build_replicas(num_replicas: int, sched_config: SchedulerConfig, num_blocks: int, make_pricer,
                   pipeline_parallel_size: int = 1) -> list[Replica]:
    """Identical replicas, each with its own KV pool (num_blocks usable blocks) and pricer."""
    replicas = []
    for i in range(num_replicas):
        kv = KVCacheManager(num_blocks, sched_config.block_size, sched_config.enable_prefix_caching)
        replicas.append(Replica(i, Scheduler(sched_config, kv), make_pricer(), pipeline_parallel_size))
    return replicas
