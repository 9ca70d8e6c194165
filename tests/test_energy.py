"""The energy model: the estimator recovers known parameters, the evaluation keeps shape groups whole, the
artifact round-trips and refuses a missing or edited file in one line, and a simulation's energy is the sum of
power x time over its kernels plus the idle power over the rest of the time, recomputed here kernel by kernel."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from kernelsight.calibrate import energy as ce
from kernelsight.predictor.energy import (POOLED, EnergyModel, PowerModel, content_sha256, default_energy_path,
                                          load_energy_model, utilisation)
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import load_hardware
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.compose import compose, typed_configs, workload_config
from kernelsight.sim.energy import ENERGY_KEYS, FAMILY_PREFIX
from kernelsight.sim.run import build_setup, run

H100 = load_hardware("h100_sxm")


# -- the estimator --------------------------------------------------------------------------------

@pytest.mark.parametrize("truth", [(0.2, 0.6, 0.5), (0.15, 2.0, 0.4), (0.05, 0.0, 0.9)])
def test_power_model_recovers_known_parameters(truth):
    """Noise-free rows of a known model (some at the TDP cap) give back its parameters."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (300, 2)) * [0.5, 1.0]
    y = np.minimum(truth[0] + X @ truth[1:], 1.0)
    fit = PowerModel().fit(X, y)
    assert (fit.static_, fit.compute_, fit.memory_) == pytest.approx(truth, abs=1e-6)
    assert fit.predict(X) == pytest.approx(y, rel=1e-6)
    assert fit.get_params() == {"max_static": 1.0, "max_coef": 4.0}


def test_power_model_is_not_pulled_low_by_noise():
    """Multiplicative noise: the log-ratio fit keeps the median prediction on the median reading."""
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 0.6, (4000, 2))
    truth = 0.2 + X @ [0.7, 0.5]
    y = truth * np.exp(rng.normal(0, 0.2, len(X)))
    ratio = PowerModel().fit(X, y).predict(X) / truth
    assert np.median(ratio) == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("X, y, message", [
    (np.ones((5, 3)), np.ones(5), "shape"),
    (np.full((5, 2), 1.5), np.ones(5), r"\[0, 1\]"),
    (np.full((5, 2), np.nan), np.ones(5), "finite"),
    (np.full((5, 2), 0.5), np.ones(4), "4 power readings"),
    (np.full((2, 2), 0.5), np.ones(2), "at least 3"),
    (np.full((5, 2), 0.5), [1, 1, 0, 1, 1], "> 0"),
])
def test_power_model_bad_inputs_are_one_line(X, y, message):
    with pytest.raises(KernelsightError, match=message) as err:
        PowerModel().fit(X, y)
    assert "\n" not in str(err.value)


def test_power_model_predict_before_fit_and_bad_bounds():
    with pytest.raises(KernelsightError, match="before fit"):
        PowerModel().predict(np.zeros((1, 2)))
    with pytest.raises(KernelsightError, match="must be > 0"):
        PowerModel(max_coef=0).fit(np.full((5, 2), 0.5), np.ones(5))
    with pytest.raises(KernelsightError, match="no parameter"):
        PowerModel().set_params(alpha=1)


def test_utilisation_is_the_roofline_share_of_the_time_capped_at_one():
    c, m = utilisation([1.0, 3.0, 1.0], [2.0, 1.0, 0.0], [4.0, 2.0, 0.0])
    assert c.tolist() == [0.25, 1.0, 0.0] and m.tolist() == [0.5, 0.5, 0.0]


# -- the evaluation's grouping ----------------------------------------------------------------------

def _gemm_rows(ms, ns, power=500.0) -> pd.DataFrame:
    rows = pd.DataFrame({"family": "gemm", "m": ms, "n": ns, "k": 4096, "dtype": "bf16", "provider": "p",
                         "device": "h100_sxm", "sweep_id": "s", "latency_ms": 0.1, "energy_j": power * 1e-4,
                         "power_w": power, "status": "ok", "flags": ""})
    return rows


def test_folds_keep_near_duplicate_shapes_together():
    """m = 4096 and 4097 (and the same shape twice) round to one power-of-two group: always one fold."""
    ms = [1, 2, 16, 64, 256, 1024, 4096, 4097, 4096, 16384, 8, 32]
    rows = _gemm_rows(ms, [4096] * len(ms))
    folds = ce.folds_of(rows, 5, 0)
    groups = ce.shape_groups(rows)
    assert groups[6] == groups[7] == groups[8] and groups[0] != groups[1]
    for g in np.unique(groups):
        assert len(set(folds[groups.to_numpy() == g])) == 1
    assert len(set(folds)) == 5


