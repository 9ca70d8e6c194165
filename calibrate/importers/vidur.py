"""Microsoft Vidur profiles -> sweep rows.

Compute: profiling/compute/<gpu>/<org>/<model>/mlp.csv holds, per (num_tokens,
tensor-parallel degree TP), the times of one transformer block's operators as
Vidur's profiler ran them (vidur/profiling/mlp/mlp_impl.py: sarathi layers, the
model cast to torch.float16, so dtype fp16). With t = num_tokens, hd = n_embd /
n_head and E = n_expanded_embd:

  attn_pre_proj   gemm m=t, n=(n_head + 2 n_kv_head) hd / TP, k=n_embd  (QKV)
  attn_post_proj  gemm m=t, n=n_embd, k=n_head hd / TP
  mlp_up_proj     gemm m=t, n=2E/TP (gated) or E/TP, k=n_embd
  mlp_down_proj   gemm m=t, n=n_embd, k=E/TP
  mlp_act         act silu_mul (tokens=t, intermediate=E/TP) when gated, else
                  elementwise gelu (numel = t E/TP: torch.nn.GELU)
  *_layernorm     norm, fused_residual False, kind from the model's architecture
                  (Vidur's data/model_configs/<model>.yml `norm`, matching the
                  Hugging Face models): rms for Llama-2/3, CodeLlama, InternLM and
                  Qwen; layer for phi-2.
  attn_rope       rope tokens=t, heads=n_head/TP, kv_heads=n_kv_head/TP, head_dim=hd.
                  phi-2 rotates only 40 % of head_dim (partial_rotary_factor 0.4)
                  while the family prices a full rotation: an approximation
                  (its bytes are dominated by reading and writing Q and K).
  add             elementwise add, numel = t n_embd. phi-2's parallel block adds
                  attention output, MLP output and residual under this one timer
                  (two add kernels), so its numel is 2 t n_embd: same bytes and flops.
  emb             elementwise embedding, numel = t n_embd.

latency_ms is the `median` column; min/max are not percentiles, so p10/p90 stay
null. num_tokens 2048 and 4096 appear twice per TP (two profiling runs of the
same shape): both rows are kept as repeat measurements.

Network: profiling/network/<node>/{all_reduce,send_recv}.csv -> allreduce /
sendrecv, provider 'nccl' (torch.distributed), fp16 buffers; `size` is bytes
(the profiler records 2 x elements). world_size = num_workers; link 'nvlink'
when all workers sit in one node (num_workers <= devices_per_node), else 'net'.
The pairwise_nvlink nodes are labelled nvlink too, although a 4-GPU all-reduce
there also crosses PCIe between the NVLink pairs. Each collective would appear
once per rank; a collective ends when its last rank does, so ranks are combined
by taking the slowest rank (Vidur's collectives profiler keeps only rank 0, so
on the published files this is one row per measurement). Repeated measurements
of one size stay separate rows.

Devices: the <gpu> folder ('a100', 'h100'; network nodes '<gpu>_<topology>') is
resolved through the hardware catalog: a100 -> a100_sxm (Vidur's A100 80GB SXM
profiles), h100 -> h100_sxm. A GPU the catalog lacks (a40) is rejected, counted.
sweep_id = vidur/<gpu>/<org>/<model> (compute) or vidur/network/<node>.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kernelsight.predictor.errors import KernelsightError

from .common import ImportResult, assign_devices, candidates, finish, read_source_info, read_table, row_locations

DATASET = "vidur"
DTYPE = "fp16"
MODEL_COLUMNS = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
                 "num_tensor_parallel_workers"]
COLLECTIVES = {"all_reduce": "allreduce", "send_recv": "sendrecv"}
NETWORK_KEY = ["num_workers", "devices_per_node", "size"]


@dataclass(frozen=True)
class Architecture:
    """What the mlp.csv columns do not say: the norm kind and whether the block is parallel."""

    norm: str
    parallel_block: bool = False  # attention and MLP in parallel: the 'add' timer spans two adds


# From Vidur's data/model_configs/<model>.yml (`norm`, `post_attn_norm`), i.e. the models' public architectures.
ARCHITECTURES = {
    "Qwen/Qwen-72B": Architecture("rms"),
    "codellama/CodeLlama-34b-Instruct-hf": Architecture("rms"),
    "internlm/internlm-20b": Architecture("rms"),
    "meta-llama/Llama-2-7b-hf": Architecture("rms"),
    "meta-llama/Llama-2-70b-hf": Architecture("rms"),
    "meta-llama/Meta-Llama-3-8B": Architecture("rms"),
    "meta-llama/Meta-Llama-3-70B": Architecture("rms"),
    "microsoft/phi-2": Architecture("layer", parallel_block=True),
}

PROVIDERS = {"gemm": "torch.F.linear", "rms": "sarathi.rms_norm", "layer": "torch.layer_norm",
             "rope": "sarathi.rotary_embedding", "silu_mul": "sarathi.silu_and_mul", "gelu": "torch.gelu",
             "add": "torch.add", "embedding": "sarathi.vocab_parallel_embedding"}

CONVERSION = """\
Converted with `kernelsight import dataset=vidur` (calibrate/importers/vidur.py). One file per GPU (catalog
key: a100 -> a100_sxm, h100 -> h100_sxm), rows in the kernelsight sweep contract, dtype fp16 (Vidur casts
the profiled model to torch.float16). mlp.csv: one row per (operator, num_tokens, TP): QKV/out/up/down
projections -> gemm with TP-sharded n or k, layernorms -> norm (rms, or layer for phi-2), attn_rope -> rope,
mlp_act -> act silu_mul (gelu elementwise for phi-2), add -> elementwise add (two adds for phi-2's parallel
block), emb -> elementwise embedding; latency is the median column (min/max are not p10/p90). Network:
all_reduce / send_recv -> allreduce / sendrecv (size in bytes, world_size = num_workers, link nvlink inside
one node, net across nodes; the slowest rank of a collective counts). The a40 network folder is rejected:
the A40 is not in the hardware catalog. flops/bytes/blocks come from kernelsight's cost model; rows
measured faster than their roofline are kept with flag eta_lt_1.
"""


def convert(src, progress=None) -> ImportResult:
    """Every compute profile and network profile under src/profiling. progress: a tqdm-like factory for a
    bar over the files, or None."""
    info = read_source_info(Path(src), DATASET)
    root = info.folder / "profiling"
    mlps = sorted((root / "compute").glob("*/*/*/mlp.csv"))
    nets = sorted((root / "network").glob("*/*.csv"))
    if not mlps and not nets:
        raise KernelsightError(f"{root}: no compute/<gpu>/<org>/<model>/mlp.csv or network/<node>/*.csv profiles")
    frames, notes = [], []
    files = [*mlps, *nets]
    for path in progress(files, desc=DATASET, unit="file") if progress else files:
        if path in mlps:
            frames.append(_compute(path))
        elif path.stem not in COLLECTIVES:
            notes.append(f"skipped {path}: no kernel-family mapping for collective {path.stem!r}")
        else:
            frames.append(_network(path))
    cands = pd.concat(frames, ignore_index=True)
    cands["device"], unknown = assign_devices(cands["device_name"])
    cands["reject"] = cands["reject"].where(cands["reject"].notna(), unknown)
    return finish(info, cands, notes, sweeps={s: {"dtype": DTYPE} for s in cands["sweep_id"].unique()})


def _compute(path: Path) -> pd.DataFrame:
    gpu, org, model = path.parent.relative_to(path.parents[3]).parts
    df = read_table(path, MODEL_COLUMNS)
    ops = sorted({c.split(".")[1] for c in df.columns if c.startswith("time_stats.") and c.count(".") == 2})
    arch = ARCHITECTURES.get(f"{org}/{model}")
    where = row_locations(path, len(df))
    t = df["num_tokens"].to_numpy(dtype=np.float64)
    tp = df["num_tensor_parallel_workers"].to_numpy(dtype=np.float64)
    n_head, n_kv = df["n_head"].to_numpy(dtype=np.float64), df["n_kv_head"].to_numpy(dtype=np.float64)
    embd, expanded = df["n_embd"].to_numpy(dtype=np.float64), df["n_expanded_embd"].to_numpy(dtype=np.float64)
    gated = df["use_gated_mlp"].astype(str).str.lower().eq("true").to_numpy()
    hd = embd / n_head
    frames = []
    for op in ops:
        median = f"time_stats.{op}.median"
        if median not in df.columns:
            raise KernelsightError(f"{path}: missing column {median}")
        common = dict(latency_ms=df[median], device_name=gpu, sweep_id=f"{DATASET}/{gpu}/{org}/{model}",
                      where=where, dtype=DTYPE)
        if op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"):
            n, k = {"attn_pre_proj": ((n_head + 2 * n_kv) * hd / tp, embd),
                    "attn_post_proj": (embd, n_head * hd / tp),
                    "mlp_up_proj": (np.where(gated, 2.0, 1.0) * expanded / tp, embd),
                    "mlp_down_proj": (embd, expanded / tp)}[op]
            cols = dict(family="gemm", provider=PROVIDERS["gemm"], m=t, n=n, k=k)
        elif op == "mlp_act":
            frames.append(candidates(len(df), family="act", provider=PROVIDERS["silu_mul"], tokens=t,
                                     intermediate=expanded / tp, op="silu_mul", **common)[gated])
            frames.append(candidates(len(df), family="elementwise", provider=PROVIDERS["gelu"],
                                     numel=t * expanded / tp, op="gelu", **common)[~gated])
            continue
        elif op in ("input_layernorm", "post_attention_layernorm"):
            kind = arch.norm if arch else None
            cols = dict(family="norm", provider=PROVIDERS.get(kind, "unknown"), tokens=t, hidden=embd,
                        op=kind, fused_residual=False)
        elif op == "attn_rope":
            cols = dict(family="rope", provider=PROVIDERS["rope"], tokens=t, heads=n_head / tp,
                        kv_heads=n_kv / tp, head_dim=hd)
        elif op == "add":
            adds = 2.0 if arch and arch.parallel_block else 1.0
            cols = dict(family="elementwise", provider=PROVIDERS["add"], numel=adds * t * embd, op="add")
        elif op == "emb":
            cols = dict(family="elementwise", provider=PROVIDERS["embedding"], numel=t * embd, op="embedding")
        else:
            cols = dict(family="(unmapped)", provider=f"vidur.{op}",
                        reject=f"operator {op!r} has no kernel-family mapping")
        if arch is None and "reject" not in cols:
            cols["reject"] = f"model {org}/{model} has no architecture entry (norm kind) in vidur.py"
        frames.append(candidates(len(df), **cols, **common))
    return pd.concat(frames, ignore_index=True)


def _network(path: Path) -> pd.DataFrame:
    """One row per measurement, the slowest rank's median."""
    node = path.parent.name
    median = f"time_stats.{path.stem}.median"
    df = read_table(path, [median, "rank", *NETWORK_KEY])
    df = df.assign(where=row_locations(path, len(df)), latency=df[median])
    # k-th measurement of a configuration on each rank; the k-th measurements of all ranks form one collective.
    df["repeat"] = df.groupby([*NETWORK_KEY, "rank"], sort=False).cumcount()
    slowest = df.sort_values("latency", ascending=False, kind="mergesort", na_position="first")
    df = slowest.drop_duplicates([*NETWORK_KEY, "repeat"]).sort_index()
    link = np.where(df["num_workers"] <= df["devices_per_node"], "nvlink", "net")
    return candidates(len(df), family=COLLECTIVES[path.stem], provider="nccl", dtype=DTYPE,
                      msg_bytes=df["size"].to_numpy(), world_size=df["num_workers"].to_numpy(), link=link,
                      latency_ms=df["latency"].to_numpy(), device_name=node.split("_")[0],
                      sweep_id=f"{DATASET}/network/{node}", where=df["where"].to_numpy())
