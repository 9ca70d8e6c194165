"""NVIDIA AIConfigurator vLLM collections -> sweep rows.

Layout: data/<system>/{gemm,attention,comm,moe,mla,mla_bmm}/<framework>/<version>/<table>.parquet,
with systems/<system>.yaml describing the node. Latencies are milliseconds.

  gemm_perf                  gemm (m, n, k). dtype = the weight format
                             (predictor.dtypes): bfloat16 -> bf16, fp8 (per-tensor),
                             fp8_block (128x128 block scales), nvfp4. provider:
                             kernel_source 'torch.nn.functional.linear' ->
                             'torch.F.linear', other kernel classes -> 'vllm.<class>'.
                             Older collections name every kernel 'vllm_default': a bf16
                             one is vLLM's unquantized linear, i.e. torch.F.linear; fp8
                             ones become 'vllm.default_fp8' / 'vllm.default_fp8_block'.
                             Eager block-FP8 rule: the collector generation that names
                             kernel classes timed fp8_block GEMMs without a CUDA graph
                             (use_cuda_graph=gemm_type != "fp8_block"; every other dtype
                             and the older 'vllm_default' collections are graph-timed),
                             so each call includes vLLM's Python launch path, a floor
                             of 0.055-0.29 ms per GPU and kernel (the kernel's fastest
                             row in the collection). Where a row's roofline on its GPU
                             is below that floor, the kernel can finish before the host
                             issues the next call and the row measures the host: it is
                             rejected. Above it the rows agree with graph-timed ones
                             (H100: median 0.9-1.0x vLLM 0.19's graph-timed fp8_block
                             GEMMs of the same shape; rows at the floor read 2.5-2.9x).
  context_attention_perf     attn_prefill: batch = batch_size, seq_q = isl,
                             seq_kv = isl + step, causal, window = window_size
                             (0 = none; older collections without the column
                             swept no window), dtype = attn_dtype, kv_dtype =
                             kv_cache_dtype.
  generation_attention_perf  attn_decode: seq_kv = isl + step. Assumption: block_size
                             16, vLLM's default KV-cache page (the tables do not
                             record it).
  (both)                     provider 'vllm.<backend>' from kernel_source with the
                             'vllm_' prefix dropped and 'flash_attn_faN' shortened to
                             'faN' (vllm.fa3, vllm.fa4, vllm.flash_attn, ...).
                             beam_width must be 1.
  nccl_perf                  allreduce / allgather / reducescatter / alltoall,
                             provider 'nccl'. message_size counts ELEMENTS of
                             nccl_dtype (SOURCE.md): msg_bytes = message_size * size.
  custom_allreduce_perf      allreduce, provider 'vllm.custom_ar', cuda_graph =
                             (backend == 'vllm_graph'). message_size also counts bf16
                             elements: at 64Mi-256Mi it matches NCCL's half
                             all-reduce of the same message_size within 1 %
                             (H100 x2: 1.706 vs 1.686 ms at 268435456; A100 x8:
                             4.223 vs 4.226 ms), which is where vLLM hands large
                             tensors to NCCL; read as bytes it would imply half the
                             NCCL bus bandwidth on the same GPUs.

  moe_perf                   moe: tokens = num_tokens (every token of the EP group
                             enters the kernel), experts = num_experts, top_k = topk,
                             hidden = hidden_size, intermediate = inter_size (unsharded),
                             moe_tp / moe_ep = moe_tp_size / moe_ep_size, distribution
                             as is, dtype = the weight format of moe_dtype (int4_wo ->
                             w4a16; w4a16_mxfp4: MXFP4 weights, 16-bit activations;
                             w4a8_mxfp4_mxfp8 -> w4a8_mxfp4: MXFP8 activations).
                             provider from kernel_source by MOE_PROVIDERS.
  mla_context_module_perf    mla_prefill: the whole attention block of one MLA layer on
                             one GPU (predictor/families/mla.py says what it runs).
                             batch = batch_size, seq_q = isl (new tokens per sequence),
                             seq_kv = isl + step (step = cached prefix, 0 here), heads =
                             num_heads (per GPU; tp_size must be 1), dims of `model`
                             (MLA_MODELS), dtype = gemm_type (the projections' weight
                             format), attn_dtype = mla_dtype, kv_dtype = kv_cache_dtype.
  mla_generation_module_perf mla_decode: batch = batch_size, seq_kv = step (the KV length,
                             the new token included; isl must be 1), the rest as above
                             (mla_dtype must be bfloat16). Both module tables: provider
                             'vllm.mla_module'; kernel_source names the attention backend
                             vLLM picked for the shape (FLASH_ATTN, FLASHMLA, ...,
                             'default' where not recorded), a choice inside the module.
  context_mla_perf,          rejected: vLLM 0.14's kernel-scope tables time the MLA
  generation_mla_perf        attention backend alone (given projected queries and
                             latents: no down/up projections of the queries, no o_proj),
                             not the module the MLA families price.
  mla_bmm_perf               mla_bmm: op mla_gen_pre -> pre, mla_gen_post -> post,
                             tokens = num_tokens, heads = num_heads, head_dim 128 and
                             kv_lora_rank 512 (DeepSeek-V3, the collector's fixed dims),
                             dtype = bmm_dtype, provider 'torch.bmm'.

Collectives are intra-node (num_gpus <= the system's num_gpus_per_node): link
'nvlink', or 'pcie' on GPUs without NVLink (L40S; the catalog's link_bw would
fall back to PCIe anyway, the label says what was measured). device =
resolve_device(device column), which must agree with the system folder;
otherwise the row is rejected. Every version folder is imported, each as its own
sweep: sweep_id = aiconfigurator/<system>/<framework>-<version folder>
(calibration keeps the newest version of each series, calibrate/rows.py); the
runtime version column is kept in the file metadata (the l40s custom all-reduce
folder 0.22.0 holds rows labelled 0.14.0). A folder's reuse.yaml, which tells
aiconfigurator from which version to fill shapes the folder lacks, is not
followed: a folder's rows are the ones measured there.
Timing mode is unknown, sample counts are not published (samples null), and
cuda_graph is False except where the table says a graph was used.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from kernelsight.predictor.dtypes import canonical_dtype, dtype_bytes
from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.families import get_family
from kernelsight.predictor.hardware import load_hardware
from kernelsight.predictor.roofline import roofline_frame

from .common import (ImportResult, assign_devices, candidates, finish, first_reason, read_source_info, read_table,
                     resolve_devices, row_locations)

DATASET = "aiconfigurator"
DECODE_BLOCK_SIZE = 16
NCCL_OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
            "alltoall": "alltoall"}
CUSTOM_AR_BACKENDS = {"vllm_graph": True, "vllm_eager": False}
_ATTN_COLUMNS = ["device", "kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
                 "beam_width", "attn_dtype", "kv_cache_dtype", "step", "latency", "framework", "version"]
_MOE_COLUMNS = ["device", "kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk",
                "num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency", "framework", "version"]
_MLA_COLUMNS = ["device", "kernel_source", "model", "mla_dtype", "kv_cache_dtype", "gemm_type", "num_heads",
                "batch_size", "isl", "tp_size", "step", "latency", "framework", "version"]

# kernel_source of moe_perf -> provider: which fused-MoE implementation vLLM ran. Newer collections name
# '<quant method>_<backend>_<experts class>'; the provider keeps the backend (and the monolithic/modular
# split of FlashInfer's TRT-LLM kernels, which time differently). A kernel_source missing here is rejected.
MOE_PROVIDERS = {
    # vLLM's Triton fused_moe kernel (fused_experts): bf16, fp8 per-tensor and block-scaled
    "vllm_fused_moe": "vllm.triton",
    "vllm_unquantizedfusedmoe_triton_tritonexperts": "vllm.triton",
    "vllm_modeloptfp8moe_triton_tritonexperts": "vllm.triton",
    "vllm_fp8moe_triton_tritonexperts": "vllm.triton",
    # Marlin: 4-bit (int4 or MXFP4) weights dequantised to 16 bits in registers
    "vllm_marlin_moe": "vllm.marlin",
    "vllm_marlin_int4_moe": "vllm.marlin",
    "vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts": "vllm.marlin",
    "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts": "vllm.marlin",
    "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu": "vllm.marlin",  # SiLU stands in
    "vllm_gptossmxfp4moe_marlin_marlinexperts": "vllm.marlin",
    # OpenAI's Triton MXFP4 MoE kernels (gpt-oss; Hopper)
    "vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic": "vllm.oai_triton_mxfp4",
    # vLLM's MXFP4 FusedMoE layer, backend chosen by vLLM and not recorded (0.18/0.19 collections)
    "vllm_mxfp4_moe": "vllm.mxfp4",
    # FlashInfer's CUTLASS grouped GEMMs
    "vllm_unquantizedfusedmoe_flashinfer_cutlass_flashinferexperts": "vllm.flashinfer_cutlass",
    "vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts": "vllm.flashinfer_cutlass",
    "vllm_fp8moe_flashinfer_cutlass_flashinferexperts": "vllm.flashinfer_cutlass",
    "vllm_compressedtensorsw4a4nvfp4moe_flashinfer_cutlass_flashinferexperts": "vllm.flashinfer_cutlass",
    # FlashInfer's TRT-LLM-generated MoE kernels (Blackwell), one monolithic kernel with routing ...
    "vllm_flashinfer_trtllm_moe_fp4": "vllm.flashinfer_trtllm",
    "vllm_unquantizedfusedmoe_flashinfer_trtllm_trtllmbf16experts": "vllm.flashinfer_trtllm",
    "vllm_modeloptfp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic": "vllm.flashinfer_trtllm",
    "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic": "vllm.flashinfer_trtllm",
    "vllm_compressedtensorsw4a4nvfp4moe_flashinfer_trtllm_trtllmnvfp4expertsmonolithic": "vllm.flashinfer_trtllm",
    "vllm_gptossmxfp4moe_flashinfer_trtllm_mxfp4_bf16_trtllmmxfp4expertsmonolithic": "vllm.flashinfer_trtllm",
    # ... or split into vLLM's modular prepare / experts / finalize stages
    "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmodular": "vllm.flashinfer_trtllm_modular",
    "vllm_compressedtensorsw4a4nvfp4moe_flashinfer_trtllm_trtllmnvfp4expertsmodular":
        "vllm.flashinfer_trtllm_modular",
    "vllm_mxfp4moe_flashinfer_trtllm_mxfp4_mxfp8_trtllmmxfp4expertsmodular": "vllm.flashinfer_trtllm_modular",
}

# Dims of the MLA models the module collections instantiate (HF config.json; DeepSeek-V3, R1 and V3.1
# share them): hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim.
_DEEPSEEK_V3 = dict(hidden=7168, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                    v_head_dim=128)
MLA_MODELS = {"deepseek-ai/DeepSeek-V3": _DEEPSEEK_V3, "deepseek-ai/DeepSeek-R1": _DEEPSEEK_V3,
              "nvidia/DeepSeek-V3.1-NVFP4": _DEEPSEEK_V3}
MLA_PROVIDER = "vllm.mla_module"
MLA_BMM_OPS = {"mla_gen_pre": "pre", "mla_gen_post": "post"}
MLA_BMM_PROVIDERS = {"vllm_torch_bmm": "torch.bmm", "default": "torch.bmm"}
LEGACY_MLA = ("kernel-scope MLA table (the attention backend alone: no q/kv projections, no o_proj), "
              "not the module the MLA families price")
EAGER_BLOCK_FP8 = ("fp8_block GEMM timed without a CUDA graph and host-bound "
                   "(roofline below this kernel's launch floor in the collection)")

CONVERSION = """\
Converted with `kernelsight import dataset=aiconfigurator` (calibrate/importers/aiconfigurator.py).
One file per GPU (catalog key), rows in the kernelsight sweep contract; every version folder is its own
sweep. gemm_perf -> gemm (dtype = weight format: bf16, fp8, fp8_block, nvfp4; fp8_block rows of the
collections that timed block-FP8 GEMMs without a CUDA graph are rejected where their roofline is below the
kernel's launch floor in the collection: they measure vLLM's host launch path), context_attention_perf ->
attn_prefill (seq_q = isl, seq_kv = isl + step, causal), generation_attention_perf -> attn_decode (seq_kv =
isl + step, block_size 16 assumed: vLLM's default), moe_perf -> moe (one GPU's fused MoE; provider from
kernel_source: vllm.triton, vllm.marlin, vllm.flashinfer_cutlass, vllm.flashinfer_trtllm[_modular],
vllm.oai_triton_mxfp4, vllm.mxfp4), mla_context_module_perf / mla_generation_module_perf -> mla_prefill /
mla_decode (vLLM's whole MLA attention module on one GPU, DeepSeek-V3 dims, provider vllm.mla_module; the
older kernel-scope context_mla_perf / generation_mla_perf are rejected), mla_bmm_perf -> mla_bmm (torch.bmm),
nccl_perf -> allreduce/allgather/reducescatter/alltoall with msg_bytes = message_size x element size
(message_size counts elements), custom_allreduce_perf -> allreduce 'vllm.custom_ar' (message_size counts
bf16 elements; cuda_graph from the backend column). Collectives are intra-node: link nvlink, or pcie on GPUs
without NVLink. flops/bytes/blocks come from kernelsight's cost model; rows measured faster than their
roofline on the catalog entry are kept with flag eta_lt_1. Latency is the published value (ms); p10/p90 and
sample counts are not published.
"""


def convert(src, progress=None) -> ImportResult:
    """Every system and table under src/data; src holds SOURCE.md, LICENSE, systems/ and data/.
    progress: a tqdm-like factory for a bar over the tables, or None."""
    info = read_source_info(Path(src), DATASET)
    data = info.folder / "data"
    if not data.is_dir():
        raise KernelsightError(f"{data}: missing (expected data/<system>/<kind>/<framework>/<version>/)")
    frames, notes, versions = [], [], {}
    tables = sorted(data.glob("*/*/*/*/*.parquet"))
    for table in progress(tables, desc=DATASET, unit="file") if progress else tables:
        system, _kind, framework, version = table.relative_to(data).parts[:4]
        mapper = _TABLES.get(table.stem)
        if mapper is None:
            notes.append(f"skipped {table}: no kernel-family mapping for table {table.stem!r}")
            continue
        sweep_id = f"{DATASET}/{system}/{framework}-{version}"
        cands, runtime = mapper(table, info.folder / "systems" / f"{system}.yaml")
        frames.append(_check_device(cands.assign(sweep_id=sweep_id), system))
        versions.setdefault(sweep_id, set()).update(runtime)
    if not frames:
        raise KernelsightError(f"{data}: no <system>/<kind>/<framework>/<version>/*.parquet tables found")
    return finish(info, pd.concat(frames, ignore_index=True), notes,
                  sweeps={k: {"runtime": sorted(v)} for k, v in versions.items()})


def _check_device(cands: pd.DataFrame, system: str) -> pd.DataFrame:
    """device from the raw name; rejected when unknown or not the system the folder names."""
    keys, why = assign_devices(cands["device_name"])
    folder_key, folder_problem = resolve_devices([system])[system]
    if folder_problem:
        why = why.fillna(f"system folder {system!r} is not in the hardware catalog")
    mismatch = why.isna() & (keys != folder_key)
    why[mismatch] = [f"device column {n!r} is {k}, not the folder's system {folder_key}"
                     for n, k in zip(cands["device_name"][mismatch], keys[mismatch])]
    cands["device"] = keys.where(why.isna(), None)
    cands["reject"] = cands["reject"].where(cands["reject"].notna(), why)
    return cands


def _runtime(df: pd.DataFrame) -> list:
    return sorted(f"{f} {v}" for f, v in df[["framework", "version"]].drop_duplicates().itertuples(index=False))


def _dtype(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Canonical dtypes and, for names the project does not know, a rejection reason."""
    out, why = {}, {}
    for v in values.unique():
        try:
            out[v], why[v] = canonical_dtype(v), None
        except KernelsightError:
            out[v], why[v] = None, f"unknown dtype {v!r}"
    return values.map(out).to_numpy(dtype=object), values.map(why).to_numpy(dtype=object)


