"""`kernelsight bench serve` (microbench/serving.py): workload checks, prompts, and a real continuous-batching
run of transformers on the CPU with a tiny random model (the GPU run is the same code at full size)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kernelsight import cli
from kernelsight.predictor.errors import KernelsightError
from kernelsight.cli.bench import serve_requests
from kernelsight.microbench.serving import ServeWorkload, prompt_tokens
from kernelsight.sim.workload import Workload, WorkloadConfig, trace_rows

TINY = ["device=cpu", "dtype=fp32", "model_overrides.num_hidden_layers=2", "model_overrides.hidden_size=64",
        "model_overrides.intermediate_size=128", "model_overrides.num_attention_heads=4",
        "model_overrides.num_key_value_heads=2", "model_overrides.head_dim=16", "model_overrides.vocab_size=256",
        "engine.block_size=16", "engine.num_blocks=256", "engine.max_batch_tokens=256", "warmup_requests=2"]
SMALL = ["only=[poisson_r12,closed_c8,closed_c32_prefix]",
         "workloads.poisson_r12.isl=48", "workloads.poisson_r12.osl=6", "workloads.poisson_r12.num_requests=10",
         "workloads.poisson_r12.rate=40",
         "workloads.closed_c8.isl=48", "workloads.closed_c8.osl=6", "workloads.closed_c8.num_requests=20",
         "workloads.closed_c8.concurrency=3",
         "workloads.closed_c32_prefix.isl=64", "workloads.closed_c32_prefix.osl=5",
         "workloads.closed_c32_prefix.num_requests=12", "workloads.closed_c32_prefix.concurrency=4",
         "workloads.closed_c32_prefix.shared_prefix=32"]


@pytest.mark.parametrize("spec, message", [
    ({"arrival": "burst", "isl": 8, "osl": 2, "num_requests": 4}, "arrival"),
    ({"arrival": "poisson", "isl": 8, "osl": 2, "num_requests": 4}, "needs a positive rate"),
    ({"arrival": "closed_loop", "isl": 8, "osl": 2, "num_requests": 4}, "at least 1 client"),
    ({"arrival": "closed_loop", "concurrency": 2, "isl": 8, "osl": 2, "num_requests": 4, "shared_prefix": 8},
     "must be below isl"),
    ({"arrival": "poisson", "rate": 1, "isl": 0, "osl": 2, "num_requests": 4}, "isl"),
    ({"arrival": "poisson", "rate": 1, "isl": 8, "osl": 2, "num_requests": 4, "think": 1}, "unknown setting"),
])
def test_bad_workloads_get_one_clear_line(spec, message):
    with pytest.raises(KernelsightError, match=message):
        ServeWorkload.from_mapping("w", spec)


def test_prompts_share_exactly_the_prefix():
    w = ServeWorkload.from_mapping("w", {"arrival": "poisson", "rate": 1, "isl": 40, "osl": 2, "num_requests": 5,
                                         "shared_prefix": 16})
    ps = [prompt_tokens(r, vocab=1000, seed=0) for r in serve_requests(w, seed=0)]
    assert [len(p) for p in ps] == [40] * 5 and len({tuple(p[:16]) for p in ps}) == 1
    assert len({tuple(p[16:]) for p in ps}) == 5  # unique tails
    assert ps == [prompt_tokens(r, 1000, 0) for r in serve_requests(w, seed=0)]  # seeded
    assert ps != [prompt_tokens(r, 1000, 1) for r in serve_requests(w, seed=1)]


def test_requests_are_the_simulators_stream_and_replay_as_a_trace(tmp_path):
    """bench serve sends the simulator's own requests (same seed, same arrivals and lengths), and the trace it
    writes replays them in the simulator with the same prefix sharing."""
    w = ServeWorkload.from_mapping("w", {"arrival": "poisson", "rate": 5, "isl": 64, "osl": 3, "num_requests": 20,
                                         "shared_prefix": 32})
    sim = Workload(WorkloadConfig.from_config({
        "name": "w", "arrival": "poisson", "request_rate": 5.0, "input": {"dist": "fixed", "value": 32},
        "output": {"dist": "fixed", "value": 3}, "system_prompts": 1, "system_prompt_len": 32}))
    ours = serve_requests(w, seed=7)
    assert [r.arrival_time for r in ours] == [r.arrival_time for r in sim.requests(20, 7)]
    assert np.all(np.diff([r.arrival_time for r in ours]) >= 0) and ours[-1].arrival_time > 0
    path = tmp_path / "w_trace.csv"
    pd.DataFrame(trace_rows(ours)).to_csv(path, index=False)
    replay = list(Workload(WorkloadConfig.from_config({"arrival": "trace", "trace_file": str(path),
                                                       "input": None, "output": None})).requests(None, 0))
    assert [round(r.arrival_time, 9) for r in replay] == [round(r.arrival_time - ours[0].arrival_time, 9)
                                                          for r in ours]
    assert [(r.prompt_len, r.output_len) for r in replay] == [(64, 3)] * 20
    assert replay[0].block_hash(1, 16) == replay[5].block_hash(1, 16)  # the shared 32 tokens hash alike
    assert replay[0].block_hash(2, 16) != replay[5].block_hash(2, 16)  # the rest is each request's own
    closed = ServeWorkload.from_mapping("c", {"arrival": "closed_loop", "concurrency": 4, "isl": 8, "osl": 2,
                                              "num_requests": 6})
    assert WorkloadConfig.from_config(closed.workload_mapping()).max_concurrency == 4
    assert {r.arrival_time for r in serve_requests(closed, 0)} == {0.0}


def test_cpu_run_records_every_request_and_resumes(tmp_path, capsys):
    pytest.importorskip("transformers", reason="bench serve runs transformers (pip install -e '.[bench]')")
    cli.main(["bench", "serve", f"out={tmp_path}", "run_id=t", *TINY, *SMALL])
    run = tmp_path / "cpu" / "t"
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary["name"]) == ["poisson_r12", "closed_c8", "closed_c32_prefix"]
    for name, n, osl in (("poisson_r12", 10, 6), ("closed_c8", 20, 6), ("closed_c32_prefix", 12, 5)):
        rows = pd.read_parquet(run / f"{name}.parquet")
        assert sorted(rows["request"]) == list(range(n)) and (rows["output_len"] == osl).all()
        assert (rows["ttft_ms"] > 0).all() and (rows["tpot_ms"] > 0).all()
        assert (rows["send_s"] < rows["first_token_s"]).all() and (rows["first_token_s"] < rows["finish_s"]).all()
    poisson = pd.read_parquet(run / "poisson_r12.parquet").sort_values("request")
    assert poisson["send_s"].is_monotonic_increasing  # sent at their arrival times, in order
    assert (poisson["send_s"] >= poisson["arrival_s"]).all()  # never before the simulator's arrival time
    trace = pd.read_csv(run / "closed_c32_prefix_trace.csv")  # what the simulator replays
    assert len(trace) == 12 and (trace["input_len"] == 64).all() and (trace["prefix_len"] == 32).all()
    closed = pd.read_parquet(run / "closed_c8.parquet")
    in_flight = [((closed["send_s"] <= s) & (closed["finish_s"] > s)).sum() for s in closed["send_s"]]
    assert max(in_flight) <= 3  # three clients: never more than three requests outstanding
    env = json.loads((run / "run.json").read_text())
    assert env["device"] == "cpu" and env["transformers"] and env["config"]["engine"]["max_batch_tokens"] == 256
    assert env["engine_resolved"]["max_batch_tokens"] == 256 and env["engine_resolved"]["block_size"] == 16
    assert env["engine_resolved"]["attn_implementation"] in ("sdpa", "paged|sdpa")  # what ran (named per version)
    measured = json.loads((run / "workloads.json").read_text())
    assert measured["closed_c8"]["workload"]["concurrency"] == 3 and measured["closed_c8"]["engine"]["block_size"] == 16
    capsys.readouterr()
    cli.main(["bench", "serve", f"out={tmp_path}", "run_id=t", *TINY, *SMALL])
    assert "3 already measured" in capsys.readouterr().out  # nothing re-run, summary rebuilt
    cli.main(["bench", "serve", f"out={tmp_path}", "run_id=t", *TINY, *SMALL, "only=[closed_c8]"])
    assert len(pd.read_csv(run / "summary.csv")) == 3  # a call for one workload keeps the run's whole summary
    capsys.readouterr()
    with pytest.raises(SystemExit):  # same name, other settings: refused, not silently skipped
        cli.main(["bench", "serve", f"out={tmp_path}", "run_id=t", *TINY, *SMALL, "workloads.closed_c8.num_requests=21"])
    err = capsys.readouterr().err
    assert "closed_c8" in err and "other settings" in err and len(err.strip().splitlines()) == 1


def test_bad_settings_are_one_line_errors(tmp_path, capsys):
    for args, message in ((["device=cpu", "only=[nope]"], "only: unknown workload(s) nope"),
                          (["device=tpu"], "device=tpu: must be cuda or cpu"),
                          (["device=cpu", "dtype=int4", *TINY[2:], "only=[closed_c8]"], "dtype='int4'")):
        with pytest.raises(SystemExit):
            cli.main(["bench", "serve", f"out={tmp_path}", *args])
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


class _CountingGpu:
    """An NVML-like reader: the energy counter runs at 250 W of wall time, power readings climb by 10 W each."""

    def __init__(self):
        import time
        self.t0, self.clock, self.reads = time.perf_counter(), time.perf_counter, 0

    def energy_mj(self) -> int:
        return int(250.0 * (self.clock() - self.t0) * 1e3)

    def power_w(self) -> float:
        self.reads += 1
        return 100.0 + 10.0 * self.reads


def test_power_meter_reads_joules_from_the_counter_and_peak_from_samples():
    import time

    from kernelsight.microbench.nvml import PowerMeter

    gpu = _CountingGpu()
    with PowerMeter(gpu, interval_s=0.01) as meter:
        time.sleep(0.25)
    r = meter.reading()
    assert 0.24 < r["duration_s"] < 1.0
    assert r["energy_j"] == pytest.approx(250.0 * r["duration_s"], rel=0.02)  # the counter, not the samples
    assert r["mean_power_w"] == pytest.approx(250.0, rel=0.02)
    assert r["power_samples"] == gpu.reads >= 5 and r["peak_power_w"] == 100.0 + 10.0 * gpu.reads


def test_summary_carries_energy_per_output_token():
    from kernelsight.microbench.serving import summarize

    w = ServeWorkload.from_mapping("closed_c8", {"arrival": "closed_loop", "concurrency": 2, "isl": 8, "osl": 4,
                                                 "num_requests": 2})
    rows = [{"workload": "closed_c8", "send_s": 0.0, "finish_s": 2.0, "ttft_ms": 10.0, "tpot_ms": 5.0,
             "output_len": 4}, {"workload": "closed_c8", "send_s": 0.5, "finish_s": 2.0, "ttft_ms": 12.0,
                                "tpot_ms": 6.0, "output_len": 4}]
    reading = {"energy_j": 800.0, "duration_s": 2.0, "mean_power_w": 400.0, "peak_power_w": 520.0,
               "power_samples": 20, "idle_power_w": 90.0}
    out = summarize(rows, [w], {"closed_c8": reading})[0]
    assert out["energy_per_output_token_j"] == 100.0 and out["mean_power_w"] == 400.0
    assert out["peak_power_w"] == 520.0 and out["idle_power_w"] == 90.0
    assert "energy_j" not in summarize(rows, [w])[0]  # no reading (a CPU run): no energy columns


def test_idle_seconds_must_be_a_duration(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "serve", f"out={tmp_path}", *TINY, "only=[closed_c8]", "idle_seconds=-1"])
    err = capsys.readouterr().err
    assert "idle_seconds=-1" in err and len(err.strip().splitlines()) == 1
