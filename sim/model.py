"""Model architectures: a typed ModelConfig from conf/model/<name>.yaml or a Hugging Face config.json.

Only what decides the kernels a serving engine runs is kept: sizes, GQA, head
dim, MLP or mixture-of-experts widths, norms, activation, sliding-window
layers, tied embeddings and the weight / KV-cache dtypes. Architectures are
accepted by their HF `architectures` name; anything else is refused by name
rather than approximated.

YAML files (Hydra group `model=`) hold exactly the ModelConfig fields plus
provenance (`hf_repo`, `hf_config`: the raw config.json under conf/model/ it
was written from, null when none is shipped). A config.json path is parsed
with the same rules vLLM applies: head_dim defaults to hidden/heads, float32
checkpoints are served in bf16, `quantization_config.quant_method: fp8` and a
ModelOpt `hf_quant_config.json` beside the file (FP8 weights, FP8 KV cache)
set the dtypes; rope_scaling sets the longest context vLLM allows (context_limit).
Every field read is type-checked: a count is an integer >= 1, never "32", true or 3.5.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from kernelsight.predictor.errors import KernelsightError, did_you_mean
from kernelsight.predictor.families.act import FLOPS_PER_OUTPUT
from kernelsight.predictor.families.norm import KINDS as NORM_KINDS
from kernelsight.predictor.paths import conf_dir

from .schema import Spec, check, field_value

DENSE_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM",
               "Gemma2ForCausalLM", "Phi3ForCausalLM")
MOE_ARCHS = ("Qwen3MoeForCausalLM", "MixtralForCausalLM")
SUPPORTED_ARCHS = DENSE_ARCHS + MOE_ARCHS
WEIGHT_DTYPES = ("bf16", "fp16", "fp8")
SLIDING_LAYERS = ("none", "all", "even")  # even: layers 0, 2, 4, ... (Gemma-2's interleaving)

# HF hidden_act -> the gated activation kernel vLLM runs (act family op).
_HF_ACTIVATIONS = {"silu": "silu_mul", "swish": "silu_mul", "gelu": "gelu_mul",
                   "gelu_pytorch_tanh": "gelu_tanh_mul", "gelu_new": "gelu_tanh_mul"}
_HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "bf16"}  # fp32 checkpoints are served in bf16


@dataclass(frozen=True)
class MoeConfig:
    """Mixture of experts in every layer: `experts` routed experts of width `intermediate`, `top_k` per token,
    plus an always-on shared expert of width `shared_intermediate` (0: none)."""

    experts: int
    top_k: int
    intermediate: int
    shared_intermediate: int = 0


@dataclass(frozen=True)
class LayerKind:
    """Layers that run identical kernels: priced once, `count` times per step."""

    name: str
    count: int
    window: int  # sliding window in tokens, 0 = full attention


@dataclass(frozen=True)
class ModelConfig:
    """One decoder-only transformer as the serving engine sees it.

    intermediate: dense MLP width (0 when every layer is MoE); head_dim is
    explicit (Gemma-2 and Qwen3 do not use hidden/heads); weight_dtype is
    the dtype of the linear layers (embedding, LM head, router and norms stay
    16-bit, as in the FP8 checkpoints shipped); kv_dtype the KV-cache dtype;
    derived_max_model_len: the context vLLM allows when rope_scaling extends
    it beyond max_position (yarn, dynamic, linear), null otherwise.
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
    qk_norm: bool
    attention_bias: bool
    sandwich_norms: bool
    logit_softcap: float
    sliding_window: int
    sliding_layers: str
    moe: MoeConfig | None
    weight_dtype: str
    kv_dtype: str
    derived_max_model_len: int | None = None
    hf_config: str | None = None
    source: str = field(default="", compare=False, repr=False)

    def __post_init__(self):
        _check_consistency(self)

    @property
    def context_limit(self) -> int:
        """The longest context vLLM derives from the config: derived_max_model_len when rope_scaling
        stretches max_position (see _hf_derived_max_len), else max_position."""
        return self.derived_max_model_len or self.max_position

    # -- derived --------------------------------------------------------------
    @property
    def act_dtype(self) -> str:
        """Activation dtype: fp16 for fp16 checkpoints, bf16 otherwise (FP8 models compute in bf16)."""
        return "fp16" if self.weight_dtype == "fp16" else "bf16"

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Layer groups with identical attention (all linear layers are identical across layers)."""
        if self.sliding_layers == "all":
            return (LayerKind("sliding", self.layers, self.sliding_window),)
        if self.sliding_layers == "even":
            sliding = (self.layers + 1) // 2
            return (LayerKind("sliding", sliding, self.sliding_window),
                    LayerKind("full", self.layers - sliding, 0))
        return (LayerKind("full", self.layers, 0),)

    def param_counts(self) -> dict[str, int]:
        """Parameters per component of the whole (unsharded) model."""
        h, hd, n_layers = self.hidden, self.head_dim, self.layers
        q, kv = self.heads * hd, self.kv_heads * hd
        bias = int(self.attention_bias)
        moe = self.moe
        return {
            "embedding": self.vocab * h,
            "lm_head": 0 if self.tied_embeddings else self.vocab * h,
            "attn_q": n_layers * (h * q + bias * q),
            "attn_kv": n_layers * 2 * (h * kv + bias * kv),
            "attn_o": n_layers * q * h,
            "qk_norm": n_layers * 2 * hd if self.qk_norm else 0,
            "mlp": n_layers * 3 * h * self.intermediate,
            "experts": n_layers * moe.experts * 3 * h * moe.intermediate if moe else 0,
            "shared_experts": n_layers * 3 * h * moe.shared_intermediate if moe else 0,
            "router": n_layers * h * moe.experts if moe else 0,
            "norms": n_layers * h * (4 if self.sandwich_norms else 2) + h,
        }

    def num_params(self) -> int:
        return sum(self.param_counts().values())

    def active_params(self) -> int:
        """Parameters one token touches: the routed experts count top_k of `experts`."""
        counts = self.param_counts()
        if not self.moe:
            return self.num_params()
        return self.num_params() - counts["experts"] + counts["experts"] * self.moe.top_k // self.moe.experts

    def as_dict(self) -> dict:
        """The YAML form (inverse of from_mapping)."""
        out = {f: getattr(self, f) for f in _FIELDS}
        out["moe"] = None if self.moe is None else dict(vars(self.moe))
        return out

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<mapping>") -> "ModelConfig":
        """Validate a YAML mapping or a Hydra `model` node; errors name `source` and the field."""
        values = check(data, _FIELDS, source)
        if values["moe"] is not None:
            values["moe"] = MoeConfig(**values["moe"])
        return cls(**values, source=source)


_MOE_FIELDS = {
    "experts": Spec("pos"),
    "top_k": Spec("pos"),
    "intermediate": Spec("pos"),
    "shared_intermediate": Spec("nonneg", default=0),
}
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
    "intermediate": Spec("nonneg"),
    "vocab": Spec("pos"),
    "max_position": Spec("pos"),
    "derived_max_model_len": Spec("pos", nullable=True, default=None),
    "tied_embeddings": Spec("bool"),
    "norm": Spec("choice", choices=NORM_KINDS),
    "activation": Spec("choice", choices=tuple(FLOPS_PER_OUTPUT)),
    "qk_norm": Spec("bool"),
    "attention_bias": Spec("bool"),
    "sandwich_norms": Spec("bool"),
    "logit_softcap": Spec("number"),
    "sliding_window": Spec("nonneg"),
    "sliding_layers": Spec("choice", choices=SLIDING_LAYERS),
    "moe": Spec("optional_section", fields=_MOE_FIELDS),
    "weight_dtype": Spec("choice", choices=WEIGHT_DTYPES),
    "kv_dtype": Spec("choice", choices=WEIGHT_DTYPES),
}


def _check_consistency(m: ModelConfig) -> None:
    def fail(name: str, why: str):
        raise KernelsightError(f"{m.source or m.name}: field {name!r}: {why}")

    if m.heads % m.kv_heads:
        fail("kv_heads", f"{m.kv_heads} does not divide heads = {m.heads} (GQA groups must be equal)")
    if (m.sliding_window == 0) != (m.sliding_layers == "none"):
        fail("sliding_layers", f"{m.sliding_layers!r} does not agree with sliding_window = {m.sliding_window} "
                               f"(use 'none' exactly when the window is 0)")
    if m.architecture in MOE_ARCHS:
        if m.moe is None:
            fail("moe", f"{m.architecture} is a mixture-of-experts architecture: moe must be set")
        if m.intermediate:
            fail("intermediate", "must be 0 when every layer is MoE (the expert width is moe.intermediate)")
        if m.moe.top_k > m.moe.experts:
            fail("moe.top_k", f"{m.moe.top_k} exceeds moe.experts = {m.moe.experts}")
    else:
        if m.moe is not None:
            fail("moe", f"{m.architecture} is a dense architecture: moe must be null")
        if not m.intermediate:
            fail("intermediate", "a dense model needs an MLP width >= 1")


# -- loading ----------------------------------------------------------------------

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
    return from_hf(config, name=name, source=str(path), modelopt=quant)


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


def from_hf(config: Mapping, name: str, source: str, modelopt: Mapping | None = None) -> ModelConfig:
    """Apply vLLM's reading of an HF config (see the module docstring).

    name: a file stem like 'meta-llama--Meta-Llama-3.1-8B' (the repo id with '/' as '--') or a directory name.
    Every field read is type-checked (a count is an integer >= 1: not "32", not true, not 3.5) and an
    absent or null optional field takes vLLM's default; a problem is one line naming `source` and the field.
    """
    if not isinstance(config, Mapping):
        raise KernelsightError(f"{source}: expected a mapping of config fields, got {type(config).__name__}")
    archs = config.get("architectures") or []
    if isinstance(archs, str) or not isinstance(archs, (list, tuple)):
        raise KernelsightError(f"{source}: field 'architectures' = {archs!r}: must be a list of class names")
    arch = archs[0] if archs else None
    if not isinstance(arch, str) or arch not in SUPPORTED_ARCHS:
        raise KernelsightError(f"{source}: architecture {arch!r} is not supported"
                               f"{did_you_mean(str(arch), SUPPORTED_ARCHS)}; supported: {', '.join(SUPPORTED_ARCHS)}")
    hidden, heads = _hf(config, "hidden_size", "pos", source), _hf(config, "num_attention_heads", "pos", source)
    kv_heads = _hf(config, "num_key_value_heads", "pos", source, default=heads)
    if heads % kv_heads:
        raise KernelsightError(f"{source}: field 'num_key_value_heads' = {kv_heads}: does not divide "
                               f"num_attention_heads = {heads} (GQA groups must be equal)")
    head_dim = _hf(config, "head_dim", "pos", source, default=None)
    if head_dim is None:
        if hidden % heads:
            raise KernelsightError(f"{source}: field 'hidden_size' = {hidden}: not divisible by num_attention_heads "
                                   f"= {heads}, and no head_dim is given (it defaults to their quotient)")
        head_dim = hidden // heads
    act_key = "hidden_activation" if config.get("hidden_activation") is not None else "hidden_act"
    act_name = _hf(config, act_key, "str", source)
    if act_name not in _HF_ACTIVATIONS:
        raise KernelsightError(f"{source}: activation {act_name!r} is not supported; "
                               f"known: {', '.join(_HF_ACTIVATIONS)}")
    window, sliding_layers = _hf_sliding(config, arch, source)
    moe = _hf_moe(config, arch, source)
    weight_dtype, kv_dtype = _hf_dtypes(config, modelopt, source)
    max_position = _hf(config, "max_position_embeddings", "pos", source)
    derived = _hf_derived_max_len(config, max_position, source)
    return ModelConfig(
        name=name,
        hf_repo=name.replace("--", "/", 1),
        hf_config=None,
        architecture=arch,
        hidden=hidden,
        layers=_hf(config, "num_hidden_layers", "pos", source),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=0 if moe else _hf(config, "intermediate_size", "pos", source),
        vocab=_hf(config, "vocab_size", "pos", source),
        max_position=max_position,
        derived_max_model_len=None if derived == max_position else derived,
        tied_embeddings=_hf(config, "tie_word_embeddings", "bool", source, default=arch == "Gemma2ForCausalLM"),
        norm="rms",
        activation=_HF_ACTIVATIONS[act_name],
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        attention_bias=arch == "Qwen2ForCausalLM" or _hf(config, "attention_bias", "bool", source, default=False),
        sandwich_norms=arch == "Gemma2ForCausalLM",
        logit_softcap=_hf(config, "final_logit_softcapping", "number", source, default=0.0),
        sliding_window=window,
        sliding_layers=sliding_layers,
        moe=moe,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        source=source,
    )


_REQUIRED = object()


def _hf(config: Mapping, key: str, kind: str, source: str, default: Any = _REQUIRED, prefix: str = "") -> Any:
    """config[key] checked as a schema Spec kind ('pos', 'nonneg', 'number', 'positive', 'bool', 'str');
    absent or null gives `default` (vLLM reads null as unset), or 'missing field' when it is required.
    prefix: the enclosing section in messages ('rope_scaling.')."""
    value = config.get(key)
    if value is None:
        if default is _REQUIRED:
            raise KernelsightError(f"{source}: missing field {prefix + key!r}")
        return default
    return field_value(value, Spec(kind), source, prefix + key)


def _section(config: Mapping, key: str, source: str) -> Mapping | None:
    """A nested mapping (quantization_config, rope_scaling), or None when absent or null."""
    value = config.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise KernelsightError(f"{source}: field {key!r} = {value!r}: must be a mapping or null")
    return value or None


# rope_scaling types whose max_position_embeddings already is the scaled context: vLLM leaves it as is.
_ROPE_UNSCALED = ("llama3", "longrope", "su")


def _hf_derived_max_len(config: Mapping, max_position: int, source: str) -> int:
    """vLLM's derived max_model_len (ModelConfig._get_and_verify_max_len), for the architectures supported
    here: max_position_embeddings, times rope_scaling.factor for the rope types vLLM stretches (all but
    llama3 / longrope / su, whose max_position_embeddings is already the long context); yarn scales
    original_max_position_embeddings instead. The other length keys vLLM also considers (n_positions,
    seq_length, model_max_length, ...) are not used by these architectures."""
    rope = _section(config, "rope_scaling", source)
    if rope is None:
        return max_position
    key = "type" if rope.get("rope_type") is None and rope.get("type") is not None else "rope_type"
    rope_type = _hf(rope, key, "str", source, prefix="rope_scaling.")
    if rope_type in _ROPE_UNSCALED:
        return max_position
    factor = _hf(rope, "factor", "positive", source, default=1.0, prefix="rope_scaling.")
    base = max_position
    if rope_type == "yarn":
        base = _hf(rope, "original_max_position_embeddings", "pos", source, prefix="rope_scaling.")
    return int(base * factor)


def _hf_sliding(config: Mapping, arch: str, source: str) -> tuple[int, str]:
    window = _hf(config, "sliding_window", "nonneg", source, default=0)
    if arch == "Gemma2ForCausalLM":
        return (window or 4096), "even"
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        if _hf(config, "use_sliding_window", "bool", source, default=False):
            raise KernelsightError(f"{source}: use_sliding_window = true (sliding window from max_window_layers on) "
                                   f"is not supported")
        return 0, "none"
    if arch == "LlamaForCausalLM":
        return 0, "none"
    return window, ("all" if window else "none")


def _hf_moe(config: Mapping, arch: str, source: str) -> MoeConfig | None:
    if arch == "MixtralForCausalLM":
        experts_key, width_key = "num_local_experts", "intermediate_size"
    elif arch == "Qwen3MoeForCausalLM":
        if config.get("mlp_only_layers") or _hf(config, "decoder_sparse_step", "pos", source, default=1) != 1:
            raise KernelsightError(f"{source}: dense layers inside a MoE stack (mlp_only_layers / "
                                   f"decoder_sparse_step) are not supported")
        experts_key, width_key = "num_experts", "moe_intermediate_size"
    else:
        return None
    experts, top_k = _hf(config, experts_key, "pos", source), _hf(config, "num_experts_per_tok", "pos", source)
    if top_k > experts:
        raise KernelsightError(f"{source}: field 'num_experts_per_tok' = {top_k}: exceeds {experts_key} = {experts}")
    return MoeConfig(experts=experts, top_k=top_k, intermediate=_hf(config, width_key, "pos", source))


def _hf_dtypes(config: Mapping, modelopt: Mapping | None, source: str) -> tuple[str, str]:
    key = "torch_dtype" if config.get("torch_dtype") is not None else "dtype"
    torch_dtype = _hf(config, key, "str", source, default="bfloat16")
    if torch_dtype not in _HF_DTYPES:
        raise KernelsightError(f"{source}: {key} {torch_dtype!r} is not supported; known: {', '.join(_HF_DTYPES)}")
    weight = kv = _HF_DTYPES[torch_dtype]
    quant = _section(config, "quantization_config", source)
    if quant:
        method = quant.get("quant_method")
        if method != "fp8":
            raise KernelsightError(f"{source}: quantization_config.quant_method {method!r} is not supported "
                                   f"(supported: fp8)")
        weight = "fp8"
    if modelopt:
        quantization = _section(modelopt, "quantization", f"{source}: hf_quant_config") or {}
        algo = quantization.get("quant_algo")
        if algo != "FP8":
            raise KernelsightError(f"{source}: hf_quant_config quant_algo {algo!r} is not supported (supported: FP8)")
        weight = "fp8"
        kv_algo = quantization.get("kv_cache_quant_algo")
        if kv_algo not in (None, "FP8"):
            raise KernelsightError(f"{source}: hf_quant_config kv_cache_quant_algo {kv_algo!r} is not supported")
        if kv_algo == "FP8":
            kv = "fp8"
    return weight, kv
