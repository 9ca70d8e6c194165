"""Predictor on the shipped bundle: tier selection, labels, η >= 1, and `kernelsight predict`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from kernelsight.calibrate.commands import predict
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import conf_dir, data_dir
from kernelsight.predictor.predict import Predictor
from kernelsight.predictor.sweep import write_sweep

from calibrate_synthetic import gemm_rows

GEMM = {"m": np.array([1, 64, 4096]), "n": np.array([4096] * 3), "k": np.array([4096] * 3),
        "dtype": np.array(["bf16", "bf16", "bf16"], dtype=object)}


def test_auto_tier_is_target_where_the_gpu_has_data_and_cross_elsewhere():
    h100 = Predictor("h100_sxm").estimate("gemm", GEMM)
    assert set(h100["tier"]) == {"target"} and set(h100["model"]) == {"target/h100_sxm/gemm"}
    mi300x = Predictor("mi300x").estimate("gemm", GEMM)
    assert set(mi300x["tier"]) == {"cross"} and set(mi300x["model"]) == {"cross/gemm"}
    assert (h100["eta"] >= 1).all() and (mi300x["eta"] >= 1).all()
    assert mi300x["extrapolated"].all()  # 304 compute units: beyond every training GPU


def test_auto_sends_variants_the_target_sweep_never_held_to_cross():
    cols = {**GEMM, "dtype": np.array(["bf16", "fp8", "fp4"], dtype=object)}
    res = Predictor("b200_sxm").estimate("gemm", cols)  # B200 sweep: bf16, fp8 and fp4
    assert list(res["tier"]) == ["target"] * 3
    res = Predictor("h100_sxm").estimate("gemm", {**GEMM, "dtype": np.array(["bf16", "fp8", "fp32"],
                                                                            dtype=object)})
    assert list(res["tier"]) == ["target", "target", "cross"]  # H100's GEMM sweep has no fp32


def test_explicit_tiers_and_their_errors():
    p = Predictor("h100_sxm", tier="cross")  # no H100 data: H200's target model, the same die
    res = p.estimate("gemm", GEMM)
    assert set(res["model"]) == {"target/h200_sxm/gemm (die sibling)"} and set(res["tier"]) == {"cross"}
    assert set(Predictor("l40s", tier="cross").estimate("gemm", GEMM)["model"]) == {"cross/gemm"}  # no sibling
    with pytest.raises(KernelsightError, match="no target-tier gemm model for mi300x"):
        Predictor("mi300x", tier="target").latency("gemm", GEMM)
    with pytest.raises(KernelsightError, match="unknown tier"):
        Predictor("h100_sxm", tier="best")
    roof = Predictor("h100_sxm", tier="roofline")
    assert (roof.estimate("gemm", GEMM)["eta"] == 1).all()


def test_latency_is_roofline_times_eta_and_frames_are_labelled():
    p = Predictor("h200_sxm")
    df = pd.DataFrame({"family": ["gemm", "attn_decode"], "m": [128, None], "n": [8192, None],
                       "k": [8192, None], "dtype": ["bf16", "bf16"], "batch": [None, 32],
                       "seq_kv": [None, 4096], "heads": [None, 32], "kv_heads": [None, 8],
                       "head_dim": [None, 128], "block_size": [None, 16], "window": [None, 0],
                       "kv_dtype": [None, "bf16"]})
    out = p.predict_frame(df)
    assert list(out["tier"]) == ["target", "target"]
    assert list(out["model"]) == ["target/h200_sxm/gemm", "target/h200_sxm/attn_decode"]
    assert np.allclose(out["predicted_ms"], out["t_roof"].astype(float) * out["eta"] * 1e3)
    gemm = {c: df[c].iloc[:1].to_numpy() for c in ("m", "n", "k", "dtype")}
    assert p.latency("gemm", gemm)[0] == pytest.approx(out["predicted_ms"].iloc[0] / 1e3)


def _cfg(**over):
    with initialize_config_dir(config_dir=str(Path(conf_dir()).resolve()), version_base="1.3"):
        return compose(config_name="predict", overrides=[f"{k}={v}" for k, v in over.items()])


def test_predict_command_one_kernel(capsys):
    predict(_cfg(**{"hardware": "mi300x", "kernel.family": "gemm", "kernel.m": 64, "kernel.n": 4096,
                    "kernel.k": 4096}))
    out = capsys.readouterr().out
    assert "gemm(m=64, n=4096, k=4096, dtype=bf16) on mi300x" in out and "tier cross" in out


def test_predict_command_prices_the_stated_scale_out_network(capsys):
    def roofline_us(**over):
        predict(_cfg(**{"kernel.family": "sendrecv", "kernel.msg_bytes": 16 * 2**20, "kernel.world_size": 2,
                        **over}))
        line = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("roofline")][0]
        return float(line.split()[1])

    default = roofline_us(**{"kernel.link": "net"})
    slow = roofline_us(**{"kernel.link": "net", "net_gbs_per_gpu": 12.5})
    # latency + bytes / bandwidth: only the bandwidth term moves, by 16 MiB x (1/12.5 - 1/50 s per GB)
    assert slow - default == pytest.approx(16 * 2**20 * (1 / 12.5e9 - 1 / 50e9) * 1e6, rel=1e-3)
    assert roofline_us(**{"kernel.link": "nvlink", "net_gbs_per_gpu": 12.5}) < default  # NVLink unaffected
    with pytest.raises(KernelsightError, match="net_gbs_per_gpu = 0: the scale-out network needs a bandwidth > 0"):
        predict(_cfg(**{"kernel.family": "gemm", "kernel.m": 64, "kernel.n": 64, "kernel.k": 64,
                        "net_gbs_per_gpu": 0}))


def test_predict_command_on_a_sweep_writes_per_row_errors(tmp_path, capsys):
    sweep = write_sweep(gemm_rows("l4", n_rows=30), tmp_path / "l4.parquet")  # synthetic latencies
    predict(_cfg(sweep_file=sweep, tier="cross", out=tmp_path / "pred.parquet"))
    printed = capsys.readouterr().out
    assert "MAPE" in printed and "MAPE roofline" in printed and "l4" in printed
    pred = pd.read_parquet(tmp_path / "pred.parquet")
    assert len(pred) == 30 and set(pred["tier"]) == {"cross"}
    assert np.allclose(pred["ape_pct"], (pred["predicted_ms"] - pred["latency_ms"]).abs() / pred["latency_ms"] * 100)
    with pytest.raises(KernelsightError, match="kernel.family"):
        predict(_cfg())
