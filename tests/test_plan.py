"""`kernelsight plan`: the load search, the candidate space, sizing and the command's files and refusals."""
import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import Hardware
from kernelsight.sim.compose import compose, group_config
from kernelsight.sim.engine_profile import load_engine
from kernelsight.sim.model import ModelConfig
from kernelsight.sim.plan import (Candidate, Load, PlanSettings, SearchSpace, Slo, batches, candidates, engine_for,
                                  evaluate, evaluate_many, pareto, rank, search_load)
from kernelsight.sim.run import build_setup, run
from kernelsight.sim.workload import Workload, WorkloadConfig

SLO = {"ttft_ms": 300.0, "tpot_ms": 15.0}


def threshold_measure(limit: float, calls: list):
    """A system whose p90 TPOT crosses 15 ms exactly at load `limit` (monotone in load)."""
    def measure(x):
        calls.append(x)
        return {"completed": 10, "p90_ttft_ms": 1.0, "p90_tpot_ms": 15.0 * x / limit}
    return measure


@pytest.mark.parametrize("limit", [0.07, 3.0, 7.3, 40.0, 900.0])
def test_search_brackets_the_highest_load_within_the_tolerance(limit):
    calls = []
    best, probes = search_load(threshold_measure(limit, calls), Slo(**SLO), start=5.0, tolerance=0.1)
    assert best <= limit < best * 1.1 + 1e-9
    assert all(p.met == (p.load <= limit) for p in probes) and [p.load for p in probes] == calls
    assert len(calls) <= 12


def test_search_respects_the_upper_bound_and_whole_number_loads():
    calls = []
    best, _ = search_load(threshold_measure(1e9, calls), Slo(**SLO), start=10.0, tolerance=0.1, upper=64.0)
    assert 64 / 1.1 <= best < 64 and max(calls) < 64
    calls = []
    best, _ = search_load(threshold_measure(37.5, calls), Slo(**SLO), start=8, tolerance=0.1, integer=True)
    assert best <= 37 < best * 1.1 and all(float(x).is_integer() for x in calls)
    best, probes = search_load(threshold_measure(0.5, []), Slo(**SLO), start=8, tolerance=0.1, integer=True)
    assert best == 0 and probes[-1].load == 1


def test_search_warm_start_closes_the_bracket_in_two_probes():
    calls = []
    best, _ = search_load(threshold_measure(7.3, calls), Slo(**SLO), start=7.0, tolerance=0.1, step=1.0999)
    assert len(calls) == 2 and best == 7.0


def test_search_says_when_no_load_meets_the_slo():
    never = lambda x: {"completed": 10, "p90_ttft_ms": 1.0, "p90_tpot_ms": 99.0}  # noqa: E731
    best, probes = search_load(never, Slo(**SLO), start=4.0, tolerance=0.1)
    assert best == 0 and min(p.load for p in probes) >= 4.0 / 256 / 4


def test_slo_percentile_and_goodput():
    summary = {"completed": 100, "p90_ttft_ms": 200, "p90_tpot_ms": 14, "p99_tpot_ms": 20,
               "p99_ttft_ms": 250, "request_goodput": 9.0, "request_throughput": 10.0}
    assert Slo(**SLO).met(summary)
    assert not Slo(**SLO, percentile="p99").met(summary)
    assert Slo(**SLO, goodput=0.9).met(summary) and not Slo(**SLO, goodput=0.95).met(summary)
    assert not Slo(**SLO).met({**summary, "completed": 0})
    with pytest.raises(KernelsightError, match="plan needs an SLO"):
        Slo.from_mapping({"ttft_ms": None})
    with pytest.raises(KernelsightError, match="slo.percentile='p95'"):
        Slo.from_mapping({"ttft_ms": 1, "percentile": "p95"})
    with pytest.raises(KernelsightError, match=r"slo.goodput=1.5"):
        Slo.from_mapping({"ttft_ms": 1, "goodput": 1.5})
    with pytest.raises(KernelsightError, match="slo.tpot_ms=-1"):
        Slo.from_mapping({"tpot_ms": -1})


def _composed(model="llama3.1-8b", **overrides):
    cfg, _ = compose({"model": model}, overrides)
    return cfg, ModelConfig.from_mapping(cfg["model"])