def test_crossval_predicts_each_fold_from_the_others_only(monkeypatch):
    """Every row's prediction comes from a fit that never saw its fold (its shape group)."""
    rows = _gemm_rows([2 ** i for i in range(12)], [4096] * 12)
    rows["t_loop"] = rows["t_timed"] = 1e-4
    rows["tdp_w"] = 700.0
    rows["compute_share_loop"] = rows["compute_share_timed"] = np.linspace(0.01, 0.9, 12)
    rows["memory_share_loop"] = rows["memory_share_timed"] = np.linspace(0.9, 0.05, 12)
    seen = []
    real = ce.fit_families

    def spy(train, pooled):
        seen.append(set(train.index))
        return real(train, pooled)
    monkeypatch.setattr(ce, "fit_families", spy)
    settings = ce.EnergySettings(fit=["x"], folds=4, min_groups=1)
    pred = ce.crossval(rows, settings)
    folds = ce.folds_of(rows, 4, 0)
    assert len(seen) == 4
    for f, train in zip(sorted(set(folds)), seen):
        assert train == set(rows.index[folds != f])
    assert pred["model_w_loop"].notna().all() and pred["constant_w"].notna().all()


def test_rows_above_tdp_are_kept_and_implausible_ones_dropped():
    rows = _gemm_rows([64, 128, 256, 512], [4096] * 4)
    rows["power_w"] = [500.0, 900.0, 1100.0, np.nan]
    rows["energy_j"] = rows["power_w"] * 1e-4
    kept, counts = ce.select_rows(rows, {}, max_power_tdp=1.5)
    assert kept["power_w"].tolist() == [500.0, 900.0]
    assert counts[["implausible power", "no energy", "used"]].iloc[0].tolist() == [1, 1, 2]
    kept, counts = ce.select_rows(rows, {"gemm": ["other"]}, max_power_tdp=1.5)
    assert kept.empty and counts["other provider"].iloc[0] == 2


# -- the artifact ----------------------------------------------------------------------------------

def _model() -> EnergyModel:
    params = {"gemm": {"static": 0.2, "compute": 1.5, "memory": 0.4, "rows": 10, "fit": "family"},
              POOLED: {"static": 0.25, "compute": 1.0, "memory": 0.5, "rows": 20, "fit": "every row"}}
    return EnergyModel(params, 0.2, {"device": "h100_sxm"}, {"x": 1})


def test_artifact_round_trip(tmp_path):
    path = _model().save(tmp_path / "energy.json")
    back = load_energy_model(path)
    assert back.families == _model().families and back.idle == 0.2 and back.fitted_on == {"device": "h100_sxm"}
    assert back.to_dict() == _model().to_dict()
    assert back.params("moe") == back.families[POOLED] and back.source("gemm") == "family"
    assert back.source("moe") == POOLED


def _write(path, edit=None, rehash=False, text=None):
    doc = _model().to_dict()
    if edit:
        edit(doc)
    if rehash:
        doc["content_sha256"] = content_sha256(doc)
    path.write_text(text if text is not None else json.dumps(doc))
    return path


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "no such file"),
    (lambda p: _write(p, lambda d: d["families"]["gemm"].update(static=0.3)), "content hash mismatch"),
    (lambda p: _write(p, lambda d: d.update(idle=0.5)), "content hash mismatch"),
    (lambda p: _write(p, text="{not json"), "not valid JSON"),
    (lambda p: _write(p, text="[1, 2]"), "not a JSON object"),
    (lambda p: _write(p, lambda d: d.update(format="other")), "format"),
    (lambda p: _write(p, lambda d: d.update(schema_version=99), rehash=True), "newer"),
    (lambda p: _write(p, lambda d: d.pop("idle"), rehash=True), "missing idle"),
    (lambda p: _write(p, lambda d: d["families"]["gemm"].update(static=1.5), rehash=True), r"static = 1.5"),
    (lambda p: _write(p, lambda d: d["families"]["gemm"].update(memory="x"), rehash=True), "must be numbers"),
    (lambda p: _write(p, lambda d: d["families"].pop(POOLED), rehash=True), "pooled"),
])
def test_a_missing_or_tampered_artifact_is_one_line(tmp_path, make, message):
    path = make(tmp_path / "energy.json")
    with pytest.raises(KernelsightError, match=message) as err:
        load_energy_model(path)
    assert "\n" not in str(err.value) and "energy.json" in str(err.value)


