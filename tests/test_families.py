"""The kernel cost model: hand-computed values and the invariants every family must keep."""
import dataclasses
import math

import numpy as np
import pytest

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import COLLECTIVES, REGISTRY, SHAPE_COLUMNS, get_family, make_shape
from kernelsight.predictor.families.collectives import ALPHA_HOP_S, ALPHA_LAUNCH_S, algbw, busbw, busbw_factor
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.roofline import roofline_frame, roofline_shape, wave_factor

H100 = load_hardware("h100_sxm")

DESIGN_FAMILIES = {"gemm", "attn_prefill", "attn_decode", "kv_write", "rope", "norm", "act", "elementwise",
                   "moe", "mla_prefill", "mla_decode", "mla_bmm", "allreduce", "allgather", "reducescatter",
                   "alltoall", "sendrecv"}
DSV3 = dict(hidden=7168, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
TINY_MLA = dict(hidden=16, q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=6)

# One valid shape per family, used by the invariant tests.
EXAMPLES = {
    "gemm": dict(m=512, n=4096, k=4096, dtype="bf16"),
    "attn_prefill": dict(batch=2, seq_q=512, seq_kv=1024, heads=32, kv_heads=8, head_dim=128),
    "attn_decode": dict(batch=64, seq_kv=2048, heads=32, kv_heads=8, head_dim=128),
    "kv_write": dict(tokens=256, kv_heads=8, head_dim=128),
    "rope": dict(tokens=256, heads=32, kv_heads=8, head_dim=128),
    "norm": dict(tokens=256, hidden=4096),
    "act": dict(tokens=256, intermediate=14336),
    "elementwise": dict(numel=1 << 20, op="add"),
    "moe": dict(tokens=256, experts=128, top_k=8, hidden=2048, intermediate=768),
    "mla_prefill": dict(batch=2, seq_q=512, seq_kv=1024, heads=16, **DSV3),
    "mla_decode": dict(batch=64, seq_kv=2048, heads=16, **DSV3),
    "mla_bmm": dict(tokens=64, heads=16, head_dim=128, kv_lora_rank=512),
    **{c: dict(msg_bytes=1 << 20, world_size=8) for c in COLLECTIVES},
}


def test_registry_holds_exactly_the_design_families():
    assert set(REGISTRY) == DESIGN_FAMILIES
    assert set(EXAMPLES) == DESIGN_FAMILIES
    for fam in REGISTRY.values():
        assert fam.dominant in fam.columns
        assert fam.tile  # the tile assumption is written down
        assert set(fam.columns) <= set(SHAPE_COLUMNS)


def test_gemm_8192_cubed_on_h100_by_hand():
    s = make_shape("gemm", m=8192, n=8192, k=8192, dtype="bf16")
    assert s.flops == 2 * 8192 ** 3 == pytest.approx(1.0995e12, rel=1e-4)
    assert s.bytes == 3 * 8192 * 8192 * 2  # A, B read, C written, 2 bytes each
    assert s.blocks == 64 * 64  # 128x128 tiles
    r = roofline_shape(s, H100)
    assert s.flops / 989.4e12 == pytest.approx(1.111e-3, rel=1e-3)  # the ideal, u = 1
    assert r["wave_factor"] == pytest.approx(math.ceil(4096 / 132) * 132 / 4096)  # 1.03125
    assert r["t_roof"] == pytest.approx(1.0995e12 * 1.03125 / 989.4e12, rel=1e-4)  # ~1.146 ms
    assert r["bound"] == "compute"


def test_fp8_halves_gemm_operand_bytes_and_doubles_peak():
    bf16 = make_shape("gemm", m=4096, n=4096, k=4096, dtype="bf16")
    fp8 = make_shape("gemm", m=4096, n=4096, k=4096, dtype="fp8")
    out = 4096 * 4096 * 2  # both write bf16
    assert fp8.bytes - out == pytest.approx((bf16.bytes - out) / 2)
    assert roofline_shape(fp8, H100)["t_compute"] == pytest.approx(roofline_shape(bf16, H100)["t_compute"] / 2,
                                                                   rel=1e-3)


def test_decode_gemm_is_memory_bound():
    r = roofline_shape(make_shape("gemm", m=1, n=4096, k=4096), H100)
    assert r["bound"] == "memory"
    assert r["t_roof"] == pytest.approx((4096 + 4096 * 4096 + 4096) * 2 / 3.35e12)


def test_attention_prefill_by_hand():
    s = make_shape("attn_prefill", batch=1, seq_q=4, seq_kv=4, heads=2, kv_heads=1, head_dim=8)
    assert s.flops == 4 * 2 * 8 * 10  # causal: 1+2+3+4 pairs
    assert s.bytes == 2 * 4 * 2 * 8 * 2 + 2 * 4 * 1 * 8 * 2  # Q,O + K,V
    assert s.blocks == 2  # one 128-row tile per head
    chunk = make_shape("attn_prefill", batch=1, seq_q=2, seq_kv=4, heads=2, kv_heads=1, head_dim=8)
    assert chunk.flops == 4 * 2 * 8 * (3 + 4)  # two new tokens after a 2-token cached prefix
    window = make_shape("attn_prefill", batch=1, seq_q=4, seq_kv=4, heads=2, kv_heads=1, head_dim=8, window=2)
    assert window.flops == 4 * 2 * 8 * (1 + 2 + 2 + 2)
    dense = make_shape("attn_prefill", batch=1, seq_q=4, seq_kv=4, heads=2, kv_heads=1, head_dim=8, causal=False)
    assert dense.flops == 4 * 2 * 8 * 16


def test_attention_decode_by_hand_and_gqa_shrinks_kv_bytes():
    s = make_shape("attn_decode", batch=2, seq_kv=100, heads=32, kv_heads=8, head_dim=128, block_size=16)
    kv = 2 * (2 * 100 * 8 * 128 * 2)
    qo = 2 * (2 * 32 * 128 * 2)
    table = 2 * 4 * math.ceil(100 / 16)
    assert s.bytes == kv + qo + table
    assert s.flops == 4 * 2 * 32 * 128 * 100
    assert s.blocks == 2 * 8 * 1
    mha = make_shape("attn_decode", batch=2, seq_kv=100, heads=32, kv_heads=32, head_dim=128, block_size=16)
    assert s.bytes < mha.bytes
    fp8 = make_shape("attn_decode", batch=2, seq_kv=100, heads=32, kv_heads=8, head_dim=128, kv_dtype="fp8")
    assert fp8.bytes == kv / 2 + qo + table


def test_small_families_by_hand():
    kv = make_shape("kv_write", tokens=10, kv_heads=8, head_dim=128)
    assert kv.bytes == 2 * 10 * 8 * 128 * (2 + 2) + 8 * 10 and kv.flops == 0
    rope = make_shape("rope", tokens=10, heads=32, kv_heads=8, head_dim=128)
    assert rope.flops == 3 * 10 * 40 * 128
    assert rope.bytes == 2 * 10 * 40 * 128 * 2 + 10 * (128 * 2 + 8)
    norm = make_shape("norm", tokens=10, hidden=4096, op="rms", fused_residual=True)
    assert norm.bytes == 10 * 4096 * 2 * 4 + 4096 * 2 and norm.flops == 10 * 4096 * 5
    ln = make_shape("norm", tokens=10, hidden=4096, op="layer", dtype="fp32")
    assert ln.bytes == 10 * 4096 * 4 * 2 + 4096 * 4 * 2 and ln.flops == 10 * 4096 * 7
    act = make_shape("act", tokens=10, intermediate=14336)
    assert act.bytes == 3 * 10 * 14336 * 2 and act.flops == 6 * 10 * 14336
    add = make_shape("elementwise", numel=1000, op="add", dtype="fp32")
    assert add.bytes == 3 * 1000 * 4 and add.blocks == 2
    emb = make_shape("elementwise", numel=1000, op="embedding")
    assert emb.bytes == 2 * 1000 * 2


def test_moe_by_hand():
    s = make_shape("moe", tokens=1, experts=8, top_k=2, hidden=16, intermediate=32)
    active = 8 * (1 - (1 - 2 / 8) ** 1)
    assert active == pytest.approx(2.0)
    assert s.flops == 6 * 2 * 16 * 32
    assert s.bytes == pytest.approx(active * 3 * 16 * 32 * 2 + 2 * (2 * 16 + 3 * 32) * 2)
    many = make_shape("moe", tokens=4096, experts=8, top_k=2, hidden=16, intermediate=32)
    assert many.bytes > s.bytes  # all 8 experts are hit
    fp8 = make_shape("moe", tokens=4096, experts=8, top_k=2, hidden=16, intermediate=32, dtype="fp8")
    assert fp8.bytes < many.bytes


def test_mla_decode_by_hand():
    # T = 2 tokens, C = 8 keys, H = 2 heads, D = 16, Lq = 8, Lkv = 8, P = 4, R = 2, V = 6
    s = make_shape("mla_decode", batch=2, seq_kv=4, heads=2, **TINY_MLA)
    weights = 16 * (8 + 8 + 2) + 8 * 2 * (4 + 2) + 2 * 6 * 16   # fused_qkv_a, q_b, o_proj = 576
    absorbed = 2 * 8 * (4 + 6)                                 # W_UK and W_UV, bf16 = 160
    assert s.flops == 2 * 2 * weights + 2 * 2 * absorbed + 2 * 8 * 2 * (8 + 2 + 8)  # GEMMs, bmms, latent attention
    acts = 2 * 2 * (18 + 12) + 2 * 2 * 16 + 2 * 2 * 2 * (8 + 8 + 6)  # down/q out, hidden in/out, bmm ins/outs
    assert s.bytes == weights * 2 + (absorbed + acts) * 2 + (8 + 2) * (8 + 2) * 2  # KV read 8 rows, write 2
    assert s.blocks == 3 + 2 * (1 + 1) + 2 * 1 * 1  # GEMM tiles, bmm tiles per head, (sequence, head group, split)
    fp8 = make_shape("mla_decode", batch=2, seq_kv=4, heads=2, dtype="fp8_block", kv_dtype="fp8", **TINY_MLA)
    assert s.bytes - fp8.bytes == pytest.approx(weights * (2 - (1 + 4 / 128 ** 2)) + 10 * 10 * 1)
    assert fp8.flops == s.flops


def test_mla_prefill_by_hand_and_without_query_compression():
    s = make_shape("mla_prefill", batch=1, seq_q=4, seq_kv=4, heads=2, kv_dtype="fp8", **TINY_MLA)
    weights, kv_b = 576, 8 * 2 * (4 + 6)  # as in the decode test; kv_b: latent -> per-head nope keys and values
    assert s.flops == 2 * 4 * weights + 2 * 4 * kv_b + 2 * (1 + 2 + 3 + 4) * 2 * (4 + 2 + 6)
    acts = 2 * 4 * (18 + 12) + 2 * 4 * 16 + 2 * 4 * 2 * (4 + 6) + 2 * 4 * 2 * 6
    assert s.bytes == (weights + kv_b) * 2 + acts * 2 + 4 * (8 + 2) * 1  # fp8 latent rows of 4 keys
    assert s.blocks == 3 + 1 + 1 * 2 * 1
    prefix = make_shape("mla_prefill", batch=1, seq_q=2, seq_kv=4, heads=2, kv_dtype="fp8", **TINY_MLA)
    assert prefix.flops - 2 * 2 * weights == 2 * 4 * kv_b + 2 * (3 + 4) * 2 * 12  # every key expanded, 2 queries
    no_q_lora = make_shape("mla_prefill", batch=1, seq_q=4, seq_kv=4, heads=2, **{**TINY_MLA, "q_lora_rank": 0})
    weights = 16 * (8 + 2) + 16 * 2 * 6 + 2 * 6 * 16  # kv_a, q_proj from the hidden state, o_proj
    assert no_q_lora.flops == 2 * 4 * weights + 2 * 4 * kv_b + 2 * 10 * 2 * 12


def test_mla_bmm_by_hand_and_inside_mla_decode():
    pre = make_shape("mla_bmm", tokens=64, heads=16, head_dim=128, kv_lora_rank=512, op="pre")
    post = make_shape("mla_bmm", tokens=64, heads=16, head_dim=128, kv_lora_rank=512, op="post")
    assert pre.flops == post.flops == 2 * 16 * 64 * 128 * 512
    assert pre.bytes == post.bytes == 2 * (16 * 64 * (128 + 512) + 16 * 128 * 512)
    assert (pre.blocks, post.blocks) == (16 * 4, 16 * 1)  # 128x128 output tiles per head: 64x512, 64x128
    dec = make_shape("mla_decode", batch=64, seq_kv=1, heads=16, **DSV3)
    proj = 2 * 64 * (7168 * (1536 + 512 + 64) + 1536 * 16 * 192 + 16 * 128 * 7168)
    attention = 2 * 64 * 16 * (2 * 512 + 64)
    assert dec.flops == proj + pre.flops + post.flops + attention  # the two bmms are part of the module


def test_collectives_follow_nccl_tests_conventions():
    assert busbw_factor("allreduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("allgather", "reducescatter", "alltoall"):
        assert busbw_factor(op, 4) == pytest.approx(3 / 4)
    assert busbw_factor("sendrecv", 2) == 1
    assert algbw(1e9, 0.01) == pytest.approx(1e11)
    assert busbw("allreduce", 1e9, 0.01, 8) == pytest.approx(1e11 * 1.75)
    s = make_shape("allreduce", msg_bytes=1 << 30, world_size=8, link="nvlink")
    assert s.bytes == pytest.approx((1 << 30) * 1.75)
    r = roofline_shape(s, H100)
    assert r["bound"] == "link"
    ring_alpha = ALPHA_LAUNCH_S["nvswitch"] + 2 * 7 * ALPHA_HOP_S["nvswitch"]  # a 1 GiB all-reduce runs a ring
    assert r["t_roof"] == pytest.approx(ring_alpha + (1 << 30) * 1.75 / 450e9)
    pcie = roofline_shape(make_shape("allreduce", msg_bytes=1 << 30, world_size=8, link="pcie"), H100)
    assert pcie["t_roof"] > r["t_roof"]


def test_wave_factor_is_at_least_one_and_one_for_whole_waves():
    blocks = np.arange(0, 5000)
    u = wave_factor(blocks, 132)
    assert (u >= 1).all()
    assert u[132] == 1 and u[264] == 1 and u[0] == 1
    assert u[133] == pytest.approx(264 / 133)


@pytest.mark.parametrize("family", sorted(DESIGN_FAMILIES))
def test_cost_and_roofline_grow_with_size(family):
    """Flops and bytes never shrink when a size grows; roofline time never shrinks when one doubles."""
    fam = get_family(family)
    base = make_shape(family, **EXAMPLES[family])
    base_roof = roofline_shape(base, H100)["t_roof"]
    sizes = [f.name for f in fam.fields if f.kind == "pos" and f.name not in ("block_size", "world_size",
                                                                              "heads", "kv_heads", "experts",
                                                                              "moe_tp", "moe_ep")]
    assert sizes
    for name in sizes:
        params = dataclasses.asdict(base)
        params[name] = getattr(base, name) * 2
        if family in ("attn_prefill", "mla_prefill") and name == "seq_q":
            params["seq_kv"] = base.seq_kv + base.seq_q
        if family == "moe" and name == "top_k":
            continue
        bigger = make_shape(family, **params)
        assert bigger.flops >= base.flops and bigger.bytes >= base.bytes, name
        assert roofline_shape(bigger, H100)["t_roof"] >= base_roof, name


@pytest.mark.parametrize("family,bad,message", [
    ("gemm", dict(m=0, n=1, k=1), "gemm.m = 0: must be an integer >= 1"),
    ("gemm", dict(m=-5, n=1, k=1), "gemm.m = -5"),
    ("gemm", dict(m=1.5, n=1, k=1), "must be an integer"),
    ("gemm", dict(m=1, n=1, k=1, dtype="int3"), "dtype"),
    ("attn_prefill", dict(batch=1, seq_q=8, seq_kv=4, heads=8, kv_heads=8, head_dim=64), "seq_kv"),
    ("attn_decode", dict(batch=1, seq_kv=8, heads=6, kv_heads=4, head_dim=64), "multiple of kv_heads"),
    ("moe", dict(tokens=1, experts=4, top_k=8, hidden=8, intermediate=8), "top_k"),
    ("mla_prefill", dict(batch=1, seq_q=8, seq_kv=4, heads=8, **TINY_MLA), "seq_kv (prefix + new tokens)"),
    ("mla_decode", dict(batch=1, seq_kv=8, heads=8, **{**TINY_MLA, "qk_rope_head_dim": 3}), "must be even"),
    ("mla_decode", dict(batch=1, seq_kv=8, heads=0, **TINY_MLA), "mla_decode.heads = 0"),
    ("mla_bmm", dict(tokens=1, heads=1, head_dim=128, kv_lora_rank=512, op="mid"), "must be one of ['pre', 'post']"),
    ("norm", dict(tokens=1, hidden=8, op="batch"), "must be one of"),
    ("allreduce", dict(msg_bytes=8, world_size=1), "world_size must be >= 2"),
    ("allreduce", dict(msg_bytes=8, world_size=2, link="smoke-signal"), "link"),
])
def test_bad_shapes_give_one_clear_line(family, bad, message):
    with pytest.raises(KernelsightError) as e:
        make_shape(family, **bad)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", [True, False, "32", 3.5, None])
def test_a_size_is_an_integer_not_a_bool_string_or_fraction(value):
    with pytest.raises(KernelsightError) as e:
        make_shape("gemm", m=value, n=8, k=8)
    assert str(e.value) == f"gemm.m = {value!r}: must be an integer >= 1"
    import pandas as pd
    frame = pd.DataFrame({"family": ["gemm", "gemm"], "m": [8, value], "n": [8, 8], "k": [8, 8], "dtype": "bf16"})
    with pytest.raises(KernelsightError, match=r"row 1: gemm.m"):
        roofline_frame(frame, H100)


def test_whole_number_settings_refuse_bools_and_fractions():
    import numpy as np

    from kernelsight.predictor.errors import check_seed, whole_number
    assert whole_number(np.int64(4), "m") == 4 and check_seed(0) == 0
    for value in (True, 3.5, 4.0, "4", 0):
        with pytest.raises(KernelsightError, match=f"m={value!r}: must be an integer >= 1"):
            whole_number(value, "m")
    with pytest.raises(KernelsightError, match=r"seed=-1: must be an integer >= 0 \(a random seed\)"):
        check_seed(-1)


def test_roofline_of_an_empty_frame_is_empty():
    import pandas as pd
    for empty in (pd.DataFrame(), pd.DataFrame({"family": []}), pd.DataFrame({"family": pd.Series([], dtype=float)})):
        out = roofline_frame(empty, H100)
        assert out.empty and "t_roof" in out.columns
    with pytest.raises(KernelsightError, match="row 0: family is empty"):
        roofline_frame(pd.DataFrame({"family": [None], "m": [1]}), H100)


def test_unknown_family_and_field_suggest_names():
    with pytest.raises(KernelsightError, match="did you mean 'gemm'"):
        get_family("gemn")
    with pytest.raises(KernelsightError, match="did you mean 'head_dim'"):
        make_shape("attn_decode", batch=1, seq_kv=1, heads=1, kv_heads=1, head_dm=64)


def test_frame_roofline_matches_single_shapes_and_names_bad_rows():
    import pandas as pd
    rows = [make_shape(f, **EXAMPLES[f]).row() for f in sorted(DESIGN_FAMILIES)]
    df = pd.DataFrame(rows)
    out = roofline_frame(df, H100)
    for i, f in enumerate(sorted(DESIGN_FAMILIES)):
        single = roofline_shape(make_shape(f, **EXAMPLES[f]), H100)
        assert out.loc[i, "t_roof"] == pytest.approx(single["t_roof"])
        assert out.loc[i, "flops"] == pytest.approx(single["flops"])
    df.loc[df.family == "gemm", "k"] = 0
    bad_index = df.index[df.family == "gemm"][0]
    with pytest.raises(KernelsightError, match=f"row {bad_index}: gemm.k"):
        roofline_frame(df, H100)


def test_vector_families_use_the_fp32_core_peak():
    r = roofline_shape(make_shape("norm", tokens=1, hidden=8), H100)
    assert r["t_compute"] == pytest.approx(8 * 4 * wave_factor(1, 132) / 67e12)


def test_a_format_without_tensor_cores_runs_weight_only_and_a_missing_fallback_is_an_error():
    """vLLM runs FP8 and 4-bit weights on GPUs without their tensor cores through weight-only kernels (Marlin):
    the math is bf16, the weights move at their own size."""
    a100, h100, b200 = (load_hardware(k) for k in ("a100_sxm", "h100_sxm", "b200_sxm"))
    big = dict(m=8192, n=8192, k=8192)
    assert roofline_shape(make_shape("gemm", **big, dtype="fp8"), a100)["t_compute"] == pytest.approx(
        roofline_shape(make_shape("gemm", **big, dtype="bf16"), a100)["t_compute"])
    assert roofline_shape(make_shape("gemm", **big, dtype="nvfp4"), h100)["t_compute"] == pytest.approx(
        roofline_shape(make_shape("gemm", **big, dtype="bf16"), h100)["t_compute"])
    assert roofline_shape(make_shape("gemm", **big, dtype="nvfp4"), b200)["t_compute"] < roofline_shape(
        make_shape("gemm", **big, dtype="fp8"), b200)["t_compute"]
    assert make_shape("gemm", m=1, n=4096, k=4096, dtype="mxfp4").bytes < make_shape(
        "gemm", m=1, n=4096, k=4096, dtype="fp8").bytes / 1.8
    with pytest.raises(KernelsightError, match="no bf16 peak"):
        roofline_shape(make_shape("gemm", m=1, n=1, k=1, dtype="fp8"), load_hardware("v100_sxm"))


def test_gemm_with_few_tiles_splits_k_to_fill_the_sms():
    """One 128x128 tile over a long K runs as split-K on the whole GPU, not on one SM."""
    s = make_shape("gemm", m=128, n=128, k=65536)
    r = roofline_shape(s, H100)
    assert s.blocks == 1  # the tile decomposition, device-independent
    assert r["blocks"] == 132 and r["wave_factor"] == 1
    short = roofline_shape(make_shape("gemm", m=128, n=128, k=512), H100)
    assert short["blocks"] == 2  # slices are at least 256 deep
    big = roofline_shape(make_shape("gemm", m=8192, n=8192, k=8192), H100)
    assert big["blocks"] == 4096  # enough tiles: no split
