"""KV-cache capacity the way vLLM sizes it at start-up (Worker.determine_available_memory).

vLLM loads the weights, runs one profile forward pass at max_num_batched_tokens
(plus a dummy sampler pass over max_num_seqs rows), and gives the KV cache
what is left of total * gpu_memory_utilization:

  kv = total * util - weights - activation peak - non-torch memory - CUDA-graph memory
  blocks = floor(kv / (block_size * layers * rows * kv_heads_per_gpu * head_dim * kv_bytes))

layers: those of the GPU's pipeline stage or, for a model with sliding-window layers under vLLM's hybrid
allocator, of one KV-cache group (kv_groups): the blocks are then shared by the full-attention group and
the sliding-window groups, which hold only their window (kv_cache.SlidingGroups).

rows: K and V (2), or MLA's single latent row (1; head_dim = kv_lora_rank + qk_rope_head_dim, one KV
head kept whole on every TP rank, as vLLM replicates the latent cache).

total: the nominal memory (mem_gb, GiB) less the driver's reserve
(engine memory.total_reserved_fraction). weights: parallel.weight_bytes_per_gpu.
Activation peak: the larger of (a) the forward pass, whose live tensors are the
residual stream and hidden states (2 x T x hidden) plus the widest layer
transient (gate_up + activation output, the fused-MoE caches, or qkv +
attention output), and (b) the sampler pass: logits of max_num_seqs rows over
the full vocabulary in the activation dtype, their fp32 copy and fp32
probabilities. Non-torch memory (cuBLAS workspaces, context growth) and
collective buffers (NCCL, custom all-reduce; only with more than one GPU per
replica) are engine constants, documented in conf/engine/*.yaml.
For Llama-3.1-8B on an 80 GB H100 at 0.9 this gives 27,9xx blocks of 16
tokens; vLLM logs 27,8xx-28,1xx (tests/test_model.py cites the logs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernelsight.predictor.dtypes import dtype_bytes
from kernelsight.predictor.errors import KernelsightError

from .engine_profile import EngineProfile
from .kv_cache import SlidingGroups
from .model import ModelConfig
from .parallel import ParallelConfig, shard, weight_bytes_per_gpu

GiB = float(2**30)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory budget in bytes, and the KV blocks it leaves."""

    total: float
    requested: float
    weights: float
    activations: float
    non_torch: float
    cuda_graphs: float
    kv_cache: float
    block_bytes: float
    blocks: int
    block_size: int
    sliding: SlidingGroups | None = None   # sliding-window groups sharing the blocks (kv_groups)

    @property
    def kv_tokens(self) -> int:
        """Tokens the blocks hold in the full-attention layers (all layers without sliding groups)."""
        return self.blocks * self.block_size