def test_candidates_follow_what_vllm_starts():
    cfg, dense = _composed("llama3.1-8b")  # 8 KV heads
    space = SearchSpace.from_mapping({"tp": [1, 2, 3, 16], "attention_dp": [1, 2], "max_num_seqs": [256, 4096],
                                      "max_num_batched_tokens": [2048], "max_gpus_per_replica": 16},
                                     ["h100_sxm"])
    got = candidates(dense, cfg["engine"], space)
    assert {c.tp for c in got} == {1, 2, 16}  # 3 neither divides nor is a multiple of 8 KV heads
    assert {c.attention_dp for c in got} == {1}  # attention DP only on a mixture of experts
    assert {c.max_num_seqs for c in got} == {256}  # 4096 > max_num_batched_tokens 2048: vLLM refuses
    assert {c.ep for c in got} == {1}
    defaults = candidates(dense, cfg["engine"], SearchSpace.from_mapping({"tp": [1]}, ["l40s", "h100_sxm"]))
    assert {(c.gpu, c.max_num_batched_tokens, c.max_num_seqs) for c in defaults} == {("l40s", 2048, 256),
                                                                                     ("h100_sxm", 8192, 1024)}
    cfg, moe = _composed("qwen3-30b-a3b")
    got = candidates(moe, cfg["engine"], SearchSpace.from_mapping({"tp": [1, 4], "attention_dp": [1, 2],
                                                                   "kv_cache_dtype": ["auto", "fp8"]}, ["h200_sxm"]))
    layouts = {(c.tp, c.attention_dp, c.ep) for c in got}
    assert layouts == {(1, 1, 1), (1, 2, 1), (1, 2, 2), (4, 1, 1), (4, 1, 4), (4, 2, 1), (4, 2, 8)}
    assert {c.kv_cache_dtype for c in got} == {moe.kv_dtype, "fp8"}
    # 'auto' is the KV dtype vLLM serves on each GPU: Gemma without bf16 runs in fp32, KV cache included
    cfg, gemma = _composed("gemma-3-1b")
    auto = candidates(gemma, cfg["engine"], SearchSpace.from_mapping({"tp": [1]}, ["v100_pcie", "h100_sxm"]))
    assert {(c.gpu, c.kv_cache_dtype) for c in auto} == {("v100_pcie", "fp32"), ("h100_sxm", "bf16")}
    assert all(len({(c.gpu, c.tp, c.pp, c.ep, c.attention_dp) for c in b}) == 1 for b in batches(got))
    for bad, match in (({"tp": [0]}, "search.tp"), ({"kv_cache_dtype": ["int4"]}, "kv_cache_dtype"),
                       ({"ep": "some"}, "search.ep")):
        with pytest.raises(KernelsightError, match=match):
            SearchSpace.from_mapping(bad, ["h100_sxm"])


def test_engine_knobs_and_vllm_capture_sizes():
    cfg, _ = _composed()
    cand = Candidate("h100_sxm", 1, 1, 1, 1, 64, 4096, "bf16")
    engine = engine_for(cfg["engine"], cand)
    assert engine.scheduler.max_num_seqs == 64 and engine.scheduler.max_num_batched_tokens == 4096
    assert engine.cuda_graph.capture_sizes[-1] == 128  # min(2 x max_num_seqs, 512)
    assert cfg["engine"]["scheduler"]["max_num_seqs"] == "auto"  # the composed profile is not changed
    assert engine_for(cfg["engine"], replace(cand, max_num_seqs=1024)).cuda_graph.capture_sizes[-1] == 512


def _settings(model_cfg, workload: dict | None = None, **kwargs):
    cfg, model = model_cfg
    wl = WorkloadConfig.from_config({**cfg["workload"], **(workload or {})})
    hw = {g: Hardware.from_mapping(group_config("hardware", g)[0]) for g in ("h100_sxm", "l4")}
    return PlanSettings(model=model, engine=cfg["engine"], workload=wl, slo=Slo.from_mapping(kwargs.pop("slo", SLO)),
                        hardware=hw, prices={"h100_sxm": 3.0}, num_requests=kwargs.pop("num_requests", 120),
                        **kwargs)


@pytest.fixture(scope="module")
def tiny():
    """Llama-3.1-8B cut to 4 layers: a small model whose highest SLO rate on one H100 is quick to find."""
    return _composed("llama3.1-8b", **{"model.layers": 4, "model.name": "tiny-llama"})


