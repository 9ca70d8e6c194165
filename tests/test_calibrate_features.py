"""η features: hand-checked values on known rows, one implementation for fitting and prediction."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kernelsight.predictor.families.collectives import ALPHA_HOP_S, ALPHA_LAUNCH_S
from kernelsight.predictor.features import describe, feature_matrix, feature_names
from kernelsight.predictor.hardware import load_hardware

H100 = load_hardware("h100_sxm")


def _row(family, tier, hw=H100, **cols):
    x = feature_matrix(family, tier, {k: [v] for k, v in cols.items()}, hw)
    return dict(zip(feature_names(family, tier), x[0]))


def test_gemm_decode_shape_on_h100_by_hand():
    f = _row("gemm", "target", m=1, n=4096, k=4096, dtype="bf16")
    assert f["log2_m"] == 0 and f["log2_n"] == 12 and f["dtype_bytes"] == 2
    assert f["log2_flops"] == pytest.approx(25.0)  # 2 * 4096 * 4096 = 2^25
    bytes_ = (4096 + 4096 * 4096) * 2 + 4096 * 2
    assert f["log2_bytes"] == pytest.approx(math.log2(bytes_))
    ridge = 989.4e12 / 3350e9  # bf16 peak over HBM bandwidth
    assert f["log2_intensity_rel_ridge"] == pytest.approx(math.log2(2**25 / bytes_ / ridge))
    # 32 tiles of 128x128 (ceil(1/128) * 4096/128); split-K by min(132 // 32, 4096/256) = 4 fills 128 SMs
    blocks = 32 * 4
    assert f["log2_waves"] == pytest.approx(math.log2(blocks / 132))
    assert "tail_fill" not in f and "wave_factor" not in f  # GEMMs see the wave penalty instead
    assert f["log2_wave_penalty"] == 0  # memory-bound: quantizing the compute time changes no roofline
    assert f["log2_bytes_rel_l2"] == pytest.approx(math.log2(bytes_ / (50 * 2**20)))
    assert f["m_tile_fill"] == pytest.approx(1 / 128) and f["n_tile_fill"] == 1.0
    assert f["log2_k_alignment"] == 8  # capped at 256
    assert f["log2_split_k"] == 2  # 4 K slices per output tile
    t_memory_us = bytes_ / 3350e9 * 1e6
    assert f["log2_t_roof_us"] == pytest.approx(math.log2(t_memory_us))


def test_whole_waves_fill_the_tail():
    f = _row("gemm", "target", m=128 * 12, n=128 * 11, k=256, dtype="fp8")  # 132 blocks: one full wave
    assert f["log2_wave_penalty"] == 0 and f["dtype_bytes"] == 1
    assert f["log2_split_k"] == 0  # the tiles fill the SMs: no split-K
    f = _row("attn_prefill", "target", batch=1, seq_q=128, seq_kv=128, heads=132, kv_heads=132, head_dim=128,
             causal=False, window=0, dtype="bf16", kv_dtype="bf16")  # one 128-row query tile per head
    assert f["tail_fill"] == 1.0 and f["wave_factor"] == 1.0


def test_a_compute_bound_gemm_pays_its_tail_wave():
    # 7 x 19 = 133 output tiles on 132 SMs (no split-K: the tiles already fill them): two waves, the second
    # with one block; compute-bound, so the roofline doubles less one block's share
    f = _row("gemm", "target", m=128 * 7, n=128 * 19, k=16384, dtype="bf16")
    assert f["log2_waves"] == pytest.approx(math.log2(133 / 132))
    assert f["log2_wave_penalty"] == pytest.approx(math.log2(264 / 133))
    f = _row("attn_prefill", "target", batch=1, seq_q=128, seq_kv=128, heads=133, kv_heads=133, head_dim=128,
             causal=False, window=0, dtype="bf16", kv_dtype="bf16")  # other families keep the fill and factor
    assert f["tail_fill"] == pytest.approx(1 / 132) and f["wave_factor"] == pytest.approx(264 / 133)


def test_prefill_gqa_group_size():
    f = _row("attn_prefill", "target", batch=1, seq_q=1000, seq_kv=1000, heads=32, kv_heads=8, head_dim=128,
             causal=True, window=0, dtype="bf16", kv_dtype="bf16")
    assert f["log2_gqa_group"] == 2 and f["log2_heads"] == 5
    assert f["q_tile_fill"] == pytest.approx(1000 / 1024)


def test_tensor_kernels_see_the_gpu_through_the_roofline_only():
    for family in ("gemm", "attn_prefill", "attn_decode", "moe", "mla_prefill", "mla_decode", "mla_bmm"):
        assert feature_names(family, "cross") == feature_names(family, "target"), family
    shape = dict(m=4096, n=4096, k=4096, dtype="fp8")
    assert _row("gemm", "cross", **shape) == _row("gemm", "target", **shape)
    assert not any(name.startswith("hw_") for name in feature_names("moe", "cross"))


def test_cross_tier_adds_hardware_features_to_vector_kernels():
    target, cross = feature_names("norm", "cross"), feature_names("norm", "target")
    assert target[: len(cross)] == cross
    f = _row("norm", "cross", tokens=16, hidden=4096, op="rms", fused_residual=True, dtype="bf16")
    assert f["hw_log2_fp32_tflops"] == pytest.approx(math.log2(67))
    assert f["hw_log2_ridge"] == pytest.approx(math.log2(67e12 / 3350e9))
    assert f["hw_num_sms"] == 132 and f["hw_clock_ghz"] == pytest.approx(1.98)
    assert f["hw_log2_l2_mb"] == pytest.approx(math.log2(50))


def test_vector_kernels_use_the_fp32_peak():
    f = _row("norm", "cross", tokens=16, hidden=4096, op="rms", fused_residual=True, dtype="bf16")
    assert f["hw_log2_peak_tflops"] == pytest.approx(math.log2(67))
    assert f["op_code"] == 0 and f["fused_residual"] == 1


def test_collective_features_by_hand():
    f = _row("allreduce", "cross", msg_bytes=2**30, world_size=8, link="nvlink", dtype="bf16")
    bus = 2**30 * 2 * 7 / 8
    assert f["log2_bus_bytes"] == pytest.approx(math.log2(bus))
    alpha = ALPHA_LAUNCH_S["nvswitch"] + 2 * 7 * ALPHA_HOP_S["nvswitch"]  # ring: 2 (n - 1) hops
    t = alpha + bus / 450e9
    assert f["log2_t_roof_us"] == pytest.approx(math.log2(t * 1e6))
    assert f["bandwidth_share"] == pytest.approx(1 - alpha / t)
    assert f["hw_log2_link_gbs"] == pytest.approx(math.log2(450))
    # the GPU's link rates only through the row's path: as per-GPU constants they named the training GPUs
    assert not {"hw_log2_nvlink_gbs", "hw_log2_pcie_gbs"} & set(f)
    pcie = _row("allreduce", "cross", msg_bytes=2**30, world_size=4, link="pcie", dtype="bf16")
    assert pcie["hw_log2_link_gbs"] == pytest.approx(math.log2(64 * (2 / 4) ** 2))  # H100 SXM: no P2P in the catalog


def test_unknown_catalog_values_are_nan_not_a_guess():
    from dataclasses import replace

    unclocked = replace(load_hardware("gb200"), boost_clock_mhz=None)
    f = _row("allreduce", "cross", hw=unclocked, msg_bytes=4096, world_size=4, link="nvlink", dtype="bf16")
    assert np.isnan(f["hw_clock_ghz"]) and np.isfinite(f["hw_log2_link_gbs"])


def test_every_family_has_named_documented_features():
    from kernelsight.predictor.bundle import T_ROOF_FEATURE
    from kernelsight.predictor.families import REGISTRY

    for family in REGISTRY:
        for tier in ("target", "cross"):
            spec = describe(family, tier)
            names = [s["name"] for s in spec]
            assert len(names) == len(set(names)) and all(s["doc"] for s in spec)
            assert T_ROOF_FEATURE in names  # a gap model (predictor/bundle.py) forms η from it


def test_bad_shapes_fail_with_one_line():
    from kernelsight.predictor.errors import KernelsightError

    with pytest.raises(KernelsightError, match="gemm.m"):
        feature_matrix("gemm", "target", {"m": [0], "n": [1], "k": [1], "dtype": ["bf16"]}, H100)
    with pytest.raises(ValueError, match="unknown tier"):
        feature_names("gemm", "sideways")
