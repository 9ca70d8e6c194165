"""Model architectures: a typed ModelConfig from conf/model/<name>.yaml or a Hugging Face config.json.

Only what decides the kernels a serving engine runs is kept: sizes, GQA or MLA
attention, head dim and rotary width, MLP or mixture-of-experts widths and which
layers carry which, norms, activation, sliding-window / chunked / NoPE layers,
tied embeddings and the weight formats / KV-cache dtype. Architectures are
accepted by their HF `architectures` name; anything else is refused by name
rather than approximated. What each architecture runs per layer is its model
graph (sim/graphs).

YAML files (Hydra group `model=`) hold exactly the ModelConfig fields plus
provenance (`hf_repo`, `hf_config`: the raw config.json under conf/model/ it
was written from, null when none is shipped). A config.json path is parsed
with the same rules vLLM applies: head_dim defaults to hidden/heads, float32
checkpoints are served in bf16, Llama-4 reads its text_config, MLA caches one
latent row of kv_lora_rank + qk_rope_head_dim per token (vLLM's head size, one
KV head); rope_scaling sets the longest context vLLM allows (context_limit).
Weight formats come from the checkpoint's `quantization_config` or a ModelOpt
`hf_quant_config.json` beside the file (sim/quantization.py); modules the
checkpoint leaves unquantized keep 16 bits, per component (attention input
projections, o_proj, dense MLP, routed experts, shared experts:
`weight_formats`). Embedding, LM head, router and norms are always 16-bit.
Every field read is type-checked: a count is an integer >= 1, never "32", true or 3.5.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from kernelsight.predictor.dtypes import FORMATS, compute_dtype, weight_format
from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.families.act import FLOPS_PER_OUTPUT
from kernelsight.predictor.families.norm import KINDS as NORM_KINDS
from kernelsight.predictor.paths import conf_dir

from .hf_reader import HfReader
from .quantization import checkpoint_formats
from .schema import Spec, check

DENSE_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM",
               "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Phi3ForCausalLM",
               "GraniteForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "SeedOssForCausalLM", "Glm4ForCausalLM",
               "CohereForCausalLM", "Cohere2ForCausalLM")
# Cohere's Command-R family (vLLM commandr.py): one weight-only LayerNorm feeds attention and MLP side by side
# (parallel_block), per-head LayerNorm of q and k when use_qk_norm, the LM head tied to the embedding; Command-R7B
# and Command-A (Cohere2) attend in a sliding window with RoPE on three layers of four, globally without RoPE on
# the fourth.
COHERE_ARCHS = ("CohereForCausalLM", "Cohere2ForCausalLM")
GEMMA3_ARCHS = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
# transformers' Gemma3TextConfig defaults: the published Gemma-3 configs leave most fields out (vLLM reads them
# through transformers, which fills these in).
_GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                         "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                         "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
                         "tie_word_embeddings": True, "sliding_window": 4096, "sliding_window_pattern": 6}
MOE_ARCHS = ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM", "MiniMaxM2ForCausalLM",
             "GptOssForCausalLM", "Glm4MoeForCausalLM", "Llama4ForConditionalGeneration", "DeepseekV3ForCausalLM",
             "DeepseekV2ForCausalLM", "Ernie4_5_MoeForCausalLM", "GraniteMoeForCausalLM",
             "GraniteMoeSharedForCausalLM", "OlmoeForCausalLM")
MLA_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
# Architectures whose attention bias is on q, k and v only (o_proj has none): vLLM's Qwen2, Qwen2-MoE, GLM-4.5,
# GLM-4-0414, Seed-OSS.
QKV_BIAS_ONLY = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Glm4MoeForCausalLM", "Glm4ForCausalLM",
                 "SeedOssForCausalLM")
# Architectures vLLM builds without any attention bias, whatever the config says (OLMo-2/3, OLMoE, Granite-MoE,
# Command-R).
NO_ATTENTION_BIAS = ("Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM", "GraniteMoeForCausalLM",
                     "GraniteMoeSharedForCausalLM", "CohereForCausalLM", "Cohere2ForCausalLM")
# Architectures whose q and k are RMS-normed over the whole projection after an all-gather of every TP rank's
# heads (vLLM's OLMo-2/3 and OLMoE _apply_qk_norm): qk_norm 'gathered'.
GATHERED_QK_NORM = ("Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM")
GRANITE_ARCHS = ("GraniteForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM")
# Architectures vLLM does not serve in fp16 (numerical instability): fp32 on a GPU without bf16.
FP16_UNSTABLE = ("Gemma2ForCausalLM", *GEMMA3_ARCHS)
SUPPORTED_ARCHS = DENSE_ARCHS + MOE_ARCHS
# Vision-language checkpoints whose language model is a supported architecture, read from their text_config (or
# the top level, where older configs keep it): a text request runs the language model alone, so these are that
# model plus the vision tower's weights (vision_params), as vLLM serves them without images.
VISION_LANGUAGE = {"Qwen2VLForConditionalGeneration": "Qwen2ForCausalLM",
                   "Qwen2_5_VLForConditionalGeneration": "Qwen2ForCausalLM",
                   "Qwen3VLForConditionalGeneration": "Qwen3ForCausalLM",
                   "Qwen3VLMoeForConditionalGeneration": "Qwen3MoeForCausalLM",
                   "Mistral3ForConditionalGeneration": "MistralForCausalLM"}
# Architectures people ask for that are refused, and why: layers no measured kernel family prices.
NOT_MODELLED = {
    "Qwen3NextForCausalLM": "its Gated DeltaNet linear-attention layers",
    "DeepseekV32ForCausalLM": "DeepSeek sparse attention's lightning indexer and top-k sparse MLA",
    "NemotronHForCausalLM": "its Mamba-2 layers",
    "GraniteMoeHybridForCausalLM": "its Mamba-2 layers",
    "FalconH1ForCausalLM": "its Mamba-2 layers",
    "JambaForCausalLM": "its Mamba layers",
    "KimiLinearForCausalLM": "its Kimi Delta Attention linear-attention layers",
    "MiniMaxM1ForCausalLM": "its lightning (linear) attention layers",
    "Gemma3nForConditionalGeneration": "its per-layer embeddings and AltUp / LAuReL blocks",
}
WEIGHT_DTYPES = tuple(FORMATS)
KV_DTYPES = ("bf16", "fp16", "fp8")
SLIDING_LAYERS = ("none", "all", "even")  # even: layers 0, 2, 4, ... (Gemma-2's and gpt-oss's interleaving)
# RMSNorm of q and k per head (Qwen3), over the whole projection (MiniMax-M2: the sums of squares all-reduced
# under TP), or over the whole projection all-gathered from every TP rank (OLMo-2)
QK_NORMS = ("none", "head", "projection", "gathered")
SCORINGS = ("softmax", "sigmoid")
#: Linear layers whose weight format can differ: attention input projections (q/k/v, or MLA's q_a, q_b,
#: kv_a, kv_b), attention output (o_proj), dense MLP, routed experts, shared experts.
COMPONENTS = ("attention", "attention_out", "mlp", "experts", "shared_experts")

# HF hidden_act -> the gated activation kernel vLLM runs (act family op).
_HF_ACTIVATIONS = {"silu": "silu_mul", "swish": "silu_mul", "gelu": "gelu_mul",
                   "gelu_pytorch_tanh": "gelu_tanh_mul", "gelu_new": "gelu_tanh_mul"}
_HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "bf16"}  # fp32 checkpoints are served in bf16
SIXTEEN_BIT = ("bf16", "fp16", "fp32")  # formats stored unquantized


@dataclass(frozen=True)
class MoeConfig:
    """Mixture of experts: `experts` routed experts of width `intermediate`, `top_k` per token, scored by
    softmax or sigmoid, plus an always-on shared expert of width `shared_intermediate` (0: none).
    Layer i (from 0) is a MoE layer when i >= first_dense and (i + 1) is a multiple of `every`; the
    others run the dense MLP. bias: the experts and the router carry biases (gpt-oss). shared_gate: the
    shared expert's output is scaled by a per-token sigmoid gate (Qwen2-MoE's shared_expert_gate)."""

    experts: int
    top_k: int
    intermediate: int
    shared_intermediate: int = 0
    first_dense: int = 0
    every: int = 1
    scoring: str = "softmax"
    bias: bool = False
    shared_gate: bool = False


@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a q_lora_rank bottleneck (0: projected
    straight from the hidden state), keys and values from one cached latent of kv_lora_rank plus a shared
    rotary key of qk_rope_head_dim; per head qk_nope_head_dim + qk_rope_head_dim query/key and v_head_dim
    value dims."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ComponentFormats:
    """Weight format of a component where it differs from the model's weight_dtype (None: weight_dtype)."""

    attention: str | None = None
    attention_out: str | None = None
    mlp: str | None = None
    experts: str | None = None
    shared_experts: str | None = None

    def as_dict(self) -> dict | None:
        """The set entries, or None when every component takes weight_dtype."""
        return {c: getattr(self, c) for c in COMPONENTS if getattr(self, c)} or None