def gemm_provider(kernel_source: str, gemm_dtype: str) -> str:
    if kernel_source == "torch.nn.functional.linear" or (kernel_source == "vllm_default" and gemm_dtype == "bfloat16"):
        return "torch.F.linear"
    if kernel_source == "vllm_default":
        return f"vllm.default_{gemm_dtype}"
    return f"vllm.{kernel_source}"


def attention_provider(kernel_source: str) -> str:
    name = kernel_source[len("vllm_"):] if kernel_source.startswith("vllm_") else kernel_source
    return "vllm." + re.sub(r"^flash_attn_(fa\d+)$", r"\1", name)


def _gemm(path: Path, system: Path):
    df = read_table(path, ["device", "kernel_source", "gemm_dtype", "m", "n", "k", "latency", "framework", "version"])
    dtype, why = _dtype(df["gemm_dtype"])
    providers = {(s, d): gemm_provider(s, d) for s, d in df[["kernel_source", "gemm_dtype"]].drop_duplicates()
                 .itertuples(index=False)}
    return candidates(len(df), family="gemm",
                      provider=[providers[k] for k in zip(df["kernel_source"], df["gemm_dtype"])],
                      dtype=dtype, m=df["m"], n=df["n"], k=df["k"], latency_ms=df["latency"],
                      device_name=df["device"], reject=first_reason(why, _eager_block_fp8(df, system.stem)),
                      where=row_locations(path, len(df))), _runtime(df)


