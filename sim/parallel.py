"""Parallel layout of one model replica: tensor (tp), pipeline (pp), expert (ep) and data (dp) parallelism.

conf/parallel/<name>.yaml (Hydra group `parallel=`). The semantics follow vLLM:
- tp shards attention heads, MLP width and the (64-padded) vocabulary. When tp
  exceeds the KV heads, each GPU keeps one KV head (replicated), so tp must
  divide the KV heads or be a multiple of them.
- pp splits the layers into ceil(layers / pp)-layer stages; the first stage
  also holds the embedding, the last the final norm and LM head.
- attention_dp runs attention data-parallel: attention_dp groups of tp GPUs
  each serve their own requests (vLLM's --data-parallel-size on a MoE model);
  the experts of every layer span all tp * attention_dp GPUs, so each MoE
  layer gathers the tokens of every group first (vLLM's default all-to-all
  backend: all-gather to dispatch, reduce-scatter to combine).
- ep splits the routed experts over ep of those tp * attention_dp GPUs
  (--enable-expert-parallel); the remaining moe_tp = tp * attention_dp / ep
  factor shards each expert's width.
- dp is the number of independent replicas (behind a router); it does not
  change what one GPU holds or runs.
- node_gpus: GPUs of one NVLink domain; MoE traffic of a group larger than
  that crosses the scale-out network.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kernelsight.predictor.dtypes import dtype_bytes
from kernelsight.predictor.errors import KernelsightError, did_you_mean, whole_number
from kernelsight.predictor.families.collectives import LINKS
from kernelsight.predictor.hardware import NET_GBS_PER_GPU

from .model import SIXTEEN_BIT, ModelConfig
from .schema import Spec, check, load_config

FP8_BLOCK = 128  # block-FP8 weights: one scale per 128 x 128 block (vLLM's weight_block_size)
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE for VocabParallelEmbedding / ParallelLMHead


@dataclass(frozen=True)
class ParallelConfig:
    """tp * pp GPUs per replica, dp replicas; link: the fabric of TP/EP collectives, pp_link: of the
    hop between pipeline stages (net when the stages sit on different nodes); net_gbs_per_gpu: the
    cluster's scale-out bandwidth per GPU and direction in GB/s, which prices every `net` hop."""

    name: str
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    attention_dp: int = 1
    node_gpus: int = 8
    link: str = "nvlink"
    pp_link: str = "nvlink"
    net_gbs_per_gpu: float = NET_GBS_PER_GPU
    source: str = ""

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.attention_dp * self.pp

    @property
    def moe_group(self) -> int:
        """GPUs one MoE layer spans: every attention group's tp GPUs."""
        return self.tp * self.attention_dp

    @property
    def moe_tp(self) -> int:
        """Shards of each expert's width: the MoE group's factor left after splitting experts over ep."""
        return self.moe_group // self.ep

    @property
    def moe_link(self) -> str:
        """Fabric of the MoE group's dispatch and combine: the network once it outgrows one NVLink domain."""
        return "net" if self.moe_group > self.node_gpus else self.link

    def __post_init__(self):
        """Sizes are integers >= 1 however the layout was built (a bool or 2.0 is not), ep divides tp,
        links are known: one line naming the setting (and the file, when it came from one)."""
        where = f"{self.source}: " if self.source else ""
        for name in ("tp", "pp", "ep", "dp", "attention_dp", "node_gpus"):
            whole_number(getattr(self, name), f"{where}parallel.{name}")
        if self.moe_group % self.ep:
            raise KernelsightError(f"{where}field 'ep' = {self.ep} must divide tp x attention_dp = {self.moe_group} "
                                   f"(experts are split over the GPUs the attention groups span)")
        for name in ("link", "pp_link"):
            if getattr(self, name) not in LINKS:
                raise KernelsightError(f"{where}parallel.{name}={getattr(self, name)!r}: must be one of "
                                       f"{', '.join(LINKS)}{did_you_mean(str(getattr(self, name)), LINKS)}")
        net = self.net_gbs_per_gpu
        if isinstance(net, bool) or not isinstance(net, (int, float)) or not 0 < net < math.inf:
            raise KernelsightError(f"{where}parallel.net_gbs_per_gpu={net!r}: must be a number > 0 "
                                   f"(GB/s per GPU and direction)")

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<mapping>") -> "ParallelConfig":
        return cls(**check(data, _FIELDS, source), source=source)


_FIELDS = {
    "name": Spec("str"),
    "tp": Spec("pos", default=1),
    "pp": Spec("pos", default=1),
    "ep": Spec("pos", default=1),
    "dp": Spec("pos", default=1),
    "attention_dp": Spec("pos", default=1),
    "node_gpus": Spec("pos", default=8),
    "link": Spec("choice", default="nvlink", choices=LINKS),
    "pp_link": Spec("choice", default="nvlink", choices=LINKS),
    "net_gbs_per_gpu": Spec("positive", default=NET_GBS_PER_GPU),
}


