"""Step -> kernels (hand-checked shapes, attention aggregation, MoE routing, collectives) and step pricing."""
from __future__ import annotations

import random
import time
import json
from pathlib import Path
from dataclasses import replace

import numpy as np
import pytest
import yaml

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import get_family, make_shape
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.paths import conf_dir
from kernelsight.predictor.predict import Predictor
from kernelsight.predictor.roofline import roofline_columns
from kernelsight.predictor.sweep import read_sweep
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.engine_profile import EngineProfile, load_engine
from kernelsight.sim.graph import step_kernels
from kernelsight.sim.model import load_model
from kernelsight.sim.parallel import ParallelConfig, load_parallel
from kernelsight.sim.pricing import StepPricer


H100 = load_hardware("h100_sxm")
ENGINE = load_engine("vllm_v1")
MIXED = StepBatch(prefill_new=(1000, 37), prefill_ctx=(0, 2048), decode_ctx=(100, 2000, 4097), prefill_sampled=1)


def calls_by_name(model, batch, parallel="default", engine=ENGINE, **kw):
    calls = step_kernels(load_model(model), batch, load_parallel(parallel) if isinstance(parallel, str) else parallel,
                         engine, **kw)
    names = [c.name for c in calls]
    assert len(names) == len(set(names)), names
    return {c.name: c for c in calls}


def pricer(model="llama3.1-8b", parallel="default", engine=ENGINE, hw=H100):
    return StepPricer(load_model(model), hw, engine, load_parallel(parallel), Predictor(hw, tier="roofline"))


# -- kernels -----------------------------------------------------------------------------------

