"""Whole simulations: Little's law, closed-loop concurrency, and `kernelsight simulate` end to end."""
import json
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import conf_dir
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.engine import Engine, build_replicas
from kernelsight.sim.pricing import StepTime
from kernelsight.sim.report import BreakdownAccumulator
from kernelsight.sim.scheduler import SchedulerConfig
from kernelsight.cli.simulate import KEY_COLUMNS, simulate
from kernelsight.predictor.outputs import append_row
from kernelsight.sim.workload import Workload, WorkloadConfig

CLI = "import sys; from kernelsight import cli; cli.main(['simulate', *sys.argv[1:]])"


class LinearPricer:
    def step_time(self, batch):
        gpu = 0.006 + 4e-5 * batch.num_tokens
        return StepTime(gpu, 0.001, gpu + 0.001)


class Rows:
    """Recorder keeping finished requests."""

    def __init__(self):
        self.requests = []

    def step(self, *args):
        pass

    def request(self, req, latencies):
        self.requests.append(req)


def run_engine(workload: dict, n: int, blocks=2000, seed=0, frontend=(0.0, 0.0), **sched):
    cfg = SchedulerConfig(**{"max_num_batched_tokens": 512, "max_num_seqs": 64, "block_size": 16, **sched})
    w = Workload(WorkloadConfig.from_config(workload))
    eng = Engine(build_replicas(1, cfg, blocks, LinearPricer), max_concurrency=w.max_concurrency, recorder=Rows(),
                 frontend_latency_s=frontend[0], frontend_jitter_s=frontend[1], seed=seed)
    return eng.run(w.requests(n, seed)), eng.recorder.requests


SHAREGPT_LIKE = {"input": {"dist": "lognormal", "mean": 161.31, "sigma": 1.0, "max": 2048},
                 "output": {"dist": "lognormal", "mean": 100.0, "sigma": 0.8, "max": 1024}}


@pytest.mark.parametrize("blocks", [2000, 120])     # 120 blocks: KV pressure, preemptions re-queue requests
def test_littles_law_holds_for_the_system_and_the_waiting_queue(blocks):
    rate = 12.0
    s, reqs = run_engine({"arrival": "poisson", "request_rate": rate, **SHAREGPT_LIKE}, 1500, blocks=blocks)
    lam = s["request_throughput"]
    if blocks == 2000:      # a stable queue serves what arrives (the small pool cannot keep up)
        assert lam == pytest.approx(rate, rel=0.08)
    # time-averaged counts from the event loop = arrival rate x mean time, from per-request timestamps
    assert s["mean_requests_in_system"] == pytest.approx(lam * s["mean_e2el_ms"] / 1e3, rel=1e-9)
    assert s["mean_requests_waiting"] == pytest.approx(lam * s["mean_queue_ms"] / 1e3, rel=1e-9)
    assert s["mean_requests_waiting"] > 0
    if blocks == 120:
        assert s["preemptions"] > 0


def test_closed_loop_holds_the_concurrency_at_every_instant():
    c = 8
    s, reqs = run_engine({"arrival": "poisson", "request_rate": float("inf"), "max_concurrency": c,
                          **SHAREGPT_LIKE}, 300)
    assert s["completed"] == 300 and s["max_concurrent_requests"] == c
    events = sorted([(r.arrival_time, 1) for r in reqs] + [(r.finish_time, -1) for r in reqs],
                    key=lambda e: (e[0], e[1]))       # a finish frees its slot before the next send
    level, levels = 0, []
    for t, d in events:
        level += d
        levels.append((t, level))
    assert max(l for _, l in levels) == c
    # while requests remain to be sent, every finish is immediately followed by a send
    sends = sorted(r.arrival_time for r in reqs)
    finishes = sorted(r.finish_time for r in reqs)
    assert sends[:c] == [0.0] * c
    np.testing.assert_allclose(sends[c:], finishes[:300 - c])


