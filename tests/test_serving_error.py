"""The engine profile's serving error: the simulator's own error on real runs, which widens simulated 80 % ranges
(sim/engine_profile.py ServingError), and how `kernelsight validate` fits it and scores it held out
(validate/serving_error.py)."""
from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import conf_dir, read_yaml
from kernelsight.sim.engine_profile import ServingError, load_engine
from kernelsight.validate import serving_error


def _profile(**error):
    data = read_yaml(conf_dir() / "engine" / "vllm_v1.yaml", "engine")
    data["serving_error"] = error
    return load_engine(data)


def test_the_shipped_profile_carries_a_serving_error_and_it_is_not_part_of_what_runs():
    shipped = load_engine("vllm_v1")
    for metric in ("ttft", "tpot", "throughput"):
        lo, hi = getattr(shipped.serving_error, metric)
        assert lo < 0 < hi
    without = _profile()
    assert without.serving_error == ServingError()
    # cached simulations are keyed by the profile's repr: the serving error does not change a simulation
    without = replace(without, source=shipped.source)
    assert repr(without) == repr(shipped) and without == shipped


@pytest.mark.parametrize("error, why", [
    ({"ttft": {"p10": 0.2, "p90": -0.1}}, "p10 = 0.2 must be <= p90 = -0.1"),
    ({"ttft": {"p10": "low", "p90": 0.1}}, "must be a finite number"),
    ({"tpot": {"p10": -0.1}}, "missing field 'serving_error.tpot.p90'"),
    ({"latency": {"p10": -0.1, "p90": 0.1}}, "unknown field 'serving_error.latency'"),
])
def test_a_bad_serving_error_is_one_line_naming_the_field(error, why):
    with pytest.raises(KernelsightError) as e:
        _profile(**error)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_each_summary_metric_widens_by_the_measured_metric_that_stands_for_it():
    error = ServingError(ttft=(-0.2, 0.3), tpot=(-0.1, 0.1), throughput=None)
    assert [ServingError.metric_of(k) for k in ("p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "median_itl_ms",
                                                "request_throughput", "duration_s")] == \
        ["ttft", "tpot", "tpot", "tpot", "throughput", None]
    lo, hi = error.widen("mean_ttft_ms", 100.0, 95.0, 110.0)
    assert lo == pytest.approx(100 * math.exp(-0.2)) and hi == pytest.approx(100 * math.exp(0.3))
    assert error.widen("mean_tpot_ms", 10.0, 8.0, 12.0) == (8.0, 12.0)  # kernels' range already wider
    assert error.widen("output_throughput", 50.0, 49.0, 51.0) == (49.0, 51.0)  # no serving error for it


def test_simulate_widens_latency_ranges_and_closed_loop_throughput_only():
    import kernelsight

    def ranges(**settings):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = kernelsight.simulate(num_requests=40, **settings).summary
        return s, s["intervals"]

    error = load_engine("vllm_v1").serving_error
    s, got = ranges()
    lo, hi = got["mean_ttft_ms"]
    assert lo <= s["mean_ttft_ms"] * math.exp(error.ttft[0]) + 1e-9
    assert hi >= s["mean_ttft_ms"] * math.exp(error.ttft[1]) - 1e-9
    # open loop below capacity: the arrival rate sets the throughput, so its range stays the kernels'
    lo, hi = got["request_throughput"]
    assert s["request_throughput"] * math.exp(error.throughput[0]) < lo
    closed, got = ranges(**{"workload": "closed_loop"})
    lo, hi = got["request_throughput"]
    assert lo <= closed["request_throughput"] * math.exp(error.throughput[0]) + 1e-9


def _frame(bias: dict, rows: int = 20, seed: int = 0) -> pd.DataFrame:
    """Validation rows of models with a log error of `bias[model]` plus noise; one tier."""
    rng = np.random.default_rng(seed)
    parts = []
    for model, b in bias.items():
        predicted = rng.uniform(10, 100, rows)
        parts.append(pd.DataFrame({
            "tier": "target", "model_path": model, "precision": "bf16",
            "ttft_heldout": predicted, "ttft": predicted * np.exp(b + rng.normal(0, 0.05, rows)),
            "tpot_heldout": predicted, "tpot": predicted * np.exp(b + rng.normal(0, 0.05, rows)),
            "throughput_heldout": predicted, "throughput": predicted * np.exp(-b + rng.normal(0, 0.05, rows))}))
    return pd.concat(parts, ignore_index=True)


def test_the_fit_treats_the_model_as_the_unit_and_leaves_queueing_rows_out():
    df = _frame({"a": -0.1, "b": 0.0, "c": 0.1})
    plain = np.quantile(np.log(df["ttft"] / df["ttft_heldout"]), [0.1, 0.9])
    fitted = serving_error.fit(df).ttft
    assert fitted[0] < plain[0] and fitted[1] > plain[1]  # three biases: the range of a new model is wider
    queueing = df.copy()
    queueing.loc[0, "ttft"] = 1e6  # above 10x its model's median TTFT: waits for KV capacity, not a model error
    assert serving_error.fit(queueing).ttft == pytest.approx(serving_error.fit(df.drop(index=0)).ttft)
    assert serving_error.fit(df[df["model_path"] == "a"]) == ServingError()  # one model: nothing to fit


def test_a_held_out_model_is_scored_against_the_other_models_range():
    df = _frame({"a": 0.0, "b": 0.02, "c": -0.02, "far": 1.0})
    out = serving_error.add_heldout_ranges(df)
    far = out[out["model_path"] == "far"]
    assert (far["ttft"] > far["ttft_serving_hi"]).all()  # its own residuals never widen its range
    expected = serving_error.fit(df[df["model_path"] != "far"]).ttft
    assert far["ttft_serving_hi"].to_numpy() == pytest.approx(far["ttft_heldout"].to_numpy() * np.exp(expected[1]))
    covered = serving_error.coverage(out)
    assert list(covered.columns) == ["tier", "metric", "rows", "kernels %", "serving error %", "both %"]
    ttft = covered[covered["metric"] == "TTFT"].iloc[0]
    assert ttft["rows"] == len(df) and ttft["serving error %"] <= 75 and np.isnan(ttft["kernels %"])


def test_coverage_of_both_ranges_is_the_wider_of_the_two():
    df = _frame({"a": 0.0, "b": 0.02, "c": -0.02, "far": 1.0})
    df["ttft_lo"], df["ttft_hi"] = df["ttft_heldout"] * 0.5, df["ttft_heldout"] * 5.0  # kernels cover "far"
    covered = serving_error.coverage(serving_error.add_heldout_ranges(df)).set_index("metric")
    assert covered.loc["TTFT", "both %"] >= max(covered.loc["TTFT", "kernels %"],
                                                covered.loc["TTFT", "serving error %"])
    assert covered.loc["TTFT", "both %"] == 100.0
