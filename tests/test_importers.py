"""Public-data importers: column mappings on hand-checked rows, flagging, rejections, bad files, CLI (the committed
data: test_importers_committed.py).

Inputs are small trees in each dataset's real layout and format, built in
tmp_path from rows copied out of the real files (values as published).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pytest

from kernelsight.calibrate.importers import aiconfigurator, neusight, vidur
from kernelsight.cli.data import data_summary, import_dataset
from kernelsight.calibrate.importers.common import ETA_LT_1, format_report, write_public
from kernelsight import cli
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import make_shape
from kernelsight.predictor.sweep import read_environment, read_sweep

H100 = "NVIDIA H100 80GB HBM3"
AIC_COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
NEUSIGHT_COMMIT = "6945927d9afcca2b9daf021f8395e53edc5b4eef"


def _provenance(folder: Path, repo: str, commit: str, license_: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SOURCE.md").write_text(f"Source: github.com/{repo} at commit {commit}, folder x ({license_}, see LICENSE).\n")
    (folder / "LICENSE").write_text(f"{license_} license text\n")
    return folder


def _parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


# -- aiconfigurator -----------------------------------------------------------

def _gemm(source, dtype, m, n, k, latency, device=H100, version="0.24.0"):
    return dict(framework="VLLM", version=version, device=device, op_name="gemm", kernel_source=source,
                gemm_dtype=dtype, m=m, n=n, k=k, latency=latency)


def _attn(op, isl, step, latency, kv="bfloat16", window=0, batch=4):
    return dict(framework="VLLM", version="0.24.0", device=H100, op_name=op, kernel_source="vllm_flash_attn_fa3",
                batch_size=batch, isl=isl, num_heads=32, num_key_value_heads=8, head_dim=128, beam_width=1,
                attn_dtype="bfloat16", kv_cache_dtype=kv, step=step, window_size=window, latency=latency)


def _nccl(op, dtype, gpus, size, latency, device=H100):
    return dict(framework="TRTLLM", version="2.29.2", device=device, op_name=op, kernel_source="NCCL",
                nccl_dtype=dtype, num_gpus=gpus, message_size=size, latency=latency)


def _custom_ar(backend, gpus, size, latency):
    return dict(framework="vLLM", version="0.24.0", device=H100, op_name="all_reduce",
                kernel_source=f"vLLM_custom_{backend.split('_')[1]}", allreduce_dtype="bfloat16", num_gpus=gpus,
                message_size=size, latency=latency, backend=backend)


def aic_tree(root: Path, gemm_rows=None) -> Path:
    src = _provenance(root / "aiconfigurator", "ai-dynamo/aiconfigurator", AIC_COMMIT, "Apache-2.0")
    for system, per_node in (("h100_sxm", 8), ("l40s", 8)):
        (src / "systems").mkdir(exist_ok=True)
        (src / "systems" / f"{system}.yaml").write_text(f"node:\n  num_gpus_per_node: {per_node}\n")
    data = src / "data" / "h100_sxm"
    _parquet(data / "gemm/vllm/0.24.0/gemm_perf.parquet", gemm_rows or [
        _gemm("torch.nn.functional.linear", "bfloat16", 4096, 4096, 4096, 0.16602578428056505),
        _gemm("DeepGemmFp8BlockScaledMMKernel", "fp8_block", 4096, 4096, 4096, 0.146683),  # host-bound (eager)
        _gemm("DeepGemmFp8BlockScaledMMKernel", "fp8_block", 16384, 4096, 4096, 0.589083),
        _gemm("CutlassFP8ScaledMMLinearKernel", "fp8", 4096, 4096, 4096, 0.1537511083814833)])
    _parquet(data / "gemm/vllm/0.19.0/gemm_perf.parquet", [
        _gemm("vllm_default", "bfloat16", 4096, 4096, 4096, 0.166, version="0.19.0"),
        _gemm("vllm_default", "fp8_block", 4096, 4096, 4096, 0.150, version="0.19.0")])
    _parquet(data / "attention/vllm/0.24.0/context_attention_perf.parquet", [
        _attn("context_attention", 1024, 0, 0.12139200170834859),
        _attn("context_attention", 1024, 0, 0.10896533727645874, kv="fp8", window=128)])
    _parquet(data / "attention/vllm/0.24.0/generation_attention_perf.parquet", [
        _attn("generation_attention", 1, 1023, 0.11940800150235494, batch=64)])
    _parquet(data / "comm/nccl/2.29.2/nccl_perf.parquet", [
        _nccl("all_reduce", "half", 8, 256, 0.01559), _nccl("all_gather", "half", 8, 256, 0.01014),
        _nccl("reduce_scatter", "half", 8, 256, 0.01024), _nccl("alltoall", "int8", 8, 256, 0.00744)])
    _parquet(data / "comm/vllm/0.24.0/custom_allreduce_perf.parquet", [
        _custom_ar("vllm_graph", 2, 1048576, 0.012379839420318603),
        _custom_ar("vllm_eager", 2, 1048576, 0.020221760272979734)])
    _parquet(src / "data/l40s/comm/nccl/2.27.3/nccl_perf.parquet",
             [_nccl("all_reduce", "half", 2, 256, 0.00518, device="NVIDIA L40S")])
    return src


def test_aiconfigurator_gemm_rows(tmp_path):
    rows = aiconfigurator.convert(aic_tree(tmp_path)).rows
    gemm = rows[rows.family == "gemm"].set_index(["sweep_id", "provider"])
    new = gemm.loc["aiconfigurator/h100_sxm/vllm-0.24.0"]
    assert set(new.index) == {"torch.F.linear", "vllm.DeepGemmFp8BlockScaledMMKernel",
                              "vllm.CutlassFP8ScaledMMLinearKernel"}
    assert new.loc["torch.F.linear", "dtype"] == "bf16"
    assert new.loc["vllm.DeepGemmFp8BlockScaledMMKernel", "dtype"] == "fp8_block"
    assert new.loc["vllm.CutlassFP8ScaledMMLinearKernel", "dtype"] == "fp8"
    linear = new.loc["torch.F.linear"]
    assert (linear.m, linear.n, linear.k) == (4096, 4096, 4096)
    assert linear.latency_ms == pytest.approx(0.16602578428056505)
    assert linear.flops == make_shape("gemm", m=4096, n=4096, k=4096, dtype="bf16").flops == 2 * 4096**3
    old = gemm.loc["aiconfigurator/h100_sxm/vllm-0.19.0"]
    assert set(old.index) == {"torch.F.linear", "vllm.default_fp8_block"}
    assert old.loc["vllm.default_fp8_block", "dtype"] == "fp8_block"
    assert (rows.source == f"import:aiconfigurator@{AIC_COMMIT[:8]}").all()
    assert (rows.timing == "unknown").all() and rows.samples.isna().all() and rows.latency_p10_ms.isna().all()
    assert (rows.device[rows.device_name == H100] == "h100_sxm").all()


def test_aiconfigurator_attention_rows(tmp_path):
    src = aic_tree(tmp_path)
    _parquet(src / "data/h100_sxm/attention/vllm/0.19.0/context_attention_perf.parquet",  # older: no window_size
             [{k: v for k, v in _attn("context_attention", 512, 0, 0.05).items() if k != "window_size"}
              | {"kernel_source": "vllm_flash_attn", "version": "0.19.0"}])
    rows = aiconfigurator.convert(src).rows
    pre = rows[rows.family == "attn_prefill"].set_index(["sweep_id", "window"])
    full = pre.loc[("aiconfigurator/h100_sxm/vllm-0.24.0", 0)]
    assert (full.batch, full.seq_q, full.seq_kv, full.heads, full.kv_heads, full.head_dim) == (4, 1024, 1024, 32, 8, 128)
    assert bool(full.causal) and full.provider == "vllm.fa3" and full.kv_dtype == "bf16"
    assert pre.loc[("aiconfigurator/h100_sxm/vllm-0.24.0", 128)].kv_dtype == "fp8"
    old = pre.loc[("aiconfigurator/h100_sxm/vllm-0.19.0", 0)]
    assert old.provider == "vllm.flash_attn" and old.seq_q == 512
    dec = rows[rows.family == "attn_decode"].iloc[0]
    assert (dec.batch, dec.seq_kv, dec.block_size) == (64, 1 + 1023, 16)  # seq_kv = isl + step


def test_aiconfigurator_collectives(tmp_path):
    rows = aiconfigurator.convert(aic_tree(tmp_path)).rows
    nccl = rows[rows.provider == "nccl"].set_index(["device", "family"])
    ar = nccl.loc[("h100_sxm", "allreduce")]
    assert (ar.msg_bytes, ar["dtype"], ar.world_size, ar.link) == (512, "fp16", 8, "nvlink")  # 256 half elements
    assert nccl.loc[("h100_sxm", "alltoall")].msg_bytes == 256  # int8: one byte per element
    assert {"allgather", "reducescatter"} <= set(nccl.loc["h100_sxm"].index)
    assert nccl.loc[("l40s", "allreduce")].link == "pcie"  # no NVLink on L40S
    custom = rows[rows.provider == "vllm.custom_ar"]
    graph, eager = custom[custom.cuda_graph].iloc[0], custom[~custom.cuda_graph].iloc[0]
    assert graph.msg_bytes == eager.msg_bytes == 2 * 1048576  # bf16 elements
    assert graph.latency_ms < eager.latency_ms
    assert not rows[rows.provider == "nccl"].cuda_graph.any()


def test_aiconfigurator_rejects_and_flags(tmp_path):
    src = aic_tree(tmp_path, gemm_rows=[
        _gemm("torch.nn.functional.linear", "bfloat16", 4096, 4096, 4096, 0.166),
        _gemm("torch.nn.functional.linear", "bfloat16", 4096, 4096, 4096, 0.001),  # 137 PFLOP/s: eta < 1
        _gemm("torch.nn.functional.linear", "bfloat16", 4096, 4096, 4096, -0.2),
        _gemm("torch.nn.functional.linear", "bfloat16", 4096, 4096, 4096, float("nan")),
        _gemm("torch.nn.functional.linear", "bfloat16", 0, 4096, 4096, 0.1),
        _gemm("torch.nn.functional.linear", "bfloat16", 4096, 4096, 4096, 0.1, device="NVIDIA H200"),
        _gemm("torch.nn.functional.linear", "bfloat16", 4096, 4096, 4096, 0.1, device="NVIDIA Z900")])
    result = aiconfigurator.convert(src)
    gemm = result.rows[(result.rows.family == "gemm") & (result.rows.sweep_id.str.endswith("0.24.0"))]
    assert sorted(gemm.latency_ms) == [0.001, 0.166]
    assert gemm.set_index("latency_ms").loc[0.001, "flags"] == ETA_LT_1
    assert gemm.set_index("latency_ms").loc[0.166, "flags"] == ""
    reasons = result.reasons().set_index("reason")["rows"].to_dict()
    assert reasons["latency not positive or missing"] == 2
    assert reasons["invalid shape: gemm.m must be an integer >= 1"] == 1
    assert reasons["device column 'NVIDIA H200' is h200_sxm, not the folder's system h100_sxm"] == 1
    assert reasons["unknown device 'NVIDIA Z900' (not in the hardware catalog)"] == 1
    report = result.report().set_index(["device", "family"])
    # kept (2 + 2 of 0.19.0), flagged, rejected; rows of another or unknown GPU count under their raw name
    assert report.loc[("h100_sxm", "gemm")].tolist()[1:] == [4, 1, 3]
    assert report.loc[("NVIDIA H200", "gemm"), "rejected"] == report.loc[("NVIDIA Z900", "gemm"), "rejected"] == 1
    text = format_report(result)
    assert "1 flagged eta<1" in text and "NVIDIA Z900" in text and "gemm_perf.parquet row 6" in text


def test_aiconfigurator_eager_block_fp8_rule(tmp_path):
    """Eagerly timed fp8_block rows (kernel-class collections) whose roofline is below the kernel's floor in the
    table are host-bound and rejected; graph-timed 'vllm_default' rows of the same size are kept."""
    deep, flash = "DeepGemmFp8BlockScaledMMKernel", "FlashInferFp8BlockScaledMMKernel"
    src = aic_tree(tmp_path, gemm_rows=[  # H100 rows of vLLM 0.24.0 (floors: DeepGEMM 0.1467, FlashInfer 0.0592 ms)
        _gemm(deep, "fp8_block", 4096, 4096, 4096, 0.146683),    # roofline 0.072 ms < floor: host-bound
        _gemm(deep, "fp8_block", 8192, 4096, 4096, 0.288517),    # roofline 0.143 ms < floor 0.1467: host-bound
        _gemm(deep, "fp8_block", 16384, 4096, 4096, 0.589083),   # roofline 0.286 ms > floor: kept
        _gemm(flash, "fp8_block", 1, 4096, 4096, 0.059211),      # the FlashInfer floor itself: host-bound
        _gemm(flash, "fp8_block", 8, 4096, 4096, 0.060955),
        _gemm("CutlassFP8ScaledMMLinearKernel", "fp8", 1, 4096, 4096, 0.0081)])  # graph-timed: never this rule
    _parquet(src / "data/h100_sxm/gemm/vllm/0.19.0/gemm_perf.parquet", [
        _gemm("vllm_default", "fp8_block", 1, 4096, 4096, 0.022207, version="0.19.0")])
    result = aiconfigurator.convert(src)
    gemm = result.rows[result.rows.family == "gemm"]
    kept = set(zip(gemm.provider, gemm.m))
    assert kept == {("vllm.DeepGemmFp8BlockScaledMMKernel", 16384), ("vllm.CutlassFP8ScaledMMLinearKernel", 1),
                    ("vllm.default_fp8_block", 1)}
    reasons = result.reasons().set_index("reason")
    assert reasons.loc[aiconfigurator.EAGER_BLOCK_FP8, "rows"] == 4
    assert "fp8_block GEMM timed without a CUDA graph" in format_report(result)


def _moe(source, dtype, tokens, latency, hidden=4096, inter=2048, topk=6, experts=256, tp=1, ep=1, dist="balanced",
         version="0.24.0"):
    return dict(framework="VLLM", version=version, device=H100, op_name="moe", kernel_source=source, moe_dtype=dtype,
                num_tokens=tokens, hidden_size=hidden, inter_size=inter, topk=topk, num_experts=experts,
                moe_tp_size=tp, moe_ep_size=ep, distribution=dist, latency=latency)


def _mla(op, source, isl, step, batch, latency, kv="bfloat16", gemm="bfloat16", tp=1, model="deepseek-ai/DeepSeek-V3"):
    return dict(framework="VLLM", version="0.24.0", device=H100, op_name=op, kernel_source=source, model=model,
                architecture="DeepseekV3ForCausalLM", mla_dtype="bfloat16", kv_cache_dtype=kv, gemm_type=gemm,
                num_heads=16, batch_size=batch, isl=isl, tp_size=tp, step=step, latency=latency)


def _mla_bmm(op, latency):
    return dict(framework="VLLM", version="0.24.0", device=H100, op_name=op, kernel_source="vllm_torch_bmm",
                bmm_dtype="bfloat16", num_tokens=64, num_heads=16, latency=latency)


def moe_mla_tree(root: Path) -> Path:
    """aic_tree plus H100 moe, MLA module, kernel-scope MLA and MLA bmm tables (rows of the real files)."""
    src = aic_tree(root)
    data = src / "data" / "h100_sxm"
    _parquet(data / "moe/vllm/0.24.0/moe_perf.parquet", [
        _moe("vllm_fp8moe_triton_tritonexperts", "fp8_block", 1, 0.082480),
        _moe("vllm_fp8moe_flashinfer_cutlass_flashinferexperts", "fp8_block", 1, 0.170011, hidden=7168, topk=8,
             ep=2),
        _moe("vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts", "int4_wo", 1, 0.108619, hidden=7168,
             topk=8, experts=384),
        _moe("vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic", "w4a16_mxfp4", 1, 0.060250,
             hidden=2880, inter=2880, topk=4, experts=32, dist="power_law_1.01"),
        _moe("vllm_mxfp4moe_flashinfer_trtllm_mxfp4_mxfp8_trtllmmxfp4expertsmodular", "w4a8_mxfp4_mxfp8", 1, 0.03),
        _moe("vllm_someday_newbackend_experts", "bfloat16", 1, 0.05),
        _moe("vllm_fp8moe_triton_tritonexperts", "fp8_block", 1, 0.08, ep=3),       # 256 experts over 3 ranks
        _moe("vllm_fp8moe_triton_tritonexperts", "fp8_block", 1, 0.08, dist="zipf_1.1")])
    _parquet(data / "moe/vllm/0.19.0/moe_perf.parquet", [
        _moe("vllm_fused_moe", "fp8", 1, 0.148155, inter=14336, topk=2, experts=8, version="0.19.0")])
    _parquet(data / "mla/vllm/0.24.0/mla_context_module_perf.parquet", [
        _mla("mla_context_module", "FLASH_ATTN_MLA", 1, 0, 2, 0.1002),
        _mla("mla_context_module", "FLASH_ATTN", 1024, 0, 2, 0.3722),
        _mla("mla_context_module", "FLASH_ATTN", 1024, 0, 2, 0.3948, kv="fp8", gemm="fp8_block"),
        _mla("mla_context_module", "FLASH_ATTN", 1024, 0, 2, 0.2, tp=2),
        _mla("mla_context_module", "FLASH_ATTN", 1024, 0, 2, 0.3, model="moonshotai/Kimi-K2-Instruct")])
    _parquet(data / "mla/vllm/0.24.0/mla_generation_module_perf.parquet", [
        _mla("mla_generation_module", "FLASH_ATTN_MLA", 1, 4096, 64, 0.2243),
        _mla("mla_generation_module", "FLASHMLA", 1, 4096, 64, 0.1869, kv="fp8", gemm="fp8_block"),
        _mla("mla_generation_module", "FLASHMLA", 2, 4096, 64, 0.19)])
    _parquet(data / "mla/vllm/0.14.0/context_mla_perf.parquet", [
        dict(framework="VLLM", version="0.14.0", device=H100, op_name="context_mla",
             kernel_source="vllm_flash_attn_mla", mla_dtype="bfloat16", kv_cache_dtype="bfloat16", num_heads=32,
             batch_size=1, isl=1, tp_size=4, step=0, latency=0.183536)])
    _parquet(data / "mla_bmm/vllm/0.24.0/mla_bmm_perf.parquet",
             [_mla_bmm("mla_gen_pre", 0.004381), _mla_bmm("mla_gen_post", 0.004797)])
    return src


def test_aiconfigurator_moe_rows(tmp_path):
    result = aiconfigurator.convert(moe_mla_tree(tmp_path))
    moe = result.rows[result.rows.family == "moe"]
    new = moe[moe.sweep_id.str.endswith("0.24.0")].set_index("provider")
    assert set(new.index) == {"vllm.triton", "vllm.flashinfer_cutlass", "vllm.marlin", "vllm.oai_triton_mxfp4",
                              "vllm.flashinfer_trtllm_modular"}
    triton = new.loc["vllm.triton"]
    assert (triton.tokens, triton.experts, triton.top_k, triton.hidden, triton.intermediate) == (1, 256, 6, 4096, 2048)
    assert (triton.moe_tp, triton.moe_ep, triton.distribution, triton["dtype"]) == (1, 1, "balanced", "fp8_block")
    assert triton.latency_ms == pytest.approx(0.082480)
    assert triton.flops == make_shape("moe", tokens=1, experts=256, top_k=6, hidden=4096, intermediate=2048,
                                      dtype="fp8_block", moe_tp=1, moe_ep=1, distribution="balanced").flops
    assert new.loc["vllm.flashinfer_cutlass", "moe_ep"] == 2
    assert new.loc["vllm.marlin", "dtype"] == "w4a16"                      # int4_wo
    gptoss = new.loc["vllm.oai_triton_mxfp4"]
    assert (gptoss["dtype"], gptoss.distribution) == ("w4a16_mxfp4", "power_law_1.01")
    assert new.loc["vllm.flashinfer_trtllm_modular", "dtype"] == "w4a8_mxfp4"   # w4a8_mxfp4_mxfp8
    old = moe[moe.sweep_id.str.endswith("0.19.0")].iloc[0]
    assert (old.provider, old["dtype"], old.intermediate) == ("vllm.triton", "fp8", 14336)  # vllm_fused_moe
    reasons = result.reasons()
    counts = reasons[reasons.family == "moe"].set_index("reason")["rows"].to_dict()
    assert counts == {
        "kernel_source vllm_someday_newbackend_experts is not in the MoE provider table "
        "(aiconfigurator.MOE_PROVIDERS)": 1,
        "invalid shape: moe: experts must divide by moe_ep and intermediate by moe_tp": 1,
        "invalid shape: moe.distribution must be one of ['balanced', 'uniform', 'power_law_1.01', "
        "'power_law_1.2']": 1}


def test_aiconfigurator_mla_rows(tmp_path):
    result = aiconfigurator.convert(moe_mla_tree(tmp_path))
    rows = result.rows
    dims = dict(hidden=7168, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                v_head_dim=128)
    pre = rows[rows.family == "mla_prefill"].set_index("latency_ms")
    assert sorted(pre.index) == [0.1002, 0.3722, 0.3948] and set(pre.provider) == {"vllm.mla_module"}
    long = pre.loc[0.3722]
    assert (long.batch, long.seq_q, long.seq_kv, long.heads) == (2, 1024, 1024, 16)
    assert all(long[k] == v for k, v in dims.items())
    assert (long["dtype"], long.attn_dtype, long.kv_dtype) == ("bf16", "bf16", "bf16")
    assert (pre.loc[0.3948, "dtype"], pre.loc[0.3948, "kv_dtype"]) == ("fp8_block", "fp8")  # gemm_type, kv cache
    assert long.flops == make_shape("mla_prefill", batch=2, seq_q=1024, seq_kv=1024, heads=16, **dims).flops
    dec = rows[rows.family == "mla_decode"].set_index("latency_ms")
    assert sorted(dec.index) == [0.1869, 0.2243]
    assert (dec.loc[0.2243, "batch"], dec.loc[0.2243, "seq_kv"], dec.loc[0.2243, "heads"]) == (64, 4096, 16)  # step
    assert (dec.loc[0.1869, "dtype"], dec.loc[0.1869, "kv_dtype"]) == ("fp8_block", "fp8")
    assert pd.isna(dec.loc[0.2243, "seq_q"]) and pd.isna(dec.loc[0.2243, "attn_dtype"])
    bmm = rows[rows.family == "mla_bmm"].set_index("op")
    assert (bmm.loc["pre", "tokens"], bmm.loc["pre", "heads"], bmm.loc["post", "head_dim"]) == (64, 16, 128)
    assert set(bmm.provider) == {"torch.bmm"} and bmm.loc["post", "latency_ms"] == 0.004797
    reasons = result.reasons()
    mla = reasons[reasons.family.str.startswith("mla")].set_index(["family", "reason"])["rows"].to_dict()
    assert mla == {
        ("mla_prefill", aiconfigurator.LEGACY_MLA): 1,
        ("mla_prefill", "tp_size is not 1 (num_heads are the heads of the GPU measured)"): 1,
        ("mla_prefill", "model moonshotai/Kimi-K2-Instruct has no MLA dims (aiconfigurator.MLA_MODELS)"): 1,
        ("mla_decode", "isl is not 1 (a decode step adds one token per sequence)"): 1}
    assert "context_mla_perf.parquet row 0" in format_report(result)


def test_aiconfigurator_row_without_a_roofline_is_rejected(tmp_path):
    src = aic_tree(tmp_path)
    (src / "systems" / "a100_sxm.yaml").write_text("node:\n  num_gpus_per_node: 8\n")
    a100 = "NVIDIA A100-SXM4-80GB"
    _parquet(src / "data/a100_sxm/gemm/vllm/0.14.0/gemm_perf.parquet", [
        _gemm("vllm_default", "bfloat16", 4096, 4096, 4096, 0.5, device=a100, version="0.14.0"),
        _gemm("vllm_default", "fp8", 4096, 4096, 4096, 0.5, device=a100, version="0.14.0"),  # weight-only: bf16
        _gemm("vllm_default", "fp4", 4096, 4096, 4096, 0.5, device=a100, version="0.14.0")])  # fp4 math: none
    result = aiconfigurator.convert(src)
    assert result.rows[result.rows.device == "a100_sxm"]["dtype"].tolist() == ["bf16", "fp8"]
    reason = result.reasons().set_index("device").loc["a100_sxm"]
    assert reason.reason.startswith("no roofline: GPU 'a100_sxm'") and "no fp4 peak" in reason.reason
    assert reason.example.endswith("gemm_perf.parquet row 2")


# -- vidur --------------------------------------------------------------------

VIDUR_OPS = ["emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]


def _mlp_row(medians: dict, **model) -> dict:
    row = {}
    for op, med in medians.items():  # the real files carry min/max/mean/median/std per op
        row |= {f"time_stats.{op}.min": med * 0.95, f"time_stats.{op}.max": med * 1.1,
                f"time_stats.{op}.mean": med, f"time_stats.{op}.median": med, f"time_stats.{op}.std": 0.001}
    return row | model


LLAMA2_7B = dict(n_head=32, n_kv_head=32, n_embd=4096, n_expanded_embd=11008, vocab_size=32768, use_gated_mlp=True)
PHI2 = dict(n_head=32, n_kv_head=32, n_embd=2560, n_expanded_embd=10240, vocab_size=51200, use_gated_mlp=False)


def _net(rows):
    cols = ["time_stats.x.min", "time_stats.x.max", "time_stats.x.mean", "time_stats.x.median", "time_stats.x.std",
            "rank", "num_workers", "size", "collective", "devices_per_node", "max_devices_per_node"]
    return pd.DataFrame(rows, columns=cols)


def vidur_tree(root: Path) -> Path:
    src = _provenance(root / "vidur", "microsoft/vidur", VIDUR_COMMIT, "MIT")
    compute = src / "profiling" / "compute"
    llama = [  # real h100 rows: num_tokens 4096 TP1 (a100 file) and 128 TP2
        _mlp_row(dict(zip(VIDUR_OPS, [0.234, 0.105, 1.911, 0.149, 0.611, 0.104, 3.3655, 0.266, 1.604, 0.055])),
                 **LLAMA2_7B, num_tokens=4096, num_tensor_parallel_workers=1),
        _mlp_row(dict(zip(VIDUR_OPS, [0.006, 0.004, 0.025, 0.003, 0.012, 0.004, 0.039, 0.003, 0.025, 0.002])),
                 **LLAMA2_7B, num_tokens=128, num_tensor_parallel_workers=2)]
    for gpu in ("h100",):
        (compute / gpu / "meta-llama/Llama-2-7b-hf").mkdir(parents=True)
        pd.DataFrame(llama).to_csv(compute / gpu / "meta-llama/Llama-2-7b-hf/mlp.csv", index=False)
    phi_ops = [op for op in VIDUR_OPS if op != "post_attention_layernorm"]
    phi = [_mlp_row(dict(zip(phi_ops, [0.005, 0.006, 0.02, 0.003, 0.011, 0.026, 0.003, 0.029, 0.004])),
                    **PHI2, num_tokens=128, num_tensor_parallel_workers=1)]
    (compute / "h100/microsoft/phi-2").mkdir(parents=True)
    pd.DataFrame(phi).to_csv(compute / "h100/microsoft/phi-2/mlp.csv", index=False)
    net = src / "profiling" / "network"
    for node, name, rows in (
            ("h100_dgx", "all_reduce", [[0.015, 0.038, 0.03, 0.037, 0.01, 0, 8, 2048, "all_reduce", 8, 8],
                                        [0.015, 0.038, 0.03, 0.050, 0.01, 1, 8, 2048, "all_reduce", 8, 8],
                                        [0.015, 0.038, 0.03, 0.040, 0.01, 0, 8, 2048, "all_reduce", 8, 8],
                                        [0.40, 0.50, 0.45, 0.45, 0.01, 0, 16, 2048, "all_reduce", 8, 8]]),
            ("a40_pairwise_nvlink", "send_recv", [[0.009, 0.013, 0.011, 0.012, 0.001, 0, 2, 2048, "send_recv", 1, 8]])):
        (net / node).mkdir(parents=True)
        df = _net(rows)
        df.columns = [c.replace(".x.", f".{name}.") for c in df.columns]
        df.to_csv(net / node / f"{name}.csv")
    return src


def test_vidur_compute_mapping(tmp_path):
    rows = vidur.convert(vidur_tree(tmp_path)).rows
    llama = rows[rows.sweep_id == "vidur/h100/meta-llama/Llama-2-7b-hf"]
    assert (llama.device == "h100_sxm").all() and (llama.dtype == "fp16").all()
    gemm = llama[llama.family == "gemm"]
    shapes = {m: set(zip(g.n, g.k, g.latency_ms)) for m, g in gemm.groupby("m")}
    # 4096 tokens, TP1: QKV n = (32 + 2*32) * 128, out, gate+up n = 2 * 11008, down k = 11008
    assert shapes[4096] == {(12288, 4096, 1.911), (4096, 4096, 0.611), (22016, 4096, 3.3655), (4096, 11008, 1.604)}
    # 128 tokens, TP2: the sharded dimension halves
    assert shapes[128] == {(6144, 4096, 0.025), (4096, 2048, 0.012), (11008, 4096, 0.039), (4096, 5504, 0.025)}
    assert set(gemm.provider) == {"torch.F.linear"}
    act = llama[llama.family == "act"].set_index("tokens")
    assert (act.loc[4096, "intermediate"], act.loc[4096, "op"], act.loc[128, "intermediate"]) == (11008, "silu_mul", 5504)
    norm = llama[llama.family == "norm"]
    assert set(norm.op) == {"rms"} and len(norm) == 4 and not norm.fused_residual.any()
    rope = llama[(llama.family == "rope") & (llama.tokens == 128)].iloc[0]
    assert (rope.heads, rope.kv_heads, rope.head_dim) == (16, 16, 128)
    elem = llama[(llama.family == "elementwise") & (llama.m.isna())].set_index(["op", "numel"])
    assert elem.loc[("add", 4096 * 4096)].latency_ms == 0.055
    assert elem.loc[("embedding", 128 * 4096)].latency_ms == 0.006
    assert llama.latency_p10_ms.isna().all() and llama.latency_p90_ms.isna().all()


def test_vidur_phi2_architecture(tmp_path):
    rows = vidur.convert(vidur_tree(tmp_path)).rows
    phi = rows[rows.sweep_id == "vidur/h100/microsoft/phi-2"]
    assert phi[phi.family == "norm"].op.tolist() == ["layer"]  # no post-attention norm in phi-2
    gelu = phi[phi.op == "gelu"].iloc[0]
    assert (gelu.family, gelu.numel) == ("elementwise", 128 * 10240)
    assert "act" not in set(phi.family)
    assert phi[phi.op == "add"].numel.tolist() == [2 * 128 * 2560]  # attn + mlp + residual: two adds


def test_vidur_network_ranks_links_and_unknown_gpu(tmp_path):
    result = vidur.convert(vidur_tree(tmp_path))
    ar = result.rows[result.rows.family == "allreduce"].set_index(["world_size", "latency_ms"])
    # two measurements of 8 GPUs at 2048 bytes: the first combines rank 0 (0.037) and rank 1 (0.050)
    assert sorted(ar.loc[8].index) == [0.040, 0.050]
    assert (ar.loc[8].link == "nvlink").all() and (ar.loc[8].msg_bytes == 2048).all()
    assert ar.loc[(16, 0.45)].link == "net"  # 16 workers, 8 per node
    reasons = result.reasons()
    assert reasons[["device", "family", "reason", "rows"]].values.tolist() == [
        ["a40", "sendrecv", "unknown device 'a40' (not in the hardware catalog)", 1]]


def test_vidur_unknown_model_is_rejected(tmp_path):
    src = vidur_tree(tmp_path)
    (src / "profiling/compute/h100/acme/Mystery-1B").mkdir(parents=True)
    pd.DataFrame([_mlp_row({"add": 0.01, "attn_pre_proj": 0.02}, **LLAMA2_7B, num_tokens=8,
                           num_tensor_parallel_workers=1)]).to_csv(
        src / "profiling/compute/h100/acme/Mystery-1B/mlp.csv", index=False)
    result = vidur.convert(src)
    assert not (result.rows.sweep_id == "vidur/h100/acme/Mystery-1B").any()
    assert "model acme/Mystery-1B has no architecture entry (norm kind) in vidur.py" in set(result.reasons().reason)


# -- neusight ------------------------------------------------------------------

_NEU = dict(Device="Tesla T4", **{"Torch Version": "p2.1.0", "CUDNN Version": 8902, "CUDA Version": "cu121"})


def _neu(op, latency, kernel, **shape):
    return dict(OPName=op, Latency=latency, **{"Kernel Name": kernel}, **_NEU) | shape


def neusight_tree(root: Path) -> Path:
    src = _provenance(root / "neusight", "sitar-lab/NeuSight", NEUSIGHT_COMMIT, "MIT")
    train = src / "train"
    for op, rows in {
        "linear": [_neu("linear", 0.052213333547115326, "volta_sgemm_32x128_tn", B=1, M=58, N=13, K=141),
                   _neu("linear", 0.06, "volta_sgemm_32x32_sliced1x4_tn", B=2, M=126, N=115, K=72),
                   _neu("linear", 0.05, "cutlass_80_tensorop_s1688gemm_64x64_32x6_tn", B=1, M=64, N=64, K=64)],
        "ln": [_neu("ln", 0.05036799982190132, "vectorized_layer_norm_kernel", B=60, H=272)],
        "add": [_neu("add", 0.025945600494742392, "vectorized_elementwise_kernel", B=127, H=168)],
    }.items():
        path = train / op / "p2.1.0" / "Tesla T4.csv"
        path.parent.mkdir(parents=True)
        pd.DataFrame(rows).to_csv(path, index=False)
    test = src / "test"
    test.mkdir()
    ln = [_neu("ln", 0.8186, "vectorized_layer_norm_kernel", B=32768, H=1600, large=True)]
    soft = [_neu("softmax", 0.7137, "cunn_SoftMaxForward", B=32768, H=1600, large=True)]
    elem = [_neu("addu", 0.6, "vectorized_elementwise_kernel", B=32768, H=1024, large=True),
            _neu("frobnicate", 0.6, "some_kernel", B=32768, H=1024, large=True)]
    for name, rows in (("ln", ln), ("softmax", soft), ("elem", elem), ("vec", ln + soft + elem)):
        pd.DataFrame(rows).to_csv(test / f"{name}.csv", index=False)
    return src


def test_neusight_mapping(tmp_path):
    result = neusight.convert(neusight_tree(tmp_path))
    rows = result.rows
    assert (rows.device == "t4").all() and (rows.dtype == "fp32").all()
    gemm = rows[rows.family == "gemm"].set_index("latency_ms")
    assert tuple(gemm.loc[0.052213333547115326, ["m", "n", "k"]]) == (58, 13, 141)
    assert tuple(gemm.loc[0.06, ["m", "n", "k"]]) == (2 * 126, 115, 72)  # m = B * M
    norm = rows[rows.family == "norm"].set_index("sweep_id")
    assert tuple(norm.loc["neusight/train", ["tokens", "hidden", "op"]]) == (60, 272, "layer")
    elem = rows[rows.family == "elementwise"].set_index("op")
    assert elem.loc["add", "numel"] == 127 * 168 and elem.loc["add", "sweep_id"] == "neusight/train"
    assert elem.loc["softmax", "numel"] == 32768 * 1600 and elem.loc["addu", "sweep_id"] == "neusight/test"
    assert len(rows[rows.sweep_id == "neusight/test"]) == 3  # ln, softmax, addu once each


def test_neusight_rejections(tmp_path):
    reasons = neusight.convert(neusight_tree(tmp_path)).reasons()
    counts = reasons.groupby("reason")["rows"].sum().to_dict()
    assert counts["duplicate of an earlier test row (test/vec.csv repeats ln, softmax and elem rows)"] == 4
    assert counts["op 'frobnicate' is not in the elementwise op table"] == 1  # its vec.csv repeat is a duplicate
    assert counts["kernel is not an FP32 SIMT GEMM (TF32?)"] == 1
    dup = reasons[reasons.reason.str.startswith("duplicate")]
    assert dup.example.str.contains("vec.csv").all()


# -- bad inputs: one clear line --------------------------------------------------

def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_corrupt_parquet_is_one_line(tmp_path):
    src = aic_tree(tmp_path)
    bad = src / "data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(KernelsightError) as e:
        aiconfigurator.convert(src)
    assert str(bad) in _one_line(e) and "not a readable Parquet file" in str(e.value)


def test_missing_column_is_one_line(tmp_path):
    src = aic_tree(tmp_path)
    path = src / "data/h100_sxm/comm/nccl/2.29.2/nccl_perf.parquet"
    pd.read_parquet(path).drop(columns="message_size").to_parquet(path)
    with pytest.raises(KernelsightError) as e:
        aiconfigurator.convert(src)
    assert _one_line(e) == f"{path}: missing column(s) message_size"


def test_corrupt_moe_and_mla_tables_are_one_line(tmp_path):
    src = moe_mla_tree(tmp_path)
    moe = src / "data/h100_sxm/moe/vllm/0.24.0/moe_perf.parquet"
    good = moe.read_bytes()
    moe.write_bytes(good[: len(good) // 2])
    with pytest.raises(KernelsightError) as e:
        aiconfigurator.convert(src)
    assert str(moe) in _one_line(e) and "not a readable Parquet file" in str(e.value)
    moe.write_bytes(good)
    mla = src / "data/h100_sxm/mla/vllm/0.24.0/mla_generation_module_perf.parquet"
    pd.read_parquet(mla).drop(columns="gemm_type").to_parquet(mla)
    with pytest.raises(KernelsightError) as e:
        aiconfigurator.convert(src)
    assert _one_line(e) == f"{mla}: missing column(s) gemm_type"


def test_missing_folders_and_notes(tmp_path):
    with pytest.raises(KernelsightError, match="no such vidur folder"):
        vidur.convert(tmp_path / "nowhere")
    src = neusight_tree(tmp_path)
    (src / "SOURCE.md").unlink()
    with pytest.raises(KernelsightError, match=r"SOURCE.md: missing"):
        neusight.convert(src)
    empty = _provenance(tmp_path / "v" / "vidur", "microsoft/vidur", VIDUR_COMMIT, "MIT")
    with pytest.raises(KernelsightError, match="no compute/"):
        vidur.convert(empty)
    with pytest.raises(KernelsightError, match="not the aiconfigurator repository"):
        aiconfigurator.convert(empty)


def test_bad_csv_is_one_line(tmp_path):
    src = vidur_tree(tmp_path)
    path = src / "profiling/compute/h100/microsoft/phi-2/mlp.csv"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(KernelsightError) as e:
        vidur.convert(src)
    assert str(path) in _one_line(e)


# -- writing --------------------------------------------------------------------

def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_write_public_round_trip_and_determinism(tmp_path):
    src = aic_tree(tmp_path)
    result = aiconfigurator.convert(src)
    (tmp_path / "a" / "aiconfigurator").mkdir(parents=True)
    (tmp_path / "a" / "aiconfigurator" / "b200_sxm.parquet").write_bytes(b"stale")
    first = write_public(result, tmp_path / "a", aiconfigurator.CONVERSION)
    write_public(aiconfigurator.convert(src), tmp_path / "b", aiconfigurator.CONVERSION)
    assert _digest(tmp_path / "a" / "aiconfigurator") == _digest(tmp_path / "b" / "aiconfigurator")
    assert sorted(p.name for p in (tmp_path / "a" / "aiconfigurator").iterdir()) == [
        "LICENSE", "SOURCE.md", "h100_sxm.parquet", "l40s.parquet"]  # the stale file is gone
    back = read_sweep(first[0])
    assert len(back) == (result.rows.device == "h100_sxm").sum()
    env = read_environment(first[0])
    assert env["commit"] == AIC_COMMIT and env["license"] == "Apache-2.0" and env["device_name"] == [H100]
    assert env["sweeps"]["aiconfigurator/h100_sxm/vllm-0.24.0"] == {"runtime": ["VLLM 0.24.0", "vLLM 0.24.0"]}
    note = (tmp_path / "a" / "aiconfigurator" / "SOURCE.md").read_text()
    assert note.startswith("Source: github.com/ai-dynamo/aiconfigurator") and "## Conversion by kernelsight" in note
    assert "| h100_sxm | gemm | 5 | 0 | 1 |" in note


# -- commands -------------------------------------------------------------------

def test_import_and_data_commands(tmp_path, capsys):
    vidur_tree(tmp_path)
    neusight_tree(tmp_path)
    out = tmp_path / "public"
    cli.main(["import", "dataset=vidur", f"src={tmp_path}", f"out={out}"])
    printed = capsys.readouterr().out
    assert "vidur (import:vidur@7d475133)" in printed and "a40 sendrecv: 1 x unknown device 'a40'" in printed
    assert sorted(p.name for p in (out / "vidur").iterdir()) == ["LICENSE", "SOURCE.md", "h100_sxm.parquet"]
    cli.main(["data", f"path={out}"])
    table = capsys.readouterr().out
    assert "h100_sxm" in table and "allreduce" in table
    summary = data_summary(_cfg(path=str(out)))
    total = summary.set_index(["device", "family"]).loc[("all", "all")]
    assert total.total == len(read_sweep(out)) and total.ok + total.flagged + total.failed == total.total


def test_import_all_writes_nothing_when_one_dataset_fails(tmp_path):
    vidur_tree(tmp_path)
    neusight_tree(tmp_path)  # no aiconfigurator/ folder
    out = tmp_path / "public"
    with pytest.raises(KernelsightError, match="no such aiconfigurator folder"):
        import_dataset(_cfg(dataset="all", src=str(tmp_path), out=str(out)))
    assert not out.exists()


def test_command_errors_are_one_line(tmp_path, capsys):
    for args in (["import", f"src={tmp_path / 'missing'}"], ["import", "dataset=vidr"],
                 ["data", f"path={tmp_path / 'none'}"]):
        with pytest.raises(SystemExit) as e:
            cli.main(args)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith(f"kernelsight {args[0]}: error:")


def _cfg(**values):
    from omegaconf import OmegaConf

    return OmegaConf.create(values)