def test_frontend_delay_counts_in_ttft_and_makes_a_closed_loop_client_miss_the_next_step():
    closed = {"arrival": "poisson", "request_rate": float("inf"), "max_concurrency": 1,
              "input": {"dist": "fixed", "value": 100}, "output": {"dist": "fixed", "value": 5}}
    # One client: without a frontend its next request joins the step scheduled at its finish (TTFT = one
    # prefill step); 2 ms of frontend latency lands it mid-step on an idle engine: TTFT = 2 ms + the prefill.
    prefill = 0.006 + 4e-5 * 100 + 0.001
    _, plain = run_engine(closed, 4)
    _, delayed = run_engine(closed, 4, frontend=(0.002, 0.0))
    assert [r.first_token_time - r.arrival_time for r in plain] == pytest.approx([prefill] * 4)
    assert [r.first_token_time - r.arrival_time for r in delayed] == pytest.approx([0.002 + prefill] * 4)
    # Two clients out of phase: at a finish the engine at once schedules a decode step of the other client.
    # Without a frontend the next request joins it (TTFT = one mixed step); 1 ms late, it waits that decode
    # step out first (TTFT = decode step + mixed step).
    decode, mixed = 0.006 + 4e-5 * 1 + 0.001, 0.006 + 4e-5 * 101 + 0.001
    two = {**closed, "max_concurrency": 2, "ramp_up_s": 0.03}

    def resubmitted_ttfts(frontend):
        return [r.first_token_time - r.arrival_time for r in run_engine(two, 8, frontend=frontend)[1][2:]]

    assert resubmitted_ttfts((0.0, 0.0)) == pytest.approx([mixed] * 6)
    assert resubmitted_ttfts((0.001, 0.0)) == pytest.approx([decode + mixed] * 6)
    # Jitter is seeded: the same seed gives the same run, another seed another.
    a = [r.first_token_time for r in run_engine(two, 20, frontend=(0.001, 0.004), seed=1)[1]]
    b = [r.first_token_time for r in run_engine(two, 20, frontend=(0.001, 0.004), seed=1)[1]]
    c = [r.first_token_time for r in run_engine(two, 20, frontend=(0.001, 0.004), seed=2)[1]]
    assert a == b and a != c
    with pytest.raises(KernelsightError, match="must be >= 0"):
        run_engine(closed, 1, frontend=(-0.001, 0.0))


def test_goodput_counts_requests_meeting_every_slo():
    w = {"arrival": "poisson", "request_rate": 20.0, **SHAREGPT_LIKE}
    cfg = SchedulerConfig(512, 64, 16)
    eng = Engine(build_replicas(1, cfg, 2000, LinearPricer), slo_ms={"ttft_ms": 30.0, "tpot_ms": 12.0},
                 recorder=Rows())
    s = eng.run(Workload(WorkloadConfig.from_config(w)).requests(400, 1))
    good = sum(1 for r in eng.recorder.requests
               if (r.first_token_time - r.arrival_time) * 1e3 <= 30.0
               and (r.output_len == 1 or (r.finish_time - r.first_token_time) / (r.output_len - 1) * 1e3 <= 12.0))
    assert 0 < good < 400
    assert s["request_goodput"] == pytest.approx(good / s["duration_s"])


def composed(*overrides):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="simulate", overrides=list(overrides))


def test_simulate_with_the_real_pricer_writes_every_output(tmp_path, capsys):
    out = tmp_path / "out"
    summary = simulate(composed("num_requests=40", "workload=shared_prefix", f"output_dir={out}",
                                "trace_kernel_steps=2", "slo.ttft_ms=200"))
    text = capsys.readouterr().out
    assert "Serving Simulation Result" in text and "Mean TTFT (ms)" in text and "GPU time by kernel family" in text
    assert summary["completed"] == 40 and summary["prefix_cache_hit_rate"] > 0.3
    assert 0 < summary["request_goodput"] <= summary["request_throughput"]
    requests = pq.read_table(out / "requests.parquet").to_pandas()
    assert len(requests) == 40 and (requests["ttft_ms"] > 0).all()
    assert requests["e2el_ms"].mean() == pytest.approx(summary["mean_e2el_ms"])
    steps = pq.read_table(out / "steps.parquet").to_pandas()
    assert len(steps) == summary["num_steps"] and (steps["end_s"] > steps["launch_s"]).all()
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    kernels = [e for e in trace if e.get("tid") == 2]
    assert {"qkv_proj", "o_proj", "down_proj"} <= {e["name"] for e in kernels}
    breakdown = pd.read_csv(out / "breakdown.csv", comment="#", index_col="family")
    assert breakdown.loc["gemm", "share"] > 0.5 and breakdown["share"].sum() == pytest.approx(1.0)
    written = json.loads((out / "summary.json").read_text())
    assert written["completed"] == 40
    assert "Priced by (share of family time)" in text and "target: target/h100_sxm/gemm" in text
    gemm = [s for s in written["pricing_sources"] if s["family"] == "gemm"]
    assert [(s["tier"], s["model"], s["time_share"]) for s in gemm] == [("target", "target/h100_sxm/gemm", 1.0)]
    for png in ("latency_cdf.png", "timeline.png", "breakdown.png"):
        assert (out / png).stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the staging folder became out: nothing left beside


