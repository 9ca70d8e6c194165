"""80 % prediction intervals: fitted on held-out residuals per path and family, coverage cross-fitted, applied
by the predictor (never below the roofline, wider where a prediction extrapolates)."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kernelsight.calibrate.intervals import (MIN_ROWS, coverage, fit_intervals, quantiles, residual_frame,
                                            sibling_groups)
from kernelsight.predictor.predict import Predictor, interval_quantiles


def scored(rng, n=400, spread=0.2, shift=0.0):
    """A scored frame like calibrate.evaluate's: target K-fold rows and cross leave-one-GPU-out rows."""
    rows = []
    for tier, splits in (("target", [f"fold {f}" for f in range(4)]), ("cross", ["lodo a", "lodo b", "lodo c"])):
        for split in splits:
            r = rng.normal(shift, spread * (2 if tier == "cross" else 1), n)
            pred = rng.uniform(0.01, 1.0, n)
            rows.append(pd.DataFrame({"tier": tier, "split": split, "family": "gemm",
                                      "device": split.split()[-1] if tier == "cross" else "h100_sxm",
                                      "fold": int(split.split()[-1]) if tier == "target" else -1,
                                      "sibling": False, "pred_lightgbm": pred, "pred_lightgbm_no_sibling": pred,
                                      "latency_ms": pred * np.exp(r)}))
    extra = pd.DataFrame({"tier": "cross", "split": "gb200 holdout", "family": "gemm", "device": "gb200", "fold": -1,
                          "sibling": False, "pred_lightgbm": 1.0, "pred_lightgbm_no_sibling": 1.0,
                          "latency_ms": [100.0]})  # not a LODO row
    return pd.concat([*rows, extra], ignore_index=True)


def test_quantiles_per_path_and_held_out_coverage_near_80_percent():
    res = residual_frame(scored(np.random.default_rng(0)))
    assert set(res["path"]) == {"target", "cross"} and len(res) == 4 * 400 + 3 * 400  # the extra protocol left out
    fitted = fit_intervals(res)
    t, c = fitted["target"]["gemm"], fitted["cross"]["gemm"]
    assert t["p10"] == pytest.approx(-1.2816 * 0.2, abs=0.03) and t["p90"] == pytest.approx(1.2816 * 0.2, abs=0.03)
    assert c["p90"] - c["p10"] == pytest.approx(2 * (t["p90"] - t["p10"]), rel=0.15)  # the weaker path is wider
    cov = coverage(res).set_index("path")
    assert cov.loc["target", "coverage_pct"] == pytest.approx(80, abs=3)
    assert cov.loc["cross", "coverage_pct"] == pytest.approx(80, abs=4)


def test_a_biased_unit_is_caught_by_cross_fitted_coverage():
    """Coverage is measured on rows the interval never saw: a GPU the others do not predict falls outside."""
    frame = scored(np.random.default_rng(1))
    unbiased = coverage(residual_frame(frame)).set_index("path").loc["cross", "coverage_pct"]
    frame.loc[frame["split"] == "lodo c", "latency_ms"] *= 3.0
    cov = coverage(residual_frame(frame)).set_index("path")
    assert cov.loc["cross", "coverage_pct"] < unbiased - 10


def test_cross_residuals_are_the_cross_model_alone_on_every_held_out_gpu():
    """Rows a die sibling priced give a sibling residual and, from the cross model's own prediction, a cross
    one; rows priced at the roofline by rule (network collectives) give none."""
    frame = scored(np.random.default_rng(3))
    lodo = frame["split"].str.startswith("lodo ")
    frame["at_roofline"] = False
    frame.loc[lodo & (frame["device"] == "a"), "sibling"] = True
    frame.loc[lodo & (frame["device"] == "a"), "pred_lightgbm_no_sibling"] *= 2.0
    frame.loc[lodo & (frame["device"] == "b"), "at_roofline"] = True
    res = residual_frame(frame)
    assert sorted(res.loc[res["path"] == "cross", "device"].unique()) == ["a", "c"]
    assert list(res.loc[res["path"] == "sibling", "device"].unique()) == ["a"]
    a = (res["path"] == "cross") & (res["device"] == "a")
    sib = res["path"] == "sibling"
    assert res.loc[a, "residual"].to_numpy() == pytest.approx(res.loc[sib, "residual"].to_numpy() - np.log(2.0))


