"""Attention data-parallel ranks step in lockstep (engine.LockstepGroup), as vLLM's data-parallel engines do on a MoE
model: a rank with nothing scheduled runs a dummy batch, and where every rank's batch fits a CUDA graph all are
padded to the largest rank's tokens."""
import warnings
from dataclasses import replace

import pytest
from hydra import compose, initialize_config_dir

from kernelsight.cli.config import container, typed_configs
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import conf_dir
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.engine import Engine, LockstepGroup, build_replicas
from kernelsight.sim.pricing import StepTime
from kernelsight.sim.report import BreakdownAccumulator
from kernelsight.sim.request import Request
from kernelsight.sim.run import build_setup, run
from kernelsight.sim.scheduler import SchedulerConfig
from kernelsight.sim.workload import Workload, WorkloadConfig

GRAPH_TOKENS = 64


class RecordingPricer:
    """Token-wise kernels at the forward's tokens, attention per real token; CUDA graphs up to GRAPH_TOKENS."""

    def __init__(self):
        self.batches = []

    def graphed(self, batch):
        return batch.forward_tokens <= GRAPH_TOKENS

    def step_time(self, batch):
        self.batches.append(batch)
        gpu = 0.004 + 4e-5 * batch.forward_tokens + 1e-5 * batch.num_tokens
        return StepTime(gpu, 0.001, gpu + 0.001)


def lockstep_engine(ranks: int, router="round_robin", **sched):
    cfg = SchedulerConfig(**{"max_num_batched_tokens": 512, "max_num_seqs": 64, "block_size": 16, **sched})
    pricer = RecordingPricer()
    replicas = build_replicas(ranks, cfg, 2000, lambda: pricer, lockstep=ranks)
    return Engine(replicas, router), pricer


def fixed(prompt: int, output: int, clients: int) -> Workload:
    return Workload(WorkloadConfig.from_config({
        "name": "closed_loop", "arrival": "poisson", "request_rate": float("inf"), "max_concurrency": clients,
        "input": {"dist": "fixed", "value": prompt}, "output": {"dist": "fixed", "value": output}}))


def test_an_idle_rank_runs_a_dummy_batch_every_step_and_the_ranks_share_one_pipeline():
    engine, pricer = lockstep_engine(2)
    summary = engine.run(fixed(40, 10, 1).requests(1, 0))
    assert summary["completed"] == 1
    assert engine.replicas[0].group is engine.replicas[1].group
    assert isinstance(engine.replicas[0].group, LockstepGroup)
    real = [b for b in pricer.batches if b.num_tokens]
    dummies = [b for b in pricer.batches if not b.num_tokens]
    assert len(real) == len(dummies) == summary["num_steps"] == 10   # one prefill, nine decodes
    # the prompt's step is graphed (40 <= 64 tokens): the dummy is padded to it; decodes pad to 1
    assert [d.dp_tokens for d in dummies] == [40] + [1] * 9
    assert [b.forward_tokens for b in real] == [40] + [1] * 9


def test_ranks_pad_to_the_largest_only_where_every_batch_fits_a_cuda_graph():
    for prompt, padded in ((48, True), (200, False)):   # 200 tokens: that rank runs eagerly, so all do
        engine, pricer = lockstep_engine(2)
        # rank 0 decodes its request when rank 1's request arrives (round robin) and is prefilled
        engine.run([Request(0, 0.0, 8, 40), Request(1, 0.05, prompt, 2)])
        i = next(i for i, b in enumerate(pricer.batches) if b.prefill_new and b.prefill_new[0] == prompt)
        rank0 = pricer.batches[i - 1]   # the ranks are priced in order in each step
        assert rank0.decode_ctx and not rank0.prefill_new
        assert rank0.forward_tokens == (prompt if padded else 1), (prompt, rank0)
        assert pricer.batches[i].forward_tokens == prompt


def test_the_step_takes_the_slowest_rank_and_both_ranks_see_the_same_token_times():
    engine, pricer = lockstep_engine(2)
    summary = engine.run(fixed(40, 20, 2).requests(2, 0))
    # in phase: both ranks prefill 40 tokens, then decode 1 token each, 19 times
    step = [0.004 + 4e-5 * 40 + 1e-5 * 40 + 0.001] + [0.004 + 4e-5 + 1e-5 + 0.001] * 19
    assert summary["mean_ttft_ms"] == pytest.approx(step[0] * 1e3)
    assert summary["mean_tpot_ms"] == pytest.approx(step[1] * 1e3)


