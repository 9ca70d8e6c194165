"""Weight formats of a Hugging Face checkpoint, per component, as vLLM reads its quantization config.

`quantization_config` of config.json, with quant_method fp8 (per-tensor, or `weight_block_size` [128, 128]:
fp8_block), compressed-tensors (each config group's weight scheme on the modules its targets name: fp8,
fp8_block, int4 w4a16, nvfp4), mxfp4 (vLLM quantizes the MoE experts only), modelopt (FP8, NVFP4 in groups of
16) or awq / gptq (4-bit in groups of 128: w4a16); without one, a ModelOpt hf_quant_config.json beside the
file. Any other method or scheme is refused by name. The lists of modules a checkpoint leaves unquantized
(modules_to_not_convert, ignored_layers, ignore, exclude_modules) are matched against the model's checkpoint
module names: a component (attention input projections, o_proj, dense MLP, routed experts, shared experts)
they name in every layer that has it stays 16-bit; one they name in part is refused, formats per layer are
not modelled. The model gets weight_dtype = its largest component's format and weight_formats = the others
that differ.
"""
from __future__ import annotations

import fnmatch
import re

from kernelsight.predictor.errors import KernelsightError, did_you_mean

from .hf_reader import HfReader

_QUANT_METHODS = ("fp8", "compressed-tensors", "mxfp4", "modelopt", "awq", "gptq")
_EXCLUDE_KEYS = ("modules_to_not_convert", "ignored_layers", "ignore", "exclude_modules")
_MODELOPT_ALGOS = {"FP8": "fp8", "NVFP4": "nvfp4"}


def checkpoint_formats(model, quant: HfReader | None, modelopt: HfReader | None) -> tuple[dict, str]:
    """(format per component, KV-cache dtype) a checkpoint states (the module docstring): quant is config.json's
    quantization_config, modelopt the hf_quant_config.json beside it (None: absent; one of them is set);
    model the ModelConfig they apply to. Components the result leaves out keep 16 bits."""
    kv = model.kv_dtype
    if quant is None:  # vLLM reads hf_quant_config.json only when config.json states no quantization_config
        section = modelopt.section("quantization")
        if section is None:
            raise KernelsightError(f"{modelopt.source}: missing field 'quantization'")
        return _modelopt(model, section, kv)
    method = quant("quant_method", "str")
    if method not in _QUANT_METHODS:
        raise KernelsightError(f"{quant.source}: field {quant.prefix + 'quant_method'!r} = {method!r} is not "
                               f"supported{did_you_mean(method, _QUANT_METHODS)}; supported: "
                               f"{', '.join(_QUANT_METHODS)}")
    if method == "modelopt":
        return _modelopt(model, quant.section("quantization") or quant, kv)
    if method == "compressed-tensors":
        return _compressed_tensors(model, quant), kv
    if method == "mxfp4":
        formats = {"experts": _mxfp4_format(model, quant)}
    else:
        fmt = _fp8_format(quant) if method == "fp8" else _int4_format(quant)
        formats = {c: fmt for c in model.components()}
    return _excluded(model, formats, quant, [k for k in _EXCLUDE_KEYS if quant.raw(k) is not None]), kv


def _fp8_format(quant: HfReader) -> str:
    """quant_method fp8: per-tensor scales, or 128x128 blocks (weight_block_size), as vLLM's Fp8Config reads it."""
    scheme = quant("activation_scheme", "str", default="dynamic")
    if scheme not in ("dynamic", "static"):
        quant.fail("activation_scheme", "must be 'dynamic' or 'static'")
    block = quant.raw("weight_block_size")
    if block is None:
        return "fp8"
    if isinstance(block, str) or not isinstance(block, (list, tuple)) or len(block) != 2 or \
            any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in block):
        quant.fail("weight_block_size", "must be a list of two integers >= 1")
    if list(block) != [128, 128]:
        quant.fail("weight_block_size", "only 128x128 blocks are priced (fp8_block)")
    return "fp8_block"


def _mxfp4_format(model, quant: HfReader) -> str:
    """quant_method mxfp4 (gpt-oss): vLLM's Mxfp4Config quantizes the fused experts only."""
    if not model.moe:
        raise KernelsightError(f"{quant.source}: field 'quantization_config.quant_method' = 'mxfp4': vLLM applies "
                               f"it to MoE experts only, and {model.architecture} has none")
    return "mxfp4"


def _int4_format(quant: HfReader) -> str:
    """AWQ / GPTQ: 4-bit integer weights in groups of 128 with 16-bit activations (w4a16)."""
    bits = quant("bits", "pos")
    if bits != 4:
        quant.fail("bits", "only 4-bit AWQ / GPTQ weights are priced (w4a16)")
    group = quant.raw("group_size")
    if group != 128:
        quant.fail("group_size", "w4a16 is priced with one scale per 128 weights: must be 128")
    return "w4a16"