@dataclass(frozen=True)
class LayerSpec:
    """What sets one layer's kernels: its attention (sliding window, chunk size, RoPE) and its MLP."""

    window: int
    chunk: int
    rope: bool
    moe: bool


@dataclass(frozen=True)
class AttentionKind:
    """Layers with identical attention: priced once, `count` times per step. window: sliding window in
    tokens; chunk: chunked local attention (queries attend within aligned chunks of this many tokens);
    0 = none."""

    name: str
    count: int
    window: int = 0
    chunk: int = 0


@dataclass(frozen=True)
class WeightPart:
    """Parameters of one kind, whole model: stored as `dtype`, split over GPUs by `split`: 'tp' (tensor
    parallel), 'kv' (KV heads, replicated beyond their number), 'experts' (the MoE group), 'none'
    (replicated) or 'vocab' (the padded vocabulary over tp, embedding and LM head)."""

    name: str
    params: int
    dtype: str
    split: str


@dataclass(frozen=True)
class ModelConfig:
    """One decoder-only transformer as the serving engine sees it.

    intermediate: dense MLP width (0 when every layer is MoE); head_dim is explicit (Gemma-2 and Qwen3
    do not use hidden/heads; MLA's is vLLM's head size, the latent row kv_lora_rank + qk_rope_head_dim
    with one KV head); rotary_dim: dims RoPE rotates per head (null: all of head_dim; MLA: the
    qk_rope_head_dim part); attention_chunk: chunked local attention on the RoPE layers (Llama-4);
    nope_every: every nope_every-th layer (1-based) runs without RoPE and attends globally (0: none);
    full_every: with sliding_layers 'all', every full_every-th layer (1-based) attends globally instead
    (Gemma-3's five local layers to one global; 0: none); vision_params: the vision encoder and projector
    vLLM loads beside the language model (memory only: text requests run none of its kernels);
    attention_sinks: one learned logit per head in the softmax (gpt-oss); weight_dtype is the format of
    the linear layers, weight_formats the components stored otherwise (embedding, LM head, router and
    norms are always 16-bit); kv_dtype the KV-cache dtype; derived_max_model_len: the context vLLM allows
    when rope_scaling extends it beyond max_position (yarn, dynamic, linear), null otherwise;
    served_dtype: the activation dtype when a GPU cannot run the checkpoint's (set by served_on);
    parallel_block: attention and MLP both read one input norm and add to the residual together (Cohere's
    Command-R: one norm per layer, not two).
    """

    name: str
    hf_repo: str
    architecture: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_position: int
    tied_embeddings: bool
    norm: str
    activation: str
    qk_norm: str
    attention_bias: bool
    sandwich_norms: bool
    logit_softcap: float
    sliding_window: int
    sliding_layers: str
    moe: MoeConfig | None
    weight_dtype: str
    kv_dtype: str
    rotary_dim: int | None = None
    attention_chunk: int = 0
    nope_every: int = 0
    full_every: int = 0
    vision_params: int = 0
    attention_sinks: bool = False
    mla: MlaConfig | None = None
    weight_formats: ComponentFormats = ComponentFormats()
    derived_max_model_len: int | None = None
    hf_config: str | None = None
    served_dtype: str | None = None
    parallel_block: bool = False
    source: str = field(default="", compare=False, repr=False)

    def __post_init__(self):
        for name, cls in (("moe", MoeConfig), ("mla", MlaConfig)):  # the as_dict() form builds one too
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, cls(**value))
        if not isinstance(self.weight_formats, ComponentFormats):
            object.__setattr__(self, "weight_formats", ComponentFormats(**(self.weight_formats or {})))
        _check_consistency(self)

    @property
    def context_limit(self) -> int:
        """The longest context vLLM derives from the config: derived_max_model_len when rope_scaling
        stretches max_position (see _hf_derived_max_len), else max_position."""
        return self.derived_max_model_len or self.max_position

    # -- derived --------------------------------------------------------------
    @property
    def act_dtype(self) -> str:
        """Activation dtype: fp16 for fp16 checkpoints, bf16 otherwise (quantized models compute in bf16);
        served_dtype where served_on set it."""
        return self.served_dtype or ("fp16" if self.weight_dtype == "fp16" else "bf16")

    def served_on(self, hw) -> "ModelConfig":
        """The model as vLLM's dtype='auto' serves it on `hw`: unchanged where the GPU runs its activation
        dtype; otherwise (bf16 before Ampere: V100, T4) in the GPU's first supported 16/32-bit dtype, fp16, or
        fp32 for the architectures vLLM keeps off fp16 (numerical instability), 16-bit weights and the KV
        cache with it. One line naming both when the GPU has neither."""
        act = self.act_dtype
        supported = hw.supported_dtypes
        if act in supported:
            return self
        choices = [d for d in ("fp16", "fp32") if d in supported and not (d == "fp16" and self.architecture in
                                                                           FP16_UNSTABLE)]
        if not choices:
            raise KernelsightError(f"model {self.name} on {hw.key}: the GPU has no {act} peak in the hardware "
                                   f"catalog and vLLM would not serve this architecture in fp16 or fp32 there")
        served = choices[0]

        def swap(fmt):
            return served if fmt == act else fmt

        formats = ComponentFormats(**{c: swap(getattr(self.weight_formats, c)) for c in COMPONENTS})
        model = replace(self, served_dtype=served, weight_dtype=swap(self.weight_dtype), kv_dtype=swap(self.kv_dtype),
                        weight_formats=formats)
        for component in model.components():
            fmt = model.weight_format(component)
            if compute_dtype(fmt, supported) not in supported:
                raise KernelsightError(f"model {self.name} on {hw.key}: its {fmt} {component.replace('_', ' ')} "
                                       f"weights need {weight_format(fmt).compute} tensor cores or weight-only "
                                       f"kernels in bf16 (Ampere or later); vLLM refuses this checkpoint there")
        return model

    @property
    def router_dtype(self) -> str:
        """dtype of the router GEMM: vLLM builds MiniMax-M2's gate in fp32, every other in the activation dtype."""
        return "fp32" if self.architecture == "MiniMaxM2ForCausalLM" else self.act_dtype

    @property
    def rope_dim(self) -> int:
        """Dims RoPE rotates per head (MLA: the rotary key part)."""
        if self.mla:
            return self.mla.qk_rope_head_dim
        return self.rotary_dim or self.head_dim

    @property
    def kv_cache_rows(self) -> int:
        """Cached rows per token, layer and KV head: K and V, or MLA's single latent."""
        return 1 if self.mla else 2

    def weight_format(self, component: str) -> str:
        """Format of one component's linear weights (COMPONENTS)."""
        return getattr(self.weight_formats, component) or self.weight_dtype

    def components(self) -> tuple[str, ...]:
        """The components this model has."""
        plan = self.layer_plan()
        present = {"attention": True, "attention_out": True, "mlp": not all(p.moe for p in plan),
                   "experts": any(p.moe for p in plan),
                   "shared_experts": bool(self.moe and self.moe.shared_intermediate)}
        return tuple(c for c in COMPONENTS if present[c])

    def layer_plan(self) -> tuple[LayerSpec, ...]:
        """Per layer, in order: its sliding window, attention chunk, RoPE and MoE (see the field docs)."""
        return _layer_plan(self)

    @property
    def moe_layers(self) -> int:
        return sum(p.moe for p in self.layer_plan())

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def rope_layers(self) -> int:
        return sum(p.rope for p in self.layer_plan())

    def attention_kinds(self) -> tuple[AttentionKind, ...]:
        """Layer groups with identical attention, in order of first appearance."""
        counts: dict[tuple[int, int], int] = {}
        for p in self.layer_plan():
            counts[(p.window, p.chunk)] = counts.get((p.window, p.chunk), 0) + 1
        return tuple(AttentionKind("sliding" if w else "chunked" if c else "full", n, w, c)
                     for (w, c), n in counts.items())

    def weight_parts(self) -> tuple[WeightPart, ...]:
        """Every parameter of the (unsharded) model, by kind, with its storage dtype and how it is split."""
        h, hd, n_layers, ab = self.hidden, self.head_dim, self.layers, self.act_dtype
        moe, mla = self.moe, self.mla
        attn, attn_out = self.weight_format("attention"), self.weight_format("attention_out")
        parts = [WeightPart("embedding", self.vocab * h, ab, "vocab"),
                 WeightPart("lm_head", 0 if self.tied_embeddings else self.vocab * h, ab, "vocab")]
        if mla:
            qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
            q_in = mla.q_lora_rank or h
            parts += [WeightPart("attn_q_a", n_layers * h * mla.q_lora_rank, attn, "none"),
                      WeightPart("attn_q", n_layers * q_in * self.heads * qk, attn, "tp"),
                      WeightPart("attn_kv_a", n_layers * h * (mla.kv_lora_rank + mla.qk_rope_head_dim), attn, "none"),
                      WeightPart("attn_kv", n_layers * mla.kv_lora_rank * self.heads
                                 * (mla.qk_nope_head_dim + mla.v_head_dim), attn, "tp"),
                      WeightPart("attn_o", n_layers * self.heads * mla.v_head_dim * h, attn_out, "tp"),
                      WeightPart("attn_norms", n_layers * (mla.q_lora_rank + mla.kv_lora_rank), ab, "none")]
        else:
            q, kv = self.heads * hd, self.kv_heads * hd
            bias = (q + 2 * kv + (h if self.architecture not in QKV_BIAS_ONLY else 0)) if self.attention_bias else 0
            qk_norm = {"none": 0, "head": 2 * hd, "projection": q + kv, "gathered": q + kv}[self.qk_norm]
            if self.architecture == "Llama4ForConditionalGeneration":
                qk_norm = 0  # an RMSNorm without weight
            parts += [WeightPart("attn_q", n_layers * h * q, attn, "tp"),
                      WeightPart("attn_kv", n_layers * 2 * h * kv, attn, "kv"),
                      WeightPart("attn_o", n_layers * q * h, attn_out, "tp"),
                      WeightPart("attn_bias", n_layers * bias, ab, "none"),
                      WeightPart("qk_norm", n_layers * qk_norm, ab, "none")]
        parts.append(WeightPart("attn_sinks", n_layers * self.heads if self.attention_sinks else 0, "fp32", "tp"))
        parts.append(WeightPart("mlp", self.dense_layers * 3 * h * self.intermediate, self.weight_format("mlp"), "tp"))
        if moe:
            n_moe = self.moe_layers
            parts += [WeightPart("experts", n_moe * moe.experts * 3 * h * moe.intermediate,
                                 self.weight_format("experts"), "experts"),
                      WeightPart("expert_bias", n_moe * moe.experts * (2 * moe.intermediate + h) if moe.bias else 0,
                                 ab, "experts"),
                      WeightPart("shared_experts", n_moe * 3 * h * moe.shared_intermediate,
                                 self.weight_format("shared_experts"), "tp"),
                      WeightPart("router", n_moe * (h + moe.bias) * moe.experts, self.router_dtype, "none")]
        per_layer = 1 if self.parallel_block else 4 if self.sandwich_norms else 2
        parts.append(WeightPart("norms", n_layers * h * per_layer + h, ab, "none"))
        if self.vision_params:
            parts.append(WeightPart("vision", self.vision_params, ab, "tp"))
        return tuple(parts)

    def param_counts(self) -> dict[str, int]:
        """Parameters per kind of the whole (unsharded) model."""
        return {p.name: p.params for p in self.weight_parts()}

    def num_params(self) -> int:
        return sum(self.param_counts().values())

    def active_params(self) -> int:
        """Parameters one token touches: the routed experts count top_k of `experts`."""
        counts = self.param_counts()
        if not self.moe:
            return self.num_params()
        routed = counts["experts"] + counts["expert_bias"]
        return self.num_params() - routed + routed * self.moe.top_k // self.moe.experts

    def as_dict(self) -> dict:
        """The YAML form (inverse of from_mapping)."""
        out = {f: getattr(self, f) for f in _FIELDS}
        out["moe"] = None if self.moe is None else dict(vars(self.moe))
        out["mla"] = None if self.mla is None else dict(vars(self.mla))
        out["weight_formats"] = self.weight_formats.as_dict()
        return out

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<mapping>") -> "ModelConfig":
        """Validate a YAML mapping or a Hydra `model` node; errors name `source` and the field."""
        return cls(**check(data, _FIELDS, source), source=source)