def _eager_block_fp8(df: pd.DataFrame, system: str) -> np.ndarray:
    """Per row: EAGER_BLOCK_FP8 where an eagerly timed fp8_block GEMM is host-bound (module docstring), else None.

    The floor of a kernel is its fastest row in the table; host-bound rows are those whose roofline on the
    folder's GPU is below it (a GPU outside the catalog leaves the rows to the device check)."""
    out = np.full(len(df), None, dtype=object)
    eager = (df["gemm_dtype"] == "fp8_block") & (df["kernel_source"] != "vllm_default")
    device = resolve_devices([system])[system][0]
    if not eager.any() or device is None:
        return out
    part = df[eager].assign(family="gemm", dtype="fp8_block")
    lat = pd.to_numeric(part["latency"], errors="coerce")
    problems = get_family("gemm").violations({c: part[c].to_numpy() for c in ("m", "n", "k", "dtype")})
    keep = pd.isna(problems) & (lat > 0).to_numpy()
    part, lat = part[keep], lat[keep]
    if part.empty:
        return out
    floor = lat.groupby(part["kernel_source"]).transform("min") / 1e3
    t_roof = roofline_frame(part[["family", "m", "n", "k", "dtype"]], load_hardware(device))["t_roof"]
    host_bound = part.index[(t_roof < floor).to_numpy()]
    out[df.index.get_indexer(host_bound)] = EAGER_BLOCK_FP8
    return out


