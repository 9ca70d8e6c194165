"""Fast-forwarded decode runs give what step-by-step simulation gives, on every output.

Each case simulates one workload twice from the same setup, with fast_forward on and off, writing the
run's files (recorder on) and keeping the request table: every summary metric (TTFT, TPOT, ITL, E2E
latency statistics, throughputs, KV and queue statistics, step count), the per-family GPU-time breakdown
and its phase split, the breakdown's sampled steps, requests.parquet, steps.parquet and trace.json
must match. Step times are computed with the event loop's own additions, so per-request and per-step
values are equal to the last bit; sums over many steps may differ in their last digits only (summation
order), far below the 0.1 % the fast-forward promises.
"""
import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kernelsight.sim.batch import StepBatch
from kernelsight.sim.compose import compose, typed_configs, workload_config
from kernelsight.sim.engine import Engine, build_replicas
from kernelsight.sim.graph import sampled_kernels, token_kernels
from kernelsight.sim.kv_cache import KVCacheManager
from kernelsight.sim.metrics import StreamingDistribution
from kernelsight.sim.pricing import DECODE_BLOCK, PREFIX_BLOCK, StepTime
from kernelsight.sim.run import build_setup, run
from kernelsight.sim.scheduler import SchedulerConfig
from kernelsight.sim.workload import Workload, WorkloadConfig

SUM_RTOL = 1e-9     # sums over steps (means, busy time, breakdown): summation order only
ROW_RTOL = 1e-12    # per-request and per-step values


def setup_of(groups: dict | None = None, tier: str = "auto", **overrides):
    cfg, sources = compose(groups, overrides or None)
    return build_setup(*typed_configs(cfg, sources), workload_config(cfg), tier=tier)


def simulate_both(tmp_path, n: int, groups: dict | None = None, tier: str = "auto", **overrides):
    """(step by step, fast-forwarded) results of one workload from one setup, with their output folders."""
    setup = setup_of(groups, tier, **overrides)
    out = {}
    for ff in (False, True):
        folder = tmp_path / ("fast" if ff else "steps")
        out[ff] = run(setup, n, seed=0, out_dir=folder, keep_requests=True, fast_forward=ff), folder
    return out[False], out[True]


# Metrics that are differences of step sums (idle = GPUs x duration - busy time, at idle power): their summation
# error is relative to the whole they are taken from, here the run's energy.
RELATIVE_TO = {"energy_j_idle": "energy_j"}


def relative_differences(slow, fast) -> dict:
    """Per summary metric, |fast - slow| / |slow| (0 where equal, NaN on both sides counts as equal)."""
    diffs = {}
    for key, a in slow.summary.items():
        b = fast.summary[key]
        if key == "wall_s" or (isinstance(a, float) and math.isnan(a) and math.isnan(b)):
            continue
        diffs[key] = 0.0 if a == b else abs(b - a) / abs(slow.summary[RELATIVE_TO.get(key, key)])
    return diffs


def check_equal(pair) -> dict:
    """Assert every output of the two runs matches; returns the summary's relative differences."""
    (slow, slow_dir), (fast, fast_dir) = pair
    diffs = relative_differences(slow, fast)
    assert max(diffs.values()) <= SUM_RTOL, {k: d for k, d in diffs.items() if d > SUM_RTOL}
    assert fast.summary["num_steps"] == slow.summary["num_steps"]
    pd.testing.assert_frame_equal(fast.breakdown, slow.breakdown, rtol=SUM_RTOL)
    assert fast.engine.breakdown.phase == pytest.approx(slow.engine.breakdown.phase, rel=SUM_RTOL)
    assert fast.engine.breakdown.sample == slow.engine.breakdown.sample
    pd.testing.assert_frame_equal(fast.requests, slow.requests, rtol=ROW_RTOL)
    for table in ("requests.parquet", "steps.parquet"):
        pd.testing.assert_frame_equal(pq.read_table(fast_dir / table).to_pandas(),
                                      pq.read_table(slow_dir / table).to_pandas(), rtol=ROW_RTOL)
    assert json.loads((fast_dir / "trace.json").read_text()) == json.loads((slow_dir / "trace.json").read_text())
    return diffs


def fast_forwarded(pair) -> float:
    """Share of the run's steps that were fast-forwarded."""
    fast = pair[1][0]
    return fast.engine.fast_forwarded_steps / fast.summary["num_steps"]