@pytest.mark.parametrize("parallel, tp", [("default", 1), ("tp2", 2)])
def test_llama_8b_step_shapes_by_hand(parallel, tp):
    c = calls_by_name("llama3.1-8b", MIXED, parallel)
    tokens = 1000 + 37 + 3
    assert c["qkv_proj"].cols == {"m": tokens, "n": (32 + 2 * 8) * 128 // tp, "k": 4096, "dtype": "bf16"}
    assert c["qkv_proj"].cols["n"] == {1: 6144, 2: 3072}[tp]
    assert c["o_proj"].cols == {"m": tokens, "n": 4096, "k": 4096 // tp, "dtype": "bf16"}
    assert c["gate_up_proj"].cols == {"m": tokens, "n": 2 * 14336 // tp, "k": 4096, "dtype": "bf16"}
    assert c["down_proj"].cols == {"m": tokens, "n": 4096, "k": 14336 // tp, "dtype": "bf16"}
    assert c["act"].cols["intermediate"] == 14336 // tp
    assert (c["rope"].cols["heads"], c["rope"].cols["kv_heads"]) == (32 // tp, 8 // tp)
    assert c["kv_write"].cols["tokens"] == tokens
    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act", "rope", "kv_write", "attn_decode",
                 "attn_prefill"):
        assert c[name].count == 32
    # two residual norms per layer (all but layer 0's input norm) + the final norm; one plain norm
    assert (c["add_rmsnorm"].count, c["rmsnorm"].count) == (64, 1)
    assert c["embedding"].cols["numel"] == tokens * 4096
    # LM head on the sampled rows only: the finishing prefill chunk + 3 decodes
    assert c["lm_head"].cols == {"m": 4, "n": 128256 // tp, "k": 4096, "dtype": "bf16"}
    assert c["sampling"].cols["numel"] == 4 * 128256
    assert all(call.phase == "mixed" for name, call in c.items() if not name.startswith("attn"))
    assert (c["attn_prefill"].phase, c["attn_decode"].phase) == ("prefill", "decode")
    for call in c.values():  # every shape is valid for its family
        get_family(call.family).cost(call.columns())


def test_tp_allreduce_only_when_tensor_parallel():
    for parallel in ("default", "tp2", "tp8"):
        c = calls_by_name("llama3.1-8b", MIXED, parallel)
        tp = load_parallel(parallel).tp
        reduces = {n: call for n, call in c.items() if call.family == "allreduce"}
        if tp == 1:
            assert not reduces and "logits_gather" not in c
            continue
        assert set(reduces) == {"embedding_allreduce", "attn_allreduce", "mlp_allreduce"}
        for name in ("attn_allreduce", "mlp_allreduce"):
            assert reduces[name].count == 32
            assert reduces[name].cols == {"msg_bytes": 1040 * 4096 * 2, "world_size": tp, "link": "nvlink",
                                          "dtype": "bf16"}
        assert c["logits_gather"].cols["msg_bytes"] == 4 * 128256 * 2


def test_kv_heads_replicate_beyond_their_number():
    c = calls_by_name("llama3.1-70b", MIXED, ParallelConfig("tp16", tp=16))
    assert c["qkv_proj"].cols["n"] == (64 // 16 + 2 * 1) * 128
    assert c["kv_write"].cols["kv_heads"] == 1


def test_decode_attention_aggregate_equals_sum_over_sequences():
    ctx = (17, 300, 1024, 4097, 9000, 15)
    for model, kinds in (("llama3.1-8b", 1), ("gemma2-9b", 2)):
        c = calls_by_name(model, StepBatch(decode_ctx=ctx))
        decodes = [call for call in c.values() if call.family == "attn_decode"]
        assert len(decodes) == kinds
        for call in decodes:
            one = {k: v for k, v in call.cols.items() if k not in ("batch", "seq_kv")}
            per_seq = [make_shape("attn_decode", batch=1, seq_kv=n, **one) for n in ctx]
            agg = make_shape("attn_decode", **call.cols)
            assert agg.bytes == pytest.approx(sum(s.bytes for s in per_seq), rel=1e-3)
            assert agg.flops == pytest.approx(sum(s.flops for s in per_seq), rel=1e-3)
            if call.cols["window"]:  # Gemma-2's sliding layers read at most 4096 keys per sequence
                assert call.cols["seq_kv"] == round(sum(min(n, 4096) for n in ctx) / len(ctx))


def test_prefill_chunks_are_rows_of_one_launch_with_their_cached_prefix():
    c = calls_by_name("llama3.1-8b", MIXED)["attn_prefill"]
    assert c.num_rows == 2
    assert list(c.cols["seq_q"]) == [1000, 37] and list(c.cols["seq_kv"]) == [1000, 37 + 2048]
    cost = get_family("attn_prefill").cost(c.columns())
    pairs = 1000 * 1001 / 2 + (37 * 2048 + 37 * 38 / 2)  # causal pairs: own chunk + whole cached prefix
    assert cost.flops.sum() == pytest.approx(4 * 32 * 128 * pairs)


def test_gemma2_layer_kinds_and_sandwich_norms():
    c = calls_by_name("gemma2-9b", MIXED)
    assert c["attn_decode[sliding]"].count == c["attn_decode[full]"].count == 21
    assert (c["attn_prefill[sliding]"].cols["window"], c["attn_prefill[full]"].cols["window"]) == (4096, 0)
    assert c["act"].cols["op"] == "gelu_tanh_mul"
    assert (c["add_rmsnorm"].count, c["rmsnorm"].count) == (2 * 42, 1 + 2 * 42)
    assert c["logit_softcap"].cols["numel"] == 4 * 256000


def test_qwen3_qk_norm_over_every_head():
    c = calls_by_name("qwen3-8b", MIXED)
    assert c["qk_norm"].cols["tokens"] == 1040 * (32 + 8) and c["qk_norm"].cols["hidden"] == 128


def test_moe_layouts_as_vllm_runs_them():
    tokens = 1040
    model = load_model("qwen3-30b-a3b")
    full = calls_by_name("qwen3-30b-a3b", MIXED)
    assert "gate_up_proj" not in full and "moe_dispatch" not in full
    assert full["router"].cols == {"m": tokens, "n": 128, "k": 2048, "dtype": "bf16"}
    assert full["topk"].cols["numel"] == tokens * 128
    assert full["experts"].cols == {"tokens": tokens, "experts": 128, "top_k": 8, "hidden": 2048,
                                    "intermediate": 768, "dtype": "bf16", "moe_tp": 1, "moe_ep": 1,
                                    "distribution": "power_law_1.01"}
    total_flops = 6 * tokens * 8 * 2048 * 768
    # TP4: every GPU runs all experts at a quarter of their width over all tokens
    tp4 = calls_by_name("qwen3-30b-a3b", MIXED, "tp4")["experts"].cols
    assert (tp4["tokens"], tp4["moe_tp"], tp4["moe_ep"]) == (tokens, 4, 1)
    assert 4 * make_shape("moe", **tp4).flops == pytest.approx(total_flops, rel=1e-9)
    # TP4 + EP4: a quarter of the experts at full width over all tokens; the TP all-reduce combines, no all-to-all
    ep = calls_by_name("qwen3-30b-a3b", MIXED, "tp4_ep4")
    local = ep["experts"].cols
    assert (local["tokens"], local["moe_tp"], local["moe_ep"]) == (tokens, 1, 4)
    assert 4 * make_shape("moe", **{**local, "distribution": "balanced"}).flops == pytest.approx(total_flops,
                                                                                               rel=1e-9)
    assert 4 * make_shape("moe", **local).flops > 1.2 * total_flops  # skewed: the most loaded rank sets the time
    assert "moe_dispatch" not in ep and ep["mlp_allreduce"].count == model.layers
    # attention DP 2 x TP 2, experts over all 4 GPUs: the MoE sees both groups' tokens, gathered and scattered
    par = ParallelConfig(name="dp2tp2ep4", tp=2, attention_dp=2, ep=4)
    adp = {c.name: c for c in step_kernels(model, MIXED, par, ENGINE)}
    assert adp["experts"].cols["tokens"] == 2 * tokens and adp["experts"].cols["moe_ep"] == 4
    assert (adp["moe_dispatch"].family, adp["moe_combine"].family) == ("allgather", "reducescatter")
    assert adp["moe_dispatch"].cols["msg_bytes"] == 2 * tokens * 2048 * 2
    assert adp["moe_dispatch"].cols["world_size"] == 2 and adp["moe_dispatch"].cols["link"] == "nvlink"
    # a MoE group past one 8-GPU node crosses the network
    wide = ParallelConfig(name="dp4tp4ep16", tp=4, attention_dp=4, ep=16)
    assert {c.name: c for c in step_kernels(model, MIXED, wide, ENGINE)}["moe_dispatch"].cols["link"] == "net"
    with pytest.raises(KernelsightError, match="must divide tp x attention_dp"):
        ParallelConfig(name="bad", tp=2, attention_dp=2, ep=8)


def test_engine_fusion_switches():
    unfused = replace(ENGINE, kernels=replace(ENGINE.kernels, fused_add_rms_norm=False, silu_and_mul=False,
                                              rope_in_place=False, qkv_fused=False, gate_up_fused=False))
    c = calls_by_name("llama3.1-8b", MIXED, engine=unfused)
    for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "residual_add", "rope_copy", "act_mul"):
        assert name in c
    assert "qkv_proj" not in c and "add_rmsnorm" not in c
    assert c["k_proj"].cols["n"] == 8 * 128 and c["act"].family == "elementwise"
    assert c["rmsnorm"].count == 65 and c["residual_add"].count == 64


# -- pricing -----------------------------------------------------------------------------------

def random_batches(seed: int, n: int, budget: int = 8192, max_seqs: int = 256):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        kind = rng.choice(("decode", "prefill", "mixed"))
        decodes = tuple(rng.randint(1, 30000) for _ in range(rng.randint(1, max_seqs))) if kind != "prefill" else ()
        chunks = []
        room = budget - len(decodes)
        while kind != "decode" and room > 0 and len(chunks) < 3:
            new = rng.randint(1, room)
            chunks.append((new, rng.choice((0, rng.randint(1, 20000)))))
            room -= new
        out.append(StepBatch(prefill_new=tuple(n for n, _ in chunks), prefill_ctx=tuple(c for _, c in chunks),
                             decode_ctx=decodes, prefill_sampled=int(bool(chunks))))
    return out


@pytest.mark.parametrize("model, parallel", [("llama3.1-8b", "default"), ("gemma2-9b", "tp2"),
                                             ("qwen3-30b-a3b", "tp4_ep4"), ("gpt-oss-120b", "tp8"),
                                             ("llama4-scout", "tp8"), ("deepseek-v3", "tp8_ep8")])
def test_memoised_step_time_is_within_half_a_percent_of_exact(model, parallel):
    p = pricer(model, parallel)
    worst = 0.0
    for batch in random_batches(seed=7, n=120):
        fast, exact = p.step_time(batch), p.step_time(batch, exact=True)
        worst = max(worst, abs(fast.gpu_s - exact.gpu_s) / exact.gpu_s)
        assert fast.host_s == exact.host_s
    assert worst < 0.005


def test_flat_masked_attention_is_one_sdpa_over_the_whole_batch():
    """transformers' paged|sdpa: per layer a gather of every request's whole KV, repeat_kv to the query heads
    and ONE non-causal SDPA of all query tokens x all KV tokens; its tables match exact pricing."""
    flat = load_engine("transformers_cb")
    calls = calls_by_name("llama3.1-8b", MIXED, engine=flat)
    kv_total = 1000 + 37 + 2048 + 100 + 2000 + 4097
    sdpa = calls["attn_flat"]
    assert (sdpa.cols["seq_q"], sdpa.cols["seq_kv"], sdpa.cols["causal"]) == (1040, kv_total, False)
    assert sdpa.cols["heads"] == sdpa.cols["kv_heads"] == 32 and sdpa.count == 32
    assert calls["kv_gather"].cols["numel"] == 2 * kv_total * 8 * 128
    assert calls["repeat_kv"].cols["numel"] == 2 * kv_total * 32 * 128
    assert calls["attn_mask"].cols["numel"] == 1040 * kv_total and calls["attn_mask"].count == 1
    assert not {"attn_prefill", "attn_decode", "qkv_proj", "gate_up_proj"} & set(calls)  # nothing fused
    p = pricer(engine=flat)
    worst = 0.0
    for batch in random_batches(seed=3, n=60):
        fast, exact = p.step_time(batch), p.step_time(batch, exact=True)
        worst = max(worst, abs(fast.gpu_s - exact.gpu_s) / exact.gpu_s)
    assert worst < 0.005
    # a 1024-token prompt beside 32 decodes: its queries meet every request's keys (33x the decode-only work;
    # at the roofline the gathered KV bytes, which the prompt adds little to, keep it above 2x)
    decodes = StepBatch(decode_ctx=(1100,) * 32)
    mixed = StepBatch(prefill_new=(1024,), prefill_ctx=(0,), decode_ctx=(1100,) * 32, prefill_sampled=1)
    a, b = p.breakdown(decodes), p.breakdown(mixed)
    attention = lambda d: d["family"].get("attn_prefill", 0) + d["family"].get("attn_decode", 0)  # noqa: E731
    assert attention(b) > 2 * attention(a)


def test_flat_slowdown_scales_the_masked_sdpa_alone():
    """attention.flat_slowdown multiplies the flat SDPA's time, in the tables and exact pricing alike; the
    gathers, the mask and every other kernel keep theirs."""
    fast = load_engine("transformers_cb")
    base = replace(fast, attention=replace(fast.attention, flat_slowdown=1.0))
    slow = replace(fast, attention=replace(fast.attention, flat_slowdown=3.0))
    p1, p3 = pricer(engine=base), pricer(engine=slow)
    k1 = {k.call.name: k.total_s for k in p1.kernels(MIXED)}
    k3 = {k.call.name: k.total_s for k in p3.kernels(MIXED)}
    assert k3["attn_flat"] == pytest.approx(3 * k1["attn_flat"])
    assert {n: t for n, t in k3.items() if n != "attn_flat"} == {n: t for n, t in k1.items() if n != "attn_flat"}
    added = p3.step_time(MIXED).gpu_s - p1.step_time(MIXED).gpu_s
    assert added == pytest.approx(2 * k1["attn_flat"], rel=0.01)  # the interpolated tables agree


@pytest.mark.parametrize("value", [0, -1.5, "fast"])
def test_flat_slowdown_must_be_a_positive_number(value):
    data = yaml.safe_load((conf_dir() / "engine" / "transformers_cb.yaml").read_text())
    data["attention"]["flat_slowdown"] = value
    with pytest.raises(KernelsightError, match=r"field 'attention.flat_slowdown' = .*must be"):
        EngineProfile.from_mapping(data, "my_engine.yaml")


def test_transformers_flat_slowdown_is_the_measured_efficient_backend_ratio():
    """The profile's flat_slowdown is what our H200 sweep measured: torch's memory-efficient SDPA against
    the shipped bundle's prefill prediction, median over the rows that ran it (to the profile's 0.1)."""
    sweep = read_sweep(Path(__file__).resolve().parents[1] / "data" / "sweeps" / "h200_sxm" / "full-1")
    rows = sweep[(sweep.provider == "torch.sdpa.efficient") & (sweep.status == "ok")].reset_index(drop=True)
    assert len(rows) == 10
    predicted = Predictor("h200_sxm").predict(rows.assign(family="attn_prefill")[
        ["family", "batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "causal", "window", "dtype",
         "kv_dtype"]])["latency_us"] / 1e3
    ratio = float(np.median(rows["latency_ms"] / predicted))
    assert load_engine("transformers_cb").attention.flat_slowdown == pytest.approx(round(ratio, 1))


def test_exact_step_time_is_the_sum_of_kernel_rooflines():
    p = pricer()
    batch = StepBatch(decode_ctx=(1024,) * 64)
    kernel_s = sum(float(roofline_columns(k.call.family, k.call.columns(), H100)["t_roof"].sum()) * k.call.count
                   for k in p.kernels(batch))
    t = p.step_time(batch)
    assert t.gpu_s == pytest.approx(kernel_s, rel=1e-9)  # decode at 64: full graph, GPU bound
    host = ENGINE.host
    assert t.host_s == pytest.approx((host.step_overhead_us + 64 * host.per_request_us + host.sampler_us) * 1e-6)
    assert t.total_s == pytest.approx(t.gpu_s + t.host_s)  # no async scheduling in vllm_v1
    overlapped = pricer(engine=replace(ENGINE, host=replace(ENGINE.host, async_scheduling=True))).step_time(batch)
    assert overlapped.total_s == pytest.approx(max(t.gpu_s, t.host_s))


def test_cuda_graph_padding_and_launch_bound_eager_steps():
    p = pricer()
    padded = {k.call.name: k for k in p.kernels(StepBatch(decode_ctx=(500,) * 13))}
    assert padded["qkv_proj"].call.cols["m"] == 16  # 13 decodes replay the 16-token graph
    assert padded["attn_decode"].call.cols["batch"] == 13 and padded["lm_head"].call.cols["m"] == 13
    mixed = {k.call.name: k for k in p.kernels(StepBatch(prefill_new=(300,), prefill_ctx=(0,), decode_ctx=(9,)))}
    assert mixed["qkv_proj"].call.cols["m"] == 304  # piecewise graph of 304 tokens
    big = {k.call.name: k for k in p.kernels(StepBatch(prefill_new=(1000,), prefill_ctx=(0,)))}
    assert big["qkv_proj"].call.cols["m"] == 1000  # above the largest capture size: eager, unpadded
    batch = StepBatch(decode_ctx=(64,))
    graphed = p.step_time(batch)
    kernel_s = sum(k.total_s for k in p.kernels(batch))
    assert graphed.gpu_s == pytest.approx(kernel_s)  # one graph launch hides behind 4.5 ms of weight reads
    slow_cpu = replace(ENGINE.host, kernel_launch_us=30.0)
    eager = pricer(engine=replace(ENGINE, host=slow_cpu, cuda_graph=replace(ENGINE.cuda_graph, enabled=False)))
    launches = sum(k.call.count for k in p.kernels(batch))
    assert eager.step_time(batch).gpu_s == pytest.approx(launches * 30e-6)  # launch bound: GPU waits for the CPU
    assert eager.breakdown(batch)["family"]["launch"] == pytest.approx(launches * 30e-6 - kernel_s)


def test_breakdown_adds_up_by_family_and_phase():
    p = pricer("qwen3-30b-a3b", "tp4_ep4")
    for batch in random_batches(seed=3, n=20) + [StepBatch(decode_ctx=(5,))]:
        b = p.breakdown(batch)
        assert sum(b["family"].values()) == pytest.approx(b["gpu_s"], rel=1e-9)
        assert sum(b["phase"].values()) == pytest.approx(b["gpu_s"], rel=1e-9)
        assert b["gpu_s"] == pytest.approx(p.step_time(batch).gpu_s, rel=1e-12)
        if not batch.prefill_new:
            assert b["phase"]["prefill"] == 0
    assert p.step_time(StepBatch()).total_s == 0 and p.kernels(StepBatch()) == []


def test_pricing_is_fast_enough_for_20k_steps():
    p = pricer()
    batches = random_batches(seed=11, n=400)
    for batch in batches:  # first use builds the lazily memoised decode tables
        p.step_time(batch)
    start = time.perf_counter()
    for _ in range(10):
        for batch in batches:
            p.step_time(batch)
    per_step = (time.perf_counter() - start) / (10 * len(batches))
    assert per_step < 100e-6, f"{per_step * 1e6:.1f} us per step"


def test_pricing_sources_say_what_priced_each_familys_time_and_how_much_extrapolated():
    engine = load_engine("vllm_v1")
    batch = StepBatch(prefill_new=(700,), prefill_ctx=(0,), decode_ctx=tuple(range(500, 532)), prefill_sampled=1)
    tp8 = StepPricer(load_model("llama3.1-70b"), H100, engine, load_parallel("tp8"), Predictor(H100))
    sources = tp8.pricing_sources([batch, batch])
    by = {(s["family"], s["tier"], s["model"]): s for s in sources}
    assert by[("gemm", "target", "target/h100_sxm/gemm")]["time_share"] == 1.0
    assert by[("allreduce", "engine", "vLLM all-reduce measured on h100_sxm")]["time_share"] == 1.0
    for family in {s["family"] for s in sources}:
        assert sum(s["time_share"] for s in sources if s["family"] == family) == pytest.approx(1.0)
    # kernel seconds are the step's, as priced exactly (two copies of the batch: twice its kernels)
    kernels = tp8.kernels(batch)
    assert sum(s["kernel_s"] for s in sources) == pytest.approx(2 * sum(k.total_s for k in kernels))
    # a GPU without data (GB300) is priced by the cross tier; its element-wise kernels lie past the training
    # GPUs' bandwidth and are flagged, attention (clock and L2 derived in the catalog) lies within it
    gb300 = load_hardware("gb300")
    cross = StepPricer(load_model("llama3.1-8b"), gb300, engine, load_parallel("default"), Predictor(gb300))
    outside = {}
    for s in cross.pricing_sources([batch]):
        assert (s["tier"], s["model"]) == ("cross", f"cross/{s['family']}")
        outside[s["family"]] = s["outside_training_range"]
    assert outside["norm"] == 1.0 and outside["attn_decode"] == 0.0
    assert tp8.pricing_sources([]) == []


# -- the registered model graphs of MoE, MLA and hybrid-attention architectures ------------------------------

def test_every_model_has_a_registered_graph_and_only_one():
    from kernelsight.sim.graphs.registry import GRAPHS
    from kernelsight.sim.model import SUPPORTED_ARCHS, list_models
    assert set(GRAPHS) == set(SUPPORTED_ARCHS)
    for name in list_models():  # every shipped model builds a step
        assert step_kernels(load_model(name), MIXED, load_parallel("default"), ENGINE)


def test_gpt_oss_formats_sinks_and_sliding_layers():
    c = calls_by_name("gpt-oss-120b", MIXED, "tp8")
    assert c["qkv_proj"].cols == {"m": 1040, "n": (64 // 8 + 2 * 1) * 64, "k": 2880, "dtype": "bf16"}
    assert c["o_proj"].cols["dtype"] == "bf16" and c["router"].cols["dtype"] == "bf16"
    assert (c["experts"].cols["dtype"], c["experts"].cols["experts"], c["experts"].cols["top_k"]) == ("mxfp4", 128, 4)
    assert "act" not in c and "gate_up_proj" not in c  # swiglu runs inside the fused MoE
    assert (c["attn_decode[sliding]"].cols["window"], c["attn_decode[full]"].cols["window"]) == (128, 0)
    assert c["attn_decode[sliding]"].count == c["attn_decode[full]"].count == 18
    assert c["attn_decode[sliding]"].cols["seq_kv"] == round((100 + 128 + 128) / 3)  # MIXED decodes 100, 2000, 4097


def test_minimax_m2_norms_q_and_k_over_the_whole_projection():
    c = calls_by_name("minimax-m2.5", MIXED, "tp8_ep8")
    assert (c["q_norm"].cols["hidden"], c["k_norm"].cols["hidden"]) == (48 // 8 * 128, 1 * 128)
    assert c["qk_norm_allreduce"].cols == {"msg_bytes": 1040 * 2 * 4, "world_size": 8, "link": "nvlink",
                                           "dtype": "fp32"}
    assert c["rope"].cols["head_dim"] == 64  # rotary_dim of head_dim 128
    assert c["router"].cols["dtype"] == "fp32" and c["topk"].cols["op"] == "sigmoid"
    assert (c["qkv_proj"].cols["dtype"], c["experts"].cols["dtype"]) == ("fp8_block", "fp8_block")
    assert "qk_norm" not in c and "qk_norm_allreduce" not in calls_by_name("minimax-m2.5", MIXED)


def test_qwen2_moe_shared_gate_and_glm_partial_rope_from_config_json():
    from kernelsight.sim.model import from_hf

    def calls(name, parallel):
        model = load_model(name)
        return {c.name: c for c in step_kernels(model, MIXED, parallel, ENGINE)}, model

    c, qwen = calls("qwen1.5-moe-a2.7b", load_parallel("default"))
    tokens = c["router"].cols["m"]
    assert c["shared_expert_gate"].cols == {"m": tokens, "n": 1, "k": 2048, "dtype": "bf16"}
    assert c["shared_gate_mul"].cols["numel"] == tokens * 2048 and c["shared_gate_mul"].count == 24
    assert c["shared_gate_up_proj"].cols["n"] == 2 * 5632 and c["experts"].cols["experts"] == 60
    c, glm = calls("glm-4.5", ParallelConfig("x", tp=8, ep=8))
    assert c["rope"].cols["head_dim"] == 64 and c["qk_norm"].cols["hidden"] == 128   # half of each head; per head
    assert (c["experts"].count, c["gate_up_proj"].count, c["topk"].cols["op"]) == (89, 3, "sigmoid")
    assert "shared_expert_gate" not in c and c["shared_gate_up_proj"].cols["n"] == 2 * 1536 // 8


def test_llama4_rope_nope_and_chunked_layers():
    c = calls_by_name("llama4-maverick", MIXED, "tp8")
    assert (c["rope"].count, c["attn_temperature"].count) == (36, 12)
    assert "qk_norm" not in c  # Maverick: use_qk_norm false
    scout = calls_by_name("llama4-scout", MIXED, "tp8")
    assert scout["qk_norm"].count == 36 and scout["qk_norm"].cols["dtype"] == "fp32"
    assert (c["experts"].count, c["gate_up_proj"].count, c["shared_gate_up_proj"].count) == (24, 24, 24)
    assert c["gate_up_proj"].cols["n"] == 2 * 16384 // 8 and c["shared_gate_up_proj"].cols["n"] == 2 * 8192 // 8
    assert (c["experts"].cols["top_k"], c["topk"].cols["op"]) == (1, "sigmoid")
    # chunked attention: a prefill crossing an 8192 boundary is two rows, each with its own chunk's prefix
    batch = StepBatch(prefill_new=(5000,), prefill_ctx=(6000,), decode_ctx=(9000, 100), prefill_sampled=1)
    k = calls_by_name("llama4-scout", batch, "tp8")
    chunked, full = k["attn_prefill[chunked]"].cols, k["attn_prefill[full]"].cols
    assert (list(chunked["seq_q"]), list(chunked["seq_kv"])) == ([2192, 2808], [8192, 2808])
    assert (list(full["seq_q"]), list(full["seq_kv"])) == ([5000], [11000])
    assert k["attn_decode[chunked]"].cols["seq_kv"] == round(((9000 - 1) % 8192 + 1 + 100) / 2)
    assert k["attn_decode[full]"].cols["seq_kv"] == round((9000 + 100) / 2)


def test_deepseek_mla_is_one_module_per_layer_and_nothing_twice():
    c = calls_by_name("deepseek-v3", MIXED, "tp8_ep8")
    # the MLA module holds the projections, RoPE, the KV write and o_proj: none of them is launched beside it
    assert not {"qkv_proj", "o_proj", "rope", "kv_write", "qk_norm", "attn_decode", "attn_prefill"} & set(c)
    assert not any(call.family == "mla_bmm" for call in c.values())
    decode, prefill = c["mla_decode"].cols, c["mla_prefill"].cols
    assert (decode["batch"], decode["heads"], decode["kv_lora_rank"], decode["dtype"]) == (3, 16, 512, "fp8_block")
    assert list(prefill["seq_kv"]) == [1000, 37 + 2048] and c["mla_decode"].count == 61
    assert c["attn_allreduce"].count == 61
    assert (c["gate_up_proj"].count, c["experts"].count, c["shared_gate_up_proj"].count) == (3, 58, 58)
    assert (c["experts"].cols["experts"], c["experts"].cols["moe_ep"], c["topk"].cols["op"]) == (256, 8, "sigmoid")
    nv = calls_by_name("deepseek-v3.1-nvfp4", MIXED, "tp8_ep8")
    assert (nv["mla_decode"].cols["dtype"], nv["mla_decode"].cols["kv_dtype"]) == ("bf16", "fp8")
    assert {nv[n].cols["dtype"] for n in ("gate_up_proj", "down_proj", "experts", "shared_gate_up_proj")} == {"nvfp4"}
    with pytest.raises(KernelsightError, match="flat_masked attention layout"):
        pricer("deepseek-v3", "tp8_ep8", engine=load_engine("transformers_cb"))
    p = pricer("deepseek-v3", "tp8_ep8")
    assert p.attention_families == ("mla_prefill", "mla_decode")
    assert set(p.breakdown(MIXED)["family"]) >= {"mla_prefill", "mla_decode", "moe"}


def test_gemm_calls_carry_their_components_format():
    c = calls_by_name("llama3.1-70b", MIXED, "tp8")
    model = load_model("llama3.1-70b")
    mixed = replace(model, weight_dtype="fp8_block", weight_formats={"attention_out": "bf16", "mlp": "w4a16"})
    k = {call.name: call for call in step_kernels(mixed, MIXED, load_parallel("tp8"), ENGINE)}
    assert (k["qkv_proj"].cols["dtype"], k["o_proj"].cols["dtype"]) == ("fp8_block", "bf16")
    assert {k[n].cols["dtype"] for n in ("gate_up_proj", "down_proj")} == {"w4a16"}
    assert k["lm_head"].cols["dtype"] == c["lm_head"].cols["dtype"] == "bf16"


def test_chunked_decode_runs_match_their_steps():
    p = pricer("llama4-scout", "tp8")
    ctx = np.array([8000, 8190, 100, 20000])
    run = p.decode_run(ctx, 12)
    for j in range(12):
        step = p.step_time(StepBatch(decode_ctx=tuple((ctx + j).tolist())))
        assert run.gpu_s[j] == pytest.approx(step.gpu_s, rel=1e-12)


# The done-when check: each architecture's decode step of 64 sequences at KV length 1024, priced by the roofline
# predictor, lies within 1.5x of a roofline computed by hand from the config.json: the weights each GPU reads
# once plus the KV it reads, over HBM bandwidth, against the batch's matmul FLOPs at each format's peak.
HAND_BYTES = {"bf16": 2.0, "fp8_block": 1 + 4 / 128 ** 2, "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32}


def hand_decode_roofline(config_file: str | dict, formats: dict, kv_bytes: float, hw, tp: int, ep: int = 1,
                         adp: int = 1, batch: int = 64, kv_len: int = 1024) -> float:
    """Seconds of one GPU's decode step by hand: every weight it holds and the batch touches read once in its
    format (routed experts: the ones the batch's (token, expert) pairs hit under balanced routing; MLA decode:
    kv_b_proj as the absorbed bf16 W_UK / W_UV), the LM head, and the KV cache read; the larger of that over
    HBM bandwidth and 2 FLOPs per weight and token (plus attention's) over the format's peak."""
    raw = config_file if isinstance(config_file, dict) else \
        json.loads((conf_dir() / "model" / "hf" / config_file).read_text())
    c = raw.get("text_config", raw)
    h, n_layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    read, work = [], []

    def weights(params, fmt, layers=1, tokens=batch):
        read.append(layers * params * HAND_BYTES[fmt])
        work.append((layers * 2 * tokens * params, fmt))

    if "kv_lora_rank" in c:
        ql, kl, nope, rope, v = (c[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                "v_head_dim"))
        weights(h * ((ql or 0) + kl + rope), formats["attention"], n_layers)  # down-projections, on every GPU
        weights((ql or h) * heads * (nope + rope) / tp, formats["attention"], n_layers)  # no q latent: from h
        weights(kl * heads * (nope + v) / tp, "bf16", n_layers)
        weights(heads * v * h / tp, formats["attention_out"], n_layers)
        read.append(n_layers * batch * kv_len * (kl + rope) * kv_bytes)     # the latent cache, whole per GPU
        work.append((n_layers * 2 * batch * kv_len * heads / tp * (2 * kl + rope), "bf16"))
    else:
        kv_heads, hd = c["num_key_value_heads"], c.get("head_dim") or h // heads
        kv_gpu = max(1, kv_heads // tp)
        weights(h * (heads // tp + 2 * kv_gpu) * hd, formats["attention"], n_layers)
        weights(heads // tp * hd * h, formats["attention_out"], n_layers)
        for kind in c.get("layer_types") or ["full_attention"] * n_layers:
            seen = min(kv_len, c["sliding_window"]) if kind == "sliding_attention" else kv_len
            read.append(batch * seen * 2 * kv_gpu * hd * kv_bytes)
            work.append((4 * batch * seen * heads // tp * hd, "bf16"))
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    if "first_k_dense_replace" in c:
        dense, width, dense_width = c["first_k_dense_replace"], c["moe_intermediate_size"], c["intermediate_size"]
        shared = c["n_shared_experts"] * width
    elif "interleave_moe_layer_step" in c:
        dense = n_layers - n_layers // c["interleave_moe_layer_step"]
        width, dense_width, shared = c["intermediate_size"], c["intermediate_size_mlp"], c["intermediate_size"]
    elif experts:
        dense, width, dense_width = 0, c.get("moe_intermediate_size") or c["intermediate_size"], 0
        shared = c.get("shared_expert_intermediate_size", 0)
    else:
        dense, width, dense_width, shared = n_layers, 0, c["intermediate_size"], 0
    weights(3 * h * dense_width / tp, formats["mlp"], dense)
    if experts:
        moe_layers, moe_tp = n_layers - dense, tp * adp // ep
        pairs = batch * adp * c["num_experts_per_tok"] / ep               # on this GPU's experts
        hit = min(experts / ep, pairs)
        read.append(moe_layers * hit * 3 * h * width / moe_tp * HAND_BYTES[formats["experts"]])
        work.append((moe_layers * 2 * pairs * 3 * h * width / moe_tp, formats["experts"]))
        weights(h * experts, "bf16", moe_layers)                           # router
        weights(3 * h * shared / tp, formats["shared_experts"], moe_layers)
    weights(c["vocab_size"] * h / tp, "bf16")                             # LM head
    return max(sum(read) / hw.mem_bw, sum(f / hw.peak_flops(fmt) for f, fmt in work))


def _formats(attention="bf16", attention_out=None, mlp=None, experts=None, shared_experts=None):
    rest = attention_out or attention
    return {"attention": attention, "attention_out": rest, "mlp": mlp or rest, "experts": experts or rest,
            "shared_experts": shared_experts or rest}


ROOFLINE_CASES = [  # model, its config.json, formats by hand, KV bytes, GPU, layout
    ("gpt-oss-20b", "openai--gpt-oss-20b_config.json", _formats(experts="mxfp4"), 2, "h100_sxm", dict(tp=1)),
    ("gpt-oss-120b", "openai--gpt-oss-120b_config.json", _formats(experts="mxfp4"), 2, "h100_sxm", dict(tp=8)),
    ("minimax-m2.5", "MiniMaxAI--MiniMax-M2.5_config.json", _formats("fp8_block"), 2, "h200_sxm", dict(tp=8, ep=8)),
    ("deepseek-v3", "deepseek-ai--DeepSeek-V3_config.json", _formats("fp8_block"), 2, "h200_sxm", dict(tp=8, ep=8)),
    ("deepseek-r1", "deepseek-ai--DeepSeek-R1_config.json", _formats("fp8_block"), 2, "h200_sxm", dict(tp=8, ep=8)),
    ("kimi-k2", "moonshotai--Kimi-K2-Instruct_config.json", _formats("fp8_block"), 2, "h200_sxm",
     dict(tp=8, attention_dp=2, ep=16)),  # 1.03T parameters: two nodes, experts over 16 GPUs
    ("deepseek-v3.1-nvfp4", "nvidia--DeepSeek-V3.1-NVFP4_config.json", _formats("bf16", "nvfp4"), 1, "h200_sxm",
     dict(tp=8, ep=8)),
    ("llama4-scout", "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json", _formats(), 2, "h100_sxm", dict(tp=8)),
    ("llama4-maverick", "meta-llama--Llama-4-Maverick-17B-128E-Instruct_config.json", _formats(), 2, "h200_sxm",
     dict(tp=8, ep=8)),
    ("mixtral-8x22b", "mistralai--Mixtral-8x22B-v0.1_config.json", _formats(), 2, "h100_sxm", dict(tp=8)),
    ("qwen3-30b-a3b-fp8", "Qwen--Qwen3-30B-A3B-FP8_config.json", _formats("fp8_block"), 2, "h100_sxm", dict(tp=1)),
    ("qwen3-235b-a22b-nvfp4", "nvidia--Qwen3-235B-A22B-NVFP4_config.json", _formats("nvfp4"), 1, "h200_sxm",
     dict(tp=8, ep=8)),
    ("llama3.1-405b", "meta-llama--Meta-Llama-3.1-405B_config.json", _formats(), 2, "h200_sxm", dict(tp=8)),
    ("glm-4.5-air", "zai-org--GLM-4.5-Air_config.json", _formats(), 2, "h100_sxm", dict(tp=4)),
    ("glm-4.5", "zai-org--GLM-4.5_config.json", _formats(), 2, "b200_sxm", dict(tp=8, ep=8)),
    ("deepseek-v2-lite", "deepseek-ai--DeepSeek-V2-Lite_config.json", _formats(), 2, "h100_sxm", dict(tp=1)),
    ("qwen1.5-moe-a2.7b", "Qwen--Qwen1.5-MoE-A2.7B_config.json", _formats(), 2, "h100_sxm", dict(tp=1)),
    ("gemma-3-1b", {**json.loads((conf_dir() / "model" / "hf" / "google--gemma-3-1b-it_config.json").read_text()),
                    # layer_types spelled out for the hand count: 5 sliding, 1 global
                    "layer_types": ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(26)]},
     _formats(), 2, "h100_sxm", dict(tp=1)),
]


@pytest.mark.parametrize("name, config_file, formats, kv_bytes, gpu, layout", ROOFLINE_CASES,
                         ids=[c[0] for c in ROOFLINE_CASES])
def test_decode_step_of_every_architecture_is_near_its_hand_roofline(name, config_file, formats, kv_bytes, gpu,
                                                                     layout):
    from kernelsight.sim.memory import memory_plan
    from kernelsight.sim.model import from_hf, load_hf_config

    hw = load_hardware(gpu)
    par = ParallelConfig("x", **layout)
    model = from_hf(config_file, name, f"{name}/config.json") if isinstance(config_file, dict) else \
        load_hf_config(conf_dir() / "model" / "hf" / config_file)  # simulated straight from its config
    assert memory_plan(model, hw, ENGINE, par).blocks * 16 >= 64 * 1024  # the layout holds the batch
    priced = StepPricer(model, hw, ENGINE, par, Predictor(hw, tier="roofline")).step_time(
        StepBatch(decode_ctx=(1024,) * 64)).gpu_s
    hand = hand_decode_roofline(config_file, formats, kv_bytes, hw, par.tp, par.ep, par.attention_dp)
    assert hand / 1.5 <= priced <= 1.5 * hand, f"{name}: {priced * 1e3:.2f} ms priced, {hand * 1e3:.2f} ms by hand"
