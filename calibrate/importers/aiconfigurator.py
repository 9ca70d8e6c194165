"""NVIDIA AIConfigurator vLLM collections -> sweep rows.

Layout: data/<system>/{gemm,attention,comm}/<framework>/<version>/<table>.parquet,
with systems/<system>.yaml describing the node. Latencies are milliseconds.

  gemm_perf                  gemm (m, n, k). gemm_dtype bfloat16 -> bf16, fp8 and
                             fp8_block -> fp8, nvfp4 -> fp4. provider: kernel_source
                             'torch.nn.functional.linear' -> 'torch.F.linear', other
                             kernel classes -> 'vllm.<class>'. Older collections name
                             every kernel 'vllm_default': a bf16 one is vLLM's
                             unquantized linear, i.e. torch.F.linear; fp8 ones become
                             'vllm.default_fp8' / 'vllm.default_fp8_block' so
                             per-tensor and block-scaled kernels stay apart.
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

Collectives are intra-node (num_gpus <= the system's num_gpus_per_node): link
'nvlink', or 'pcie' on GPUs without NVLink (L40S; the catalog's link_bw would
fall back to PCIe anyway, the label says what was measured). device =
resolve_device(device column), which must agree with the system folder;
otherwise the row is rejected. sweep_id = aiconfigurator/<system>/<framework>-
<version folder>; the runtime version column is kept in the file metadata
(the l40s custom all-reduce folder 0.22.0 holds rows labelled 0.14.0).
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
from kernelsight.predictor.hardware import load_hardware

from .common import (ImportResult, assign_devices, candidates, finish, first_reason, read_source_info, read_table,
                     resolve_devices, row_locations)

DATASET = "aiconfigurator"
DECODE_BLOCK_SIZE = 16
NCCL_OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
            "alltoall": "alltoall"}
CUSTOM_AR_BACKENDS = {"vllm_graph": True, "vllm_eager": False}
_ATTN_COLUMNS = ["device", "kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
                 "beam_width", "attn_dtype", "kv_cache_dtype", "step", "latency", "framework", "version"]

CONVERSION = """\
Converted with `kernelsight import dataset=aiconfigurator` (calibrate/importers/aiconfigurator.py).
One file per GPU (catalog key), rows in the kernelsight sweep contract: gemm_perf -> gemm (bf16, fp8 and
fp8_block as fp8, nvfp4 as fp4), context_attention_perf -> attn_prefill (seq_q = isl, seq_kv = isl + step,
causal), generation_attention_perf -> attn_decode (seq_kv = isl + step, block_size 16 assumed: vLLM's
default), nccl_perf -> allreduce/allgather/reducescatter/alltoall with msg_bytes = message_size x element
size (message_size counts elements), custom_allreduce_perf -> allreduce 'vllm.custom_ar' (message_size
counts bf16 elements; cuda_graph from the backend column). Collectives are intra-node: link nvlink, or pcie
on GPUs without NVLink. flops/bytes/blocks come from kernelsight's cost model; rows measured faster than
their roofline on the catalog entry are kept with flag eta_lt_1. Latency is the published value (ms);
p10/p90 and sample counts are not published.
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


def _gemm(path: Path, _system: Path):
    df = read_table(path, ["device", "kernel_source", "gemm_dtype", "m", "n", "k", "latency", "framework", "version"])
    dtype, why = _dtype(df["gemm_dtype"])
    providers = {(s, d): gemm_provider(s, d) for s, d in df[["kernel_source", "gemm_dtype"]].drop_duplicates()
                 .itertuples(index=False)}
    return candidates(len(df), family="gemm",
                      provider=[providers[k] for k in zip(df["kernel_source"], df["gemm_dtype"])],
                      dtype=dtype, m=df["m"], n=df["n"], k=df["k"], latency_ms=df["latency"],
                      device_name=df["device"], reject=why, where=row_locations(path, len(df))), _runtime(df)


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
    "nccl_perf": _nccl,
    "custom_allreduce_perf": _custom_allreduce,
}