def test_lockstep_groups_must_divide_the_replicas():
    cfg = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=64, block_size=16)
    with pytest.raises(KernelsightError, match="3 replicas do not form lockstep groups of 2"):
        build_replicas(3, cfg, 100, RecordingPricer, lockstep=2)


# ----- with the real pricer -----

def moe_setup(*overrides, attention_dp=2):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="simulate", overrides=["model=qwen3-30b-a3b", "predictor.tier=roofline",
                                                         f"parallel.attention_dp={attention_dp}",
                                                         f"parallel.ep={attention_dp}", *overrides])
    model, hw, engine, parallel = typed_configs(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # roofline pricing warns
        return build_setup(model, hw, engine, parallel, WorkloadConfig.from_config(container(cfg.workload)),
                           tier="roofline")


def test_a_dummy_or_padded_batch_is_priced_by_its_tables_as_kernel_by_kernel():
    pricer = moe_setup().pricer
    prompt = StepBatch(prefill_new=(600,), prefill_ctx=(0,), prefill_sampled=1)   # beyond CUDA graphs: eager
    for batch in (StepBatch(dp_tokens=1), StepBatch(dp_tokens=40), StepBatch(decode_ctx=(900,) * 3, dp_tokens=48),
                  StepBatch(prefill_new=(30,), prefill_ctx=(0,), prefill_sampled=1, dp_tokens=200),
                  replace(prompt, moe_tokens=601), StepBatch(dp_tokens=1, moe_tokens=601)):
        tables, exact = pricer.step_time(batch), pricer.step_time(batch, exact=True)
        assert tables.gpu_s == pytest.approx(exact.gpu_s, rel=5e-3), batch
        parts = pricer.breakdown(batch)
        assert sum(parts["family"].values()) == pytest.approx(parts["gpu_s"], rel=1e-9)
        assert parts["gpu_s"] == pytest.approx(tables.gpu_s, rel=1e-12)
    # run eagerly beside a dummy batch, the prompt's MoE layers take 601 tokens, not 2 x 600 as equal batches would
    assert pricer.step_time(replace(prompt, moe_tokens=601)).gpu_s < pricer.step_time(prompt).gpu_s
    moe = {k.call.name: k.call.cols["tokens"] for k in pricer.kernels(replace(prompt, moe_tokens=601))
           if k.call.family == "moe"}
    assert moe and set(moe.values()) == {602}   # each rank's share rounded up: ceil(601 / 2) x 2
    own = pricer.step_time(StepBatch(decode_ctx=(900,) * 3))
    assert pricer.step_time(StepBatch(decode_ctx=(900,) * 3, dp_tokens=48)).gpu_s > own.gpu_s
    assert pricer.kernels(StepBatch(dp_tokens=8)) and not any(
        k.call.family.startswith("attn") for k in pricer.kernels(StepBatch(dp_tokens=8)))


def test_ranks_in_phase_run_as_one_group_would_and_out_of_phase_they_pay_for_padding():
    setup = moe_setup("engine.frontend.jitter_ms=0")   # requests reach the ranks when sent: they stay in phase
    both = run_closed(setup, clients=8)
    setup.one_group = True   # one rank with its half of the clients (how validate simulates such rows)
    one = run_closed(setup, clients=4)
    for key in ("mean_ttft_ms", "mean_tpot_ms"):
        assert both[key] == pytest.approx(one[key], rel=1e-9)
    # open-loop arrivals put prefills on one rank while the other decodes: its decodes are padded
    setup = moe_setup("workload=sharegpt", "workload.request_rate=30")
    acc = BreakdownAccumulator()
    engine = setup.new_engine(0, breakdown=acc)
    lockstep = engine.run(setup.workload.requests(300, 0))
    setup.replicas = lambda: build_replicas(2, setup.scheduler, setup.num_blocks, lambda: setup.pricer)
    apart = setup.new_engine(0).run(setup.workload.requests(300, 0))
    assert lockstep["completed"] == apart["completed"] == 300
    assert lockstep["mean_tpot_ms"] > 1.01 * apart["mean_tpot_ms"]
    assert acc.family["decode"].get("dp_wait", 0.0) > 0   # the faster rank waits for the slower one


def run_closed(setup, clients: int) -> dict:
    workload = fixed(512, 32, clients)
    setup = replace(setup, workload=workload)
    return run(setup, 3 * clients, seed=0, breakdown=False).summary