def _modelopt(model, q: HfReader, kv: str) -> tuple[dict, str]:
    """ModelOpt (hf_quant_config.json `quantization`, or quant_method modelopt): FP8 per-tensor or NVFP4 in
    groups of 16, exclude_modules left 16-bit; kv_cache_quant_algo FP8 sets an FP8 KV cache."""
    algo = q("quant_algo", "str")
    if algo not in _MODELOPT_ALGOS:
        q.fail("quant_algo", f"not supported; supported: {', '.join(_MODELOPT_ALGOS)}")
    fmt = _MODELOPT_ALGOS[algo]
    if fmt == "nvfp4" and q("group_size", "pos", default=16) != 16:
        q.fail("group_size", "NVFP4 scales groups of 16 weights: must be 16")
    kv_algo = q.raw("kv_cache_quant_algo")
    if kv_algo not in (None, "FP8"):
        q.fail("kv_cache_quant_algo", "not supported (FP8 or null)")
    formats = _excluded(model, {c: fmt for c in model.components()}, q,
                        [k for k in _EXCLUDE_KEYS if q.raw(k) is not None])
    return formats, "fp8" if kv_algo == "FP8" else kv


def _compressed_tensors(model, quant: HfReader) -> dict:
    """compressed-tensors: each config group's weight scheme on the components its targets name ('Linear':
    all), `ignore` left 16-bit."""
    groups = quant.section("config_groups")
    if groups is None:
        raise KernelsightError(f"{quant.source}: missing field 'quantization_config.config_groups'")
    formats: dict[str, str] = {}
    for name in groups.config:
        group = groups.section(name)
        if group is None:
            groups.fail(name, "must be a mapping with targets and weights")
        fmt = _compressed_scheme(group)
        targets = group.strings("targets")
        if not targets:
            group.fail("targets", "must name the modules the scheme applies to ('Linear' or module patterns)")
        if "Linear" in targets:
            covered = model.components()
        else:
            match = _Patterns([t for t in targets if t != "Linear"], f"{group.source}: field {group.prefix}targets")
            covered = tuple(c for c in model.components() if _coverage(model, c, match, group, "targets") == "all")
        for component in covered:
            formats.setdefault(component, fmt)
    if not formats:
        groups.fail(next(iter(groups.config), ""), "targets none of the model's linear layers")
    return _excluded(model, formats, quant, ["ignore"] if quant.raw("ignore") is not None else [])


def _compressed_scheme(group: HfReader) -> str:
    """One config group's weight format: fp8 (tensor / channel), fp8_block (128x128), w4a16 (int4, groups of
    128, 16-bit activations) or nvfp4 (fp4, groups of 16, fp4 activations)."""
    w = group.section("weights")
    if w is None:
        raise KernelsightError(f"{group.source}: missing field {group.prefix + 'weights'!r}")
    bits, kind = w("num_bits", "pos"), w("type", "str")
    strategy = w("strategy", "str", default="tensor")
    acts = group.section("input_activations")
    if bits == 8 and kind == "float" and acts is not None:
        if strategy in ("tensor", "channel"):
            return "fp8"
        if strategy == "block":
            if w.raw("block_structure") != [128, 128]:
                w.fail("block_structure", "only 128x128 blocks are priced (fp8_block)")
            return "fp8_block"
        w.fail("strategy", "fp8 weights are priced per tensor, per channel or in 128x128 blocks")
    if bits == 4 and kind == "int" and acts is None:
        if strategy != "group" or w.raw("group_size") != 128:
            w.fail("group_size", "int4 weights are priced as w4a16: strategy 'group' with group_size 128")
        return "w4a16"
    if bits == 4 and kind == "float" and acts is not None:
        if w.raw("group_size") != 16:
            w.fail("group_size", "NVFP4 scales groups of 16 weights: must be 16")
        return "nvfp4"
    w.fail("num_bits", f"num_bits {bits} type {kind!r} with {'no ' if acts is None else ''}quantized activations is "
                       f"not supported; supported: fp8 (tensor, channel, 128x128 block), int4 w4a16 (group 128), nvfp4")


def _excluded(model, formats: dict, q: HfReader, keys: list[str]) -> dict:
    """formats with every component the exclusion lists cover wholly left in the activation dtype."""
    out = dict(formats)
    for key in keys:
        patterns = _Patterns(q.strings(key), f"{q.source}: field {q.prefix + key!r}")
        for component in list(out):
            covered = _coverage(model, component, patterns, q, key)
            if covered == "all":
                out[component] = model.act_dtype
    return out


