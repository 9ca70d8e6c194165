"""`kernelsight validate`'s composition terms in the step pricer: vLLM's custom all-reduce below its size
limit, measured all-reduce rows per tier (interpolated, never extrapolated) and the shipped copy of them, the
custom all-reduce fit, and fp8 weights and KV cache priced as fp8."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.predict import Predictor
from kernelsight.predictor.roofline import roofline_columns
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.engine_profile import load_engine
from kernelsight.sim.graph import token_kernels
from kernelsight.sim.memory import kv_cache_blocks
from kernelsight.sim.model import load_model
from kernelsight.sim.parallel import ParallelConfig
from kernelsight.sim.pricing import StepPricer
from kernelsight.sim.vllm_allreduce import MeasuredAllReduce, measured_allreduce, vllm_allreduce_rows
from kernelsight.validate.allreduce import fit_custom_allreduce


def test_custom_allreduce_below_the_size_limit_nccl_above():
    hw, engine = load_hardware("h100_sxm"), load_engine("vllm_v1")
    model = load_model("llama3.1-8b")
    pricer = StepPricer(model, hw, engine, ParallelConfig("tp8", tp=8), Predictor(hw, tier="roofline"))
    ar = engine.allreduce
    limit = ar.custom_max_bytes(8)
    assert limit == 0.25 * 2**20
    cols = {"msg_bytes": np.array([4096.0, limit - 16, limit, 8 * limit]), "world_size": np.array([8] * 4),
            "link": np.array(["nvlink"] * 4, dtype=object), "dtype": np.array(["bf16"] * 4, dtype=object)}
    nccl = Predictor(hw, tier="roofline").predict(cols, family="allreduce")["seconds"]
    got, by = pricer._allreduce_flavour(cols, nccl)
    assert by.tolist() == ["vLLM custom all-reduce model"] * 2 + ["", ""]
    bus = cols["msg_bytes"] * 2 * 7 / 8
    custom = ar.custom_alpha_us * 1e-6 + bus / (ar.custom_bus_efficiency * hw.link_bw("nvlink"))
    np.testing.assert_allclose(got[:2], custom[:2])
    np.testing.assert_allclose(got[2:], nccl[2:])
    off = dataclasses.replace(engine, allreduce=dataclasses.replace(ar, custom=False))
    assert off.allreduce.custom_max_bytes(8) == 0.0


def test_measured_allreduce_interpolates_log_log_and_never_extrapolates():
    rows = pd.DataFrame({"world_size": [8, 8, 8, 8, 4], "msg_bytes": [1024.0, 2**20, 2**20, 2**20, 1024.0],
                         "seconds": [1e-5, 1e-4, 2e-4, 9e-4, 3e-6]})
    table = MeasuredAllReduce.from_rows("x", rows)
    assert sorted(table.curves) == [8]  # one size at TP 4 is no curve
    got = table.seconds([1024.0, 2**15, 2**20, 512.0, 2**21, 2**15], [8, 8, 8, 8, 8, 4])
    # repeats at one size count by their median (2e-4); 32 KiB lies halfway in log bytes
    np.testing.assert_allclose(got[:3], [1e-5, np.sqrt(1e-5 * 2e-4), 2e-4])
    assert np.isnan(got[3:]).all()


def test_measured_allreduce_uses_the_gpu_rows_or_a_die_sibling_on_the_same_nvlink():
    assert measured_allreduce("h100_sxm").device == "h100_sxm"
    assert measured_allreduce("h100_sxm", "cross").device == "h200_sxm"  # the cross tier's source
    assert measured_allreduce("gb200", "cross").device == "b200_sxm"
    assert measured_allreduce("a100_sxm", "cross") is None  # no sibling with rows
    assert measured_allreduce("l40s") is None  # no NVLink: NCCL over PCIe stays the predictor's
    assert measured_allreduce("h100_sxm", "roofline") is None  # the plain roofline prices no measurement
    rows = vllm_allreduce_rows()
    assert list(rows.columns[:5]) == ["device", "world_size", "dtype", "msg_bytes", "latency_ms"]


def test_measured_allreduce_prices_what_its_rows_cover_per_tier():
    hw, engine = load_hardware("h100_sxm"), load_engine("vllm_v1")
    assert engine.allreduce.measured
    model, par = load_model("llama3.1-8b"), ParallelConfig("tp8", tp=8)
    rows = vllm_allreduce_rows()
    mib = 2.0**20
    cols = {"msg_bytes": np.array([mib, 4 * mib, 4096 * mib]), "world_size": np.array([8] * 3),
            "link": np.array(["nvlink"] * 3, dtype=object), "dtype": np.array(["bf16"] * 3, dtype=object)}
    nccl = np.full(3, 1.0)

    def measured(device, size):
        sel = (rows["device"] == device) & (rows["world_size"] == 8) & (rows["msg_bytes"] == size)
        return rows.loc[sel, "seconds"].median()

    for tier, device in (("auto", "h100_sxm"), ("cross", "h200_sxm")):
        predictor = Predictor(hw, tier=tier)
        got, by = StepPricer(model, hw, engine, par, predictor)._allreduce_flavour(cols, nccl)
        np.testing.assert_allclose(got[:2], [measured(device, mib), measured(device, 4 * mib)])
        assert got[2] == 1.0  # 4 GiB: beyond the rows, the NCCL price stays
        assert by.tolist() == [f"vLLM all-reduce measured on {device}"] * 2 + [""]
    # off, or for the plain roofline: the custom kernel below 0.25 MiB at TP 8 and NCCL above it
    off = dataclasses.replace(engine, allreduce=dataclasses.replace(engine.allreduce, measured=False))
    for eng, tier in ((off, "auto"), (engine, "roofline")):
        pricer = StepPricer(model, hw, eng, par, Predictor(hw, tier=tier))
        assert pricer.measured_allreduce is None
        got, by = pricer._allreduce_flavour(cols, nccl)
        np.testing.assert_array_equal(got, nccl)
        assert by.tolist() == ["", "", ""]


def test_custom_allreduce_fit_recovers_a_synthetic_kernel_and_reports_held_out_gpus():
    rng = np.random.default_rng(0)
    rows = []
    for device, bw in (("a", 300e9), ("b", 450e9), ("c", 900e9)):
        for bus in np.geomspace(256, 64 * 2**20, 19):
            rows.append({"device": device, "world_size": 8, "bus_bytes": bus, "link_bw": bw,
                         "seconds": (5.5e-6 + bus / (0.6 * bw)) * rng.uniform(0.999, 1.001)})
    fit = fit_custom_allreduce(pd.DataFrame(rows), exclude=("b",))
    assert fit.alpha_us == pytest.approx(5.5, rel=0.01) and fit.bus_efficiency == pytest.approx(0.6, rel=0.01)
    assert fit.train_devices == ("a", "c")
    assert fit.errors.set_index("device").loc["b", "held_out"]


def test_fp8_weights_and_kv_cache_are_priced_as_fp8():
    hw, engine = load_hardware("h100_sxm"), load_engine("vllm_v1")
    fp8 = load_model("llama3.1-70b-fp8")
    bf16 = dataclasses.replace(fp8, weight_dtype="bf16", kv_dtype="bf16", name="bf16")
    par = ParallelConfig("tp4", tp=4)
    gemms = {m.name: [c for c in token_kernels(m, par, engine, 4096) if c.name == "gate_up_proj"][0]
             for m in (fp8, bf16)}
    assert gemms[fp8.name].cols["dtype"] == "fp8"
    roof = {name: roofline_columns("gemm", call.columns(), hw) for name, call in gemms.items()}
    # compute bound at 4096 tokens: fp8 runs at the fp8 peak, twice bf16's on H100
    ratio = hw.peak_flops("fp8") / hw.peak_flops("bf16")
    assert ratio == pytest.approx(2.0, rel=1e-3)
    assert roof["bf16"]["t_compute"][0] / roof[fp8.name]["t_compute"][0] == pytest.approx(ratio, rel=1e-9)
    small = {m.name: [c for c in token_kernels(m, par, engine, 8) if c.name == "gate_up_proj"][0]
             for m in (fp8, bf16)}
    weights = {n: roofline_columns("gemm", c.columns(), hw)["bytes"][0] for n, c in small.items()}
    assert weights["bf16"] / weights[fp8.name] == pytest.approx(2.0, rel=0.01)  # 1-byte weights
    # fp8 KV cache: half the decode-attention bytes and twice the KV blocks
    pred = Predictor(hw, tier="roofline")
    batch = StepBatch(decode_ctx=(4096,) * 32)
    attn = {m.name: [k for k in StepPricer(m, hw, engine, par, pred).kernels(batch)
                     if k.call.family == "attn_decode"][0] for m in (fp8, bf16)}
    assert attn["bf16"].seconds / attn[fp8.name].seconds == pytest.approx(2.0, rel=0.05)
    fp8_weights_bf16_kv = dataclasses.replace(fp8, kv_dtype="bf16")
    assert kv_cache_blocks(fp8, hw, engine, par) == pytest.approx(2 * kv_cache_blocks(fp8_weights_bf16_kv, hw, engine,
                                                                                       par), abs=2)


def test_shipped_allreduce_rows_are_the_reference_datas():
    """data/engine/vllm_custom_ar.csv (in the wheel) holds exactly the CUDA-graph custom_ar rows of data/public."""
    from kernelsight.predictor.paths import data_dir
    from kernelsight.sim.vllm_allreduce import measured_rows, shipped_rows_path

    shipped = pd.read_csv(shipped_rows_path())
    fresh = measured_rows(data_dir() / "public" / "aiconfigurator")
    pd.testing.assert_frame_equal(shipped, fresh, check_dtype=False, rtol=1e-8)
