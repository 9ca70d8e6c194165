"""`kernelsight validate`: CSV checks, model mapping, the step-log composition model and its fit,
leave-one-model-out, deployments, the report and the README block (the composition terms in the pricer, the
all-reduce flavours and fp8 pricing, are in test_validate_pricing.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from kernelsight import cli
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import conf_dir
from kernelsight.sim.engine_profile import EngineProfile, load_engine
from kernelsight.sim.graph import token_kernels
from kernelsight.sim.model import load_model
from kernelsight.sim.parallel import ParallelConfig
from kernelsight.validate import composition as comp
from kernelsight.validate import report as rep
from kernelsight.validate.rows import (ValidationRow, default_csv, model_for, parse_mappings, read_rows, throughput,
                                       with_protocol)
from kernelsight.validate.run import RunSettings, Tier, deployment_engine, refusals, round_s, simulate_row

HEADER = "id,model_path,precision,system,isl,osl,concurrency,tp_size,ttft_ms,tpot_ms"
GOOD = "a,Qwen/Qwen3-32B,bf16,h100_sxm,1024,128,8.0,2.0,154.2,18.0"
MAPPINGS = [{"model_path": "Qwen/Qwen3-32B", "precision": "bf16", "model": "qwen3-32b", "deployment": "aiconfigurator"},
            {"model_path": "Qwen/Qwen3-32B", "precision": "fp8", "model": "qwen3-32b", "weight_dtype": "fp8",
             "kv_dtype": "fp8"},
            {"model_path": "meta-llama/Llama-3.1-70B", "precision": "fp8", "model": "llama3.1-70b-fp8",
             "kv_dtype": "bf16", "range_ratio": 0.8}]


def write_csv(tmp_path, *lines, header=HEADER):
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def one_line_error(call, *args) -> str:
    with pytest.raises(KernelsightError) as e:
        call(*args)
    message = str(e.value)
    assert "\n" not in message
    return message


# -- CSV --------------------------------------------------------------------------------------

def test_shipped_csv_reads_every_row_with_types():
    rows = read_rows(default_csv())
    assert len(rows) == 138
    first = rows[0]
    assert (first.line, first.device, first.tp, first.concurrency, first.isl, first.osl) == (1, "h100_sxm", 2, 8, 1024,
                                                                                             128)
    assert first.precision == "bf16" and first.ttft_ms == pytest.approx(154.2481599)
    assert {r.model_path for r in rows} == {"Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B"}
    assert {r.band for r in rows} == {"c<16", "16<=c<64", "c>=64"}


@pytest.mark.parametrize("line, column", [
    ("a,Qwen/Qwen3-32B,bf16,h100_sxm,1024,128,eight,2,154.2,18.0", "concurrency"),
    ("a,Qwen/Qwen3-32B,bf16,h100_sxm,1024,128,8.5,2,154.2,18.0", "concurrency"),
    ("a,Qwen/Qwen3-32B,bf16,h100_sxm,1024,128,8,2,-1,18.0", "ttft_ms"),
    ("a,Qwen/Qwen3-32B,bf16,h100_sxm,1024,128,8,2,154.2,", "tpot_ms"),
    ("a,Qwen/Qwen3-32B,int3,h100_sxm,1024,128,8,2,154.2,18.0", "precision"),
    ("a,Qwen/Qwen3-32B,bf16,h100_sxmm,1024,128,8,2,154.2,18.0", "system"),
])
def test_bad_row_is_one_line_with_file_row_and_column(tmp_path, line, column):
    path = write_csv(tmp_path, GOOD, line)
    message = one_line_error(read_rows, path)
    assert str(path) in message and "row 2" in message and f"'{column}'" in message


def test_bad_files_are_one_line(tmp_path):
    assert "missing column 'tpot_ms'" in one_line_error(
        read_rows, write_csv(tmp_path, GOOD.rsplit(",", 1)[0], header=HEADER.rsplit(",", 1)[0]))
    assert "no data rows" in one_line_error(read_rows, write_csv(tmp_path))
    assert "no such validation CSV" in one_line_error(read_rows, tmp_path / "absent.csv")
    # (attention_dp_size=2 is a layout, refused per row: tests/test_validate_layouts.py; 'two' is a bad file)
    dp = write_csv(tmp_path, GOOD + ",two", header=HEADER + ",attention_dp_size")
    assert "column 'attention_dp_size' = 'two' is not a number" in one_line_error(read_rows, dp)


def test_throughput_formula():
    # 8 clients, each finishing 128 tokens every 154.248 + 127 x 18.037 = 2444.953 ms
    assert throughput(8, 128, 154.2481599, 18.0370482875) == pytest.approx(1024 / 2.444953292, rel=1e-8)
    row = read_rows(default_csv())[0]
    e2e_s = (row.ttft_ms + (row.osl - 1) * row.tpot_ms) / 1e3
    assert row.throughput == pytest.approx(row.concurrency * row.osl / e2e_s)


# -- model mapping ----------------------------------------------------------------------------

def test_model_mapping_and_dtype_overrides():
    rows = {(r.model_path, r.precision): r for r in read_rows(default_csv())}
    maps = parse_mappings(MAPPINGS)
    qwen = model_for(rows[("Qwen/Qwen3-32B", "bf16")], maps)
    assert qwen == load_model("qwen3-32b")
    qwen8 = model_for(rows[("Qwen/Qwen3-32B", "fp8")], maps)
    assert (qwen8.weight_dtype, qwen8.kv_dtype, qwen8.hidden, qwen8.layers) == ("fp8", "fp8", 5120, 64)
    llama = model_for(rows[("meta-llama/Llama-3.1-70B", "fp8")], maps)
    assert (llama.weight_dtype, llama.kv_dtype, llama.layers) == ("fp8", "bf16", 80)
    assert llama.name == "llama3.1-70b-fp8[kvbf16]"


def test_range_ratio_comes_from_the_mapping_and_bad_values_are_one_line():
    rows = {(r.model_path, r.precision): r for r in read_rows(default_csv())}
    maps = parse_mappings(MAPPINGS)
    assert with_protocol(rows[("meta-llama/Llama-3.1-70B", "fp8")], maps).range_ratio == 0.8
    assert with_protocol(rows[("Qwen/Qwen3-32B", "bf16")], maps).range_ratio == 1.0
    assert with_protocol(rows[("Qwen/Qwen3-32B", "bf16")], []).range_ratio == 1.0
    base = {"model_path": "a", "precision": "bf16", "model": "qwen3-32b"}
    for bad in (0, 1.5, "0.8", True):
        message = one_line_error(parse_mappings, [{**base, "range_ratio": bad}])
        assert "validate.models[0]" in message and "range_ratio" in message


def test_range_ratio_draws_benchmark_serving_lengths():
    # benchmark_serving --random-range-ratio r: lengths uniform in [floor(r L), L]; r = 1 keeps them fixed.
    model, settings = load_model("llama3.1-8b"), RunSettings(0, 4, 0, engine_map())
    log = simulate_row(small_row(range_ratio=0.5), model, ROOFLINE, settings)
    assert log.output_len.min() >= 12 and log.output_len.max() <= 24 and len(set(log.output_len)) > 3
    fixed = simulate_row(small_row(), model, ROOFLINE, settings)
    assert set(fixed.output_len) == {24} and len(fixed.output_len) == 4 * 6


def test_deployment_comes_from_the_mapping_and_bad_values_are_one_line():
    rows = {(r.model_path, r.precision): r for r in read_rows(default_csv())}
    maps = parse_mappings(MAPPINGS)
    assert with_protocol(rows[("Qwen/Qwen3-32B", "bf16")], maps).deployment == "aiconfigurator"
    assert with_protocol(rows[("meta-llama/Llama-3.1-70B", "fp8")], maps).deployment == "engine"
    assert with_protocol(rows[("Qwen/Qwen3-32B", "bf16")], []).deployment == "engine"
    message = one_line_error(parse_mappings, [{"model_path": "a", "precision": "bf16", "model": "qwen3-32b",
                                               "deployment": "dynamo"}])
    assert "validate.models[0]" in message and "deployment='dynamo'" in message and "aiconfigurator" in message


def test_aiconfigurator_deployment_sets_budget_seqs_and_graphs():
    # aiconfigurator's vLLM rule: budget = batch size + isl + 1500, max_num_seqs = batch size, graphs 1..batch size.
    row = small_row(isl=2000, concurrency=4, deployment="aiconfigurator")
    engine = deployment_engine(engine_map(NO_FRONTEND), row)
    assert engine["scheduler"]["max_num_batched_tokens"] == 3504 and engine["scheduler"]["max_num_seqs"] == 4
    assert engine["cuda_graph"]["capture_sizes"] == [1, 2, 3, 4]
    assert deployment_engine(engine_map(), dataclasses.replace(row, deployment="engine")) == engine_map()
    # A burst of four 2000-token prompts: one step under vLLM's 8192 budget, three (chunked) under 3504.
    model, settings = load_model("llama3.1-8b"), RunSettings(0, 1, 0, engine_map(NO_FRONTEND), start="burst")
    default = simulate_row(dataclasses.replace(row, deployment="engine"), model, ROOFLINE, settings)
    chunked = simulate_row(row, model, ROOFLINE, settings)
    assert sorted(default.first) == [0, 0, 0, 0] and sorted(chunked.first) == [0, 1, 1, 2]


def test_unmapped_model_falls_back_to_hf_repo_or_fails_in_one_line():
    row = ValidationRow("x", 7, "nvidia/Llama-3.1-70B-Instruct-FP8", "fp8", "h100_sxm", 8, 8, 1, 1, 1, 1.0, 1.0)
    assert model_for(row, []).name == "llama3.1-70b-fp8"
    unknown = dataclasses.replace(row, model_path="acme/unknown-7b")
    message = one_line_error(model_for, unknown, [], "runs.csv: row 7")
    assert "runs.csv: row 7" in message and "validate.models" in message
    assert "not in conf/model" in one_line_error(parse_mappings, [{"model_path": "a", "precision": "bf16",
                                                                  "model": "nope"}])


# -- step log and composition -------------------------------------------------------------------

def small_row(**kw) -> ValidationRow:
    base = dict(row_id="t", line=1, model_path="meta-llama/Llama-3.1-8B", precision="bf16", device="h100_sxm",
                isl=300, osl=24, concurrency=6, tp=1, pp=1, ttft_ms=50.0, tpot_ms=8.0)
    return ValidationRow(**{**base, **kw})


def engine_map(frontend: dict | None = None, **host) -> dict:
    """The shipped engine profile as a mapping, with host terms (and the frontend) replaced."""
    engine = OmegaConf.to_container(OmegaConf.load(conf_dir() / "engine" / "vllm_v1.yaml"))
    engine["host"].update(host)
    engine["frontend"].update(frontend or {})
    return engine


NO_FRONTEND = {"latency_ms": 0, "jitter_ms": 0, "async_latency_ms": 0, "async_jitter_ms": 0}


ROOFLINE = Tier("roofline", "roofline", None)


def test_step_log_reproduces_the_engine_metrics_and_reprices_exactly():
    # Without a frontend delay and with a burst start, every send is a completion event: exact re-pricing.
    row, model = small_row(), load_model("llama3.1-8b")
    settings = RunSettings(0, 1, 0, engine_map(NO_FRONTEND), start="burst")
    log = simulate_row(row, model, ROOFLINE, settings, num_requests=30)
    host = load_engine("vllm_v1").host
    everyone = comp.measured_requests(log, row.concurrency, 0)
    lin = comp.linearize(log, host, everyone)
    assert lin.ttft0 == pytest.approx(log.summary["mean_ttft_ms"], rel=1e-9)
    assert lin.tpot0 == pytest.approx(log.summary["mean_tpot_ms"], rel=1e-9)
    # Other host terms: the affine re-pricing equals simulating again with them.
    theta = {"step_overhead_us": 2500.0, "per_request_us": 40.0, "sampler_us": 0.0}
    again = simulate_row(row, model, ROOFLINE, dataclasses.replace(settings, engine=engine_map(NO_FRONTEND, **theta)),
                         num_requests=30)
    ttft, tpot = lin.metrics(theta)
    assert ttft == pytest.approx(again.summary["mean_ttft_ms"], rel=1e-9)
    assert tpot == pytest.approx(again.summary["mean_tpot_ms"], rel=1e-9)
    assert ttft > lin.ttft0 and tpot > lin.tpot0


def test_step_log_with_frontend_delays_and_staggered_start_keeps_idle_time_and_send_offsets():
    # The shipped profile: requests reach the scheduler after a jittered frontend delay, clients start out of
    # phase, so the engine idles and start-up sends fall between step ends. The log still reproduces the
    # simulated metrics exactly; re-pricing holds the schedule fixed, so it is close, not exact.
    row, model = small_row(concurrency=3), load_model("llama3.1-8b")
    settings = RunSettings(0, 1, 0, engine_map(), start="staggered")
    log = simulate_row(row, model, ROOFLINE, settings, num_requests=30)
    assert log.idle_s.sum() > 0 and (log.send_offset_s > 0).any()
    lin = comp.linearize(log, load_engine("vllm_v1").host, comp.measured_requests(log, row.concurrency, 0))
    assert lin.ttft0 == pytest.approx(log.summary["mean_ttft_ms"], rel=1e-9)
    assert lin.tpot0 == pytest.approx(log.summary["mean_tpot_ms"], rel=1e-9)
    theta = {"step_overhead_us": 300.0, "per_request_us": 25.0, "sampler_us": 0.0}
    again = simulate_row(row, model, ROOFLINE, dataclasses.replace(settings, engine=engine_map(**theta)),
                         num_requests=30)
    ttft, tpot = lin.metrics(theta)
    assert ttft == pytest.approx(again.summary["mean_ttft_ms"], rel=0.1)
    assert tpot == pytest.approx(again.summary["mean_tpot_ms"], rel=0.02)


def test_staggered_round_prefills_a_long_prompt_in_budget_chunks():
    # A prompt longer than the step budget is prefilled in chunks; a step beyond the budget is refused.
    from kernelsight.sim.batch import StepBatch
    from kernelsight.validate.run import row_setup

    row, model = small_row(isl=5000, osl=4, concurrency=2), load_model("llama3.1-8b")
    engine = engine_map()
    engine["scheduler"]["max_num_batched_tokens"] = 2048
    settings = RunSettings(0, 1, 0, engine, start="staggered")
    pricer = row_setup(row, model, ROOFLINE, engine).pricer
    chunks = [(2048, 0, 0), (2048, 2048, 0), (904, 4096, 1)]
    prefill = sum(pricer.step_time(StepBatch(prefill_new=(n,), prefill_ctx=(done,), prefill_sampled=s)).total_s
                  for n, done, s in chunks)
    decode = pricer.step_time(StepBatch(decode_ctx=(5002,) * 2)).total_s
    assert round_s(pricer, row) == pytest.approx(prefill + 4 * decode, rel=1e-12)
    message = one_line_error(pricer.step_time, StepBatch(prefill_new=(5000,), prefill_ctx=(0,), prefill_sampled=1))
    assert "5000 tokens" in message and "max_num_batched_tokens=2048" in message
    log = simulate_row(row, model, ROOFLINE, settings)
    assert len(log.first) == 2


def test_warmup_rounds_are_excluded_by_send_order():
    row = small_row()
    log = simulate_row(row, load_model("llama3.1-8b"), ROOFLINE, RunSettings(2, 1, 0, engine_map()))
    assert len(log.request_id) == 3 * row.concurrency
    mask = comp.measured_requests(log, row.concurrency, 2)
    assert mask.sum() == row.concurrency and set(log.request_id[mask]) == set(range(12, 18))


def synthetic(rng, n, theta):
    """Rows with random affine coefficients and measurements made by `theta`."""
    lins = []
    for _ in range(n):
        d = {k: rng.uniform(0.001, 0.05) for k in comp.TERMS}
        lins.append(comp.Linearized({k: 100.0 for k in comp.TERMS}, rng.uniform(50, 500), rng.uniform(5, 50),
                                    d, {k: v / 10 for k, v in d.items()}))
    return lins, comp.predict(lins, theta)


def test_fit_recovers_known_parameters():
    rng = np.random.default_rng(3)
    truth = {"step_overhead_us": 730.0, "per_request_us": 12.5, "sampler_us": 100.0}
    lins, measured = synthetic(rng, 40, truth)
    fitted = comp.fit(lins, measured, ["step_overhead_us", "per_request_us"], ["ttft", "tpot"])
    assert fitted["step_overhead_us"] == pytest.approx(730.0, rel=1e-5)
    assert fitted["per_request_us"] == pytest.approx(12.5, rel=1e-4)
    assert fitted["sampler_us"] == 100.0  # not fitted: the profile's value
    with pytest.raises(KernelsightError, match="choose from"):
        comp.fit(lins, measured, ["gpu_speed"])


def test_leave_one_model_out_never_trains_on_the_held_out_model():
    rng = np.random.default_rng(5)
    theta_a = {"step_overhead_us": 200.0, "per_request_us": 3.0, "sampler_us": 100.0}
    theta_b = {"step_overhead_us": 1500.0, "per_request_us": 30.0, "sampler_us": 100.0}
    lins_a, meas_a = synthetic(rng, 12, theta_a)
    lins_b, meas_b = synthetic(rng, 9, theta_b)
    lins, measured = lins_a + lins_b, np.vstack([meas_a, meas_b])
    groups = ["A"] * 12 + ["B"] * 9
    params = ["step_overhead_us", "per_request_us"]
    pred, thetas = comp.leave_one_group_out(lins, measured, groups, params, ["ttft", "tpot"])
    # B is predicted with A's parameters only, and A with B's: each held-out error is the other's gap.
    assert thetas["B"]["step_overhead_us"] == pytest.approx(200.0, rel=1e-4)
    assert thetas["A"]["per_request_us"] == pytest.approx(30.0, rel=1e-4)
    np.testing.assert_allclose(pred[12:], comp.predict(lins_b, theta_a), rtol=1e-5)
    assert not np.allclose(pred[12:], meas_b, rtol=1e-2)
    with pytest.raises(KernelsightError, match="two models"):
        comp.leave_one_group_out(lins_a, meas_a, ["A"] * 12, params)
    # Rows outside `train` never inform a fit: C's three rows (measured as if its host cost were huge) are left out,
    # so holding out B still recovers A's parameters; held-out C is predicted all the same.
    lins_c, meas_c = synthetic(rng, 3, {**theta_a, "per_request_us": 900.0})
    train = np.array([True] * 21 + [False] * 3)
    pred, thetas = comp.leave_one_group_out(lins + lins_c, np.vstack([measured, meas_c]), groups + ["C"] * 3, params,
                                            ["ttft", "tpot"], train=train)
    assert thetas["B"]["per_request_us"] == pytest.approx(3.0, rel=1e-3) and np.isfinite(pred[21:]).all()
    _, with_c = comp.leave_one_group_out(lins + lins_c, np.vstack([measured, meas_c]), groups + ["C"] * 3, params,
                                         ["ttft", "tpot"])
    assert with_c["B"]["per_request_us"] > 10.0   # C's rows would have pulled the fit


# -- report and README ----------------------------------------------------------------------------

def test_readme_block_rewrite_is_idempotent_and_keeps_the_rest(tmp_path):
    head = pd.DataFrame([{"set": "vllm_dev", "tier": "target", "kind": "heldout", "rows": 3, "ttft": 11.0,
                          "tpot": 5.0, "throughput": 2.5},
                         {"set": "vllm_dev", "tier": "cross", "kind": "heldout", "rows": 3, "ttft": 14.0, "tpot": 9.0,
                          "throughput": 4.0},
                         {"set": "vllm_moe_dev", "tier": "target", "kind": "heldout", "rows": 2, "ttft": 30.0,
                          "tpot": 6.0, "throughput": 5.0},
                         {"set": "vllm_moe_dev", "tier": "cross", "kind": "heldout", "rows": 2, "ttft": 31.0,
                          "tpot": 7.0, "throughput": 6.0}])
    readme = tmp_path / "README.md"
    readme.write_text(f"# kernelsight\n\nintro\n\n{rep.README_START}\nold\n{rep.README_END}\n\n## more\ntext\n")
    block = rep.readme_block(head)
    assert rep.rewrite_readme(readme, block)
    once = readme.read_text()
    assert not rep.rewrite_readme(readme, rep.readme_block(head))
    assert readme.read_text() == once
    assert once.startswith("# kernelsight\n\nintro\n\n") and once.endswith("\n\n## more\ntext\n")
    assert "| vllm_dev | target (η with the GPU's own kernel data) | 3 | 5.0 | 11.0 | 2.5 | 6.2 / 14.3 / 2.7 |" in once
    # each set beside its own targets: the MoE set has no seed-paper figures and a target only in the target tier
    assert "| vllm_moe_dev | target (η with the GPU's own kernel data) | 2 | 6.0 | 30.0 | 5.0 | n/a | <= 8 / 15 / 8 |" in once
    assert "| 2 | 7.0 | 31.0 | 6.0 | n/a | n/a |" in once
    assert "old" not in once
    (tmp_path / "plain.md").write_text("no markers\n")
    assert "markers" in one_line_error(rep.rewrite_readme, tmp_path / "plain.md", block)


def test_validate_command_end_to_end_on_two_rows(capsys, tmp_path):
    table, report = tmp_path / "rows.json", tmp_path / "validation.md"
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{rep.README_START}\n{rep.README_END}\n")
    cli.main(["validate", str(default_csv()), "rows=[1,116]", "tiers.cross=null",
              "tiers.target.predictor_tier=roofline", "protocol.num_requests=24", "jobs=1", f"table={table}",
              f"report={report}", f"readme={readme}"])
    out = capsys.readouterr().out
    df = pd.read_json(table)
    assert list(df["line"]) == [1, 116] and set(df["tier"]) == {"target"}
    assert (df["measured_requests"] == [24, 24]).all()  # no warmup rounds: every simulated request counts
    for col in ("ttft_simulated", "tpot_simulated", "throughput_simulated", "ttft_heldout", "err_tpot_heldout"):
        assert np.isfinite(df[col]).all()
    assert df["err_ttft_simulated"].iloc[0] == pytest.approx(100 * (df["ttft_simulated"].iloc[0] / 154.2481599 - 1))
    text = report.read_text()
    assert "## Headline" in text and "Held-out errors per model and layout" in text
    assert (tmp_path / "validation_parity_target.png").stat().st_size > 10_000
    assert "target (η with the GPU's own kernel data)" in readme.read_text()
    assert "report:" in out


def test_validate_command_bad_csv_row_is_one_line(capsys, tmp_path):
    path = write_csv(tmp_path, GOOD, "b,Qwen/Qwen3-32B,bf16,h100_sxm,1024,128,0,2,154.2,18.0")
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "row 2" in err and "'concurrency'" in err


@pytest.mark.parametrize("override, message", [("protocol.rounds=0", "protocol.rounds=0: must be an integer >= 1"),
                                               ("protocol.warmup_rounds=-1", "protocol.warmup_rounds=-1"),
                                               ("protocol.start=later", "protocol.start='later'"),
                                               ("jobs=many", "jobs='many': must be an integer >= 1 (worker processes)")])
def test_validate_bad_protocol_is_one_line(capsys, override, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", "rows=[vllm_dev:1]", "tiers.cross=null", override])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_report_names_the_die_sibling_that_prices_the_cross_tier():
    from kernelsight.validate.context import sibling_note
    from kernelsight.validate.run import Tier

    note = sibling_note(Tier("cross", "cross", None), ["h100_sxm", "l40s"])
    assert "h100_sxm from h200_sxm" in note and "l40s" not in note
    assert "cross-device models only" in sibling_note(Tier("cross", "cross", None), ["mi300x"])


def test_a_cross_bundle_is_evaluated_without_its_gpu_for_its_kernel_intervals(tmp_path):
    from kernelsight.validate.cross_bundle import cross_bundle_settings

    settings = cross_bundle_settings(str(tmp_path / "no_h100"), ["h100_sxm", "h100_pcie", "gh200"], 0)
    assert settings.evaluate and "h100_sxm" not in settings.devices and "h200_sxm" in settings.devices
    # the report beside the bundle (publishing replaces the bundle's folder), without plots or extra protocols
    assert settings.out == str(tmp_path / "no_h100-report")
    assert settings.evaluation["holdouts"] == {} and settings.evaluation["plots"] is False


def test_cached_cross_bundle_is_rebuilt_only_when_stale(tmp_path, monkeypatch, capsys):
    """The shipped bundle is fitted on the same data, rules, learner, features and code as the cross-tier
    one: its manifest marks a cached bundle current; any difference marks it stale."""
    import json

    from kernelsight.cli import validate as command
    from kernelsight.predictor.paths import data_dir

    ensure_cross_bundle = command.ensure_cross_bundle
    built = []
    monkeypatch.setattr(command, "publish", lambda settings, progress=None: built.append(settings.bundle))
    shipped = json.loads((data_dir() / "artifacts" / "default" / "manifest.json").read_text())
    cached = tmp_path / "no_h100"
    cached.mkdir()
    ensure_cross_bundle(str(cached), ["h100_sxm"], 0)
    assert built == [str(cached)] and "not built yet" in capsys.readouterr().err
    built.clear()
    (cached / "manifest.json").write_text(json.dumps({**shipped, "intervals": {}}))  # published without evaluation
    assert ensure_cross_bundle(str(cached), ["h100_sxm"], 0) == str(cached) and built == [str(cached)]
    assert "it has no kernel intervals (built without evaluation): rebuilding" in capsys.readouterr().err
    for change, what in ((lambda m: m, None),
                         (lambda m: {**m, "learner": {**m["learner"], "num_trees": 7}}, "learner"),
                         (lambda m: {**m, "training_data": m["training_data"][1:]}, "training_data"),
                         (lambda m: {**m, "code_version": "0.0.0"}, "code_version"),
                         (lambda m: {**m, "features": {**m["features"], "cross": {  # a model of other features
                             **m["features"]["cross"], "gemm": m["features"]["cross"]["gemm"][:-1]}}}, "features")):
        built.clear()
        (cached / "manifest.json").write_text(json.dumps(change(shipped)))
        assert ensure_cross_bundle(str(cached), ["h100_sxm"], 0) == str(cached)
        err = capsys.readouterr().err
        assert built == ([] if what is None else [str(cached)])
        assert (what is None and err == "") or f"{what} changed since it was built: rebuilding" in err


def test_inferencemax_deployment_runs_async_and_fuses_norms_into_small_all_reduces():
    row = small_row(concurrency=4, tp=2, deployment="inferencemax")
    engine = deployment_engine(engine_map(NO_FRONTEND), row)
    assert engine["scheduler"]["max_num_batched_tokens"] == 8192 and engine["scheduler"]["max_num_seqs"] == 4
    assert engine["host"]["async_scheduling"] and engine["allreduce"]["fuse_rms_norm_max_mib"]["tp2"] == 1.0
    # Llama-3.1-8B: 8 KiB of bf16 hidden state per token; 1 MiB fuses up to 128 tokens.
    model, par = load_model("llama3.1-8b"), ParallelConfig("tp2", tp=2)
    fused, plain = load_engine(engine), load_engine(engine_map(NO_FRONTEND))

    def norms(profile, tokens):
        return {c.name: c.count for c in token_kernels(model, par, profile, tokens) if c.family == "norm"}

    assert norms(plain, 128) == {"add_rmsnorm": 64, "rmsnorm": 1}
    assert norms(fused, 128) == {"rmsnorm": 1} and norms(fused, 129) == norms(plain, 129)
    table = {c.name: c.count for c in token_kernels(model, par, fused, np.array([1, 128, 129, 4096]))}
    assert table["add_rmsnorm"].tolist() == [0, 0, 64, 64]
    assert not load_engine(engine_map()).allreduce.fused_norm_max_bytes(2)  # off in the shipped profile


def test_backend_version_is_read_and_a_bad_one_is_one_line(tmp_path):
    header = HEADER + ",backend_version"
    rows = read_rows(write_csv(tmp_path, GOOD + ",0.18.0", GOOD.replace("a,", "b,", 1) + ",", header=header))
    assert [r.backend_version for r in rows] == [(0, 18, 0), ()]
    assert read_rows(write_csv(tmp_path, GOOD + ",0.11.2rc1", header=header))[0].backend_version == (0, 11, 2)
    message = one_line_error(read_rows, write_csv(tmp_path, GOOD + ",latest", header=header))
    assert "row 1" in message and "backend_version" in message and "'latest'" in message


def test_vllm_releases_from_0_16_fuse_the_all_reduce_with_the_norm_on_hopper_and_blackwell():
    # vLLM 0.16's -O2 fuses a TP all-reduce with the residual add and RMSNorm after it on SM 9.x / 10.x, up to
    # FI_ALLREDUCE_FUSION_MAX_SIZE_MB; not with PP or data parallelism, not on other GPUs or earlier releases.
    engine = engine_map(NO_FRONTEND)
    assert not any(engine["allreduce"]["fuse_rms_norm_max_mib"].values())

    def fused(**kw):
        return deployment_engine(engine, small_row(**{"tp": 8, "backend_version": (0, 18, 0), **kw}))[
            "allreduce"]["fuse_rms_norm_max_mib"]

    assert fused() == {"tp2": 64, "tp4": 2, "tp8": 0.5}
    assert fused(device="b200_sxm") == {"tp2": 64, "tp4": 32, "tp8": 1}
    assert fused(deployment="aiconfigurator") == fused()
    for kw in ({"backend_version": (0, 14, 0)}, {"backend_version": ()}, {"tp": 1}, {"pp": 2},
               {"attention_dp": 2}, {"device": "a100_sxm"}, {"device": "l40s"}):
        assert fused(**kw) == engine["allreduce"]["fuse_rms_norm_max_mib"], kw
    # In the graph: a decode step's add + RMSNorm kernels go into the all-reduce below 0.5 MiB at TP 8, not above.
    model, par = load_model("llama3.1-70b"), ParallelConfig("tp8", tp=8)
    profile = EngineProfile.from_mapping(deployment_engine(engine, small_row(tp=8, backend_version=(0, 18, 0))), "t")
    norms = {t: sum(c.count for c in token_kernels(model, par, profile, t) if c.family == "norm") for t in (16, 64)}
    assert norms[16] < norms[64]  # 16 x 8192 x 2 B = 0.25 MiB fused; 64 tokens = 1 MiB is not


def test_rows_of_another_serving_engine_are_refused_and_the_rest_run(tmp_path):
    header = HEADER + ",backend"
    csv = write_csv(tmp_path, GOOD + ",vllm", GOOD.replace("a,", "b,", 1) + ",trtllm",
                    GOOD.replace("a,", "c,", 1) + ",", header=header)
    rows = read_rows(csv)
    assert [r.backend for r in rows] == ["vllm", "trtllm", ""]
    models = [load_model("qwen3-32b")] * 3
    problems = refusals(rows, models, engine_map())
    assert list(problems) == [rows[1].key] and "backend 'trtllm'" in problems[rows[1].key]


def test_vllm_releases_from_0_14_schedule_asynchronously():
    # vLLM turned async scheduling on by default in 0.14.0: rows of later releases ran with it, earlier ones
    # (and rows that do not say) as the profile has it, unless their deployment asked for it.
    sync = engine_map(NO_FRONTEND)
    assert not sync["host"]["async_scheduling"]
    for version, expected in (((0, 18, 0), True), ((0, 14, 0), True), ((0, 13, 9), False), ((), False)):
        for deployment in ("engine", "aiconfigurator"):
            row = small_row(concurrency=4, deployment=deployment, backend_version=version)
            assert deployment_engine(sync, row)["host"]["async_scheduling"] is expected
    assert deployment_engine(sync, small_row(deployment="inferencemax", backend_version=(0, 10, 1)))["host"][
        "async_scheduling"]
    model, settings = load_model("llama3.1-8b"), RunSettings(0, 1, 0, sync, start="burst")
    assert simulate_row(small_row(concurrency=4, backend_version=(0, 18, 0)), model, ROOFLINE, settings).asynchronous
    assert not simulate_row(small_row(concurrency=4, backend_version=(0, 12, 0)), model, ROOFLINE,
                            settings).asynchronous


def test_async_rows_are_scored_as_they_ran_and_do_not_inform_the_host_fit():
    row, model = small_row(concurrency=4, deployment="inferencemax"), load_model("llama3.1-8b")
    settings = RunSettings(0, 1, 0, engine_map(NO_FRONTEND), start="burst")
    log = simulate_row(row, model, ROOFLINE, settings)
    assert log.asynchronous
    lin = comp.linearize(log, load_engine(settings.engine).host, np.ones(len(log.request_id), dtype=bool))
    assert lin.ttft0 == pytest.approx(log.summary["mean_ttft_ms"], rel=1e-9)
    assert lin.tpot0 == pytest.approx(log.summary["mean_tpot_ms"], rel=1e-9)
    assert set(lin.dtpot.values()) == {0.0} and lin.hidden({}) and not lin.hidden({"step_overhead_us": 1e6})
    # Only asynchronous rows to learn from: the host terms are not identified and come out 0, not the
    # profile's value (fitted on every row, the held-out ones included).
    theta = comp.fit([lin, lin], np.array([[50.0, 8.0], [50.0, 9.0]]), ["per_request_us"])
    assert theta["per_request_us"] == 0.0


def test_a_bundle_name_resolves_to_the_shipped_one_or_the_user_cache(tmp_path, monkeypatch):
    """Bundles built on demand (the cross-tier validation bundle) go to the user cache, never into the package."""
    from kernelsight.validate.cross_bundle import resolve_bundle

    monkeypatch.setenv("KERNELSIGHT_CACHE", str(tmp_path / "cache"))
    assert resolve_bundle(None) is None
    assert resolve_bundle("default").endswith("artifacts/default")
    assert resolve_bundle("no_h100") == str(tmp_path / "cache" / "bundles" / "no_h100")
    assert resolve_bundle(str(tmp_path)) == str(tmp_path)
