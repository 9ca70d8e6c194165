"""The frontend delay per scheduling mode: the engine profile's two settings, and `validate`'s choice among
candidate delays (fit.frontend) on every row and leave-one-model-out."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernelsight import cli
from kernelsight.predictor.errors import KernelsightError
from kernelsight.sim.engine_profile import EngineProfile
from kernelsight.sim.run import build_setup
from kernelsight.sim.model import load_model
from kernelsight.sim.parallel import load_parallel
from kernelsight.predictor.hardware import load_hardware
from kernelsight.sim.workload import WorkloadConfig
from kernelsight.validate.rows import default_csv
from kernelsight.validate.score import choose_frontend, parse_frontend_fit

from test_validate import engine_map


def test_an_async_engine_takes_its_own_frontend_delay_and_falls_back_to_the_synchronous_one():
    both = engine_map({"latency_ms": 5, "jitter_ms": 10, "async_latency_ms": 1, "async_jitter_ms": 0})
    profile = EngineProfile.from_mapping(both)
    assert profile.frontend.delay_ms(False) == (5, 10) and profile.frontend.delay_ms(True) == (1, 0)
    one = engine_map({"latency_ms": 5, "jitter_ms": 10})
    one["frontend"].pop("async_latency_ms", None), one["frontend"].pop("async_jitter_ms", None)
    assert EngineProfile.from_mapping(one).frontend.delay_ms(True) == (5, 10)
    with pytest.raises(KernelsightError, match="'frontend.async_latency_ms' = -1: must be >= 0"):
        EngineProfile.from_mapping(engine_map({"async_latency_ms": -1}))
    for async_scheduling, expected in ((False, 5e-3), (True, 1e-3)):
        engine = {**both, "host": {**both["host"], "async_scheduling": async_scheduling}}
        setup = build_setup(load_model("llama3.1-8b"), load_hardware("h100_sxm"), EngineProfile.from_mapping(engine),
                            load_parallel("default"), WorkloadConfig.from_config({"name": "w"}), tier="roofline")
        assert setup.new_engine(0).frontend_latency_s == pytest.approx(expected)


def test_each_mode_picks_the_lowest_median_error_and_a_held_out_model_never_votes_for_itself():
    # rows: model a (sync) prefers candidate 1, models b and c (sync) prefer 0; model d alone runs async.
    errors = np.array([[0.9, 0.0], [0.9, 0.0], [0.9, 0.0], [0.1, 0.2], [0.1, 0.2], [0.3, 0.1]])
    groups = ["a", "a", "a", "b", "c", "d"]
    asynchronous = np.array([False] * 5 + [True])
    picks = choose_frontend(errors, asynchronous, groups)
    assert picks["all rows"] == {"sync": 1, "async": 1}
    assert picks["a"] == {"sync": 0, "async": 1}          # without a's rows, b and c decide
    assert picks["b"]["sync"] == 1 and picks["c"]["sync"] == 1
    assert picks["d"] == {"sync": 1, "async": 0}          # no other async rows: the first candidate
    only_async = choose_frontend(errors, asynchronous, groups, modes_fitted=("async",))
    assert only_async["all rows"] == {"sync": None, "async": 1}   # synchronous rows keep the profile's delay


GOOD_CANDIDATES = [{"latency_ms": 5, "jitter_ms": 10}, {"latency_ms": 0, "jitter_ms": 0}]


@pytest.mark.parametrize("section, message", [
    ([{"latency_ms": 1, "jitter_ms": 0}],
     "expected {candidates: [{latency_ms, jitter_ms}, ...], modes: [sync, async]}"),
    ({"candidates": GOOD_CANDIDATES}, "expected {candidates"),
    ({"candidates": "5+10", "modes": ["async"]}, "fit.frontend.candidates='5+10': must be a non-empty list"),
    ({"candidates": GOOD_CANDIDATES, "modes": ["later"]},
     "fit.frontend.modes=['later']: must be a non-empty list of sync, async"),
    ({"candidates": [{"latency_ms": -1, "jitter_ms": 0}], "modes": ["async"]},
     "field 'fit.frontend.candidates[0].latency_ms' = -1: must be >= 0"),
    ({"candidates": [{"latency_ms": 1}], "modes": ["async"]}, "missing field 'fit.frontend.candidates[0].jitter_ms'"),
    ({"candidates": [{"latency_ms": 1, "jitter_ms": 0, "delay": 2}], "modes": ["sync"]},
     "unknown field 'fit.frontend.candidates[0].delay'"),
    ({"candidates": [{"latency_ms": 1, "jitter_ms": 0}] * 2, "modes": ["sync"]}, "1+0 ms is listed twice")])
def test_bad_frontend_fits_are_one_line(section, message):
    with pytest.raises(KernelsightError) as e:
        parse_frontend_fit(section)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert parse_frontend_fit(None) == ((), ())
    assert parse_frontend_fit({"candidates": GOOD_CANDIDATES, "modes": ["async", "sync"]}) == (((5, 10), (0, 0)),
                                                                                                ("sync", "async"))


def test_validate_simulates_each_candidate_apart_and_reports_its_picks(tmp_path, capsys):
    table, report = tmp_path / "rows.csv", tmp_path / "validation.md"
    # row 1: Qwen3-32B, vLLM 0.12 (synchronous); rows 116, 117: Llama-3.1-70B, InferenceMAX (asynchronous)
    common = ["validate", str(default_csv()), "rows=[1,116,117]", "tiers.cross=null", "intervals=false", "plots=false",
              "tiers.target.predictor_tier=roofline", "protocol.num_requests=16", "jobs=1"]
    cli.main([*common, f"table={table}", f"report={report}", "fit.frontend.modes=[async]",
              "fit.frontend.candidates=[{latency_ms:7,jitter_ms:0},{latency_ms:0,jitter_ms:0}]",
              "engine.frontend.latency_ms=3", "engine.frontend.jitter_ms=0"])
    df = pd.read_csv(table).set_index("line")
    # the synchronous row keeps the profile's delay; Llama, alone in its mode, runs held out at the first candidate
    assert list(df["frontend"]) == ["profile 3+0 ms", "7+0 ms", "7+0 ms"]
    kept = sorted(p.name for p in table.with_suffix(".parts").iterdir())
    assert kept == ["target-frontend0-0-vllm_dev-row116.npz", "target-frontend0-0-vllm_dev-row117.npz",
                    "target-frontend7-0-vllm_dev-row116.npz", "target-frontend7-0-vllm_dev-row117.npz",
                    "target-vllm_dev-row1.npz"]
    text = report.read_text()
    assert "| all but meta-llama/Llama-3.1-70B | profile 3+0 ms | 7+0 ms |" in text
    assert "of asynchronous rows chosen among 7+0 ms, 0+0 ms (fit.frontend)" in text
    # in sample, the asynchronous rows run at the candidate with the lower median TTFT error
    at = {}
    for c in (0, 7):
        cli.main([*common, f"table={tmp_path / f'at{c}.csv'}", f"report={tmp_path / f'at{c}.md'}", "fit.frontend=null",
                  f"engine.frontend.async_latency_ms={c}", "engine.frontend.async_jitter_ms=0"])
        at[c] = pd.read_csv(tmp_path / f"at{c}.csv").set_index("line").loc[[116, 117]]
    best = min((0, 7), key=lambda c: at[c]["err_ttft_simulated"].abs().median())
    assert df.loc[[116, 117], "ttft_simulated"].tolist() == pytest.approx(at[best]["ttft_simulated"].tolist())
    capsys.readouterr()


def test_rows_that_are_not_eligible_do_not_vote():
    errors = np.array([[0.1, 0.2], [0.1, 0.2], [0.9, 0.0]])
    picks = choose_frontend(errors, np.zeros(3, dtype=bool), ["a", "a", "b"], eligible=np.array([True, True, False]))
    assert picks["all rows"]["sync"] == 0 and picks["a"]["sync"] == 0   # b's row queues: a's held-out pick falls back


def test_a_row_queues_when_its_ttft_is_ten_times_its_models_median():
    from kernelsight.validate.report import queueing

    flags = queueing([100, 120, 90, 5000, 50, 40], ["a", "a", "a", "a", "b", "b"])
    assert flags.tolist() == [False, False, False, True, False, False]