def test_shipped_artifact_loads_and_covers_the_measured_families():
    model = load_energy_model()
    assert model.path == default_energy_path()
    measured = {"gemm", "attn_prefill", "attn_decode", "kv_write", "rope", "norm", "act", "elementwise", "moe"}
    assert measured <= set(model.families) and POOLED in model.families
    assert model.fitted_on["device"] == "h100_sxm" and 0 < model.idle < 0.5
    for family in measured:
        kfold = model.metrics["energy_mape_kfold"][family]
        assert kfold["model"] < kfold["tdp"]  # held-out figures beside the baseline
    h200 = model.metrics["energy_mape_held_out_gpu"]["h200_sxm/all"]
    assert h200["model"] < h200["constant"] < h200["tdp"]


def test_a_gpu_without_tdp_cannot_be_bound():
    with pytest.raises(KernelsightError, match="no TDP"):
        _model().bind(load_hardware("gh200"))


# -- simulation ------------------------------------------------------------------------------------

def _setup(groups=None, energy=None, **overrides):
    cfg, sources = compose(groups, overrides or None)
    return build_setup(*typed_configs(cfg, sources), workload_config(cfg), energy=energy)


def _by_hand(setup, batches, duration: float, gpus: int) -> dict:
    """Energy of the steps' kernels priced one by one (the predictor's roofline terms, the artifact's parameters,
    P = TDP x min(1, s + a c + b m)) plus the idle power over the time no kernel runs."""
    pricer, model = setup.pricer, load_energy_model()
    tdp, idle_w = setup.hw.tdp_w, model.idle * setup.hw.tdp_w
    family, busy, launch = {}, 0.0, 0.0
    for batch in batches:
        kernel_s = 0.0
        for call in pricer._step_calls(batch):
            priced = pricer.predictor.predict(call.columns(), family=call.family)
            t = priced["seconds"]
            p = model.params(call.family)
            watts = tdp * np.minimum(1.0, p["static"] + p["compute"] * np.minimum(priced["t_compute"] / t, 1)
                                     + p["memory"] * np.minimum(priced["t_memory"] / t, 1))
            family[call.family] = family.get(call.family, 0.0) + call.count * call.scale * float((watts * t).sum())
            kernel_s += call.count * call.scale * float(t.sum())
        gpu = pricer.breakdown(batch)["gpu_s"]
        busy += gpu
        launch += max(gpu - kernel_s, 0.0)
    idle = idle_w * (launch + gpus * duration - busy)
    return {"family": family, "idle": idle, "total": sum(family.values()) + idle}


@pytest.mark.parametrize("groups, overrides, by_family", [
    (None, {"workload.input.value": 300, "workload.output.value": 12}, True),
    # flat masked attention's kernels (gathers, masks: elementwise rows) count as attention in the breakdown
    ({"engine": "transformers_cb"}, {"workload.input.value": 200, "workload.output.value": 10}, False),
], ids=["vllm", "flat_attention"])
def test_simulated_energy_is_power_times_time_summed_over_kernels(groups, overrides, by_family):
    """A tiny run (every step kept as a sample): the summary's energy equals the kernels' power x time recomputed
    one kernel at a time, plus idle power for the rest (the tables interpolate attention: 0.5 %)."""
    setup = _setup(groups, **overrides)
    result = run(setup, 4, seed=0, fast_forward=False)
    s, acc = result.summary, result.engine.breakdown
    assert len(acc.sample) == s["num_steps"]  # every step is in the sample
    hand = _by_hand(setup, acc.sample, s["duration_s"], 1)
    assert s["energy_j"] == pytest.approx(hand["total"], rel=5e-3)
    for family, joules in hand["family"].items() if by_family else ():
        assert s[f"{FAMILY_PREFIX}{family}"] == pytest.approx(joules, rel=5e-3), family
    assert s[f"{FAMILY_PREFIX}idle"] == pytest.approx(hand["idle"], rel=5e-3)
    assert s["energy_per_output_token_j"] == pytest.approx(s["energy_j"] / s["total_output_tokens"])
    assert s["energy_per_request_j"] == pytest.approx(s["energy_j"] / s["completed"])
    assert s["mean_power_w_per_gpu"] == pytest.approx(s["energy_j"] / s["duration_s"])
    assert s["mean_power_w_per_gpu"] <= s["peak_power_w_per_gpu"] <= setup.hw.tdp_w
    assert s["energy_gpus"] == 1