def _attention(path: Path, decode: bool):
    df = read_table(path, _ATTN_COLUMNS)
    window = df["window_size"] if "window_size" in df.columns else 0
    dtype, why_d = _dtype(df["attn_dtype"])
    kv_dtype, why_kv = _dtype(df["kv_cache_dtype"])
    beam = np.where(df["beam_width"] != 1, "beam_width is not 1 (no family for beam search)", None)
    providers = {s: attention_provider(s) for s in df["kernel_source"].unique()}
    cols = dict(family="attn_decode" if decode else "attn_prefill", provider=df["kernel_source"].map(providers),
                batch=df["batch_size"], seq_kv=df["isl"] + df["step"], heads=df["num_heads"],
                kv_heads=df["num_key_value_heads"], head_dim=df["head_dim"], window=window,
                dtype=dtype, kv_dtype=kv_dtype, latency_ms=df["latency"], device_name=df["device"],
                reject=first_reason(why_d, why_kv, beam), where=row_locations(path, len(df)))
    if decode:
        cols["block_size"] = DECODE_BLOCK_SIZE
    else:
        cols.update(seq_q=df["isl"], causal=True)
    return candidates(len(df), **cols), _runtime(df)


def _moe(path: Path, _system: Path):
    df = read_table(path, _MOE_COLUMNS)
    dtype, why_d = _dtype(df["moe_dtype"])
    provider = df["kernel_source"].map(MOE_PROVIDERS)
    why_p = np.where(provider.isna(), "kernel_source " + df["kernel_source"].astype(str)
                     + " is not in the MoE provider table (aiconfigurator.MOE_PROVIDERS)", None)
    return candidates(len(df), family="moe", provider=provider.fillna(df["kernel_source"]), dtype=dtype,
                      tokens=df["num_tokens"], experts=df["num_experts"], top_k=df["topk"],
                      hidden=df["hidden_size"], intermediate=df["inter_size"], moe_tp=df["moe_tp_size"],
                      moe_ep=df["moe_ep_size"], distribution=df["distribution"], latency_ms=df["latency"],
                      device_name=df["device"], reject=first_reason(why_d, why_p),
                      where=row_locations(path, len(df))), _runtime(df)