_MOE_FIELDS = {
    "experts": Spec("pos"),
    "top_k": Spec("pos"),
    "intermediate": Spec("pos"),
    "shared_intermediate": Spec("nonneg", default=0),
    "first_dense": Spec("nonneg", default=0),
    "every": Spec("pos", default=1),
    "scoring": Spec("choice", default="softmax", choices=SCORINGS),
    "bias": Spec("bool", default=False),
    "shared_gate": Spec("bool", default=False),
}
_MLA_FIELDS = {
    "q_lora_rank": Spec("nonneg"),
    "kv_lora_rank": Spec("pos"),
    "qk_nope_head_dim": Spec("pos"),
    "qk_rope_head_dim": Spec("pos"),
    "v_head_dim": Spec("pos"),
}
_FORMAT_FIELDS = {c: Spec("choice", default=None, choices=WEIGHT_DTYPES, nullable=True) for c in COMPONENTS}
_FIELDS = {
    "name": Spec("str"),
    "hf_repo": Spec("str"),
    "hf_config": Spec("str", nullable=True),
    "architecture": Spec("choice", choices=SUPPORTED_ARCHS),
    "hidden": Spec("pos"),
    "layers": Spec("pos"),
    "heads": Spec("pos"),
    "kv_heads": Spec("pos"),
    "head_dim": Spec("pos"),
    "rotary_dim": Spec("pos", nullable=True, default=None),
    "intermediate": Spec("nonneg"),
    "vocab": Spec("pos"),
    "max_position": Spec("pos"),
    "derived_max_model_len": Spec("pos", nullable=True, default=None),
    "tied_embeddings": Spec("bool"),
    "norm": Spec("choice", choices=NORM_KINDS),
    "activation": Spec("choice", choices=tuple(FLOPS_PER_OUTPUT)),
    "qk_norm": Spec("choice", choices=QK_NORMS),
    "attention_bias": Spec("bool"),
    "attention_sinks": Spec("bool", default=False),
    "sandwich_norms": Spec("bool"),
    "parallel_block": Spec("bool", default=False),
    "logit_softcap": Spec("number"),
    "sliding_window": Spec("nonneg"),
    "sliding_layers": Spec("choice", choices=SLIDING_LAYERS),
    "attention_chunk": Spec("nonneg", default=0),
    "nope_every": Spec("nonneg", default=0),
    "full_every": Spec("nonneg", default=0),
    "vision_params": Spec("nonneg", default=0),
    "mla": Spec("optional_section", fields=_MLA_FIELDS, default=None),
    "moe": Spec("optional_section", fields=_MOE_FIELDS),
    "weight_dtype": Spec("choice", choices=WEIGHT_DTYPES),
    "weight_formats": Spec("optional_section", fields=_FORMAT_FIELDS, default=None),
    "kv_dtype": Spec("choice", choices=KV_DTYPES),
}