SHAREGPT_LIKE = {"input": {"dist": "lognormal", "mean": 161.31, "sigma": 1.0, "min": 1, "max": 2048},
                 "output": {"dist": "lognormal", "mean": 337.99, "sigma": 0.8, "min": 1, "max": 2048}}


# (config groups, overrides, requests, least share of the steps fast-forwarded)
@pytest.mark.parametrize("groups, overrides, n, share", [
    pytest.param({}, {}, 300, 0.5, id="poisson"),
    pytest.param({"workload": "closed_loop"}, {"workload.max_concurrency": 16}, 200, 0.5, id="closed_loop"),
    pytest.param({"workload": "shared_prefix"}, {}, 200, 0.5, id="shared_prefix"),
    pytest.param({"workload": "multi_turn"}, {}, 200, 0.5, id="multi_turn"),
    pytest.param({}, {"workload.output.value": 1500, "workload.request_rate": 2.0}, 60, 0.5, id="long_outputs"),
    pytest.param({"parallel": "tp2"}, {}, 200, 0.5, id="tp2"),
    pytest.param({}, {"engine.host.async_scheduling": True}, 300, 0.5, id="async_scheduling"),
    # replicas bound each other's runs (their steps keep the order step by step gives them)
    pytest.param({}, {"parallel.dp": 2, "router": "round_robin"}, 300, 0.05, id="dp2"),
    pytest.param({"workload": "closed_loop", "engine": "transformers_cb"}, {"workload.max_concurrency": 8}, 60,
                 0.3, id="flat_attention"),
])
def test_fast_forward_equals_step_by_step(tmp_path, groups, overrides, n, share):
    pair = simulate_both(tmp_path, n, groups, **overrides)
    check_equal(pair)
    assert fast_forwarded(pair) > share


def test_runs_reach_the_next_delivery_through_the_frontend_jitter(tmp_path):
    """vllm_v1's frontend path (5 ms + exponential 10 ms jitter): the horizon knows the next arrival's jitter (drawn
    ahead, the same draw its send takes), so a run goes on until that request reaches the scheduler instead of
    stopping one frontend latency after its arrival and stepping singly up to the delivery. Most single steps
    are then the admissions themselves (one per request); with the latency alone as the lead, two per request."""
    pair = simulate_both(tmp_path, 300)
    check_equal(pair)
    fast = pair[1][0]
    single = fast.summary["num_steps"] - fast.engine.fast_forwarded_steps
    assert single < 1.6 * 300


def test_jitter_read_ahead_is_the_draws_one_at_a_time():
    """_jitter_ahead hands out the generator's single draws in order, however far ahead it reads."""
    engine = Engine(build_replicas(1, SchedulerConfig(64, 8), 100, lambda: None), frontend_jitter_s=0.01, seed=7)
    ahead = engine._jitter_ahead(3)
    engine._jitter_next += 1
    later = engine._jitter_ahead(300)
    single = np.random.default_rng(7)
    expected = [single.exponential(0.01) for _ in range(301)]
    assert ahead == expected[:3] and later == expected[1:]


def test_sharegpt_like_trace(tmp_path):
    """A replayed trace of ShareGPT-like lengths, some prompts sharing hashed blocks."""
    rng = np.random.default_rng(3)
    n = 300
    lengths = {k: np.clip(np.rint(rng.lognormal(np.log(s["mean"]) - s["sigma"] ** 2 / 2, s["sigma"], n)), 1, 2048)
               for k, s in SHAREGPT_LIKE.items()}
    trace = pd.DataFrame({"arrival_time": np.cumsum(rng.exponential(1 / 20.0, n)),
                          "input_len": lengths["input"].astype(int), "output_len": lengths["output"].astype(int)})
    path = tmp_path / "sharegpt_like.csv"
    trace.to_csv(path, index=False)
    pair = simulate_both(tmp_path, n, {"workload": "trace"}, **{"workload.trace_file": str(path)})
    check_equal(pair)
    assert fast_forwarded(pair) > 0.3


def test_moe_model_at_roofline_pricing(tmp_path):
    pair = simulate_both(tmp_path, 200, {"model": "qwen3-30b-a3b"}, tier="roofline")
    check_equal(pair)
    assert fast_forwarded(pair) > 0.3


