"""Predictor on the shipped bundle: tier selection, labels, η >= 1, and `kernelsight predict`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from kernelsight.cli.predict import predict
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.paths import conf_dir, data_dir
from kernelsight.predictor.predict import Predictor
from kernelsight.predictor.sweep import write_sweep

from calibrate_synthetic import gemm_rows

GEMM = {"m": np.array([1, 64, 4096]), "n": np.array([4096] * 3), "k": np.array([4096] * 3),
        "dtype": np.array(["bf16", "bf16", "bf16"], dtype=object)}


def test_auto_tier_is_target_where_the_gpu_has_data_and_cross_elsewhere():
    h100 = Predictor("h100_sxm").predict(GEMM, family="gemm")
    assert set(h100["tier"]) == {"target"} and set(h100["model"]) == {"target/h100_sxm/gemm"}
    mi300x = Predictor("mi300x").predict(GEMM, family="gemm")
    assert set(mi300x["tier"]) == {"cross"} and set(mi300x["model"]) == {"cross/gemm"}
    assert (h100["eta"] >= 1).all() and (mi300x["eta"] >= 1).all()
    # a tensor-core kernel sees the GPU through its roofline: 304 compute units are fewer waves per unit, inside
    # what training saw; a vector kernel also sees the catalog, whose 304 units lie beyond every training GPU
    assert not mi300x["extrapolated"].any()
    norm = {"tokens": np.array([16]), "hidden": np.array([4096]), "op": np.array(["rms"], dtype=object),
            "fused_residual": np.array([True]), "dtype": np.array(["bf16"], dtype=object)}
    assert Predictor("mi300x").predict(norm, family="norm")["extrapolated"].all()


def test_auto_sends_variants_the_target_sweep_never_held_to_cross():
    cols = {**GEMM, "dtype": np.array(["bf16", "fp8", "nvfp4"], dtype=object)}
    res = Predictor("b200_sxm").predict(cols, family="gemm")  # B200 sweep: bf16, fp8 and nvfp4
    assert list(res["tier"]) == ["target"] * 3
    tf32 = {**GEMM, "dtype": np.array(["bf16", "fp8", "tf32"], dtype=object)}
    res = Predictor("h100_sxm").predict(tf32, family="gemm")
    assert list(res["tier"]) == ["target", "target", "cross"]  # H100's GEMM sweep has no tf32


def test_fp32_gemm_is_the_bf16_gemm_plus_the_roofline_time_fp32_adds():
    """No sweep times fp32 GEMMs (MiniMax-M2's router): the bf16 GEMM of the shape as predicted, plus the
    difference of the two rooflines (twice the bytes, the CUDA-core rate), never an η extrapolated to fp32."""
    p = Predictor("h200_sxm")
    shapes = {k: np.concatenate([v, v]) for k, v in GEMM.items() if k != "dtype"}
    res = p.predict({**shapes, "dtype": np.array(["fp32"] * 3 + ["bf16"] * 3, dtype=object)}, family="gemm")
    fp32, bf16 = slice(0, 3), slice(3, 6)
    assert list(res["model"][fp32]) == list(res["model"][bf16]) == ["target/h200_sxm/gemm"] * 3
    extra = res["t_roof"][fp32] - res["t_roof"][bf16]
    assert (extra > 0).all()
    np.testing.assert_allclose(res["seconds"][fp32], res["seconds"][bf16] + extra, rtol=1e-9)
    # a GPU without bf16 (a model served in fp32 there, Gemma on a V100): its fp16 GEMM is the proxy
    v100 = Predictor("v100_pcie")
    res = v100.predict({**shapes, "dtype": np.array(["fp32"] * 3 + ["fp16"] * 3, dtype=object)}, family="gemm")
    fp16 = bf16   # the same rows, in fp16 here
    extra = res["t_roof"][fp32] - res["t_roof"][fp16]
    assert (extra > 0).all()
    np.testing.assert_allclose(res["seconds"][fp32], res["seconds"][fp16] + extra, rtol=1e-9)
    # nor fp16 (a P4): priced as fp32 GEMMs directly, no 16-bit peak to borrow
    p4 = Predictor("p4").predict({**GEMM, "dtype": np.array(["fp32"] * 3, dtype=object)}, family="gemm")
    assert np.isfinite(p4["seconds"]).all() and (p4["seconds"] > 0).all()


def test_explicit_tiers_and_their_errors():
    p = Predictor("h100_sxm", tier="cross")  # no H100 data: H200's target model, the same die
    res = p.predict(GEMM, family="gemm")
    assert set(res["model"]) == {"target/h200_sxm/gemm (die sibling)"} and set(res["tier"]) == {"cross"}
    no_sibling = Predictor("l40s", tier="cross").predict(GEMM, family="gemm")
    assert set(no_sibling["model"]) == {"cross/gemm"}
    with pytest.raises(KernelsightError, match="no target-tier gemm model for mi300x"):
        Predictor("mi300x", tier="target").predict(GEMM, family="gemm")
    with pytest.raises(KernelsightError, match="unknown tier"):
        Predictor("h100_sxm", tier="best")
    roof = Predictor("h100_sxm", tier="roofline")
    assert (roof.predict(GEMM, family="gemm")["eta"] == 1).all()


def test_latency_is_roofline_times_eta_and_frames_are_labelled():
    p = Predictor("h200_sxm")
    df = pd.DataFrame({"family": ["gemm", "attn_decode"], "m": [128, None], "n": [8192, None],
                       "k": [8192, None], "dtype": ["bf16", "bf16"], "batch": [None, 32],
                       "seq_kv": [None, 4096], "heads": [None, 32], "kv_heads": [None, 8],
                       "head_dim": [None, 128], "block_size": [None, 16], "window": [None, 0],
                       "kv_dtype": [None, "bf16"]})
    out = p.predict(df)
    assert list(out["tier"]) == ["target", "target"]
    assert list(out["model"]) == ["target/h200_sxm/gemm", "target/h200_sxm/attn_decode"]
    assert np.allclose(out["latency_us"], out["t_roof"].astype(float) * out["eta"] * 1e6)
    gemm = {c: df[c].iloc[:1].to_numpy() for c in ("m", "n", "k", "dtype")}
    assert p.predict(gemm, family="gemm")["seconds"][0] == pytest.approx(out["latency_us"].iloc[0] / 1e6)
    with pytest.raises(KernelsightError, match="needs family="):
        p.predict(gemm)
    with pytest.raises(KernelsightError, match="family= is for a mapping"):
        p.predict(df, family="gemm")
    assert p.predict(df.iloc[:0])["latency_us"].empty


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


def test_predict_bad_kernel_and_out_are_one_line_exit_2(tmp_path, capsys):
    from kernelsight import cli

    sweep = write_sweep(gemm_rows("l4", n_rows=3), tmp_path / "l4.parquet")
    (tmp_path / "file").write_text("x")
    for args, message in ((["kernel.family=gemm", "kernel.m=true", "kernel.n=64", "kernel.k=64"],
                           "gemm.m = True: must be an integer >= 1"),
                          ([f"sweep_file={sweep}", f"out={tmp_path / 'file' / 'p.csv'}"],
                           f"out={tmp_path / 'file' / 'p.csv'}: {tmp_path / 'file'} is a file, not a directory")):
        with pytest.raises(SystemExit) as e:
            cli.main(["predict", *args])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err == f"kernelsight predict: error: {message}\n"


@pytest.mark.parametrize("args, message", [
    (["target=h100_smx"], "target=h100_smx: unknown GPU 'h100_smx': did you mean 'h100_sxm'?"),
    (["target=mi300x"], "target=mi300x: no calibration rows for this GPU; GPUs with data:"),
    (["learner.num_trees=-1"], "learner.num_trees=-1: must be an integer >= 1"),
    (["seed=-1"], "seed=-1: must be an integer >= 0 (a random seed)"),
])
def test_calibrate_settings_are_checked_before_the_data_is_loaded(args, message, tmp_path, capsys, monkeypatch):
    from kernelsight import cli
    from kernelsight.calibrate import rows

    def not_yet(files):
        raise AssertionError("the data was loaded before the settings were checked")

    monkeypatch.setattr(rows, "load_rows", not_yet)
    with pytest.raises(SystemExit) as e:
        cli.main(["calibrate", f"out={tmp_path / 'report'}", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"kernelsight calibrate: error: {message}") and err.count("\n") == 1


def test_predict_prints_the_80_percent_interval_around_the_prediction(capsys):
    """`kernelsight predict` of one kernel prints its p10-p90 range from the shipped bundle's held-out errors,
    around the central prediction, for the GPU's own model and for the cross-device one."""
    import re

    from kernelsight import cli

    for gpu, path in (("h100_sxm", "target"), ("mi300x", "cross")):
        cli.main(["predict", f"hardware={gpu}", "kernel.family=gemm", "kernel.m=64", "kernel.n=4096",
                  "kernel.k=4096", "kernel.dtype=bf16"])
        out = capsys.readouterr().out
        central = float(re.search(r"predicted (\S+) us", out).group(1))
        low, high = map(float, re.search(r"80 % interval (\S+)-(\S+) us .*" + path + " path", out).groups())
        roofline = float(re.search(r"roofline +(\S+) us", out).group(1))
        assert roofline <= low < central < high