def _mla_module(path: Path, decode: bool):
    df = read_table(path, _MLA_COLUMNS)
    dtype, why_d = _dtype(df["gemm_type"])
    attn, why_a = _dtype(df["mla_dtype"])
    kv_dtype, why_kv = _dtype(df["kv_cache_dtype"])
    dims = {m: MLA_MODELS.get(m) for m in df["model"].unique()}
    why_m = np.where(df["model"].map(lambda m: dims[m] is None),
                     "model " + df["model"].astype(str) + " has no MLA dims (aiconfigurator.MLA_MODELS)", None)
    why_tp = np.where(df["tp_size"] != 1, "tp_size is not 1 (num_heads are the heads of the GPU measured)", None)
    cols = {name: df["model"].map(lambda m, n=name: (dims[m] or {}).get(n)) for name in _DEEPSEEK_V3}
    cols.update(family="mla_decode" if decode else "mla_prefill", provider=MLA_PROVIDER, batch=df["batch_size"],
                heads=df["num_heads"], dtype=dtype, kv_dtype=kv_dtype, latency_ms=df["latency"],
                device_name=df["device"], where=row_locations(path, len(df)))
    if decode:
        why_q = np.where(df["isl"] != 1, "isl is not 1 (a decode step adds one token per sequence)", None)
        why_a = np.where(pd.isna(why_a) & (attn != "bf16"), "mla_dtype is not bfloat16 (decode math is bf16)",
                         why_a)
        cols.update(seq_kv=df["step"])
    else:
        why_q = None
        cols.update(seq_q=df["isl"], seq_kv=df["isl"] + df["step"], attn_dtype=attn)
    reasons = [r for r in (why_d, why_a, why_kv, why_m, why_tp, why_q) if r is not None]
    return candidates(len(df), reject=first_reason(*reasons), **cols), _runtime(df)