def test_energy_counts_every_gpu_of_a_tensor_parallel_replica():
    """tp=2: both GPUs run the step's kernels; per-GPU mean power stays per GPU."""
    one = run(_setup(**{"workload.input.value": 300, "workload.output.value": 12}), 4, seed=0).summary
    two = run(_setup({"parallel": "tp2"}, **{"workload.input.value": 300, "workload.output.value": 12}), 4,
              seed=0).summary
    assert two["energy_gpus"] == 2
    assert two["energy_j"] == pytest.approx(two["mean_power_w_per_gpu"] * 2 * two["duration_s"])
    assert one["energy_j"] < two["energy_j"] < 2 * one["energy_j"] * 1.5


@pytest.mark.parametrize("groups", [None, {"engine": "transformers_cb"}], ids=["dense", "flat_attention"])
def test_a_decode_run_prices_the_energy_of_each_of_its_steps(groups):
    """pricer.decode_run's joules equal breakdown()'s of every step's batch (what fast-forward adds)."""
    pricer = _setup(groups).pricer
    rng = np.random.default_rng(2)
    for n, steps in ((1, 30), (9, 120)):
        ctx = rng.integers(1, 5000, n)
        parts = pricer.decode_run(ctx, steps, breakdown=True)
        for j in range(steps):
            energy = pricer.breakdown(StepBatch(decode_ctx=tuple((ctx + j).tolist())))["energy"]
            mine = dict(parts.energy_families)
            mine[parts.attention_family] = mine.get(parts.attention_family, 0.0) + parts.attention_j[j]
            if parts.launch_j[j]:
                mine["launch"] = parts.launch_j[j]
            assert mine == pytest.approx(energy, rel=1e-12)


def test_energy_off_and_gpu_without_tdp_give_nan_fields():
    off = run(_setup(energy=False, **{"workload.output.value": 4}), 2, seed=0).summary
    assert all(math.isnan(off[k]) for k in ENERGY_KEYS if k != "energy_gpus")
    no_breakdown = run(_setup(**{"workload.output.value": 4}), 2, seed=0, breakdown=False).summary
    assert math.isnan(no_breakdown["energy_j"])
    with pytest.warns(UserWarning, match="gh200 has no TDP"):
        setup = _setup({"hardware": "gh200"}, **{"workload.output.value": 4})
    assert math.isnan(run(setup, 2, seed=0).summary["energy_j"])


def test_simulate_with_a_missing_energy_model_is_one_line(tmp_path):
    with pytest.raises(KernelsightError, match="no such file") as err:
        _setup(energy=tmp_path / "none.json")
    assert "\n" not in str(err.value)


# -- the CLI ----------------------------------------------------------------------------------------

def test_simulate_prints_the_energy_section(run_cli):
    code, out, err = run_cli(["simulate", "num_requests=20", "plots=false"])
    assert code == 0, err
    for label in ("Energy per output token (J):", "Energy per request (J):", "Mean / peak power per GPU (W):",
                  "Total energy (kJ):"):
        assert label in out
    assert "gemm" in out.split("Energy per output token")[1]


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "energy", "folds=1"], "folds=1"),
    (["calibrate", "energy", "max_power_tdp=0.9"], "max_power_tdp"),
    (["calibrate", "energy", "data.fit=[]"], "data.fit"),
    (["calibrate", "energy", "data.fit=[no/such/sweep]"], "no/such/sweep"),
    (["calibrate", "energy", "data.fit=[sweeps/h100_sxm/energy-1,sweeps/h200_sxm/full-1]"], "one GPU"),
])
def test_calibrate_energy_bad_inputs_are_one_line(run_cli, tmp_path, argv, message):
    code, out, err = run_cli([*argv, f"out={tmp_path / 'r'}", f"artifact={tmp_path / 'e.json'}"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "e.json").exists()


def test_calibrate_energy_writes_a_report_and_a_loadable_artifact(run_cli, tmp_path):
    """The shipped config, into a temporary folder: the artifact it writes is the shipped one (the fit is
    deterministic and the artifact holds no time stamp; the last digits may differ between numeric libraries)."""
    code, out, err = run_cli(["calibrate", "energy", f"out={tmp_path / 'r'}", f"artifact={tmp_path / 'e.json'}"])
    assert code == 0, err
    assert "held out" in out and (tmp_path / "r" / "REPORT.md").is_file()
    mine, shipped = load_energy_model(tmp_path / "e.json"), load_energy_model()
    assert mine.fitted_on == shipped.fitted_on and mine.details == shipped.details
    for family, params in shipped.families.items():
        assert mine.families[family] == pytest.approx(params, rel=1e-6, abs=1e-9), family
    assert mine.idle == shipped.idle