def test_answer_is_bracketed_by_two_independent_runs(tiny):
    settings = _settings(tiny, {"request_rate": 5.0}, slo={"ttft_ms": 60.0, "tpot_ms": 2.0})
    cand = Candidate("h100_sxm", 1, 1, 1, 1, 256, 2048, tiny[1].kv_dtype)
    row, probes = evaluate(settings, cand)
    assert row["status"] == "ok", row["reason"]
    best = row["max_load"]
    assert 0 < best < row["capacity_req_s"]
    # the same setup, rebuilt from scratch, at the answer and just past the bracket's upper end
    _, hw, engine = settings.model, settings.hardware["h100_sxm"], engine_for(settings.engine, cand)
    setup = build_setup(settings.model, hw, engine, cand.parallel(), settings.workload,
                        max_model_len=settings.max_model_len)

    def meets(rate):
        s = replace(setup, workload=Workload(replace(settings.workload, request_rate=rate)))
        return settings.slo.met(run(s, settings.num_requests, settings.seed, slo_ms=settings.slo.limits,
                                    breakdown=False).summary)

    assert meets(best)
    failed_above = [p["load"] for p in probes if not p["slo_met"] and p["load"] > best]
    assert failed_above and min(failed_above) <= best * 1.1 * (1 + 1e-9)
    assert not meets(min(failed_above))
    # sizing: enough replicas for the target, each below its highest load
    assert row["replicas"] == math.ceil(5.0 / best) and row["gpus"] == row["replicas"]
    assert row["usd_per_hour"] == pytest.approx(3.0 * row["gpus"])
    served = 5.0 * 128  # output tokens/s of the target load
    assert row["usd_per_mtok"] == pytest.approx(row["usd_per_hour"] / (served * 3600) * 1e6, rel=1e-6)
    assert row["j_per_output_token"] > 0 and row["ttft_ms"] <= 60.0


def test_candidates_that_do_not_fit_are_dropped_before_simulating():
    settings = _settings(_composed("llama3.1-70b"), {"request_rate": 1.0})
    row, probes = evaluate(settings, Candidate("l4", 1, 1, 1, 1, 256, 2048, "bf16"))
    assert row["status"] == "does not fit" and "does not fit on l4" in row["reason"] and probes == []
    long = _settings(_composed("llama3.1-8b"), {"request_rate": 1.0}, max_model_len=131072)
    row, _ = evaluate(long, Candidate("l4", 1, 1, 1, 1, 256, 2048, "bf16"))
    assert row["status"] == "does not fit" and "fewer than max_model_len=131072" in row["reason"]
    minimax = _settings(_composed("minimax-m2.5"), {"request_rate": 1.0})
    row, _ = evaluate(minimax, Candidate("h100_sxm", 8, 1, 1, 1, 256, 2048, minimax.model.kv_dtype))
    assert row["status"] == "refused" and "vLLM refuses this layout" in row["reason"]


def test_max_model_len_is_capped_at_the_models_context():
    """plan's max_model_len (8192 by default) is a length limit for every candidate: a model of a shorter
    context is planned at its own, not refused candidate by candidate."""
    short = _composed("llama3.1-8b", **{"model.max_position": 4096})
    assert _settings(short, {"request_rate": 1.0}, max_model_len=8192).max_model_len == 4096
    assert _settings(short, {"request_rate": 1.0}, max_model_len=2048).max_model_len == 2048
    with pytest.raises(KernelsightError, match=r"^max_model_len=1: "):
        _settings(short, {"request_rate": 1.0}, max_model_len=1)


def test_closed_loop_load_is_a_number_of_clients(tiny):
    settings = _settings(tiny, {"request_rate": math.inf, "max_concurrency": 8}, slo={"tpot_ms": 3.0})
    assert settings.load == Load("max_concurrency", 8.0)
    (row, probes), = evaluate_many(settings, [Candidate("h100_sxm", 1, 1, 1, 1, 256, 2048, "bf16")])
    assert row["status"] == "ok" and float(row["max_load"]).is_integer()
    assert all(float(p["load"]).is_integer() for p in probes)
    with pytest.raises(KernelsightError, match="slo.ttft_ms is needed for an open-loop"):
        _settings(tiny, {"request_rate": 4.0}, slo={"tpot_ms": 10.0})


def test_rank_and_pareto():
    rows = [{"status": "ok", "key": k, "usd_per_mtok": c, "gpus": g, "tpot_ms": t, "req_s_per_gpu": r,
             "output_tok_s_per_gpu": r * 100}
            for k, c, g, t, r in (("a", 2.0, 4, 30, 1.0), ("b", 1.0, 8, 20, 2.0), ("c", math.nan, 2, 10, 3.0),
                                  ("d", 1.0, 8, 25, 2.5))]
    rows.append({"status": "does not fit", "key": "e"})
    assert [r["key"] for r in rank(rows, "cost")] == ["d", "b", "a", "c"]
    assert [r["key"] for r in rank(rows, "gpus")] == ["c", "a", "d", "b"]
    assert [r["key"] for r in rank(rows, "throughput")] == ["c", "d", "b", "a"]
    with pytest.raises(KernelsightError, match="objective='cheap'"):
        rank(rows, "cheap")
    assert pareto([(10, 5), (20, 4), (15, 9), (30, 12), (12, 1)]) == [0, 2, 3]