def test_preemptions_under_kv_pressure(tmp_path):
    """A KV cache that fills up: runs stop where a step would find no free block, and preemption, recompute
    and re-admission go step by step as before."""
    pair = simulate_both(tmp_path, 400, {"model": "llama3.1-70b", "parallel": "tp4", "workload": "sharegpt"},
                         **{"engine.scheduler.gpu_memory_utilization": 0.5, "workload.request_rate": 40.0})
    check_equal(pair)
    assert pair[1][0].summary["preemptions"] > 0


SLIDING_CASES = [
    pytest.param({"model": "gpt-oss-20b"}, {"workload.input.value": 3000, "workload.output.value": 400,
                                            "workload.request_rate": 30.0,
                                            "engine.scheduler.gpu_memory_utilization": 0.3}, 300, id="kv_pressure"),
    pytest.param({"model": "gemma-3-1b", "workload": "multi_turn"}, {"engine.scheduler.gpu_memory_utilization": 0.1},
                 200, id="prefix_hits"),
    pytest.param({"model": "llama4-scout", "parallel": "tp8"}, {"workload.input.value": 12000,
                                                                "workload.output.value": 300,
                                                                "workload.request_rate": 4.0}, 60, id="chunked"),
]


@pytest.mark.parametrize("groups, overrides, n", SLIDING_CASES)
def test_sliding_window_groups(tmp_path, groups, overrides, n):
    """Sliding-window KV groups give blocks back as they take new ones: runs with and without the recorder
    (whose fast-forward takes blocks one call at a time) match step-by-step simulation."""
    pair = simulate_both(tmp_path, n, groups, **overrides)
    check_equal(pair)
    setup = setup_of(groups, **overrides)
    assert setup.sliding is not None
    slow, fast = (run(setup, n, seed=0, fast_forward=ff) for ff in (False, True))
    assert max(relative_differences(slow, fast).values()) <= SUM_RTOL
    assert fast.engine.fast_forwarded_steps > 0.25 * fast.summary["num_steps"]
    for replica in fast.engine.replicas:
        replica.kv.check_invariants()
    if groups["model"] == "gpt-oss-20b":     # the cache fills up: preemptions go step by step
        assert fast.summary["preemptions"] > 0


def test_repeated_values_count_as_copies():
    """ITL gaps shared by a run's requests enter the histogram once with a count: the same statistics."""
    values = np.array([0.0101, 0.0093, 0.0127])
    copies, counted = StreamingDistribution(), StreamingDistribution()
    copies.add_array(np.repeat(values, 7))
    copies.add(0.02)
    counted.add_repeated(values, 7)
    counted.add(0.02)
    assert counted.count == copies.count == 22
    assert counted.mean == pytest.approx(copies.mean, rel=1e-12)
    assert counted.std == pytest.approx(copies.std, rel=1e-9)
    assert np.array_equal(counted.counts, copies.counts)
    assert [counted.quantile(q) for q in (0.1, 0.5, 0.99)] == [copies.quantile(q) for q in (0.1, 0.5, 0.99)]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_blocks_filled_by_decodes_cached_at_free_change_nothing(monkeypatch, async_scheduling):
    """append_block leaves the blocks decodes fill for free() to cache: the same results as caching each in the
    step that fills it (allocate_slots), with preemptions and later turns hitting earlier turns' outputs."""
    w = Workload(WorkloadConfig.from_config({
        "arrival": "poisson", "request_rate": 40.0, "turns": 3, "think_time_s": 0.05, "system_prompts": 2,
        "system_prompt_len": 24, "input": {"dist": "lognormal", "mean": 20.0, "sigma": 0.5, "max": 60},
        "output": {"dist": "lognormal", "mean": 30.0, "sigma": 0.5, "max": 60}}))

    class Linear:
        def step_time(self, batch):
            return StepTime(0.006 + 4e-5 * batch.num_tokens, 0.001, 0.007 + 4e-5 * batch.num_tokens)

    def once():
        cfg = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=32, block_size=4,
                              async_scheduling=async_scheduling)
        return Engine(build_replicas(1, cfg, 90, Linear), max_model_len=512).run(w.requests(120, 4))

    late = once()
    monkeypatch.setattr(KVCacheManager, "append_block",
                        lambda self, request, computed: self.allocate_slots(request, computed, computed + 1, 1))
    eager = once()
    assert late["preemptions"] > 0 and late["prefix_cache_hit_rate"] > 0.2
    np.testing.assert_equal(late, eager)


@pytest.mark.parametrize("groups", [None, {"model": "gemma2-9b"}, {"engine": "transformers_cb"}],
                         ids=["dense", "sliding_window", "flat_attention"])