def _legacy_mla(path: Path, decode: bool):
    df = read_table(path, ["device", "latency", "framework", "version"])
    return candidates(len(df), family="mla_decode" if decode else "mla_prefill", provider="vllm.mla_kernel",
                      latency_ms=df["latency"], device_name=df["device"], reject=LEGACY_MLA,
                      where=row_locations(path, len(df))), _runtime(df)


def _mla_bmm(path: Path, _system: Path):
    df = read_table(path, ["device", "op_name", "kernel_source", "bmm_dtype", "num_tokens", "num_heads", "latency",
                         "framework", "version"])
    dtype, why_d = _dtype(df["bmm_dtype"])
    op = df["op_name"].map(MLA_BMM_OPS)
    why_op = np.where(op.isna(), "op_name " + df["op_name"].astype(str) + " is not an MLA bmm (mla_gen_pre/post)",
                      None)
    provider = df["kernel_source"].map(MLA_BMM_PROVIDERS)
    why_p = np.where(provider.isna(), "kernel_source " + df["kernel_source"].astype(str) + " is not torch.bmm",
                     None)
    return candidates(len(df), family="mla_bmm", provider=provider.fillna(df["kernel_source"]), dtype=dtype,
                      op=op.fillna(df["op_name"]), tokens=df["num_tokens"], heads=df["num_heads"],
                      head_dim=_DEEPSEEK_V3["qk_nope_head_dim"], kv_lora_rank=_DEEPSEEK_V3["kv_lora_rank"],
                      latency_ms=df["latency"], device_name=df["device"],
                      reject=first_reason(why_d, why_op, why_p), where=row_locations(path, len(df))), _runtime(df)