PLAN = ["plan", "model=llama3.1-8b", "model.layers=4", "gpus=[h100_sxm,l4]", "search.tp=[1,2]",
        "search.max_num_seqs=[256]", "search.max_num_batched_tokens=[2048]", "search.kv_cache_dtype=[auto]",
        "search.num_requests=100", "workload.request_rate=4", "slo.ttft_ms=200", "slo.tpot_ms=5", "intervals=1",
        "jobs=1", "quiet=true"]


def test_plan_command_prints_the_ranking_and_writes_every_candidate(run_cli, tmp_path):
    out = tmp_path / "plan"
    code, stdout, err = run_cli([*PLAN, f"output_dir={out}"])
    assert code == 0, err
    assert "h100_sxm" in stdout and "$/Mtok" in stdout and "candidates:" in stdout
    table = pd.read_parquet(out / "candidates.parquet")
    assert len(table) == 4 and set(table["status"]) <= {"ok", "refused", "does not fit", "slo not met"}
    assert (out / "pareto.png").stat().st_size > 10_000 and not (out / "partial.jsonl").exists()
    ranked = pd.read_csv(out / "ranked.csv")
    assert ranked["rank"].tolist() == list(range(1, len(ranked) + 1))
    best = ranked.iloc[0]
    assert best["ttft_ms_p10"] <= best["ttft_ms"] <= best["ttft_ms_p90"]
    error = load_engine("vllm_v1").serving_error  # the kernels' range widened to the simulator's own error
    assert best["tpot_ms_p90"] >= best["tpot_ms"] * np.exp(error.tpot[1]) * (1 - 1e-9)
    probes = pd.read_parquet(out / "probes.parquet")
    assert set(probes["key"]) <= set(table["key"]) and probes["slo_met"].any()
    code, _, err = run_cli([*PLAN, f"output_dir={out}"])
    assert code == 2 and "holds a finished plan" in err


def test_plan_resumes_an_interrupted_run(run_cli, tmp_path):
    out = tmp_path / "plan"
    code, _, err = run_cli([*PLAN, f"output_dir={out}"])
    assert code == 0, err
    table = pd.read_parquet(out / "candidates.parquet")
    # what an interrupted run leaves: the header and the first finished candidate
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from kernelsight.cli.config import container
    from kernelsight.cli.plan import PARTIAL, _fingerprint
    from kernelsight.predictor.paths import conf_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        raw = container(hydra_compose("plan", [*PLAN[1:], f"output_dir={out}"]))
    GlobalHydra.instance().clear()
    first = table.iloc[0].to_dict()
    first = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in first.items() if k != "rank"}
    first["usd_per_hour"] = 1234.5  # a value only the kept row has
    (out / "candidates.parquet").unlink()
    (out / PARTIAL).write_text(json.dumps({"fingerprint": _fingerprint(raw)}) + "\n"
                               + json.dumps({"row": first, "probes": []}, default=str) + "\n{\"row\": {\"ke")
    code, _, err = run_cli([*PLAN, f"output_dir={out}"])
    assert code == 2 and "resume=true" in err
    code, stdout, err = run_cli([*PLAN, f"output_dir={out}", "resume=true"])
    assert code == 0, err
    assert "1 kept from" in stdout
    again = pd.read_parquet(out / "candidates.parquet")
    assert again.set_index("key").loc[first["key"], "usd_per_hour"] == 1234.5
    (out / "candidates.parquet").unlink()
    (out / PARTIAL).write_text(json.dumps({"fingerprint": "other"}) + "\n")
    code, _, err = run_cli([*PLAN, f"output_dir={out}", "resume=true", "slo.tpot_ms=6"])
    assert code == 2 and "other settings" in err


@pytest.mark.parametrize("override, message", [
    ("gpus=[h100_smx]", "did you mean 'h100_sxm'"),
    ("+pricing.usd_per_gpu_hour.h100sxm=2", "pricing.usd_per_gpu_hour.h100sxm: not a catalog GPU"),
    ("pricing.usd_per_gpu_hour.h100_sxm=-2", "a positive number"),
    ("slo.ttft_ms=null", "slo.ttft_ms is needed"),
    ("search.tolerance=2", "search.tolerance=2"),
    ("search.tp=[3]", "no candidate"),
    ("objective=fast", "objective='fast'"),
    ("workload.request_rate=inf", "finite request rate"),
])
def test_plan_bad_input_is_one_line(run_cli, tmp_path, override, message):
    code, _, err = run_cli([*PLAN, f"output_dir={tmp_path / 'p'}", override])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_plan_help_lists_the_settings(run_cli):
    code, out, _ = run_cli(["plan", "--help"])
    assert code == 0 and "$/hour" in out and "slo:" in out and "pricing:" in out