def _check_consistency(m: ModelConfig) -> None:
    def fail(name: str, why: str):
        raise KernelsightError(f"{m.source or m.name}: field {name!r}: {why}")

    if m.heads % m.kv_heads:
        fail("kv_heads", f"{m.kv_heads} does not divide heads = {m.heads} (GQA groups must be equal)")
    if (m.sliding_window == 0) != (m.sliding_layers == "none"):
        fail("sliding_layers", f"{m.sliding_layers!r} does not agree with sliding_window = {m.sliding_window} "
                               f"(use 'none' exactly when the window is 0)")
    if m.rotary_dim is not None and (m.rotary_dim > m.head_dim or m.rotary_dim % 2):
        fail("rotary_dim", f"{m.rotary_dim} must be even and at most head_dim = {m.head_dim}")
    if m.attention_chunk and m.sliding_window:
        fail("attention_chunk", "chunked attention and a sliding window on the same model are not modelled")
    if m.nope_every > m.layers:
        fail("nope_every", f"{m.nope_every} exceeds layers = {m.layers}")
    if m.full_every and (m.sliding_layers != "all" or m.full_every > m.layers):
        fail("full_every", f"{m.full_every}: global layers among sliding ones need sliding_layers 'all' and at most "
                           f"layers = {m.layers}")
    if m.mla:
        _check_mla(m, fail)
    elif m.architecture in MLA_ARCHS:
        fail("mla", f"{m.architecture} runs multi-head latent attention: mla must be set")
    if m.architecture in MOE_ARCHS:
        if m.moe is None:
            fail("moe", f"{m.architecture} is a mixture-of-experts architecture: moe must be set")
        if m.moe.top_k > m.moe.experts:
            fail("moe.top_k", f"{m.moe.top_k} exceeds moe.experts = {m.moe.experts}")
        if not m.moe_layers:
            fail("moe.first_dense", f"no layer is a MoE layer (first_dense = {m.moe.first_dense}, every = "
                                    f"{m.moe.every}, layers = {m.layers})")
        if bool(m.intermediate) != bool(m.dense_layers):
            fail("intermediate", f"{m.intermediate}: must be the dense MLP width when there are dense layers "
                                 f"({m.dense_layers} here) and 0 otherwise (the expert width is moe.intermediate)")
    else:
        if m.moe is not None:
            fail("moe", f"{m.architecture} is a dense architecture: moe must be null")
        if not m.intermediate:
            fail("intermediate", "a dense model needs an MLP width >= 1")
    present = m.components()
    for component in COMPONENTS:
        if getattr(m.weight_formats, component) and component not in present:
            fail(f"weight_formats.{component}", f"this model has no {component.replace('_', ' ')} "
                                                f"(its components: {', '.join(present)})")


def _check_mla(m: ModelConfig, fail) -> None:
    """vLLM's MLA: one cached latent per token (kv_heads 1, head size kv_lora_rank + qk_rope_head_dim),
    no per-head q/k norm, no sliding window."""
    a = m.mla
    if m.architecture not in MLA_ARCHS:
        fail("mla", f"{m.architecture} does not run multi-head latent attention: mla must be null")
    if m.kv_heads != 1:
        fail("kv_heads", f"{m.kv_heads}: MLA caches one latent per token (vLLM's single KV head): must be 1")
    if m.head_dim != a.kv_lora_rank + a.qk_rope_head_dim:
        fail("head_dim", f"{m.head_dim}: MLA's cached row is mla.kv_lora_rank + mla.qk_rope_head_dim = "
                         f"{a.kv_lora_rank + a.qk_rope_head_dim}")
    if a.qk_rope_head_dim % 2:
        fail("mla.qk_rope_head_dim", f"{a.qk_rope_head_dim}: RoPE rotates pairs of dims, must be even")
    if m.rotary_dim not in (None, a.qk_rope_head_dim):
        fail("rotary_dim", f"{m.rotary_dim}: MLA rotates mla.qk_rope_head_dim = {a.qk_rope_head_dim} dims (or null)")
    if m.qk_norm != "none" or m.sliding_window or m.attention_chunk:
        fail("mla", "MLA layers have no q/k norm, sliding window or chunked attention")


# -- loading ----------------------------------------------------------------------

def _sliding_at(i: int, sliding_layers: str, full_every: int) -> bool:
    """Whether layer i (from 0) attends in the sliding window (ModelConfig.sliding_layers, full_every)."""
    if sliding_layers == "even":
        return i % 2 == 0
    return sliding_layers == "all" and not (full_every and (i + 1) % full_every == 0)