def test_gpu_biases_widen_the_cross_interval_beyond_the_pooled_quantiles():
    """Errors that are a bias per GPU: the interval for a new GPU covers the biases' spread, widened for few GPUs."""
    rng = np.random.default_rng(4)
    biases = {"a": -0.3, "b": 0.0, "c": 0.3}
    r = np.concatenate([rng.normal(b, 0.02, 500) for b in biases.values()])
    devices = np.repeat(list(biases), 500)
    lo, hi = quantiles(r, devices)
    plain_lo, plain_hi = quantiles(r)
    assert hi - lo > plain_hi - plain_lo
    assert hi > 0.3 * np.sqrt(2) * 1.47 and lo < -0.3 * np.sqrt(2) * 1.47  # K = 3: sqrt((K + 1) / (K - 1)) t / z


def test_a_new_gpu_is_covered_80_percent_of_the_time_with_three_gpus_seen():
    """Normal GPU biases, three GPUs seen: the interval covers a fourth GPU's rows about 80 % of the time (the
    Student-t predictive; the normal factor alone, sqrt((K + 1) / (K - 1)), covered about 66 %)."""
    rng = np.random.default_rng(6)
    hits = []
    for _ in range(300):
        bias = rng.normal(0.0, 0.3, 4)
        r = np.concatenate([b + rng.normal(0.0, 0.05, 100) for b in bias[:3]])
        lo, hi = quantiles(r, np.repeat(["a", "b", "c"], 100))
        new = bias[3] + rng.normal(0.0, 0.05, 100)
        hits.append(np.mean((new >= lo) & (new <= hi)))
    assert np.mean(hits) == pytest.approx(0.8, abs=0.05)


def test_gpus_count_by_their_rows():
    """Two well-predicted GPUs with 5,000 rows each and two poorly predicted ones with 100: the interval is for
    a row, so it is set by the many rows (GPUs weighted equally made it as wide as the two small GPUs' biases)."""
    rng = np.random.default_rng(7)
    parts = [(0.02, 5000), (-0.02, 5000), (0.6, 100), (-0.6, 100)]
    r = np.concatenate([rng.normal(b, 0.1, n) for b, n in parts])
    devices = np.concatenate([np.full(n, str(i)) for i, (_, n) in enumerate(parts)])
    lo, hi = quantiles(r, devices)
    assert -0.35 < lo < -0.1 and 0.1 < hi < 0.35


def test_sibling_biases_are_symmetric_about_zero():
    """Die siblings price each other, so the sibling path's GPU biases are taken as +-b about zero, not about
    their mean (which a held-out GPU's missing mirror image would shift away from it)."""
    rng = np.random.default_rng(8)
    biases = {"a": 0.4, "b": 0.05, "c": 0.1}
    res = pd.DataFrame({"path": "sibling", "family": "gemm", "device": np.repeat(list(biases), 300),
                        "extrapolated": False,
                        "residual": np.concatenate([rng.normal(b, 0.03, 300) for b in biases.values()])})
    res["unit"] = res["device"]
    q = fit_intervals(res)["sibling"]["gemm"]
    assert q["p10"] == pytest.approx(-q["p90"], abs=0.02) and q["p10"] < -0.4
    cross = fit_intervals(res.assign(path="cross"))["cross"]["gemm"]
    assert cross["p10"] > -0.2  # about the biases' mean: no mirror image


def test_die_siblings_are_held_out_together():
    """A sibling's residuals carry the held-out GPU's own data (priced by its target model, or by a cross model
    fitted with it): cross and sibling coverage hold out the GPU with its die siblings."""
    groups = sibling_groups(["h100_sxm", "h200_sxm", "b200_sxm", "gb200", "l40s", "a"])
    assert groups["h100_sxm"] == groups["h200_sxm"] == "h100_sxm+h200_sxm"
    assert groups["b200_sxm"] == groups["gb200"] != groups["h100_sxm"]
    assert groups["l40s"] == "l40s" and groups["a"] == "a"  # no sibling; not in the catalog
    frame = scored(np.random.default_rng(9))
    frame["device"] = frame["device"].replace({"a": "h100_sxm", "b": "h200_sxm", "c": "l40s"})
    res = residual_frame(frame)
    units = res[res["path"] == "cross"].groupby("device")["unit"].first()
    assert units["h100_sxm"] == units["h200_sxm"] != units["l40s"]
    assert res.loc[res["path"] == "target", "unit"].str.contains(" fold ").all()


