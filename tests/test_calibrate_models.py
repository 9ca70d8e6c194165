"""η estimators and the evaluation machinery (synthetic data with a known η: machinery only)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernelsight.calibrate.evaluate import build_blocks, evaluate_target, group_folds, group_ids, metrics
from kernelsight.calibrate.models import ConstantEtaBaseline, EtaRegressor, RooflineBaseline
from kernelsight.calibrate.rows import choose_sweeps, select, split_sweep_id, with_eta
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.features import feature_matrix
from kernelsight.predictor.hardware import load_hardware

from calibrate_synthetic import FAST_LEARNER, gemm_rows, known_eta

H100 = load_hardware("h100_sxm")


def _fit(df, **params):
    x = feature_matrix("gemm", "target", {c: df[c].to_numpy() for c in ("m", "n", "k", "dtype")}, H100)
    eta = with_eta(df)["eta"].to_numpy()
    return x, eta, EtaRegressor("gemm", "target", "h100_sxm", **{**FAST_LEARNER, **params}).fit(x, eta)


def test_fit_predict_round_trip_recovers_known_eta():
    df = gemm_rows("h100_sxm")
    x, eta, model = _fit(df)
    pred = model.predict(x)
    truth = known_eta(df["flops"].to_numpy(), "h100_sxm")
    assert np.median(np.abs(pred / truth - 1)) < 0.05
    assert model.card_["rows"] == len(df) and model.card_["features"][0] == "log2_m"


def test_predictions_are_floored_at_one_and_the_floor_is_visible():
    df = gemm_rows("h100_sxm")
    x, eta, _ = _fit(df)
    model = EtaRegressor("gemm", "target", "h100_sxm", **FAST_LEARNER).fit(x, eta * 0.5)  # η in [0.6, 3.5]
    floored, raw = model.predict(x), model.predict(x, floor=False)
    assert floored.min() == 1.0 and raw.min() < 0.9
    assert np.all(floored == np.maximum(raw, 1.0))


def test_a_gap_model_learns_the_time_above_the_roofline():
    """gap_tiers: the model's output is log(t - t_roof) in us, turned into η = 1 + gap / t_roof on the row's own
    roofline; rows below the roofline learn a gap of MIN_GAP roofline times, so η stays >= 1 without the floor."""
    from kernelsight.calibrate.models import MIN_GAP
    from kernelsight.predictor.features import feature_names
    df = gemm_rows("h100_sxm")
    cols = {c: df[c].to_numpy() for c in ("m", "n", "k", "dtype")}
    x = feature_matrix("gemm", "cross", cols, H100)
    eta = with_eta(df)["eta"].to_numpy()
    gap = EtaRegressor("gemm", "cross", gap_tiers=("cross",), **FAST_LEARNER).fit(x, eta)
    assert gap.card_["learner"]["target"] == "log gap_us"
    t_roof_us = np.exp2(x[:, feature_names("gemm", "cross").index("log2_t_roof_us")])
    raw = np.exp(gap.model_.booster.predict(x))
    assert np.allclose(gap.predict(x, floor=False), 1 + raw / t_roof_us)
    assert np.median(np.abs(gap.predict(x) / eta - 1)) < 0.05
    fast = EtaRegressor("gemm", "cross", gap_tiers=("cross",), **FAST_LEARNER).fit(x, eta * 0.5)
    assert fast.predict(x, floor=False).min() >= 1 + 0.5 * MIN_GAP
    plain = EtaRegressor("gemm", "cross", gap_tiers=("target",), **FAST_LEARNER).fit(x, eta)
    assert plain.card_["learner"]["target"] == "log eta"  # only the tiers named learn the gap


def test_a_model_of_an_unknown_target_is_refused_in_one_line():
    from kernelsight.predictor.bundle import EtaModel
    df = gemm_rows("h100_sxm")
    x, eta, model = _fit(df)
    card = {**model.card_, "learner": {**model.card_["learner"], "target": "log latency_ms"}}
    with pytest.raises(KernelsightError) as e:
        EtaModel(model.model_text_, card, "cards/gemm.json")
    assert str(e.value) == ("cards/gemm.json: model learns 'log latency_ms', which this kernelsight cannot turn "
                            "into η (it reads 'log eta' and 'log gap_us'); upgrade kernelsight")


def test_inputs_outside_the_training_range_are_clamped_and_flagged():
    small = gemm_rows("h100_sxm")
    small = small[small["m"] <= 512]
    x, eta, model = _fit(small)
    huge = feature_matrix("gemm", "target", {"m": [8192, 16384, 64], "n": [4096] * 3, "k": [4096] * 3,
                                             "dtype": ["bf16", "bf16", "fp8"]}, H100)
    pred, flag = model.model_.eta(huge)
    assert flag.tolist() == [True, True, True]  # m beyond training; fp8 never seen
    assert pred[0] == pytest.approx(pred[1])  # both clamped to the largest trained m
    inside, flag_in = model.model_.eta(x[:5])
    assert not flag_in.any()


def test_same_inputs_same_model_text():
    df = gemm_rows("h100_sxm")
    _, _, a = _fit(df)
    _, _, b = _fit(df)
    assert a.model_text_ == b.model_text_


def test_baselines():
    const = ConstantEtaBaseline().fit(["a", "a", "a", "b"], ["gemm"] * 4, [1.0, 2.0, 9.0, 4.0])
    assert const.predict(["a", "b", "c"], ["gemm"] * 3).tolist() == [2.0, 4.0, 3.0]  # c: median of medians
    assert RooflineBaseline().fit(["a"], ["gemm"], [3.0]).predict(["a", "b"], ["gemm"] * 2).tolist() == [1, 1]


def test_near_duplicate_shapes_share_a_group_and_groups_never_straddle_folds():
    df = pd.DataFrame({"m": [4096, 4097, 4000, 1, 2, 64], "n": [128] * 6, "k": [256] * 6,
                       "dtype": ["bf16"] * 5 + ["fp8"]})
    g = group_ids("gemm", df)
    assert g[0] == g[1] == g[2] and g[3] != g[4] and len(set(g)) == 4
    many = gemm_rows("h100_sxm")
    groups = group_ids("gemm", many)
    folds = group_folds(groups, 5, seed=0)
    assert set(folds) == set(range(5))
    for grp in np.unique(groups):
        assert len(set(folds[groups == grp])) == 1
    sizes = np.bincount(folds)
    assert sizes.max() - sizes.min() <= np.bincount(groups).max()
    assert (group_folds(groups, 5, seed=0) == folds).all()


def test_grouped_target_evaluation_beats_the_baselines_on_learnable_data():
    rows = with_eta(gemm_rows("h100_sxm"))
    blocks = build_blocks(rows, block_rows=10_000, seed=0)
    scored = evaluate_target(blocks, FAST_LEARNER, folds=3, seed=0)
    assert len(scored) == len(rows) and set(scored["fold"]) == {0, 1, 2}
    m = metrics(scored.assign(split="all")).set_index("model")["mape"]
    assert m["lightgbm"] < 10 < m["constant"] < m["roofline"]


def test_row_rules():
    a = gemm_rows("h100_sxm", n_rows=20)
    old = a.assign(sweep_id="synthetic/h100_sxm/v-0.9")
    other = a.assign(provider="vllm.other").iloc[:5]
    bad = a.iloc[:3].assign(status="failed")
    hot = a.iloc[:2].assign(flags="throttled")
    df = pd.concat([a, old, other, bad, hot], ignore_index=True)
    kept, counts, chosen = select(df)
    assert len(kept) == 20 and set(kept["sweep_id"]) == {"synthetic/h100_sxm/v-1.0"}
    c = counts.set_index("family").iloc[0]
    assert (c["status not ok"], c["throttled"], c["other sweep"], c["other provider"]) == (3, 2, 20, 5)
    assert chosen.iloc[0]["providers"] == "torch.F.linear"
    assert split_sweep_id("aiconfigurator/h100_sxm/vllm-0.24.0") == ("aiconfigurator/h100_sxm/vllm", (0, 24, 0))
    measured = a.assign(source="measured", sweep_id="h100_sxm/mine").iloc[:5]  # fewer rows, but preferred
    assert choose_sweeps(pd.concat([a, measured]), ("measured",)) == ["h100_sxm/mine"]
    assert choose_sweeps(pd.concat([a, measured]), ("synthetic", "measured")) == ["synthetic/h100_sxm/v-1.0"]
    assert choose_sweeps(pd.concat([a, measured])) == ["synthetic/h100_sxm/v-1.0"]  # no order: the most rows
    # family_sources go before prefer_sources for their family only; prefer_providers pick within a variant
    # (the most rows when the variant has none of them), where `providers` would drop the variant.
    triton = measured.assign(provider="triton.matmul")
    mixed = pd.concat([a, measured, triton], ignore_index=True)
    kept, _, _ = select(mixed, ("synthetic",), family_sources={"gemm": ["measured"]},
                        prefer_providers={"gemm": ["triton.matmul"]})
    assert set(kept["sweep_id"]) == {"h100_sxm/mine"} and set(kept["provider"]) == {"triton.matmul"}
    kept, _, _ = select(mixed, ("synthetic",), family_sources={"norm": ["measured"]},
                        prefer_providers={"gemm": ["cutlass.absent"]})
    assert set(kept["sweep_id"]) == {"synthetic/h100_sxm/v-1.0"} and set(kept["provider"]) == {"torch.F.linear"}
    assert select(mixed, ("synthetic",), providers={"gemm": "cutlass.absent"})[0].empty


def test_constant_baseline_round_trips_through_its_published_table():
    """`predict SWEEP` rebuilds the baseline from the bundle manifest: same η for seen and unseen GPUs."""
    from kernelsight.calibrate.models import ConstantEtaBaseline

    fitted = ConstantEtaBaseline().fit(["a", "a", "b", "c"], ["gemm", "gemm", "gemm", "norm"], [1.2, 1.4, 2.0, 3.0])
    rebuilt = ConstantEtaBaseline.from_table(fitted.table())
    devices, families = ["a", "b", "unseen", "unseen", "c"], ["gemm", "gemm", "gemm", "rope", "norm"]
    assert np.allclose(rebuilt.predict(devices, families), fitted.predict(devices, families))
    assert np.allclose(fitted.predict(devices, families), [1.3, 2.0, 1.65, 1.0, 3.0])


def test_linear_leaves_price_a_launch_bound_kernel_between_its_grid_sizes():
    """A kernel that costs 6 us plus its bytes: constant leaves price a size between two measured ones
    like one of them (η ∝ 1 / size there); linear leaves follow log size."""
    from kernelsight.predictor.roofline import roofline_columns

    def frame(tokens):
        grid = [(t, h, d) for t in tokens for h in (1, 2, 4, 8) for d in ("bf16", "fp8")]
        cols = {"tokens": np.array([g[0] for g in grid]), "kv_heads": np.array([g[1] for g in grid]),
                "head_dim": np.full(len(grid), 128), "block_size": np.full(len(grid), 16),
                "dtype": np.array(["bf16"] * len(grid)), "kv_dtype": np.array([g[2] for g in grid])}
        roof = roofline_columns("kv_write", cols, H100)
        seconds = 6e-6 + roof["t_roof"] * 1.3
        return feature_matrix("kv_write", "target", cols, H100), seconds / roof["t_roof"], seconds, roof["t_roof"]

    x, eta, _, _ = frame([1, 16, 128, 1024, 8192, 32768])
    xq, _, truth, t_roof = frame([4, 48, 400, 3000])
    errors = {}
    for tiers in ((), ("target",)):
        model = EtaRegressor("kv_write", "target", "h100_sxm", **FAST_LEARNER, linear_tiers=tiers,
                             linear_lambda=0.1).fit(x, eta)
        errors[tiers] = np.median(np.abs(model.predict(xq) * t_roof / truth - 1))
        assert ("is_linear=1" in model.model_text_) == bool(tiers)
    assert errors[("target",)] < 0.1 < errors[()]


def test_compact_model_text_keeps_linear_leaves_and_their_predictions():
    """Dropping the training-only statistics keeps each linear leaf's double-space grouping and every prediction
    (values are rounded once, later, by the publisher's slim_model_text)."""
    import lightgbm as lgb

    from kernelsight.calibrate.models import DETERMINISTIC, compact_model_text

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 20, (2000, 4))
    y = np.log(1 + np.exp(3 - x[:, 0])) + 0.05 * x[:, 1] * x[:, 2] + rng.normal(0, 0.01, 2000)
    booster = lgb.train({**DETERMINISTIC, "objective": "regression", "linear_tree": True, "linear_lambda": 0.1,
                         "num_leaves": 15}, lgb.Dataset(x, y), num_boost_round=30)
    text = booster.model_to_string()
    compact = compact_model_text(text)
    assert len(compact) < 0.85 * len(text) and "leaf_coeff=" in compact and "  " in compact
    assert "leaf_count=" not in compact and "feature_importances:" not in compact
    xq = rng.uniform(0, 20, (5000, 4))
    assert np.abs(lgb.Booster(model_str=compact).predict(xq) - booster.predict(xq)).max() == 0