@lru_cache(maxsize=64)
def _layer_plan(model: ModelConfig) -> tuple[LayerSpec, ...]:
    """ModelConfig.layer_plan, built once per config (the simulator's pricers ask for it per kernel table)."""
    plan = []
    for i in range(model.layers):
        sliding = _sliding_at(i, model.sliding_layers, model.full_every)
        rope = not (model.nope_every and (i + 1) % model.nope_every == 0)
        moe = bool(model.moe) and i >= model.moe.first_dense and (i + 1) % model.moe.every == 0
        plan.append(LayerSpec(window=model.sliding_window if sliding else 0,
                              chunk=model.attention_chunk if rope else 0, rope=rope, moe=moe))
    return tuple(plan)


def model_dir() -> Path:
    return conf_dir() / "model"


def list_models() -> list[str]:
    """Names of the shipped model configs (the valid values of `model=`)."""
    return sorted(p.stem for p in model_dir().glob("*.yaml"))


def load_model(name_or_path: str | Path | Mapping) -> ModelConfig:
    """A model by shipped name (conf/model/<name>.yaml), a .yaml path, a config.json path or a directory
    holding one, or an already-composed mapping (Hydra's `cfg.model`)."""
    from .schema import load_config

    if isinstance(name_or_path, (str, Path)):
        path = Path(name_or_path)
        if path.is_dir() and (path / "config.json").is_file():
            path = path / "config.json"
        if path.suffix == ".json" and path.is_file():
            return load_hf_config(path)
    return load_config(ModelConfig, "model", "model", name_or_path)