def test_die_siblings_are_one_draw_of_the_cross_paths_gpu_bias():
    """Two die siblings and a third GPU: the siblings' near-equal biases are one unit, not two (their cross
    residuals come from models that saw each other), so the family has two independent units and its interval
    takes the Student-t factor of K = 2; counted as three GPUs the spread looked known and the interval was
    narrower. One unit alone is too few: the path's pooled quantiles stand in."""
    rng = np.random.default_rng(11)
    biases = {"h100_sxm": 0.3, "h200_sxm": 0.32, "l40s": -0.3}
    res = pd.DataFrame({"path": "cross", "family": "gemm", "device": np.repeat(list(biases), 300),
                        "extrapolated": False,
                        "residual": np.concatenate([rng.normal(b, 0.03, 300) for b in biases.values()])})
    res["unit"] = res["device"].map(sibling_groups(list(biases)))
    grouped = fit_intervals(res)["cross"]["gemm"]
    by_gpu = quantiles(res["residual"].to_numpy(), res["device"].to_numpy())
    assert grouped["p90"] - grouped["p10"] > 1.5 * (by_gpu[1] - by_gpu[0])
    one_unit = res[res["unit"] == "h100_sxm+h200_sxm"].assign(family="act")   # two GPUs, one die
    fitted = fit_intervals(pd.concat([res, one_unit]))
    assert "gemm" in fitted["cross"] and "act" not in fitted["cross"]   # the pooled '*' prices act


def test_extrapolated_rows_get_their_own_wider_group():
    res = residual_frame(scored(np.random.default_rng(5)))
    res["extrapolated"] = np.arange(len(res)) % 2 == 0
    res.loc[res["extrapolated"], "residual"] *= 3.0
    fitted = fit_intervals(res)
    plain, wide = fitted["target"]["gemm"], fitted["target extrapolated"]["gemm"]
    assert wide["p90"] - wide["p10"] > 1.3 * (plain["p90"] - plain["p10"])  # plain: every row of the path
    q = interval_quantiles(fitted, "target", "gemm", True)
    assert q[0] <= min(wide["p10"], fitted["cross"]["gemm"]["p10"]) and q[1] >= fitted["cross"]["gemm"]["p90"]
    assert interval_quantiles(fitted, "target", "gemm", False) == (plain["p10"], plain["p90"])