def test_repeat_measurements_score_another_campaign_of_the_same_source():
    """The kept sweep's kernels timed again by an older sweep of the same source are scored against each
    other; another source, a throttled row and an excluded sweep do not count."""
    from kernelsight.calibrate.evaluate import repeat_measurements

    old = gemm_rows("h100_sxm", seed=1).assign(sweep_id="synthetic/h100_sxm/v-1.0")
    old.loc[0, "flags"] = "throttled"
    new = gemm_rows("h100_sxm", seed=2).assign(sweep_id="synthetic/h100_sxm/v-2.0")
    other = gemm_rows("h100_sxm", seed=3).assign(source="import:other@0", sweep_id="other/h100_sxm/v-1.0")
    excluded = gemm_rows("h100_sxm", seed=4).assign(sweep_id="synthetic/h100_sxm/pairwise-3.0")
    raw = pd.concat([old, new, other, excluded], ignore_index=True)
    kept, _, chosen = select(raw, prefer_sources=["synthetic"], exclude_sweeps=["pairwise"])
    assert chosen.iloc[0]["sweeps"] == "synthetic/h100_sxm/v-2.0"
    rep = repeat_measurements(raw, kept, exclude_sweeps=["pairwise"])
    assert rep[["other sweep", "rows"]].values.tolist() == [["synthetic/h100_sxm/v-1.0", len(new) - 1]]
    # two independent 1 % noises: |ratio - 1| averages about 1.1 %
    assert 0.7 < rep.iloc[0]["mape"] < 1.6 and rep.iloc[0]["median_ape"] < rep.iloc[0]["p90_ape"]
    assert repeat_measurements(new, new).empty