def _intra_node_link(system_yaml: Path, device_names: pd.Series, num_gpus: pd.Series):
    """'nvlink' (or 'pcie' without NVLink) inside one node; rows spanning nodes are rejected."""
    try:
        per_node = int(yaml.safe_load(system_yaml.read_text(encoding="utf-8"))["node"]["num_gpus_per_node"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        raise KernelsightError(f"{system_yaml}: missing or unreadable (need node.num_gpus_per_node)") from None
    links = {}
    for name, (key, _problem) in resolve_devices(device_names).items():
        links[name] = None if key is None else ("nvlink" if load_hardware(key).nvlink_gbs_per_dir else "pcie")
    link = device_names.map(links)
    why = np.where(num_gpus > per_node, f"spans more than one node ({per_node} GPUs per node)", None)
    return link, why


def _nccl(path: Path, system_yaml: Path):
    df = read_table(path, ["device", "op_name", "nccl_dtype", "num_gpus", "message_size", "latency", "framework",
                         "version"])
    dtype, why_d = _dtype(df["nccl_dtype"])
    size = np.asarray([np.nan if d is None else dtype_bytes(d) for d in dtype])
    family = df["op_name"].map(NCCL_OPS)
    why_op = np.where(family.isna(), "op_name " + df["op_name"].astype(str) + " is not a known collective", None)
    link, why_node = _intra_node_link(system_yaml, df["device"], df["num_gpus"])
    return candidates(len(df), family=family.fillna(df["op_name"]), provider="nccl", dtype=dtype,
                      msg_bytes=df["message_size"] * size, world_size=df["num_gpus"], link=link,
                      latency_ms=df["latency"], device_name=df["device"], reject=first_reason(why_d, why_op, why_node),
                      where=row_locations(path, len(df))), _runtime(df)


def _custom_allreduce(path: Path, system_yaml: Path):
    df = read_table(path, ["device", "allreduce_dtype", "num_gpus", "message_size", "latency", "backend",
                         "framework", "version"])
    dtype, why_d = _dtype(df["allreduce_dtype"])
    size = np.asarray([np.nan if d is None else dtype_bytes(d) for d in dtype])
    graph = df["backend"].map(CUSTOM_AR_BACKENDS)
    why_b = np.where(graph.isna(), "unknown backend " + df["backend"].astype(str), None)
    link, why_node = _intra_node_link(system_yaml, df["device"], df["num_gpus"])
    return candidates(len(df), family="allreduce", provider="vllm.custom_ar", dtype=dtype,
                      msg_bytes=df["message_size"] * size, world_size=df["num_gpus"], link=link,
                      cuda_graph=graph.fillna(False).astype(bool), latency_ms=df["latency"],
                      device_name=df["device"], reject=first_reason(why_d, why_b, why_node),
                      where=row_locations(path, len(df))), _runtime(df)


_TABLES = {
    "gemm_perf": _gemm,
    "context_attention_perf": lambda path, _system: _attention(path, decode=False),
    "generation_attention_perf": lambda path, _system: _attention(path, decode=True),
    "moe_perf": _moe,
    "mla_context_module_perf": lambda path, _system: _mla_module(path, decode=False),
    "mla_generation_module_perf": lambda path, _system: _mla_module(path, decode=True),
    "context_mla_perf": lambda path, _system: _legacy_mla(path, decode=False),
    "generation_mla_perf": lambda path, _system: _legacy_mla(path, decode=True),
    "mla_bmm_perf": _mla_bmm,
    "nccl_perf": _nccl,
    "custom_allreduce_perf": _custom_allreduce,
}