def test_small_groups_use_the_pooled_quantiles():
    res = residual_frame(scored(np.random.default_rng(2), n=MIN_ROWS // 8))
    fitted = fit_intervals(res)
    assert "gemm" not in fitted["target"] and "*" in fitted["target"]


def test_the_predictor_applies_the_bundle_intervals():
    p = Predictor("h100_sxm")
    shape = pd.DataFrame([{"family": "gemm", "m": 64, "n": 4096, "k": 4096, "dtype": "bf16"},
                          {"family": "gemm", "m": 1 << 22, "n": 4096, "k": 4096, "dtype": "bf16"}])  # extrapolated
    intervals = {"target": {"gemm": {"p10": -0.1, "p90": 0.2, "rows": 999}},
                 "cross": {"*": {"p10": -0.5, "p90": 0.6, "rows": 999}}}
    p.bundle = type(p.bundle).__new__(type(p.bundle))
    p.bundle.__dict__.update(Predictor("h100_sxm").bundle.__dict__)
    p.bundle.manifest = {**p.bundle.manifest, "intervals": intervals}
    out = p.predict(shape)
    assert list(out["extrapolated"]) == [False, True]
    first = out.iloc[0]
    assert first["latency_p10_us"] == pytest.approx(max(first["latency_us"] * np.exp(-0.1), first["t_roof"] * 1e6))
    assert first["latency_p90_us"] == pytest.approx(first["latency_us"] * np.exp(0.2))
    second = out.iloc[1]  # extrapolated: the wider of target's and cross's
    assert second["latency_p90_us"] == pytest.approx(second["latency_us"] * np.exp(0.6))
    assert (out["latency_p10_us"] >= out["t_roof"] * 1e6 - 1e-9).all()
    cols = p.predict({"m": np.array([64]), "n": np.array([4096]), "k": np.array([4096]),
                      "dtype": np.array(["bf16"], dtype=object)}, family="gemm")
    assert cols["seconds_p90"][0] == pytest.approx(first["latency_p90_us"] * 1e-6)
    roof = Predictor("h100_sxm", tier="roofline").predict(shape)
    assert roof["latency_p10_us"].isna().all()


def test_simulate_gives_each_latency_its_range_from_the_kernel_intervals():
    import warnings

    import kernelsight

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = kernelsight.simulate(num_requests=60)
        plain = kernelsight.simulate(num_requests=60, intervals=False)
        roofline = kernelsight.simulate(num_requests=60, **{"predictor.tier": "roofline"})
    s = result.summary
    for key in ("mean_ttft_ms", "mean_tpot_ms", "p99_tpot_ms"):
        lo, hi = s["intervals"][key]
        assert lo < s[key] < hi, key
    assert s["mean_tpot_ms"] == plain.summary["mean_tpot_ms"] and "intervals" not in plain.summary
    assert "intervals" not in roofline.summary  # η = 1 has no interval
    from kernelsight.sim.report import _fmt, format_summary

    text = format_summary(s, "title")
    lo, hi = s["intervals"]["mean_tpot_ms"]
    assert f"{_fmt(s['mean_tpot_ms'])} ({_fmt(lo)}-{_fmt(hi)})" in text
    assert "(low-high): 80 % range" in text and "(low-high)" not in format_summary(plain.summary, "title")
    assert "widened to the engine profile's serving_error" in text and s["intervals_serving_error"]


def test_the_runs_at_the_interval_ends_price_from_the_central_runs_predictions_unchanged():
    """simulate(intervals=True) keeps the central run's predictions (Predictor(memo=True)) and prices both ends
    with them (with_band): the same ranges as runs from predictors of their own band, and each kernel is
    predicted once."""
    import warnings

    import kernelsight
    from kernelsight.sim.compose import compose, typed_configs, workload_config
    from kernelsight.sim.run import INTERVAL_METRICS, build_setup, run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        central = kernelsight.simulate(num_requests=60).summary
        shared = central["intervals"]
        cfg, sources = compose(None, None)
        ends = [run(build_setup(*typed_configs(cfg, sources), workload_config(cfg), energy=False, band=band), 60,
                    seed=0, breakdown=False).summary for band in ("p10", "p90")]
    error = replace(typed_configs(cfg, sources)[2].serving_error, throughput=None)  # open loop: see simulate
    assert shared == {key: list(error.widen(key, central[key], *sorted(float(end[key]) for end in ends)))
                      for key in INTERVAL_METRICS}
    cols = {"m": np.array([64, 4096]), "n": np.array([4096, 4096]), "k": np.array([4096, 4096]),
            "dtype": np.array(["bf16", "bf16"], dtype=object)}
    memo = Predictor("h100_sxm", memo=True)
    central = memo.predict(cols, family="gemm")
    for band in ("p10", "p90"):
        own = Predictor("h100_sxm", band=band).predict(cols, family="gemm")["seconds"]
        assert memo.with_band(band).predict(cols, family="gemm")["seconds"].tolist() == own.tolist()
    assert memo.predict(cols, family="gemm")["seconds"].tolist() == central["seconds"].tolist()
    assert len(memo._memo) == 1 and not central["seconds"].flags.writeable


def test_priming_before_the_ends_fork_changes_no_price_and_shares_the_first_tables():
    """StepPricer.prime (simulate, before forking the interval ends) prices what the first steps of a run would:
    the same step prices as a fresh pricer's, and a band's pricer built on the same memo predictor then prices
    those steps without a new prediction."""
    from kernelsight.sim.batch import StepBatch
    from kernelsight.sim.compose import compose, typed_configs, workload_config
    from kernelsight.sim.run import build_setup

    cfg, sources = compose(None, None)
    configs, workload = typed_configs(cfg, sources), workload_config(cfg)
    memo = Predictor("h100_sxm", memo=True)
    primed = build_setup(*configs, workload, predictor=memo).pricer
    primed.prime()
    fresh = build_setup(*configs, workload).pricer
    batches = [StepBatch(decode_ctx=(1,)), StepBatch(decode_ctx=(900, 1500, 37)), StepBatch((1,), (0,), (), 1),
               StepBatch((200,), (0,), (5, 64), 1)]
    assert [primed.step_time(b) for b in batches] == [fresh.step_time(b) for b in batches]
    predicted = len(memo._memo)
    band = build_setup(*configs, workload, energy=False, predictor=memo.with_band("p90")).pricer
    band.step_time(StepBatch(decode_ctx=(1,)))
    band.step_time(StepBatch((1,), (0,), (), 1))
    assert predicted > 0 and len(memo._memo) == predicted


def test_the_interval_ends_keep_no_inter_token_gaps_and_change_nothing_else():
    """The ends run with itl=False (sim.run.run): every summary field but the ITL statistics is the same as with
    the gaps kept, and those are NaN rather than a wrong number."""
    import math
    import warnings

    from kernelsight.sim.compose import compose, typed_configs, workload_config
    from kernelsight.sim.run import INTERVAL_METRICS, build_setup, run

    cfg, sources = compose(None, None)
    setup = build_setup(*typed_configs(cfg, sources), workload_config(cfg), energy=False, band="p90")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept, skipped = (run(setup, 80, seed=0, breakdown=False, itl=itl).summary for itl in (True, False))
    itl_keys = {k for k in kept if k.endswith("_itl_ms")}
    assert len(itl_keys) == 5 and all(math.isnan(skipped[k]) for k in itl_keys)
    assert all(kept[k] > 0 for k in itl_keys) and set(kept) == set(skipped)
    same = {k for k in kept if k not in itl_keys and k != "wall_s"}
    assert set(INTERVAL_METRICS) <= same
    np.testing.assert_equal({k: kept[k] for k in same}, {k: skipped[k] for k in same})   # NaN equals NaN
