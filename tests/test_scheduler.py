"""Scheduler (vLLM v1 policy) and the event loop's step pipeline, with an explicit linear step price."""

import numpy as np
import pytest

from kernelsight.sim.engine import Engine, build_replicas
from kernelsight.sim.kv_cache import KVCacheManager
from kernelsight.sim.request import SHARED_PREFIX, UNIQUE, Request
from kernelsight.sim.pricing import StepTime
from kernelsight.sim.scheduler import Scheduler, SchedulerConfig
from kernelsight.sim.workload import Workload, WorkloadConfig

BS = 4


class LinearPricer:
    """gpu = base + per_token * tokens; host fixed: analytic cases are exact."""

    def __init__(self, base=0.010, per_token=1e-4, host=0.0):
        self.base, self.per_token, self.host = base, per_token, host

    def gpu(self, tokens: int) -> float:
        return self.base + self.per_token * tokens

    def step_time(self, batch):
        g = self.gpu(batch.num_tokens)
        return StepTime(g, self.host, g + self.host)


class Checker:
    """Engine recorder asserting the scheduler's limits at every step."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.steps = []
        self.tokens = {}          # request_id -> tokens scheduled in total
        self.finished = []

    def step(self, replica, step, t_schedule, t_launch, t_end, gpu, host):
        b = step.batch
        sched = replica.scheduler
        assert 0 < b.num_tokens <= self.config.max_num_batched_tokens
        assert len(sched.running) <= self.config.max_num_seqs
        assert b.num_seqs <= self.config.max_num_seqs
        assert sum(step.assignments.values()) == b.num_tokens
        replica.kv.check_invariants()
        assert replica.kv.num_used + replica.kv.num_free == replica.kv.num_blocks
        for rid, n in step.assignments.items():
            self.tokens[rid] = self.tokens.get(rid, 0) + n
        self.steps.append((t_schedule, t_launch, t_end, b, [r.request_id for r in step.preempted]))

    def request(self, req, latencies):
        self.finished.append(req)


def config(**kw):
    base = dict(max_num_batched_tokens=64, max_num_seqs=8, block_size=BS)
    base.update(kw)
    return SchedulerConfig(**base)


def engine(cfg, blocks, pricer=None, pp=1, checker=True, **kw):
    replicas = build_replicas(1, cfg, blocks, lambda: pricer or LinearPricer(), pp)
    return Engine(replicas, recorder=Checker(cfg) if checker else None, **kw)


def lognormal_workload(rate=50.0, n_in=40, n_out=30):
    return Workload(WorkloadConfig.from_config({
        "arrival": "poisson", "request_rate": rate,
        "input": {"dist": "lognormal", "mean": n_in, "sigma": 0.8, "max": 120},
        "output": {"dist": "lognormal", "mean": n_out, "sigma": 0.8, "max": 120}}))


def serve(sched: Scheduler, now: float = 0.0):
    """One synchronous step: schedule and complete it."""
    step = sched.schedule(now)
    finished = sched.update(step, now) if step is not None else []
    return step, finished


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_limits_hold_at_every_step_and_every_token_is_served(async_scheduling):
    cfg = config(async_scheduling=async_scheduling)
    eng = engine(cfg, blocks=60, pricer=LinearPricer(host=0.004))
    reqs = list(lognormal_workload().requests(150, seed=3))
    wanted = {r.request_id: r.output_len for r in reqs}
    summary = eng.run(iter(reqs))
    checker = eng.recorder
    assert summary["completed"] == 150 and summary["failed"] == 0
    assert summary["preemptions"] > 0          # the 60-block pool is too small for the load
    assert {r.request_id: r.num_output_tokens for r in checker.finished} == wanted
    assert summary["total_output_tokens"] == sum(wanted.values())
    # every request computed its prompt and all outputs but the last, plus what preemption made it redo
    for r in checker.finished:
        assert checker.tokens[r.request_id] >= r.prompt_len + r.output_len - 1 - max(r.num_cached_tokens, 0)
        if r.num_preemptions == 0 and r.num_cached_tokens == 0:
            assert checker.tokens[r.request_id] == r.prompt_len + r.output_len - 1


def test_decodes_come_first_and_long_prompts_are_chunked():
    sched = Scheduler(config(max_num_batched_tokens=16), KVCacheManager(100, BS))
    a, b = Request(0, 0.0, 4, 10), Request(1, 0.0, 4, 10)
    sched.add_request(a)
    sched.add_request(b)
    step, _ = serve(sched)
    assert step.batch.prefill_new == (4, 4) and step.batch.prefill_sampled == 2
    c = Request(2, 0.0, 40, 3)
    sched.add_request(c)
    chunks = []
    for _ in range(3):
        step, _ = serve(sched)
        assert step.batch.decode_ctx[:2] and [r.request_id for r in step.decodes][:2] == [0, 1]
        chunks.append((step.batch.prefill_new, step.batch.prefill_ctx, step.batch.prefill_sampled))
    # budget 16 minus the two decodes: chunks of 14, 14, then the remaining 12 samples the first token
    assert chunks == [((14,), (0,), 0), ((14,), (14,), 0), ((12,), (28,), 1)]
    step, _ = serve(sched)
    assert len(step.batch.decode_ctx) == 3 and step.batch.decode_ctx[2] == 41


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_whole():
    sched = Scheduler(config(max_num_batched_tokens=16, enable_chunked_prefill=False), KVCacheManager(100, BS))
    for i in range(2):
        sched.add_request(Request(i, 0.0, 4, 3))
    serve(sched)
    sched.add_request(Request(2, 0.0, 15, 2))
    step, _ = serve(sched)                       # 2 decodes leave 14 < 15 tokens: the prompt waits
    assert step.batch.prefill_new == () and len(sched.waiting) == 1
    step, finished = serve(sched)                # the decoders finish (3 tokens each)...
    assert len(finished) == 2
    step, _ = serve(sched)                       # ...and the prompt runs whole
    assert step.batch.prefill_new == (15,)


def test_max_num_seqs_caps_the_running_requests():
    sched = Scheduler(config(max_num_seqs=2), KVCacheManager(100, BS))
    for i in range(5):
        sched.add_request(Request(i, 0.0, 4, 3))
    step, _ = serve(sched)
    assert len(sched.running) == 2 and step.batch.num_seqs == 2 and len(sched.waiting) == 3


def test_waiting_queue_is_fifo_without_skipping():
    sched = Scheduler(config(max_num_batched_tokens=64), KVCacheManager(6, BS))
    sched.add_request(Request(0, 0.0, 16, 2))
    serve(sched)
    sched.add_request(Request(1, 0.0, 12, 2))   # needs 3 blocks, only 1 free
    sched.add_request(Request(2, 0.0, 4, 2))    # would fit, but must not overtake
    step, _ = serve(sched)
    assert [r.request_id for r in sched.waiting] == [1, 2]
    assert step.batch.prefill_new == ()


@pytest.mark.parametrize("caching", [False, True])
def test_preemption_recomputes_the_newest_request_and_it_resumes(caching):
    # 7 blocks of 4 tokens; two requests of prompt 8 and 12 outputs need 5 blocks each at the end
    sched = Scheduler(config(enable_prefix_caching=caching), KVCacheManager(7, BS, enable_caching=caching))
    a, b = Request(0, 0.0, 8, 12), Request(1, 0.0, 8, 12)
    sched.add_request(a)
    sched.add_request(b)
    finished, preempted_at, steps = [], None, []
    for t in range(60):
        step, done = serve(sched, float(t))
        if step is None:
            break
        steps.append(step)
        finished += done
        if step.preempted and preempted_at is None:
            preempted_at = t
            assert [r.request_id for r in step.preempted] == [1]      # the most recently admitted
            assert list(sched.waiting)[0] is b and sched.progress(b)[0] == 0
            outputs_so_far = sched.progress(b)[1]
        sched.kv.check_invariants()
    assert preempted_at is not None and {r.request_id for r in finished} == {0, 1}
    assert b.num_preemptions == 1 and a.num_preemptions == 0
    assert a.num_output_tokens == b.num_output_tokens == 12
    # b's resume step recomputes its prompt and the outputs it had (minus its own blocks still cached)
    resume = next(s for s in steps[preempted_at + 1:] if b in [r for r, _ in s.prefills])
    n = dict((r.request_id, k) for r, k in resume.prefills)[1]
    cached = dict(zip([r.request_id for r, _ in resume.prefills], resume.batch.prefill_ctx))[1]
    assert cached + n == 8 + outputs_so_far
    assert (cached > 0) == caching


def test_async_scheduling_schedules_the_next_decode_before_the_previous_token_returns():
    sched = Scheduler(config(async_scheduling=True), KVCacheManager(100, BS))
    r = Request(0, 0.0, 6, 3)
    sched.add_request(r)
    s1 = sched.schedule(0.0)
    s2 = sched.schedule(0.0)                   # step 1 still in flight
    assert s1.batch.prefill_new == (6,) and s2.batch.decode_ctx == (7,)
    assert sched.progress(r) == (7, 0, 2)
    s3 = sched.schedule(0.0)
    assert s3.batch.decode_ctx == (8,)
    assert sched.schedule(0.0) is None         # 3 tokens in flight = all of its output
    for s in (s1, s2):
        assert sched.update(s, 1.0) == []
    assert sched.update(s3, 2.0) == [r] and r.num_output_tokens == 3


def test_pipeline_parallel_without_async_never_schedules_a_request_twice_in_flight():
    sched = Scheduler(config(), KVCacheManager(100, BS))
    r = Request(0, 0.0, 6, 3)
    sched.add_request(r)
    s1 = sched.schedule(0.0)
    assert sched.schedule(0.0) is None         # its token is in flight
    sched.update(s1, 1.0)
    assert sched.schedule(1.0).batch.decode_ctx == (7,)


def test_lone_request_latencies_are_the_step_times():
    """TTFT = host + prefill step; TPOT = host + decode step (sync), max(host, decode step) (async)."""
    pricer = LinearPricer(base=0.010, per_token=1e-4, host=0.003)
    prefill_s, decode_s = pricer.gpu(100), pricer.gpu(1)
    for async_scheduling, tpot in ((False, pricer.host + decode_s), (True, max(pricer.host, decode_s))):
        eng = engine(config(max_num_batched_tokens=256, async_scheduling=async_scheduling), 100, pricer)
        s = eng.run(iter([Request(0, 0.5, 100, 20)]))
        assert s["mean_ttft_ms"] == pytest.approx((pricer.host + prefill_s) * 1e3, rel=1e-9)
        assert s["mean_tpot_ms"] == pytest.approx(tpot * 1e3, rel=1e-9)
        assert s["median_itl_ms"] == pytest.approx(tpot * 1e3, rel=5e-4)   # histogram resolution


def test_pure_decode_batch_tpot_is_the_step_time():
    pricer = LinearPricer(base=0.008, per_token=2e-4, host=0.0)
    n = 16
    reqs = [Request(i, 0.0, 8, 40) for i in range(n)]     # one prefill step, then 39 decode steps of 16
    eng = engine(config(max_num_batched_tokens=256, max_num_seqs=64), 400, pricer)
    s = eng.run(iter(reqs))
    assert s["num_steps"] == 40
    assert s["mean_ttft_ms"] == pytest.approx(pricer.gpu(8 * n) * 1e3)
    assert s["mean_tpot_ms"] == pytest.approx(pricer.gpu(n) * 1e3)
    assert s["p99_tpot_ms"] == pytest.approx(pricer.gpu(n) * 1e3)


def test_pipeline_stages_overlap_steps_of_different_requests():
    pricer = LinearPricer(base=0.020, per_token=0.0, host=0.0)
    reqs = [Request(i, 0.0, 8, 10) for i in range(2)]
    # max_num_batched_tokens 8: the two prompts go to different micro-batches
    eng = engine(config(max_num_batched_tokens=8), 100, pricer, pp=2)
    s = eng.run(iter(reqs))
    launches = [launch for _, launch, _, _, _ in eng.recorder.steps]
    ends = [end for _, _, end, _, _ in eng.recorder.steps]
    assert all(b - a >= 0.010 - 1e-12 for a, b in zip(launches, launches[1:]))   # a stage is busy gpu/2
    assert all(e - l == pytest.approx(0.020) for l, e in zip(launches, ends))
    assert launches[1] == pytest.approx(0.010)           # the 2nd micro-batch enters while the 1st runs
    assert s["completed"] == 2 and s["mean_tpot_ms"] == pytest.approx(20.0)
    assert s["duration_s"] == pytest.approx(0.010 + 10 * 0.020)


def test_requests_that_cannot_fit_fail_instead_of_blocking_the_queue():
    eng = engine(config(), blocks=4, max_model_len=100)
    s = eng.run(iter([Request(0, 0.0, 90, 20), Request(1, 0.0, 12, 8), Request(2, 0.1, 4, 2)]))
    # 0 exceeds max_model_len; 1 needs 5 blocks > 4; 2 is served
    assert s["failed"] == 2 and s["completed"] == 1


def test_shared_system_prompts_hit_the_prefix_cache():
    reqs = [Request(i, 0.01 * i, 20, 4, (((SHARED_PREFIX, i % 2), 16), ((UNIQUE, i), 4))) for i in range(10)]
    eng = engine(config(), blocks=100)
    s = eng.run(iter(reqs))
    cached = [r.num_cached_tokens for r in sorted(eng.recorder.finished, key=lambda r: r.request_id)]
    assert cached == [0, 0] + [16] * 8
    assert s["prefix_cache_hit_rate"] == pytest.approx(8 * 16 / (10 * 20))


def test_data_parallel_routers():
    cfg = config()
    reqs = lambda: [Request(i, 0.001 * i, 20, 5, (((SHARED_PREFIX, i % 3), 16), ((UNIQUE, i), 4)))
                    for i in range(30)]
    for router in ("round_robin", "least_outstanding", "prefix_aware"):
        replicas = build_replicas(3, cfg, 100, LinearPricer)
        eng = Engine(replicas, router, recorder=Checker(cfg))
        s = eng.run(iter(reqs()))
        assert s["completed"] == 30
        by_replica = {}
        for r in eng.recorder.finished:
            by_replica.setdefault(r.replica, set()).add(r.request_id % 3)
        if router == "round_robin":
            assert all(len(groups) == 1 for groups in by_replica.values())    # i % 3 -> replica i % 3
        if router == "prefix_aware":
            # after the first request of each prompt, every request goes where its prompt is cached
            assert s["prefix_cache_hit_rate"] > 0.6
            assert sorted(len(g) for g in by_replica.values()) == [1, 1, 1]
    with pytest.raises(ValueError, match="did you mean 'round_robin'"):
        Engine(build_replicas(2, cfg, 10, LinearPricer), "round_robbin")


def test_deterministic_given_the_seed():
    def once(seed):
        eng = engine(config(), blocks=80, checker=False)
        return eng.run(lognormal_workload().requests(100, seed))
    a, b, c = once(5), once(5), once(6)
    np.testing.assert_equal(a, b)       # NaN (no SLO: no goodput) counts as equal
    assert a["mean_e2el_ms"] != c["mean_e2el_ms"]


def test_a_failed_turn_fails_the_rest_of_its_conversation():
    w = Workload(WorkloadConfig.from_config({
        "arrival": "poisson", "request_rate": 1.0, "turns": 4, "input": {"dist": "fixed", "value": 30},
        "output": {"dist": "fixed", "value": 30}}))
    # turn prompts: 30, 90, 150, 210 tokens; turn 3 (150 + 30 > 160) exceeds max_model_len
    s = engine(config(), blocks=200, max_model_len=160).run(w.requests(8, 0))
    assert s["completed"] == 4 and s["failed"] == 4


def test_decode_fast_path_changes_nothing(monkeypatch):
    """Skipping allocate_slots for decodes (and caching decode-filled blocks late) gives vLLM's results:
    compare with every decode calling allocate_slots, which caches each block in the step it fills."""
    w = Workload(WorkloadConfig.from_config({
        "arrival": "poisson", "request_rate": 40.0, "turns": 3, "think_time_s": 0.05, "system_prompts": 2,
        "system_prompt_len": 24, "input": {"dist": "lognormal", "mean": 20.0, "sigma": 0.5, "max": 60},
        "output": {"dist": "lognormal", "mean": 30.0, "sigma": 0.5, "max": 60}}))

    def once():
        return engine(config(), blocks=90, checker=False, max_model_len=512).run(w.requests(120, 4))

    fast = once()
    original = KVCacheManager.allocate_slots

    def every_call(self, request, *args, **kw):
        ok = original(self, request, *args, **kw)
        request.fast_limit = 0
        return ok

    monkeypatch.setattr(KVCacheManager, "allocate_slots", every_call)
    slow = once()
    assert fast["preemptions"] > 0 and fast["prefix_cache_hit_rate"] > 0.2
    np.testing.assert_equal(fast, slow)


def test_the_engine_refuses_a_negative_seed_in_one_line():
    from kernelsight.predictor.errors import KernelsightError

    with pytest.raises(KernelsightError) as e:
        engine(config(), blocks=16, seed=-1)
    assert str(e.value) == "seed=-1: must be an integer >= 0 (a random seed)"


def test_a_decode_run_waits_for_an_admission_that_could_come():
    """may_decode_run (what the engine asks before looking for a fast-forward horizon) is False exactly where
    decode_run must be None whatever the counters: nothing running, or a waiting request with a free sequence
    slot; a full batch lets the run go on past the queue."""
    sched = Scheduler(config(max_num_seqs=2), KVCacheManager(64, BS))
    assert not sched.may_decode_run() and sched.decode_run() is None
    for i in range(2):
        sched.add_request(Request(f"r{i}", 0.0, 6, 5))
    sched.update(sched.schedule(0.0), 0.1)          # both prompts in one step, a first token each
    assert sched.may_decode_run() and sched.decode_run().steps == 4
    sched.add_request(Request("late", 0.2, 6, 5))
    assert sched.may_decode_run()                   # max_num_seqs reached: "late" cannot be admitted yet
    single = Scheduler(config(max_num_seqs=3), KVCacheManager(64, BS))
    single.add_request(Request("a", 0.0, 6, 5))
    single.update(single.schedule(0.0), 0.1)
    single.add_request(Request("b", 0.2, 6, 5))
    assert not single.may_decode_run() and single.decode_run() is None   # "b" is admitted at the next step
    assert [r.request_id for r, _ in single.schedule(0.2).prefills] == ["b"]