def load_hf_config(path: str | Path) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json (and a ModelOpt hf_quant_config.json beside it)."""
    path = Path(path)
    config = _read_json(path)
    quant_path = _quant_config_path(path)
    quant = _read_json(quant_path) if quant_path.is_file() else None
    name = path.parent.name if path.name == "config.json" else path.name.removesuffix("_config.json")
    return from_hf(config, name=name, source=str(path), modelopt=quant, modelopt_source=str(quant_path))


def _quant_config_path(path: Path) -> Path:
    if path.name == "config.json":
        return path.with_name("hf_quant_config.json")
    return path.with_name(path.name.removesuffix("config.json") + "hf_quant_config.json")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KernelsightError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise KernelsightError(f"{path}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise KernelsightError(f"{path}: expected a JSON object at the top level")
    return data


def from_hf(config: Mapping, name: str, source: str, modelopt: Mapping | None = None,
            modelopt_source: str = "hf_quant_config.json") -> ModelConfig:
    """Apply vLLM's reading of an HF config (see the module docstring).

    name: a file stem like 'meta-llama--Meta-Llama-3.1-8B' (the repo id with '/' as '--') or a directory name.
    modelopt: the ModelOpt hf_quant_config.json beside it (modelopt_source: its path, for messages).
    Every field read is type-checked (a count is an integer >= 1: not "32", not true, not 3.5) and an
    absent or null optional field takes vLLM's default; a problem is one line naming the file and the field.
    """
    if not isinstance(config, Mapping):
        raise KernelsightError(f"{source}: expected a mapping of config fields, got {type(config).__name__}")
    archs = config.get("architectures") or []
    if isinstance(archs, str) or not isinstance(archs, (list, tuple)):
        raise KernelsightError(f"{source}: field 'architectures' = {archs!r}: must be a list of class names")
    arch = archs[0] if archs else None
    accepted = (*SUPPORTED_ARCHS, *VISION_LANGUAGE)
    if isinstance(arch, str) and arch in NOT_MODELLED:
        raise KernelsightError(f"{source}: architecture {arch!r} is not supported: {NOT_MODELLED[arch]} have no "
                               f"measured kernel family to price them (supported: {', '.join(accepted)})")
    if not isinstance(arch, str) or arch not in accepted:
        raise KernelsightError(f"{source}: architecture {arch!r} is not supported"
                               f"{did_you_mean(str(arch), accepted)}; supported: {', '.join(accepted)}")
    if arch in GEMMA3_ARCHS:
        config = _with_gemma3_defaults(config, arch, source)
    top = HfReader(config, source)
    get = top
    wrapper = arch if arch in VISION_LANGUAGE else None
    if wrapper:
        arch = VISION_LANGUAGE[wrapper]
        get = top.section("text_config") or top
    if arch in ("Llama4ForConditionalGeneration", "Gemma3ForConditionalGeneration"):
        # the language model's fields; dtype and quantization stay on top
        get = top.section("text_config")
        if get is None:
            raise KernelsightError(f"{source}: missing field 'text_config' (the {arch} language model)")
    hidden, heads = get("hidden_size", "pos"), get("num_attention_heads", "pos")
    layers = get("num_hidden_layers", "pos")
    mla = _hf_mla(get) if arch in MLA_ARCHS else None
    kv_heads = 1 if mla else get("num_key_value_heads", "pos", default=heads)
    if heads % kv_heads:
        get.fail("num_key_value_heads", f"does not divide num_attention_heads = {heads} (GQA groups must be equal)")
    if mla:
        head_dim = mla.kv_lora_rank + mla.qk_rope_head_dim
    else:
        head_dim = get("head_dim", "pos", default=None)
        if head_dim is None:
            if hidden % heads:
                get.fail("hidden_size", f"not divisible by num_attention_heads = {heads}, and no head_dim is given "
                                        f"(it defaults to their quotient)")
            head_dim = hidden // heads
    act_key = "hidden_activation" if get.raw("hidden_activation") is not None else "hidden_act"
    act_name = get(act_key, "str")
    if act_name not in _HF_ACTIVATIONS:
        raise KernelsightError(f"{source}: activation {act_name!r} is not supported; "
                               f"known: {', '.join(_HF_ACTIVATIONS)}")
    window, sliding_layers, full_every = _hf_sliding(get, arch, layers)
    moe, intermediate = _hf_moe(get, arch, layers)
    max_position = get("max_position_embeddings", "pos")
    # vLLM: Gemma-3's max_position_embeddings is already the scaled context (its rope_scaling is not applied)
    derived = max_position if arch in GEMMA3_ARCHS else _hf_derived_max_len(get, max_position)
    chunk = nope_every = 0
    qk_norm = "head" if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", *GEMMA3_ARCHS) else "none"
    rotary_dim = None
    if arch == "Glm4MoeForCausalLM":  # vLLM: per-head q/k RMSNorm when use_qk_norm; RoPE on a share of head_dim
        qk_norm = "head" if get("use_qk_norm", "bool", default=False) else "none"
    elif arch in GATHERED_QK_NORM:
        qk_norm = "gathered"
    elif arch in COHERE_ARCHS:
        qk_norm = "head" if get("use_qk_norm", "bool", default=False) else "none"
    if arch in ("Glm4MoeForCausalLM", "Glm4ForCausalLM", "LlamaForCausalLM", "Phi3ForCausalLM"):
        # vLLM's Llama attention (Phi-3's too) rotates partial_rotary_factor of each head (Phi-4-mini: 0.75); GLM's
        # half of it unless the config says otherwise
        factor = get("partial_rotary_factor", "positive",
                     default=0.5 if arch in ("Glm4MoeForCausalLM", "Glm4ForCausalLM") else 1.0)
        rotary_dim = int(head_dim * factor)
        if factor > 1 or rotary_dim < 2 or rotary_dim % 2:
            get.fail("partial_rotary_factor", f"{factor} x head_dim {head_dim} must give an even number of dims "
                                              f"between 2 and head_dim")
        rotary_dim = None if rotary_dim == head_dim else rotary_dim
    if arch == "Llama4ForConditionalGeneration":
        chunk = get("attention_chunk_size", "nonneg", default=0)
        nope_every = _hf_nope_every(get, layers)
        qk_norm = "head" if get("use_qk_norm", "bool", default=False) else "none"
    elif arch == "MiniMaxM2ForCausalLM":
        qk_norm = "projection"  # vLLM's MiniMaxText01RMSNormTP over all heads, whatever qk_norm_type says
        rotary_dim = get("rotary_dim", "pos", default=head_dim)
        if rotary_dim > head_dim or rotary_dim % 2:
            get.fail("rotary_dim", f"must be even and at most head_dim = {head_dim}")
        rotary_dim = None if rotary_dim == head_dim else rotary_dim
    base_dtype = _hf_torch_dtype(top if top.raw("torch_dtype") or top.raw("dtype") else get)
    model = ModelConfig(
        name=name,
        hf_repo=name.replace("--", "/", 1),
        hf_config=None,
        architecture=arch,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        intermediate=intermediate,
        vocab=get("vocab_size", "pos"),
        max_position=max_position,
        derived_max_model_len=None if derived == max_position else derived,
        # vLLM's OLMoE never ties its LM head, Command-R always does
        tied_embeddings=arch in COHERE_ARCHS or (arch != "OlmoeForCausalLM" and get(
            "tie_word_embeddings", "bool", default=top("tie_word_embeddings", "bool", default=False)
            if wrapper else arch == "Gemma2ForCausalLM")),
        norm="layer" if arch in COHERE_ARCHS else "rms",
        activation=_HF_ACTIVATIONS[act_name],
        qk_norm=qk_norm,
        attention_bias=_hf_attention_bias(get, arch),
        attention_sinks=arch == "GptOssForCausalLM",
        sandwich_norms=arch in ("Gemma2ForCausalLM", *GEMMA3_ARCHS, "Glm4ForCausalLM"),
        logit_softcap=get("final_logit_softcapping", "number", default=0.0),
        sliding_window=window,
        sliding_layers=sliding_layers,
        attention_chunk=chunk,
        nope_every=full_every if arch == "Cohere2ForCausalLM" else nope_every,
        parallel_block=arch in COHERE_ARCHS,
        full_every=full_every,
        vision_params=_hf_vision_params(top, hidden, wrapper or arch),
        mla=mla,
        moe=moe,
        weight_dtype=base_dtype,
        kv_dtype=base_dtype,
        source=source,
    )
    quant = top.section("quantization_config")
    if quant is None and modelopt is None:
        return model
    if modelopt is not None and not isinstance(modelopt, Mapping):
        raise KernelsightError(f"{modelopt_source}: expected a JSON object at the top level")
    formats, kv = checkpoint_formats(model, quant, None if modelopt is None else HfReader(modelopt, modelopt_source))
    return _with_formats(model, formats, kv)


def _hf_attention_bias(get: HfReader, arch: str) -> bool:
    """Whether vLLM builds the attention projections with a bias (QKV_BIAS_ONLY: q, k and v only)."""
    if arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "SeedOssForCausalLM"):
        return True
    if arch in NO_ATTENTION_BIAS:
        return False
    if arch == "Ernie4_5_MoeForCausalLM":
        return get("use_bias", "bool", default=False)
    if arch == "GraniteForCausalLM" and get.raw("attention_bias") is None:
        return get("bias", "bool", default=False)
    return get("attention_bias", "bool", default=False)


def _with_formats(model: ModelConfig, formats: dict, kv: str) -> ModelConfig:
    """The model with per-component formats: weight_dtype the largest component's, the others where they differ
    (components the checkpoint leaves out in the activation dtype)."""
    counts = model.param_counts()
    size = {"attention": counts["attn_q"] + counts["attn_kv"] + counts.get("attn_q_a", 0) + counts.get("attn_kv_a", 0),
            "attention_out": counts["attn_o"], "mlp": counts["mlp"], "experts": counts.get("experts", 0),
            "shared_experts": counts.get("shared_experts", 0)}
    full = {c: formats.get(c, model.act_dtype) for c in model.components()}
    main = full[max(full, key=lambda c: size[c])]
    others = {c: f for c, f in full.items() if f != main}
    return replace(model, weight_dtype=main, weight_formats=ComponentFormats(**others), kv_dtype=kv)



def _with_gemma3_defaults(config: Mapping, arch: str, source: str) -> dict:
    """The config with transformers' Gemma3TextConfig defaults under the fields it leaves out (in text_config
    for Gemma3ForConditionalGeneration)."""
    if arch == "Gemma3ForCausalLM":
        return {**_GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise KernelsightError(f"{source}: field 'text_config' must be a mapping (the Gemma-3 language model)")
    return {**config, "text_config": {**_GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in text.items() if v is not None}}}


def _hf_vision_params(top: HfReader, text_hidden: int, arch: str) -> int:
    """Parameters of a vision-language checkpoint's vision tower and its projector into the language model (0
    for a text model), from vision_config with transformers' defaults where a field is absent: per layer the
    attention's four projections and the MLP (two matrices, three where gated), the patch (and position)
    embeddings, the merger or projector into text_hidden; biases and norms left out. The towers: Gemma-3's
    SigLIP, Qwen2-VL's and Qwen2.5-VL's ViT (gated MLP in 2.5) with their 2x2 patch merger, Qwen3-VL's ViT with
    position embeddings and one merger per deepstack layer plus the last, Mistral-3's Pixtral with its patch
    merger and two-layer projector."""
    vision = top.section("vision_config")
    if vision is None or arch not in (*VISION_LANGUAGE, "Gemma3ForConditionalGeneration"):
        return 0
    if arch == "Gemma3ForConditionalGeneration":
        h, inner = vision("hidden_size", "pos", default=768), vision("intermediate_size", "pos", default=3072)
        layers, patch = vision("num_hidden_layers", "pos", default=12), vision("patch_size", "pos", default=16)
        image, channels = vision("image_size", "pos", default=224), vision("num_channels", "pos", default=3)
        return layers * (4 * h * h + 2 * h * inner) + channels * patch * patch * h + (image // patch) ** 2 * h \
            + h * text_hidden
    if arch == "Mistral3ForConditionalGeneration":  # Pixtral
        h, inner = vision("hidden_size", "pos", default=1024), vision("intermediate_size", "pos", default=4096)
        layers, patch = vision("num_hidden_layers", "pos", default=24), vision("patch_size", "pos", default=14)
        channels, merge = vision("num_channels", "pos", default=3), top("spatial_merge_size", "pos", default=2)
        return layers * (4 * h * h + 3 * h * inner) + channels * patch * patch * h + merge * merge * h * h \
            + h * text_hidden + text_hidden * text_hidden
    channels = vision("in_channels", "pos", default=vision("in_chans", "pos", default=3))
    patch, frames = vision("patch_size", "pos", default=14), vision("temporal_patch_size", "pos", default=2)
    merge, layers = vision("spatial_merge_size", "pos", default=2), vision("depth", "pos", default=32)
    if arch == "Qwen2VLForConditionalGeneration":  # width embed_dim, plain MLP of mlp_ratio x width
        h = vision("embed_dim", "pos", default=1280)
        mlp, out, mergers = 2 * h * h * vision("mlp_ratio", "pos", default=4), text_hidden, 1
        positions = 0
    elif arch == "Qwen2_5_VLForConditionalGeneration":
        h = vision("hidden_size", "pos", default=1280)
        mlp = 3 * h * vision("intermediate_size", "pos", default=3420)
        out, mergers, positions = vision("out_hidden_size", "pos", default=text_hidden), 1, 0
    else:  # Qwen3-VL
        h = vision("hidden_size", "pos", default=1152)
        mlp = 2 * h * vision("intermediate_size", "pos", default=4304)
        positions = vision("num_position_embeddings", "pos", default=2304) * h
        out = vision("out_hidden_size", "pos", default=text_hidden)
        deepstack = vision.raw("deepstack_visual_indexes")
        if deepstack is not None and (isinstance(deepstack, str) or not isinstance(deepstack, (list, tuple))):
            vision.fail("deepstack_visual_indexes", "must be a list of layer indexes")
        mergers = 1 + len(deepstack if deepstack is not None else (8, 16, 24))
    wide = merge * merge * h  # a merger's input: merge x merge patches
    return layers * (4 * h * h + mlp) + channels * frames * patch * patch * h + positions \
        + mergers * (wide * wide + wide * out)


def _hf_torch_dtype(get: HfReader) -> str:
    key = "torch_dtype" if get.raw("torch_dtype") is not None else "dtype"
    torch_dtype = get(key, "str", default="bfloat16")
    if torch_dtype not in _HF_DTYPES:
        raise KernelsightError(f"{get.source}: {get.prefix}{key} {torch_dtype!r} is not supported; "
                               f"known: {', '.join(_HF_DTYPES)}")
    return _HF_DTYPES[torch_dtype]


# rope_scaling types whose max_position_embeddings already is the scaled context: vLLM leaves it as is.
_ROPE_UNSCALED = ("llama3", "longrope", "su")


def _hf_derived_max_len(get: HfReader, max_position: int) -> int:
    """vLLM's derived max_model_len (ModelConfig._get_and_verify_max_len), for the architectures supported
    here: max_position_embeddings, times rope_scaling.factor for the rope types vLLM stretches (all but
    llama3 / longrope / su, whose max_position_embeddings is already the long context); yarn scales
    original_max_position_embeddings instead. Configs saved by transformers 5 name the section
    rope_parameters, possibly one per attention type (full_attention, sliding_attention), read the same way.
    The other length keys vLLM also considers (n_positions, seq_length, model_max_length, ...) are not used by
    these architectures."""
    name = "rope_parameters" if get.raw("rope_parameters") is not None else "rope_scaling"
    rope = get.section(name)
    if rope is None:
        return max_position
    if rope.config and set(rope.config) <= set(_LAYER_TYPES):  # transformers 5: parameters per attention type
        sections = [rope.section(kind) for kind in rope.config]
    else:
        sections = [rope]
    base, factor = max_position, 1.0
    for section in filter(None, sections):
        key = "type" if section.raw("rope_type") is None and section.raw("type") is not None else "rope_type"
        rope_type = section(key, "str", default="default")
        if rope_type in _ROPE_UNSCALED:
            continue
        factor = section("factor", "positive", default=factor)
        if rope_type == "yarn":
            base = section("original_max_position_embeddings", "pos")
    return int(base * factor)


_LAYER_TYPES = {"sliding_attention": True, "full_attention": False}


def _hf_sliding(get: HfReader, arch: str, layers: int) -> tuple[int, str, int]:
    """(sliding window, sliding_layers, full_every) as vLLM reads the config."""
    window = get("sliding_window", "nonneg", default=4096 if arch == "Olmo3ForCausalLM" else 0)
    if arch == "Gemma2ForCausalLM":
        return (window or 4096), "even", 0
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"):
        if get("use_sliding_window", "bool", default=False):
            raise KernelsightError(f"{get.source}: use_sliding_window = true (sliding window from max_window_layers "
                                   f"on) is not supported")
        return 0, "none", 0
    if arch in GRANITE_ARCHS and get.raw("layer_types") is not None:
        raise KernelsightError(f"{get.source}: field {get.prefix + 'layer_types'!r}: Granite's per-layer sliding "
                               f"windows, RoPE bases and attention sinks are not modelled")
    if arch in ("LlamaForCausalLM", "MiniMaxM2ForCausalLM", "Llama4ForConditionalGeneration",
                "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeForCausalLM", "Glm4ForCausalLM",
                "Olmo2ForCausalLM", "OlmoeForCausalLM", "SeedOssForCausalLM", "CohereForCausalLM"):
        return 0, "none", 0  # vLLM passes these no window (MiniMax-M2's attention takes none from its config)
    if arch in ("GptOssForCausalLM", "Olmo3ForCausalLM", "Cohere2ForCausalLM", *GEMMA3_ARCHS):
        types = get.raw("layer_types")
        if types is None and arch == "GptOssForCausalLM":  # transformers' default: sliding on even layers
            types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        elif types is None and arch == "Olmo3ForCausalLM":  # Olmo3Config's default: every 4th layer global
            types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)]
        elif types is None:  # Gemma-3, Cohere2: every sliding_window_pattern-th layer global, the others sliding
            every = (get("sliding_window_pattern", "pos", default=4) if arch == "Cohere2ForCausalLM"  # Cohere2Config's
                     else get("sliding_window_pattern", "pos"))
            types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]
        sliding = _hf_layer_types(get, types, layers)
        every = sliding.index(False) + 1 if False in sliding else 0   # the first global layer, 1-based
        pattern = next((p for p in (("none", 0), ("all", 0), ("even", 0), ("all", every))
                        if [_sliding_at(i, *p) for i in range(layers)] == sliding), None)
        if pattern is None:
            at = [i for i, x in enumerate(sliding) if x]
            raise KernelsightError(f"{get.source}: field {get.prefix + 'layer_types'!r}: sliding_attention on layers "
                                   f"{at[:6]}{'...' if len(at) > 6 else ''}; sliding layers are modelled on every "
                                   f"layer, on the even layers, on all but every n-th or on none")
        if pattern[0] != "none" and not window:
            get.fail("sliding_window", "sliding_attention layers need a window >= 1")
        return (window, *pattern) if pattern[0] != "none" else (0, "none", 0)
    return window, ("all" if window else "none"), 0


def _hf_layer_types(get: HfReader, types: Any, layers: int) -> list[bool]:
    """layer_types: one 'sliding_attention' or 'full_attention' per layer -> sliding per layer."""
    if isinstance(types, str) or not isinstance(types, (list, tuple)):
        get.fail("layer_types", "must be a list with one attention type per layer")
    if len(types) != layers:
        raise KernelsightError(f"{get.source}: field {get.prefix + 'layer_types'!r} has {len(types)} entries, "
                               f"num_hidden_layers = {layers}: one attention type per layer")
    bad = [t for t in types if t not in _LAYER_TYPES]
    if bad:
        raise KernelsightError(f"{get.source}: field {get.prefix + 'layer_types'!r}: entry {bad[0]!r} is not one of "
                               f"{', '.join(_LAYER_TYPES)}")
    return [_LAYER_TYPES[t] for t in types]


def _hf_nope_every(get: HfReader, layers: int) -> int:
    """Llama-4's no_rope_layers (1: RoPE, 0: NoPE, per layer; transformers' default: NoPE on every 4th)
    as the period of its NoPE layers."""
    flags = get.raw("no_rope_layers")
    if not flags:
        interval = get("no_rope_layer_interval", "pos", default=4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if isinstance(flags, str) or not isinstance(flags, (list, tuple)) or len(flags) != layers or \
            any(x not in (0, 1) or isinstance(x, float) for x in flags):
        get.fail("no_rope_layers", f"must be a list of {layers} entries 0 (NoPE) or 1 (RoPE), one per layer")
    nope = [i for i, x in enumerate(flags) if x == 0]
    if not nope:
        return 0
    every = nope[0] + 1
    if nope != [i for i in range(layers) if (i + 1) % every == 0]:
        get.fail("no_rope_layers", "NoPE layers are modelled every n-th layer only")
    return every


def _hf_mla(get: HfReader) -> MlaConfig:
    mla = MlaConfig(q_lora_rank=get("q_lora_rank", "pos", default=0), kv_lora_rank=get("kv_lora_rank", "pos"),
                    qk_nope_head_dim=get("qk_nope_head_dim", "pos"), qk_rope_head_dim=get("qk_rope_head_dim", "pos"),
                    v_head_dim=get("v_head_dim", "pos"))
    if mla.qk_rope_head_dim % 2:
        get.fail("qk_rope_head_dim", "RoPE rotates pairs of dims: must be even")
    kv_heads = get("num_key_value_heads", "pos", default=None)
    if kv_heads is not None and kv_heads != get("num_attention_heads", "pos"):
        get.fail("num_key_value_heads", "MLA derives every head's key and value from one latent: must equal "
                                        "num_attention_heads")
    return mla


def _hf_moe(get: HfReader, arch: str, layers: int) -> tuple[MoeConfig | None, int]:
    """(the MoE config, the dense MLP width) of a config."""
    if arch in DENSE_ARCHS:
        return None, get("intermediate_size", "pos")
    intermediate = 0
    moe: dict[str, Any] = {}
    top_key = "num_experts_per_tok"
    if arch == "Ernie4_5_MoeForCausalLM":  # vLLM's Ernie4_5_MoeMoE: softmax top-k, shared experts in one MLP
        experts_key, width_key, top_key = "moe_num_experts", "moe_intermediate_size", "moe_k"
        moe["shared_intermediate"] = get("moe_num_shared_experts", "nonneg", default=0) * get(width_key, "pos")
        moe["first_dense"] = get("moe_layer_start_index", "nonneg", default=0)
        moe["every"] = get("moe_layer_interval", "pos", default=1)
        if get("moe_layer_end_index", "nonneg", default=layers - 1) < layers - 1:
            get.fail("moe_layer_end_index", f"dense layers after the MoE layers are not modelled (the MoE layers run "
                                            f"to the last, {layers - 1})")
        if moe["first_dense"] > layers:
            get.fail("moe_layer_start_index", f"exceeds num_hidden_layers = {layers}")
        if moe["first_dense"] or moe["every"] > 1:
            intermediate = get("intermediate_size", "pos")
    elif arch in ("MixtralForCausalLM", "MiniMaxM2ForCausalLM", "GptOssForCausalLM", *GRANITE_ARCHS):
        experts_key, width_key = "num_local_experts", "intermediate_size"
        if arch == "MiniMaxM2ForCausalLM":
            moe["scoring"] = get("scoring_func", "str", default="softmax")
        moe["bias"] = arch == "GptOssForCausalLM"
        if arch == "GraniteMoeSharedForCausalLM":  # vLLM's shared_mlp beside the experts, in every layer
            moe["shared_intermediate"] = get("shared_intermediate_size", "nonneg", default=0)
    elif arch == "OlmoeForCausalLM":  # softmax top-k of num_experts, each intermediate_size wide, every layer
        experts_key, width_key = "num_experts", "intermediate_size"
    elif arch in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"):
        if get.raw("mlp_only_layers"):
            get.fail("mlp_only_layers", "dense layers at listed positions are not modelled (decoder_sparse_step "
                                        "is: every n-th layer a MoE layer)")
        # configs saved by transformers 5 (Qwen3-VL-MoE's text_config) may name the count num_local_experts
        experts_key = "num_local_experts" if get.raw("num_experts") is None and \
            get.raw("num_local_experts") is not None else "num_experts"
        width_key = "moe_intermediate_size"
        moe["every"] = get("decoder_sparse_step", "pos", default=1)
        if moe["every"] > 1:
            intermediate = get("intermediate_size", "pos")
        if arch == "Qwen2MoeForCausalLM":  # one shared expert, its output scaled by a sigmoid gate
            moe["shared_intermediate"] = get("shared_expert_intermediate_size", "nonneg", default=0)
            moe["shared_gate"] = bool(moe["shared_intermediate"])
    elif arch == "Llama4ForConditionalGeneration":
        experts_key, width_key = "num_local_experts", "intermediate_size"
        moe["shared_intermediate"] = get("intermediate_size", "pos")  # one shared expert as wide as a routed one
        moe["every"] = get("interleave_moe_layer_step", "pos", default=1)
        moe["scoring"] = "sigmoid"
        if moe["every"] > 1:
            intermediate = get("intermediate_size_mlp", "pos")
    else:  # DeepseekV3ForCausalLM, DeepseekV2ForCausalLM, Glm4MoeForCausalLM (DeepSeek's MoE block)
        experts_key, width_key = "n_routed_experts", "moe_intermediate_size"
        width = get(width_key, "pos")
        moe["shared_intermediate"] = get("n_shared_experts", "nonneg", default=0) * width
        moe["first_dense"] = get("first_k_dense_replace", "nonneg", default=0)
        # GLM-4.5 scores by sigmoid (vLLM's Glm4MoE, whatever the config says); DeepSeek by its scoring_func
        moe["scoring"] = "sigmoid" if arch == "Glm4MoeForCausalLM" else get("scoring_func", "str", default="softmax")
        if get("moe_layer_freq", "pos", default=1) != 1:
            get.fail("moe_layer_freq", "MoE layers are modelled on every layer after first_k_dense_replace")
        if moe["first_dense"] > layers:
            get.fail("first_k_dense_replace", f"exceeds num_hidden_layers = {layers}")
        if moe["first_dense"]:
            intermediate = get("intermediate_size", "pos")
    experts, top_k = get(experts_key, "pos"), get(top_key, "pos")
    if top_k > experts:
        get.fail(top_key, f"exceeds {experts_key} = {experts}")
    if moe.get("scoring", "softmax") not in SCORINGS:
        get.fail("scoring_func", f"must be one of {', '.join(SCORINGS)}")
    return MoeConfig(experts=experts, top_k=top_k, intermediate=get(width_key, "pos"), **moe), intermediate
