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
set the dtypes.
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

from .schema import Spec, check

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
    16-bit, as in the FP8 checkpoints shipped); kv_dtype the KV-cache dtype.
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
    hf_config: str | None = None
    source: str = field(default="", compare=False, repr=False)

    def __post_init__(self):
        _check_consistency(self)

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
    """

    def need(key: str):
        if key not in config or config[key] is None:
            raise KernelsightError(f"{source}: missing field {key!r}")
        return config[key]

    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHS:
        raise KernelsightError(f"{source}: architecture {arch!r} is not supported"
                               f"{did_you_mean(str(arch), SUPPORTED_ARCHS)}; supported: {', '.join(SUPPORTED_ARCHS)}")
    hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    head_dim = config.get("head_dim") or hidden // heads
    act_name = config.get("hidden_activation") or need("hidden_act")
    if act_name not in _HF_ACTIVATIONS:
        raise KernelsightError(f"{source}: activation {act_name!r} is not supported; "
                               f"known: {', '.join(_HF_ACTIVATIONS)}")
    window, sliding_layers = _hf_sliding(config, arch, source)
    moe = _hf_moe(config, arch, source)
    weight_dtype, kv_dtype = _hf_dtypes(config, modelopt, source)
    return ModelConfig(
        name=name,
        hf_repo=name.replace("--", "/", 1),
        hf_config=None,
        architecture=arch,
        hidden=hidden,
        layers=int(need("num_hidden_layers")),
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        intermediate=0 if moe else int(need("intermediate_size")),
        vocab=int(need("vocab_size")),
        max_position=int(need("max_position_embeddings")),
        tied_embeddings=bool(config.get("tie_word_embeddings", arch == "Gemma2ForCausalLM")),
        norm="rms",
        activation=_HF_ACTIVATIONS[act_name],
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        attention_bias=arch == "Qwen2ForCausalLM" or bool(config.get("attention_bias", False)),
        sandwich_norms=arch == "Gemma2ForCausalLM",
        logit_softcap=float(config.get("final_logit_softcapping") or 0.0),
        sliding_window=window,
        sliding_layers=sliding_layers,
        moe=moe,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        source=source,
    )


def _hf_sliding(config: Mapping, arch: str, source: str) -> tuple[int, str]:
    window = int(config.get("sliding_window") or 0)
    if arch == "Gemma2ForCausalLM":
        return (window or 4096), "even"
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        if config.get("use_sliding_window"):
            raise KernelsightError(f"{source}: use_sliding_window = true (sliding window from max_window_layers on) "
                                   f"is not supported")
        return 0, "none"
    if arch == "LlamaForCausalLM":
        return 0, "none"
    return window, ("all" if window else "none")


def _hf_moe(config: Mapping, arch: str, source: str) -> MoeConfig | None:
    if arch == "MixtralForCausalLM":
        return MoeConfig(experts=int(config["num_local_experts"]), top_k=int(config["num_experts_per_tok"]),
                         intermediate=int(config["intermediate_size"]))
    if arch == "Qwen3MoeForCausalLM":
        if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1)) != 1:
            raise KernelsightError(f"{source}: dense layers inside a MoE stack (mlp_only_layers / "
                                   f"decoder_sparse_step) are not supported")
        return MoeConfig(experts=int(config["num_experts"]), top_k=int(config["num_experts_per_tok"]),
                         intermediate=int(config["moe_intermediate_size"]))
    return None


def _hf_dtypes(config: Mapping, modelopt: Mapping | None, source: str) -> tuple[str, str]:
    torch_dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if torch_dtype not in _HF_DTYPES:
        raise KernelsightError(f"{source}: torch_dtype {torch_dtype!r} is not supported; known: {', '.join(_HF_DTYPES)}")
    weight = kv = _HF_DTYPES[torch_dtype]
    quant = config.get("quantization_config")
    if quant:
        method = quant.get("quant_method")
        if method != "fp8":
            raise KernelsightError(f"{source}: quantization_config.quant_method {method!r} is not supported "
                                   f"(supported: fp8)")
        weight = "fp8"
    if modelopt:
        algo = (modelopt.get("quantization") or {}).get("quant_algo")
        if algo != "FP8":
            raise KernelsightError(f"{source}: hf_quant_config quant_algo {algo!r} is not supported (supported: FP8)")
        weight = "fp8"
        kv_algo = (modelopt.get("quantization") or {}).get("kv_cache_quant_algo")
        if kv_algo not in (None, "FP8"):
            raise KernelsightError(f"{source}: hf_quant_config kv_cache_quant_algo {kv_algo!r} is not supported")
        if kv_algo == "FP8":
            kv = "fp8"
    return weight, kv