def test_output_dir_is_refused_when_not_empty_and_replaced_whole_with_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(KernelsightError, match=r"output_dir=.*out: not empty; pass overwrite=true") as e:
        simulate(composed("num_requests=5", f"output_dir={out}"))
    assert "\n" not in str(e.value) and [p.name for p in out.iterdir()] == ["notes.txt"]
    simulate(composed("num_requests=5", f"output_dir={out}", "overwrite=true", "plots=false"))
    assert sorted(p.name for p in out.iterdir()) == ["breakdown.csv", "requests.parquet", "steps.parquet",
                                                     "summary.json", "trace.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(KernelsightError, match=r"output_dir=.*file/run: .*file is a file, not a directory"):
        simulate(composed("num_requests=5", f"output_dir={tmp_path / 'file' / 'run'}"))


def test_a_failed_run_leaves_output_dir_as_it_was(tmp_path, monkeypatch):
    from kernelsight.cli import simulate as command

    out = tmp_path / "out"
    simulate(composed("num_requests=5", f"output_dir={out}", "plots=false"))
    before = (out / "summary.json").read_text()

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "write_run_outputs", crash)
    with pytest.raises(KeyboardInterrupt) as e:
        simulate(composed("num_requests=7", f"output_dir={out}", "overwrite=true"))
    assert e.value.kept == "nothing written (output_dir unchanged)"
    assert (out / "summary.json").read_text() == before and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_results_table_keeps_its_rows_and_a_foreign_csv_is_refused_before_the_run(tmp_path, capsys):
    table = tmp_path / "runs.csv"
    simulate(composed("num_requests=5", f"results_table={table}"))
    simulate(composed("num_requests=6", f"results_table={table}", "hardware=a100_sxm"))
    runs = pd.read_csv(table)
    assert list(runs["hardware"]) == ["h100_sxm", "a100_sxm"] and list(runs["completed"]) == [5, 6]
    assert len(pd.read_parquet(table.with_suffix(".parquet"))) == 2
    mine = tmp_path / "mine.csv"
    mine.write_text("name,score\nx,1\n")
    capsys.readouterr()
    with pytest.raises(KernelsightError, match=r"results_table=.*mine.csv: exists and is not a kernelsight results "
                                               r"table \(no model, hardware, engine, workload column\)"):
        simulate(composed("num_requests=5", f"results_table={mine}"))
    assert "Serving Simulation Result" not in capsys.readouterr().out  # refused before simulating
    assert mine.read_text() == "name,score\nx,1\n" and not mine.with_suffix(".parquet").exists()


@pytest.mark.parametrize("overrides, message", [
    (["workload.input.dist=lognorm"], r"workload.input.dist='lognorm'.*did you mean 'lognormal'"),
    (["+workload.foo=1"], r"workload.foo: unknown field"),
    (["router=random"], r"router='random': unknown router"),
    (["slo.ttft_ms=-5"], r"slo.ttft_ms=-5: must be a positive number"),
    (["num_requests=0"], r"num_requests=0: must be an integer >= 1 \(null: every row of a trace\)"),
    (["seed=-1"], r"seed=-1: must be an integer >= 0 \(a random seed\)"),
    (["parallel=tp8", "model=phi-4"], r"model phi-4 with tp=8: tp=8 does not divide the 10 KV heads"),
])
def test_bad_configs_are_one_line_errors(overrides, message):
    with pytest.raises(KernelsightError, match=message) as e:
        simulate(composed("num_requests=5", *overrides))
    assert "\n" not in str(e.value)