def test_other_sources_score_the_whole_block_model_off_its_grid():
    """Another source's rows of the kept provider, at shapes between the grid's, are scored by the model fitted
    on the whole kept block, decode-sized ones apart; another provider and a throttled row do not count."""
    from kernelsight.calibrate.evaluate import evaluate_other_sources, other_source_rows

    kept_rows = gemm_rows("h100_sxm", seed=1)
    off_grid = gemm_rows("h100_sxm", seed=2, ms=(3, 48, 700, 3000), dims=(96, 700, 3000)).assign(
        source="import:other@0", sweep_id="other/h100_sxm/v-1.0")
    off_grid.loc[0, "flags"] = "throttled"
    foreign = off_grid.iloc[1:4].assign(provider="vllm.other")
    raw = pd.concat([kept_rows, off_grid, foreign], ignore_index=True)
    kept, _, _ = select(raw, prefer_sources=["synthetic"])
    rows = with_eta(other_source_rows(raw, kept))
    assert len(rows) == len(off_grid) - 1 and set(rows["provider"]) == {"torch.F.linear"}
    blocks = build_blocks(with_eta(kept), block_rows=10_000, seed=0)
    scored = evaluate_other_sources(blocks, rows, FAST_LEARNER, cap=10_000, seed=0)
    assert len(scored) == len(rows) and set(scored["split"]) == {"other import:other@0"}
    assert (scored["band"] == np.where(scored["dominant"] <= 64, "<= 64", "> 64")).all()
    m = metrics(scored.assign(split="all")).set_index("model")["mape"]
    assert m["lightgbm"] < 10 < m["constant"] < m["roofline"]
    assert evaluate_other_sources(blocks, rows, FAST_LEARNER, cap=10_000, seed=0, devices=["a100_sxm"]).empty