def test_a_decode_run_is_priced_as_each_of_its_steps(groups):
    """pricer.decode_run equals step_time and breakdown() (joules too) of every step's batch, to the last bit."""
    pricer = setup_of(groups).pricer
    rng = np.random.default_rng(1)
    for n, steps in ((1, 40), (7, 300), (130, 25)):
        ctx = rng.integers(1, 6000, n)
        plain, parts = pricer.decode_run(ctx, steps), pricer.decode_run(ctx, steps, breakdown=True)
        for j in range(steps):
            batch = StepBatch(decode_ctx=tuple((ctx + j).tolist()))
            each = pricer.step_time(batch)
            assert (plain.gpu_s[j], plain.host_s) == (each.gpu_s, each.host_s)
            bd = pricer.breakdown(batch)
            family = dict(parts.families)
            family["attn_decode"] = family.get("attn_decode", 0.0) + parts.attention_s[j]
            if parts.launch_s[j]:
                family["launch"] = parts.launch_s[j]
            assert (parts.gpu_s[j], family, parts.decode_phase_s[j]) == (bd["gpu_s"], bd["family"],
                                                                        bd["phase"]["decode"])
            energy = dict(parts.energy_families)
            energy["attn_decode"] = energy.get("attn_decode", 0.0) + parts.attention_j[j]
            if parts.launch_s[j]:
                energy["launch"] = parts.launch_j[j]
            assert energy == bd["energy"]


def test_token_table_priced_in_blocks_equals_the_whole_table():
    pricer = setup_of().pricer
    whole = pricer._table(token_kernels(pricer.model, pricer.parallel, pricer.engine,
                                        np.arange(1, pricer.max_tokens + 1), pricer.shard))
    assert [pricer._token_s(t) for t in range(1, pricer.max_tokens + 1)] == whole.sum(axis=0)[1:].tolist()


def test_sampled_table_priced_in_blocks_equals_the_whole_table():
    pricer = setup_of().pricer
    sizes = np.arange(1, pricer.engine.scheduler.max_num_seqs + 1)
    whole = pricer._table(sampled_kernels(pricer.model, pricer.parallel, sizes, pricer.shard))
    assert [pricer._sampled_s(n) for n in sizes.tolist()] == whole.sum(axis=0)[1:].tolist()


@pytest.mark.parametrize("groups", [None, {"model": "gpt-oss-120b", "parallel": "tp8"},
                                    {"model": "llama4-scout", "parallel": "tp8"}],
                         ids=["dense", "sliding_window", "chunked"])
def test_attention_tables_priced_in_blocks_equal_the_whole_tables(groups):
    """Decode tables priced a block of KV lengths at a time for groups of batch sizes, and prefill tables a
    block of new-token counts x prefixes at a time, equal each kind's table priced whole (seconds and joules)."""
    pricer = setup_of(groups).pricer
    grid, news, prefixes = pricer._kv_grid_array, pricer._new_grid, pricer._prefix_grid
    for kind in range(len(pricer.kinds)):
        for n in (1, 7, 8, 9, 130):
            table = pricer._decode_table(kind, n, 3 * DECODE_BLOCK - 1, 3 * DECODE_BLOCK)  # two blocks
            whole = [v.tolist() for v in pricer._price_j([pricer._decode_call(kind, n, grid)])[0]]
            priced = [j for j in range(len(grid)) if table.priced[j // DECODE_BLOCK]]
            assert len(priced) == 2 * DECODE_BLOCK
            for values, expected in ((table.seconds, whole[0]), (table.joules, whole[1])):
                assert [values[j] for j in priced] == [expected[j] for j in priced]
        for row, column in ((0, 0), (37, 9), (len(news) - 1, len(prefixes) - 1)):
            pricer._prefill_block(kind, row, column)
            call = pricer._prefill_call(kind, np.full(len(prefixes), news[row]), np.asarray(prefixes))
            whole = [v.tolist() for v in pricer._price_j([call])[0]]
            block = range(column // PREFIX_BLOCK * PREFIX_BLOCK, min(len(prefixes), (column // PREFIX_BLOCK + 1) *
                                                                     PREFIX_BLOCK))
            for table, expected in ((pricer._prefill, whole[0]), (pricer._prefill_j, whole[1])):
                assert [table[kind][row][c] for c in block] == [expected[c] for c in block]
