"""Die-sibling transfer (predictor/transfer.py): who is a sibling, the transfer formula, coverage, evaluation."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernelsight.calibrate.evaluate import NO_SIBLING, build_blocks, evaluate_cross, metrics
from kernelsight.calibrate.models import EtaRegressor
from kernelsight.calibrate.rows import with_eta
from kernelsight.predictor.features import feature_matrix
from kernelsight.predictor.hardware import list_hardware, load_hardware
from kernelsight.predictor.roofline import roofline_columns
from kernelsight.predictor.transfer import cross_eta, die_siblings, sibling_eta

from calibrate_synthetic import FAST_LEARNER, gemm_rows

H100, H200 = load_hardware("h100_sxm"), load_hardware("h200_sxm")
COLS = ("m", "n", "k", "dtype")


def _target_model(device: str):
    df = with_eta(gemm_rows(device))
    x = feature_matrix("gemm", "target", {c: df[c].to_numpy() for c in COLS}, load_hardware(device))
    return EtaRegressor("gemm", "target", device, **FAST_LEARNER).fit(x, df["eta"].to_numpy()).model_


def test_siblings_share_architecture_and_sm_count_nearest_first():
    every = list_hardware()
    # nearest memory bandwidth first: 3.35 (H800), 3.9 (H100 NVL), 4.0 (GH200), 4.8 TB/s (H200)
    assert die_siblings("h100_sxm", every) == ["h800_sxm", "h100_nvl", "gh200", "h200_sxm"]
    assert die_siblings("gb200", every) == ["b200_sxm"]  # 152 vs 148 SMs: within 5 %
    assert die_siblings("a100_sxm", ["a100_sxm", "a100_pcie", "h100_sxm"]) == ["a100_pcie"]
    # same AD102 cut (142 SMs), the L40 at the L40S's bandwidth first; the L4 has a quarter of the SMs
    assert die_siblings("l40s", every) == ["l40", "rtx_6000_ada"]
    assert die_siblings("rtx_6000_ada", ["l40s", "l4"]) == ["l40s"]
    assert die_siblings("h100_pcie", every) == []  # 114 SMs: a different cut of the die


def test_roofline_part_moves_with_the_roofline_and_the_gap_carries_over():
    model = _target_model("h200_sxm")
    cols = {"m": np.array([1, 16, 512, 4096]), "n": np.array([4096] * 4), "k": np.array([4096] * 4),
            "dtype": np.array(["bf16"] * 4, dtype=object)}
    roof_d = roofline_columns("gemm", cols, H100)
    eta, covered, source = sibling_eta("gemm", cols, roof_d, [(H200, model)])
    assert covered.all() and set(source) == {"h200_sxm"}
    roof_s = roofline_columns("gemm", cols, H200)
    eta_s, _ = model.eta(feature_matrix("gemm", "target", cols, H200, roof_s))
    t_s = roof_s["t_roof"] * eta_s
    expected = roof_d["t_roof"] + (t_s - roof_s["t_roof"])
    assert np.allclose(roof_d["t_roof"] * eta, expected)
    # memory-bound rows (m = 1): H100's roofline is 4.8/3.35 slower, the gap above it is not
    assert roof_d["t_roof"][0] / roof_s["t_roof"][0] == pytest.approx(4800 / 3350, rel=1e-3)
    assert 1.0 <= eta[0] < eta_s[0]
    assert eta[3] == pytest.approx(eta_s[3], rel=1e-6)  # compute-bound: same peak, same η


def test_rows_a_sibling_does_not_cover_go_to_the_cross_model_or_stay_at_the_roofline():
    model = _target_model("h200_sxm")
    cols = {"m": np.array([64, 64]), "n": np.array([4096, 4096]), "k": np.array([4096, 4096]),
            "dtype": np.array(["bf16", "fp8"], dtype=object)}  # the sibling never saw fp8
    roof = roofline_columns("gemm", cols, H100)
    res = cross_eta("gemm", cols, H100, roof, None, [(H200, model)])
    assert list(res["model"]) == ["target/h200_sxm/gemm (die sibling)", "roofline"]
    assert res["eta"][1] == 1.0 and list(res["extrapolated"]) == [False, True]
    df = with_eta(pd.concat([gemm_rows("l40s"), gemm_rows("a100_sxm")]))
    x = np.vstack([feature_matrix("gemm", "cross", {c: part[c].to_numpy() for c in COLS}, load_hardware(d))
                   for d, part in df.groupby("device", sort=True)])
    eta = np.concatenate([part["eta"].to_numpy() for _, part in df.groupby("device", sort=True)])
    cross = EtaRegressor("gemm", "cross", None, **FAST_LEARNER).fit(x, eta).model_
    res = cross_eta("gemm", cols, H100, roof, cross, [(H200, model)])
    assert list(res["model"]) == ["target/h200_sxm/gemm (die sibling)", "cross/gemm"]


def test_leave_one_device_out_scores_what_the_predictors_cross_path_prices():
    rows = with_eta(pd.concat([gemm_rows("h100_sxm", 0), gemm_rows("h200_sxm", 1), gemm_rows("l40s", 2)],
                              ignore_index=True))
    blocks = build_blocks(rows, block_rows=10_000, seed=0)
    scored = evaluate_cross(blocks, FAST_LEARNER, cap=10_000, seed=0, extra={}, devices=["h100_sxm", "l40s"])
    h100 = scored[scored["device"] == "h100_sxm"].reset_index(drop=True)
    assert h100["sibling"].mean() > 0.95 and not scored[scored["device"] == "l40s"]["sibling"].any()
    block = blocks[("h200_sxm", "gemm")]
    sibling = EtaRegressor("gemm", "target", "h200_sxm", **FAST_LEARNER).fit(block.x["target"], block.eta).model_
    test = blocks[("h100_sxm", "gemm")].rows
    cols = {c: test[c].to_numpy() for c in COLS}
    eta, covered, _ = sibling_eta("gemm", cols, roofline_columns("gemm", cols, H100), [(H200, sibling)])
    assert np.array_equal(covered, h100["sibling"].to_numpy())
    assert np.allclose(h100["pred_lightgbm"][covered], h100["t_roof_ms"][covered] * eta[covered])
    # the LightGBM cross model alone is scored beside it (synthetic η here is device-independent by
    # construction, so this data cannot say which is better: the calibration report does, on real data)
    assert not np.allclose(h100["pred_lightgbm"], h100[f"pred_{NO_SIBLING}"])


def test_scale_out_network_rows_stay_at_the_roofline_on_the_cross_path():
    """The `net` link is the cluster's, not the GPU's: a cross model trained on another cluster's η 6 over
    it must not price this GPU's network rows, while its NVLink rows still go to the model."""
    rng = np.random.default_rng(0)
    msg = 2.0 ** rng.integers(12, 28, 400)
    link = np.where(np.arange(400) % 2 == 0, "nvlink", "net").astype(object)
    train = {"msg_bytes": msg, "world_size": np.full(400, 2), "link": link, "dtype": np.full(400, "fp16", dtype=object)}
    a100 = load_hardware("a100_sxm")
    eta = np.where(link == "net", 6.0, 1.4)
    x = feature_matrix("sendrecv", "cross", train, a100, roofline_columns("sendrecv", train, a100))
    cross = EtaRegressor("sendrecv", "cross", None, **FAST_LEARNER).fit(x, eta).model_
    cols = {"msg_bytes": np.array([2.0**20, 2.0**20]), "world_size": np.array([2, 2]),
            "link": np.array(["nvlink", "net"], dtype=object), "dtype": np.array(["fp16", "fp16"], dtype=object)}
    res = cross_eta("sendrecv", cols, H100, roofline_columns("sendrecv", cols, H100), cross, [])
    assert list(res["model"]) == ["cross/sendrecv", "roofline"]
    assert res["eta"][0] == pytest.approx(1.4, rel=0.05) and res["eta"][1] == 1.0
    assert not res["extrapolated"][1] and not res["sibling"].any()  # a rule, not an extrapolation