@pytest.mark.parametrize("setting, value, message", [
    ("num_trees", -1, "learner.num_trees=-1: must be an integer >= 1"),
    ("num_trees", True, "learner.num_trees=True: must be an integer >= 1"),
    ("num_leaves", 1, "learner.num_leaves=1: must be an integer >= 2"),
    ("min_data_in_leaf", 2.5, "learner.min_data_in_leaf=2.5: must be an integer >= 0"),
    ("learning_rate", 0, "learner.learning_rate=0: must be a finite number > 0"),
    ("learning_rate", "fast", "learner.learning_rate='fast': must be a finite number > 0"),
    ("linear_lambda", -0.1, "learner.linear_lambda=-0.1: must be a finite number >= 0"),
    ("linear_tiers", "target", "learner.linear_tiers='target': must be a list of tiers"),
    ("gap_tiers", ["crosss"], "learner.gap_tiers: 'crosss' is not a tier"),
    ("objective", "regresion", "learner.objective='regresion': must be one of regression, "),
    ("num_threads", 0, "learner.num_threads=0: must be an integer >= 1"),
    ("seed", -3, "learner.seed=-3: must be an integer >= 0"),
    ("eta_floor", float("nan"), "learner.eta_floor=nan: must be a finite number > 0"),
])
def test_learner_settings_are_refused_at_construction_naming_the_setting(setting, value, message):
    from kernelsight.calibrate.models import check_learner

    for build in (lambda: EtaRegressor("gemm", "target", "h100_sxm", **{**FAST_LEARNER, setting: value}),
                  lambda: check_learner({**FAST_LEARNER, setting: value})):
        with pytest.raises(KernelsightError) as e:
            build()  # before any data: nothing to fit was given
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_learner_check_names_unknown_settings_and_keeps_good_ones():
    from kernelsight.calibrate.models import check_learner

    with pytest.raises(KernelsightError, match=r"learner.num_leafs: unknown setting \(did you mean 'num_leaves'\?\)"):
        check_learner({"num_leafs": 8})
    assert check_learner(FAST_LEARNER) == FAST_LEARNER
    with pytest.raises(KernelsightError, match="tier='targets': must be one of target, cross"):
        EtaRegressor("gemm", "targets")