# Checkpoint module names of each component under one layer (`{e}`: an expert index), as each architecture's
# checkpoints name them; exclusion patterns are matched against them.
_MODULES = {
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attention_out": ("self_attn.o_proj",),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "experts": ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj", "mlp.experts.{e}.down_proj"),
    "shared_experts": ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj"),
}
_ARCH_MODULES = {
    "Phi3ForCausalLM": {"attention": ("self_attn.qkv_proj",), "mlp": ("mlp.gate_up_proj", "mlp.down_proj")},
    "MixtralForCausalLM": {"experts": ("block_sparse_moe.experts.{e}.w1", "block_sparse_moe.experts.{e}.w2",
                                       "block_sparse_moe.experts.{e}.w3")},
    "MiniMaxM2ForCausalLM": {"experts": ("block_sparse_moe.experts.{e}.w1", "block_sparse_moe.experts.{e}.w2",
                                         "block_sparse_moe.experts.{e}.w3")},
    "GptOssForCausalLM": {"experts": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")},
    "Glm4ForCausalLM": {"mlp": ("mlp.gate_up_proj", "mlp.down_proj")},
    # Granite-MoE stores every expert of a layer in one tensor (input_linear: gate and up, output_linear: down)
    "GraniteMoeForCausalLM": {"experts": ("block_sparse_moe.input_linear", "block_sparse_moe.output_linear")},
    "GraniteMoeSharedForCausalLM": {
        "experts": ("block_sparse_moe.input_linear", "block_sparse_moe.output_linear"),
        "shared_experts": ("shared_mlp.input_linear", "shared_mlp.output_linear")},
    "Llama4ForConditionalGeneration": {
        "mlp": ("feed_forward.gate_proj", "feed_forward.up_proj", "feed_forward.down_proj"),
        "experts": ("feed_forward.experts.{e}.gate_proj", "feed_forward.experts.{e}.up_proj",
                    "feed_forward.experts.{e}.down_proj"),
        "shared_experts": ("feed_forward.shared_expert.gate_proj", "feed_forward.shared_expert.up_proj",
                           "feed_forward.shared_expert.down_proj")},
}
_LAYER_PREFIX = {"Llama4ForConditionalGeneration": "language_model.model.layers."}


def _module_names(model, component: str) -> list[str]:
    """Full checkpoint names of a component's modules in every layer that has it (first and last expert)."""
    names = _ARCH_MODULES.get(model.architecture, {}).get(component, _MODULES[component])
    if model.mla and component == "attention":
        names = (("self_attn.q_a_proj", "self_attn.q_b_proj") if model.mla.q_lora_rank else ("self_attn.q_proj",)) \
            + ("self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj")
    prefix = _LAYER_PREFIX.get(model.architecture, "model.layers.")
    plan = model.layer_plan()
    layers = [i for i, p in enumerate(plan)
              if component in ("attention", "attention_out") or p.moe == (component != "mlp")]
    experts = sorted({0, model.moe.experts - 1}) if model.moe else [0]
    return [f"{prefix}{i}.{n.format(e=e)}" for i in layers for n in names for e in experts]


def _coverage(model, component: str, patterns: "_Patterns", q: HfReader, key: str) -> str:
    """'all', 'none' of a component's modules match the patterns; a part of them is refused in one line."""
    names = _module_names(model, component)
    hits = sum(map(patterns.match, names))
    if hits == len(names):
        return "all"
    if hits:
        raise KernelsightError(f"{q.source}: field {q.prefix + key!r} names {hits} of the {len(names)} checkpoint "
                               f"modules of component {component!r}: a format per layer or module is not modelled "
                               f"(only per component)")
    return "none"


class _Patterns:
    """Module-name patterns as vLLM's quantization configs match them: 're:<regex>' (compressed-tensors,
    re.match), shell wildcards (ModelOpt's fnmatch, on the name or a parent module) and plain dotted names
    matching a module, one of its parents or a dotted part of its name ('lm_head', 'self_attn',
    'layers.0.mlp.gate'). A language model's names match under each prefix checkpoints give them: with or
    without Llama-4's 'language_model.', and 'model.layers.' also as vision-language checkpoints name it
    ('model.language_model.layers.' in Qwen-VL, 'language_model.model.layers.' in Mistral-3)."""

    def __init__(self, patterns: list[str], where: str):
        self.plain = [f".{p}." for p in patterns if not p.startswith("re:") and not any(c in p for c in "*?[")]
        globs = [fnmatch.translate(p) for p in patterns if not p.startswith("re:") and any(c in p for c in "*?[")]
        self.glob = re.compile("|".join(f"(?:{g})" for g in globs)) if globs else None
        self.regexes = []
        for p in patterns:
            if p.startswith("re:"):
                try:
                    self.regexes.append(re.compile(p[3:]))
                except re.error as exc:
                    raise KernelsightError(f"{where}: {p!r} is not a valid regular expression ({exc})") from None

    def match(self, name: str) -> bool:
        names = [name, name.removeprefix("language_model.")]
        if name.startswith("model.layers."):
            rest = name.removeprefix("model.")
            names += [f"model.language_model.{rest}", f"language_model.model.{rest}"]
        return any(self._match(n) for n in dict.fromkeys(names))

    def _match(self, name: str) -> bool:
        dotted = f".{name}."
        if any(p in dotted for p in self.plain):
            return True
        if any(r.match(name) for r in self.regexes):
            return True
        if self.glob is not None:
            parts = name.split(".")
            return any(self.glob.match(".".join(parts[:i])) for i in range(1, len(parts) + 1))
        return False