def load_parallel(name_or_mapping: str | Path | Mapping) -> ParallelConfig:
    """A layout by shipped name (conf/parallel/<name>.yaml), .yaml path, or composed mapping."""
    return load_config(ParallelConfig, "parallel", "parallel layout", name_or_mapping)

@dataclass(frozen=True)
class Shard:
    """What one GPU of the layout holds and runs of one model (per layer unless noted)."""

    heads: int
    kv_heads: int
    intermediate: int
    experts: int
    moe_intermediate: int
    vocab: int              # LM-head / embedding rows per GPU (padded vocabulary / tp)
    layers: int             # layers of the largest pipeline stage


def shard(model: ModelConfig, par: ParallelConfig) -> Shard:
    """Per-GPU sizes; refuses layouts vLLM refuses, with one line naming model, layout and numbers."""
    tp = par.tp
    where = f"model {model.name} with tp={tp}"

    def fail(why: str):
        raise KernelsightError(f"{where}: {why}")

    if model.heads % tp:
        fail(f"tp={tp} does not divide the {model.heads} attention heads")
    if model.kv_heads >= tp and model.kv_heads % tp:
        fail(f"tp={tp} does not divide the {model.kv_heads} KV heads")
    if model.kv_heads < tp and tp % model.kv_heads:
        fail(f"tp={tp} is not a multiple of the {model.kv_heads} KV heads (needed to replicate them)")
    if model.intermediate % tp:
        fail(f"tp={tp} does not divide the MLP width {model.intermediate}")
    experts = moe_width = 0
    if model.moe:
        if model.moe.experts % par.ep:
            fail(f"ep={par.ep} does not divide the {model.moe.experts} experts")
        if model.moe.intermediate % par.moe_tp:
            fail(f"moe_tp={par.moe_tp} (tp x attention_dp / ep) does not divide the expert width "
                 f"{model.moe.intermediate}")
        width = model.moe.intermediate // par.moe_tp
        if model.weight_format("experts") == "fp8_block" and width % FP8_BLOCK:
            fail(f"moe_tp={par.moe_tp} cuts each block-FP8 expert to {width} columns, not whole {FP8_BLOCK}-wide "
                 f"scale blocks: vLLM refuses this layout; split the experts instead (ep={par.moe_group})")
        if model.moe.shared_intermediate % tp:
            fail(f"tp={tp} does not divide the shared-expert width {model.moe.shared_intermediate}")
        if model.qk_norm == "gathered" and tp > 1 and par.attention_dp > 1:
            fail(f"attention_dp={par.attention_dp}: the q/k norm's TP all-gathers beside attention data "
                 f"parallelism are not modelled (use tp=1 per attention group)")
        experts, moe_width = model.moe.experts // par.ep, model.moe.intermediate // par.moe_tp
    elif par.ep > 1 or par.attention_dp > 1:
        fail(f"ep={par.ep}, attention_dp={par.attention_dp}: expert and attention-data parallelism need a "
             f"mixture-of-experts model")
    if par.pp > model.layers:
        fail(f"pp={par.pp} exceeds the {model.layers} layers")
    padded_vocab = math.ceil(model.vocab / VOCAB_PADDING) * VOCAB_PADDING
    return Shard(heads=model.heads // tp, kv_heads=max(1, model.kv_heads // tp),
                 intermediate=model.intermediate // tp, experts=experts, moe_intermediate=moe_width,
                 vocab=math.ceil(padded_vocab / tp), layers=math.ceil(model.layers / par.pp))


def weight_bytes_per_gpu(model: ModelConfig, par: ParallelConfig) -> float:
    """Bytes of weights on the most loaded GPU (largest pipeline stage, with the embedding or LM head).

    Every part of model.weight_parts() in its own dtype (a component's weight format, scales included;
    embedding, LM head, router and norms 16-bit), split as vLLM shards it: tensor-parallel parts over tp,
    KV projections over the KV heads each GPU keeps, routed experts over the MoE group, replicated parts
    (MLA's q_a / kv_a projections, router, norms) whole. MLA with quantized attention also keeps vLLM's
    16-bit copy of kv_b_proj's per-head up-projections (W_UK, W_UV) for its absorbed decode. Layers are
    averaged over the stages (dense and MoE layers alike).
    """
    s = shard(model, par)
    n_layers, h, ab = model.layers, model.hidden, dtype_bytes(model.act_dtype)
    divisor = {"tp": par.tp, "kv": model.kv_heads / s.kv_heads, "experts": par.moe_group, "none": 1}
    layered = sum(p.params * dtype_bytes(p.dtype) / divisor[p.split] for p in model.weight_parts()
                  if p.split != "vocab") - ab * h  # the final norm sits with the LM head
    if model.mla and model.weight_format("attention") not in SIXTEEN_BIT:
        layered += ab * model.param_counts()["attn_kv"] / par.tp
    per_layer = layered / n_layers
    table = ab * s.vocab * h  # one embedding or LM-head shard
    first = table
    last = (0 if model.tied_embeddings and par.pp == 1 else table) + ab * h
    ends = first + last if par.pp == 1 else max(first, last)
    return per_layer * s.layers + ends