def test_trace_with_a_negative_length_fails_on_the_command_line(tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text("arrival_time,input_len,output_len\n0,100,10\n0.5,-20,10\n")
    done = subprocess.run([sys.executable, "-c", CLI, "workload=trace", f"workload.trace_file={trace}",
                           "num_requests=null"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"kernelsight simulate: error: {trace}: row 3: input_len = -20 is negative"]


def test_multirun_with_the_joblib_launcher_writes_one_row_per_run(tmp_path):
    done = subprocess.run([sys.executable, "-c", CLI, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                           "workload.request_rate=4,16", "num_requests=20", "plots=false",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "sweep" / "simulate_runs.csv")
    assert sorted(table["request_rate"]) == [4.0, 16.0]
    assert (table["completed"] == 20).all() and table["mean_ttft_ms"].notna().all()
    assert len(pd.read_parquet(tmp_path / "sweep" / "simulate_runs.parquet")) == 2


def test_concurrent_jobs_never_lose_a_row(tmp_path):
    table = tmp_path / "runs.csv"
    row = dict.fromkeys(KEY_COLUMNS, "x")
    threads = [threading.Thread(target=append_row, args=(table, {**row, "job": i, "x": i * 1.5}, KEY_COLUMNS))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(pd.read_csv(table)["job"]) == list(range(8))


def test_help_describes_the_command():
    done = subprocess.run([sys.executable, "-c", CLI, "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    assert "kernelsight simulate: how fast does a model serve" in done.stdout
    assert "workload: " in done.stdout and "sharegpt" in done.stdout


def test_breakdown_keeps_an_even_sample_of_steps_within_its_bounds():
    acc = BreakdownAccumulator(sample_steps=8)
    batches = [StepBatch(decode_ctx=(i + 1,)) for i in range(1000)]
    for i, batch in enumerate(batches):
        acc.add(batch, {"family": {"gemm": 1.0}, "phase": {"decode": 1.0}})
        assert len(acc.sample) < 16 and (i < 8 or len(acc.sample) >= 8)
    kept = [b.decode_ctx[0] - 1 for b in acc.sample]
    stride = kept[1] - kept[0]
    assert kept == list(range(0, 1000, stride)) and stride == 128  # every 128th step: 8 of 1000


def test_streaming_percentiles_match_exact_ones():
    from kernelsight.sim.metrics import StreamingDistribution

    rng = np.random.default_rng(0)
    values = rng.lognormal(-4.0, 1.2, size=200_000)          # seconds
    dist = StreamingDistribution()
    dist.add_array(values[:150_000])
    for v in values[150_000:]:
        dist.add(float(v))
    ms = values * 1e3
    assert dist.count == len(values) and dist.mean == pytest.approx(ms.mean(), rel=1e-12)
    assert dist.std == pytest.approx(ms.std(), rel=1e-9)
    for q in (0.0, 0.01, 0.5, 0.9, 0.99, 1.0):
        assert dist.quantile(q) == pytest.approx(np.quantile(ms, q, method="lower"), rel=6e-4)


ARCHITECTURES = [  # a config.json of each supported MoE / MLA / hybrid-attention family, on a layout it fits
    ("openai--gpt-oss-120b_config.json", "h100_sxm", {"tp": 8}),
    ("MiniMaxAI--MiniMax-M2.5_config.json", "h200_sxm", {"tp": 8, "ep": 8}),
    ("deepseek-ai--DeepSeek-V3_config.json", "h200_sxm", {"tp": 8, "ep": 8}),
    ("moonshotai--Kimi-K2-Instruct_config.json", "h200_sxm", {"tp": 8, "attention_dp": 2, "ep": 16}),
    ("nvidia--DeepSeek-V3.1-NVFP4_config.json", "h200_sxm", {"tp": 8, "ep": 8}),
    ("meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json", "h100_sxm", {"tp": 8}),
    ("meta-llama--Llama-4-Maverick-17B-128E-Instruct_config.json", "h200_sxm", {"tp": 8, "ep": 8}),
    ("mistralai--Mixtral-8x22B-v0.1_config.json", "h100_sxm", {"tp": 8}),
    ("Qwen--Qwen3-30B-A3B-FP8_config.json", "h100_sxm", {"tp": 1}),
    ("nvidia--Qwen3-235B-A22B-NVFP4_config.json", "h200_sxm", {"tp": 8, "ep": 8}),
    ("meta-llama--Meta-Llama-3.1-405B_config.json", "h200_sxm", {"tp": 8}),
]


@pytest.mark.parametrize("config_file, gpu, layout", ARCHITECTURES, ids=[a[0].split("--")[1] for a in ARCHITECTURES])
def test_every_architecture_simulates_from_its_config_json(config_file, gpu, layout):
    import kernelsight
    from kernelsight.sim.parallel import ParallelConfig

    result = kernelsight.simulate(model=conf_dir() / "model" / "hf" / config_file, hardware=gpu,
                                  parallel=ParallelConfig("layout", **layout), num_requests=6,
                                  **{"predictor.tier": "roofline", "workload.input.value": 3000,
                                     "workload.output.value": 8})
    assert result.summary["completed"] == 6
    assert 0 < result.metrics["tpot_ms"]["mean"] < result.metrics["e2el_ms"]["mean"]


# The runs at both ends of the kernel intervals beside the central run (sim.run.interval_ends): a forked child each.

def test_the_interval_ends_side_by_side_give_the_sequential_numbers_exactly(monkeypatch):
    import warnings

    from kernelsight.sim import run as sim_run
    from kernelsight.sim.compose import compose as compose_config, typed_configs, workload_config

    received = []
    real = sim_run._received
    monkeypatch.setattr(sim_run, "_received", lambda *args: received.append(real(*args)) or received[-1])
    cfg, sources = compose_config(None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel, sequential = (sim_run.simulate(*typed_configs(cfg, sources), workload_config(cfg), num_requests=60,
                                                 intervals=True, parallel_bands=flag).summary for flag in (True, False))
    assert len(received) == 2 and None not in received  # the children's numbers, not reruns here
    assert json.dumps(parallel["intervals"]) == json.dumps(sequential["intervals"])  # bit for bit (repr, NaN too)
    same = [json.dumps({**summary, "wall_s": 0}, sort_keys=True, default=repr) for summary in (parallel, sequential)]
    assert same[0] == same[1]


def band_ends(offset: float) -> dict:
    from kernelsight.sim.run import INTERVAL_METRICS

    return {key: i + offset for i, key in enumerate(INTERVAL_METRICS)}


def in_the_child(act):
    """A band run that does `act` first when it runs in a forked child."""
    import os

    parent = os.getpid()

    def band():
        if os.getpid() != parent:
            act()
        return band_ends(0.5)
    return band


@pytest.fixture
def forked(monkeypatch):
    """The pids of the children forked while the test runs (recorded in this process)."""
    import os

    pids, real = [], os.fork

    def fork():
        pid = real()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


def assert_reaped(pids):
    """Each child forked is gone and reaped (no zombie): waiting for it finds no such child."""
    import os

    assert pids
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def garbage(text):
    from types import SimpleNamespace

    from kernelsight.sim import run as sim_run

    sim_run.json = SimpleNamespace(dumps=lambda obj: text)  # the child's module only: it was forked


@pytest.mark.parametrize("act", [
    lambda: __import__("os")._exit(0),                                                  # exits, says nothing
    lambda: __import__("os").kill(__import__("os").getpid(), 9),                      # killed
    lambda: 1 / 0,                                                                      # fails
    lambda: __import__("time").sleep(60),                                              # hangs
    lambda: garbage("{not json"),
    lambda: garbage('{"ends": {"mean_ttft_ms": "1.5"}, "warnings": []}'),
], ids=["silent", "killed", "raises", "hangs", "not-json", "wrong-fields"])
def test_a_child_that_fails_has_its_band_run_again_here(monkeypatch, act, forked):
    from kernelsight.sim import run as sim_run

    monkeypatch.setattr(sim_run, "CHILD_GRACE_S", 0.5)
    assert sim_run.interval_ends(lambda: "central", [lambda: band_ends(0.25), in_the_child(act)], parallel=True) == (
        "central", [band_ends(0.25), band_ends(0.5)])
    assert_reaped(forked)


def test_ctrl_c_here_kills_and_reaps_the_child(tmp_path, forked):
    import os
    import time

    from kernelsight.sim.run import interval_ends

    pid_file = tmp_path / "pid"

    def child_band():
        pid_file.write_text(str(os.getpid()))
        time.sleep(60)

    def interrupted():
        for _ in range(1000):
            if pid_file.exists() and pid_file.read_text():
                raise KeyboardInterrupt
            time.sleep(0.01)

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        interval_ends(interrupted, [child_band, child_band], parallel=True)
    assert time.monotonic() - start < 10
    with pytest.raises(ProcessLookupError):  # killed and reaped: neither running nor a zombie
        os.kill(int(pid_file.read_text()), 0)
    assert_reaped(forked)


def test_both_ends_run_while_the_central_run_does(tmp_path, forked):
    import time

    from kernelsight.sim.run import interval_ends

    def band(name, offset):
        def run():
            (tmp_path / name).write_text("started")
            return band_ends(offset)
        return run

    def central():  # returns once both children have started: they run beside it, not after it
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if (tmp_path / "p10").exists() and (tmp_path / "p90").exists():
                return "both ends started"
            time.sleep(0.01)
        return "alone"

    assert interval_ends(central, [band("p10", 0.25), band("p90", 0.5)], parallel=True) == (
        "both ends started", [band_ends(0.25), band_ends(0.5)])
    assert len(forked) == 2
    assert_reaped(forked)


def test_one_cpu_runs_the_interval_ends_one_after_the_other(monkeypatch):
    from kernelsight.sim import run as sim_run

    monkeypatch.setattr(sim_run, "usable_cpus", lambda: 1)
    monkeypatch.setattr(sim_run, "_fork", None)  # never called
    order = []
    assert sim_run.interval_ends(lambda: order.append("central"),
                                 [lambda: order.append("p10") or band_ends(0.25),
                                  lambda: order.append("p90") or band_ends(0.5)]) == (None, [band_ends(0.25),
                                                                                           band_ends(0.5)])
    assert order == ["central", "p10", "p90"]  # the ends after the central run: they reuse its predictions


def test_the_childs_warnings_are_given_here():
    import warnings

    from kernelsight.sim.run import interval_ends

    def warns():
        warnings.warn("the p90 band warns")
        return band_ends(0.5)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert interval_ends(lambda: None, [lambda: band_ends(0.25), warns], parallel=True) == (
            None, [band_ends(0.25), band_ends(0.5)])
    assert [str(w.message) for w in caught] == ["the p90 band warns"]  # once: the child's, not a rerun here


def test_a_gpu_without_bf16_serves_a_bf16_checkpoint_in_fp16_as_vllm_does():
    import kernelsight

    result = kernelsight.simulate(model="llama3.1-8b", hardware="v100_sxm", num_requests=20, intervals=False)
    assert result.setup.model.act_dtype == "fp16" and "served in fp16" in result.setup.describe()
    gemms = [k for k in result.pricing_sources() if k.get("family") == "gemm"]
    assert result.summary["completed"] == 20 and result.summary["mean_tpot_ms"] > 0 and gemms


def test_sliding_window_layers_keep_their_window_so_long_prompts_fit_twice_as_many(capsys):
    """gpt-oss-120b (half its layers in a 128-token window) at TP 2, 128 clients of 8192 + 1024 tokens: under
    vLLM's hybrid allocator the pool has twice the blocks and a request's sliding layers hold 9 of them, so
    all 128 fit (1.2 M tokens); with every layer keeping every token (--disable-hybrid-kv-cache-manager) the
    cache holds about half of them and requests preempt each other."""
    runs = {}
    for hybrid in (True, False):
        runs[hybrid] = simulate(composed(
            "model=gpt-oss-120b", "parallel=tp2", "workload=closed_loop", "workload.max_concurrency=128",
            "workload.input.value=8192", "workload.output.value=1024", "num_requests=256", "intervals=false",
            f"engine.scheduler.hybrid_kv_cache={str(hybrid).lower()}", "quiet=true", "plots=false"))
    on, off = runs[True], runs[False]
    assert on["kv_blocks_per_replica"] == pytest.approx(2 * off["kv_blocks_per_replica"], rel=0.001)
    assert on["preemptions"] == 0 < off["preemptions"]
    assert 0.4 < on["kv_usage_max"] < 0.7 and off["kv_usage_max"] > 0.99
    assert on["median_ttft_ms"] < 0.5 * off["median_ttft_ms"]


def test_the_run_line_names_the_batch_limits_vllm_serve_picks_for_the_gpu(capsys):
    simulate(composed("hardware=l40s", "num_requests=5", "intervals=false", "plots=false"))
    assert "engine vllm_v1 (2048 tokens x 256 seqs per step, sync scheduling" in capsys.readouterr().out
    simulate(composed("hardware=l40s", "engine.scheduler.max_num_batched_tokens=4096", "num_requests=5",
                      "intervals=false", "plots=false"))
    assert "engine vllm_v1 (4096 tokens x 256 seqs per step" in capsys.readouterr().out