def kv_groups(model: ModelConfig, engine: EngineProfile) -> tuple[int, SlidingGroups | None]:
    """vLLM's KV-cache groups (kv_cache_utils._get_kv_cache_groups_uniform_page_size): (layers of one group,
    its local-attention groups). With the hybrid allocator (engine scheduler.hybrid_kv_cache, vLLM's default;
    for chunked local attention since VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults on) a
    model with both sliding-window (or chunked) and full-attention layers groups them by type in groups of
    as many layers as its scarcer type has (as many as its commoner one when they differ by less than 25 %),
    every group drawing blocks of that many layers from one pool. Kept to one full-attention group, as every
    shipped model has; otherwise (no local layer, allocator off, only local layers, or more full layers than
    local ones) one group of all layers holds every token."""
    plan = model.layer_plan()
    local = sum(1 for p in plan if p.window or p.chunk)
    full = len(plan) - local
    if not (engine.scheduler.hybrid_kv_cache and local and full):
        return len(plan), None
    size = max(full, local) if max(full, local) < 1.25 * min(full, local) else min(full, local)
    if -(-full // size) > 1:
        return len(plan), None
    chunked = bool(model.attention_chunk)
    return size, SlidingGroups(-(-local // size), model.attention_chunk if chunked else model.sliding_window,
                               engine.scheduler.max_num_batched_tokens, chunked)


def kv_block_bytes(model: ModelConfig, engine: EngineProfile, par: ParallelConfig) -> float:
    """Bytes of one KV block on one GPU: block_size tokens of K and V (MLA: the latent row) in every layer
    of one KV-cache group (kv_groups; all layers without sliding-window groups) on its pipeline stage."""
    return _block_bytes(model, engine, par, kv_groups(model, engine)[0])


def _block_bytes(model: ModelConfig, engine: EngineProfile, par: ParallelConfig, group_layers: int) -> float:
    s = shard(model, par)
    return (engine.scheduler.block_size * math.ceil(group_layers * s.layers / model.layers) * model.kv_cache_rows
            * s.kv_heads * model.head_dim * dtype_bytes(model.kv_dtype))


def activation_peak_bytes(model: ModelConfig, engine: EngineProfile, par: ParallelConfig) -> float:
    """Peak activation memory of vLLM's profile run (see the module docstring)."""
    s = shard(model, par)
    tokens = engine.scheduler.max_num_batched_tokens
    rows = min(engine.scheduler.max_num_seqs, tokens)
    ab = dtype_bytes(model.act_dtype)
    stream = 2 * tokens * model.hidden * ab
    if model.mla:  # prefill's per-head q, expanded k and v, and the output
        a = model.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        attention = tokens * s.heads * (2 * qk + 2 * a.v_head_dim) * ab
    else:
        attention = tokens * ((s.heads + 2 * s.kv_heads) * model.head_dim + s.heads * model.head_dim) * ab
    mlp = tokens * 3 * s.intermediate * ab
    moe = 0.0
    if model.moe:
        pairs = tokens * model.moe.top_k
        moe = pairs * (3 * s.moe_intermediate + model.hidden) * ab
    sampler = rows * model.vocab * (ab + 4 + 4)
    return stream + max(attention, mlp, moe, sampler)


def memory_plan(model: ModelConfig, hw, engine: EngineProfile, par: ParallelConfig) -> MemoryPlan:
    """The budget; a model that does not fit, or leaves no KV block, is one line with the numbers."""
    engine = engine.on_gpu(hw)
    mem = engine.memory
    total = hw.mem_gb * GiB * (1.0 - mem.total_reserved_fraction)
    util = engine.scheduler.gpu_memory_utilization
    requested = total * util
    weights = weight_bytes_per_gpu(model, par)
    layout = f"tp={par.tp} pp={par.pp} ep={par.ep}"
    if weights > requested:
        raise KernelsightError(
            f"model {model.name} does not fit on {hw.key}: {weights / GiB:.1f} GiB of weights per GPU at {layout}, "
            f"but only {requested / GiB:.1f} GiB usable ({total / GiB:.1f} GiB x gpu_memory_utilization {util}); "
            f"use more tensor/pipeline parallelism (at least parallel.tp="
            f"{par.tp * 2 ** math.ceil(math.log2(weights / requested))}) or a GPU with more memory")
    activations = activation_peak_bytes(model, engine, par)
    non_torch = (mem.non_torch_gib + (mem.collective_buffers_gib if par.gpus_per_replica > 1 else 0.0)) * GiB
    graphs = mem.cuda_graph_gib * GiB
    kv = requested - weights - activations - non_torch - graphs
    group_layers, sliding = kv_groups(model, engine)
    block = _block_bytes(model, engine, par, group_layers)
    blocks = math.floor(kv / block) if kv > 0 else 0
    if blocks < 1:
        raise KernelsightError(
            f"model {model.name} on {hw.key} at {layout} leaves no memory for the KV cache: weights "
            f"{weights / GiB:.1f} + activations {activations / GiB:.1f} + other {(non_torch + graphs) / GiB:.1f} GiB "
            f"of {requested / GiB:.1f} GiB usable; raise gpu_memory_utilization, lower max_num_batched_tokens "
            f"or add GPUs")
    return MemoryPlan(total=total, requested=requested, weights=weights, activations=activations,
                      non_torch=non_torch, cuda_graphs=graphs, kv_cache=kv, block_bytes=block, blocks=blocks,
                      block_size=engine.scheduler.block_size, sliding=sliding)


def kv_cache_blocks(model: ModelConfig, hw, engine: EngineProfile, par: ParallelConfig) -> int:
    """Number of KV-cache blocks per GPU (the scheduler's block pool)."""
    return memory_plan(model, hw, engine, par).blocks
