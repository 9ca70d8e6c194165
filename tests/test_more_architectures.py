"""Granite, OLMo-2/3, OLMoE, Seed-OSS, GLM-4-0414 and Command-R from their config.json, as vLLM builds them."""
from __future__ import annotations

import pytest

from kernelsight.predictor.errors import KernelsightError
from kernelsight.sim.batch import StepBatch
from kernelsight.sim.engine_profile import load_engine
from kernelsight.sim.graph import step_kernels
from kernelsight.sim.model import from_hf
from kernelsight.sim.parallel import ParallelConfig, shard

# The published config.json files' fields the reader uses (ibm-granite/granite-3.3-8b-instruct,
# allenai/OLMo-2-1124-7B, allenai/OLMoE-1B-7B-0924, ByteDance-Seed/Seed-OSS-36B-Instruct, zai-org/GLM-4-32B-0414,
# ibm-granite/granite-3.1-3b-a800m-instruct), with their cards' parameter counts (total, active without the
# embedding and LM head where the card counts so).
CARDS = {
    "granite-3.3-8b": ({
        "architectures": ["GraniteForCausalLM"], "hidden_size": 4096, "intermediate_size": 12800,
        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 49159,
        "max_position_embeddings": 131072, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125, "logits_scaling": 16.0}, 8.17e9, None),
    "olmo-2-7b": ({
        "architectures": ["Olmo2ForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
        "torch_dtype": "float32"}, 7.30e9, None),
    "olmoe-1b-7b": ({
        "architectures": ["OlmoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 1024,
        "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 50304,
        "max_position_embeddings": 4096, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False,
        "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}, 6.92e9, 1.28e9),
    "seed-oss-36b": ({
        "architectures": ["SeedOssForCausalLM"], "hidden_size": 5120, "intermediate_size": 27648,
        "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 155136, "max_position_embeddings": 524288, "attention_bias": True, "attention_out_bias": False,
        "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}, 36.15e9, None),
    "glm-4-32b-0414": ({
        "architectures": ["Glm4ForCausalLM"], "hidden_size": 6144, "intermediate_size": 23040,
        "num_hidden_layers": 61, "num_attention_heads": 48, "num_key_value_heads": 2, "head_dim": 128,
        "vocab_size": 151552, "max_position_embeddings": 32768, "attention_bias": True, "partial_rotary_factor": 0.5,
        "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}, 32.57e9, None),
    "granite-3.1-3b-a800m": ({
        "architectures": ["GraniteMoeForCausalLM"], "hidden_size": 1536, "intermediate_size": 512,
        "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 49155,
        "max_position_embeddings": 131072, "num_local_experts": 40, "num_experts_per_tok": 8,
        "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "bfloat16"}, 3.30e9, 0.81e9),
}
CARDS.update({
    "command-r-v01": ({   # CohereForAI/c4ai-command-r-v01
        "architectures": ["CohereForCausalLM"], "hidden_size": 8192, "intermediate_size": 22528,
        "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 256000,
        "max_position_embeddings": 8192, "hidden_act": "silu", "use_qk_norm": False, "logit_scale": 0.0625,
        "layer_norm_eps": 1e-05, "torch_dtype": "float16"}, 34.98e9, None),
    "command-r7b": ({   # CohereLabs/c4ai-command-r7b-12-2024
        "architectures": ["Cohere2ForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 256000,
        "max_position_embeddings": 8192, "hidden_act": "silu", "sliding_window": 4096, "sliding_window_pattern": 4,
        "logit_scale": 0.25, "torch_dtype": "bfloat16"}, 8.03e9, None),
})
ENGINE = load_engine("vllm_v1")
MIXED = StepBatch(prefill_new=(1000, 37), prefill_ctx=(0, 2048), decode_ctx=(100, 2000, 4097), prefill_sampled=1)


def _model(name, **changes):
    config = {**CARDS[name][0], **changes}
    return from_hf(config, name, f"{name}/config.json")


def _calls(model, tp=1, **par):
    calls = step_kernels(model, MIXED, ParallelConfig(name="test", tp=tp, **par), ENGINE)
    return {c.name: c for c in calls}


@pytest.mark.parametrize("name", sorted(CARDS))
def test_parameter_counts_match_the_model_cards(name):
    model = _model(name)
    _, total, active = CARDS[name]
    assert model.num_params() == pytest.approx(total, rel=0.01)
    if active is not None:   # OLMoE's card counts the embeddings in, Granite-MoE's leaves them out
        counts = model.param_counts()
        left_out = 0 if name.startswith("olmoe") else counts["embedding"] + counts.get("lm_head", 0)
        assert model.active_params() - left_out == pytest.approx(active, rel=0.02)


def test_attention_biases_norms_and_rotary_dims_as_vllm_builds_them():
    seed, glm = _model("seed-oss-36b"), _model("glm-4-32b-0414")
    # q/k/v bias only (o_proj none): Seed-OSS always, GLM-4 from attention_bias
    assert seed.attention_bias and seed.param_counts()["attn_bias"] == 64 * (80 + 2 * 8) * 128
    assert glm.param_counts()["attn_bias"] == 61 * (48 + 2 * 2) * 128
    assert not _model("glm-4-32b-0414", attention_bias=False).attention_bias
    # GLM-4: four norms per layer (Gemma's sandwich), RoPE on half of each head unless the config says otherwise
    assert glm.sandwich_norms and glm.rotary_dim == 64
    assert _model("glm-4-32b-0414", partial_rotary_factor=1.0).rotary_dim is None
    # OLMo-2 and OLMoE have no attention bias whatever the config says, OLMoE never ties its LM head
    assert not _model("olmo-2-7b", attention_bias=True).attention_bias
    assert not _model("olmoe-1b-7b", tie_word_embeddings=True).tied_embeddings
    granite = _model("granite-3.3-8b")
    assert (granite.qk_norm, granite.attention_bias, granite.tied_embeddings) == ("none", False, True)
    assert _model("granite-3.3-8b", attention_bias=None, bias=True).attention_bias   # Granite's older key


def test_olmo_norms_q_and_k_over_the_gathered_projection():
    olmo = _model("olmo-2-7b")
    assert olmo.qk_norm == "gathered"
    one = _calls(olmo)
    assert (one["q_norm"].cols["hidden"], one["k_norm"].cols["hidden"]) == (4096, 4096)
    assert not [n for n in one if "allgather" in n or "qk_norm_allreduce" in n]
    two = _calls(olmo, tp=2)   # every rank gathers both and norms the whole width
    assert (two["q_norm"].cols["hidden"], two["k_norm"].cols["hidden"]) == (4096, 4096)
    for x in ("q", "k"):
        gather = two[f"{x}_norm_allgather"]
        assert gather.family == "allgather" and gather.count == 32
        assert gather.cols == {"msg_bytes": 1040 * 2 * 16 * 128 * 2, "world_size": 2, "link": "nvlink",
                               "dtype": "bf16"}
    assert shard(olmo, ParallelConfig(name="test", tp=2)).heads == 16


def test_olmoe_and_granite_moe_route_every_layer_and_refuse_what_is_not_modelled():
    olmoe, granite = _model("olmoe-1b-7b"), _model("granite-3.1-3b-a800m")
    assert (olmoe.moe.experts, olmoe.moe.top_k, olmoe.moe.intermediate, olmoe.moe.shared_intermediate) == (64, 8, 1024, 0)
    assert (granite.moe.experts, granite.moe.top_k, granite.moe.intermediate) == (40, 8, 512)
    assert olmoe.moe_layers == 16 and granite.moe_layers == 32 and olmoe.intermediate == granite.intermediate == 0
    assert _calls(olmoe)["experts"].cols["experts"] == 64
    shared = from_hf({**CARDS["granite-3.1-3b-a800m"][0], "architectures": ["GraniteMoeSharedForCausalLM"],
                      "shared_intermediate_size": 1024}, "gs", "gs/config.json")
    assert shared.moe.shared_intermediate == 1024 and not shared.moe.shared_gate
    with pytest.raises(KernelsightError, match=r"^model olmoe-1b-7b with tp=2: attention_dp=2: the q/k norm's TP "
                                               r"all-gathers"):
        shard(olmoe, ParallelConfig(name="test", tp=2, attention_dp=2, ep=4))
    assert shard(olmoe, ParallelConfig(name="test", tp=1, attention_dp=2, ep=2)).experts == 32
    with pytest.raises(KernelsightError, match=r"^g/config.json: field 'layer_types': Granite's per-layer sliding "
                                               r"windows"):
        from_hf({**CARDS["granite-3.3-8b"][0], "layer_types": ["full_attention"] * 40}, "g", "g/config.json")


def test_olmo3_slides_on_three_layers_of_four():
    olmo3 = from_hf({**CARDS["olmo-2-7b"][0], "architectures": ["Olmo3ForCausalLM"]}, "o3", "o3/config.json")
    assert [i for i, p in enumerate(olmo3.layer_plan()) if p.window == 0] == list(range(3, 32, 4))
    assert {k.name: (k.count, k.window) for k in olmo3.attention_kinds()} == {"sliding": (24, 4096), "full": (8, 0)}
    types = ["sliding_attention"] * 32
    assert from_hf({**CARDS["olmo-2-7b"][0], "architectures": ["Olmo3ForCausalLM"], "layer_types": types,
                    "sliding_window": 512}, "o3", "o3/config.json").sliding_layers == "all"
    assert _model("olmo-2-7b", sliding_window=4096).sliding_window == 0   # OLMo-2 has no sliding layers


def test_checkpoint_module_names_of_their_quantized_checkpoints():
    """Exclusion lists name the modules as these checkpoints store them: Granite-MoE's experts of a layer in one
    tensor pair (block_sparse_moe.input_linear / output_linear), GLM-4's MLP as a merged gate_up_proj."""
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    granite = _model("granite-3.1-3b-a800m", quantization_config={
        **fp8, "modules_to_not_convert": ["lm_head", "re:.*block_sparse_moe.*"]})
    assert (granite.weight_dtype, granite.weight_format("experts")) == ("bf16", "bf16")
    assert granite.weight_format("attention") == "fp8_block"
    glm = _model("glm-4-32b-0414", quantization_config={**fp8, "modules_to_not_convert": ["mlp.gate_up_proj",
                                                                                            "mlp.down_proj"]})
    assert (glm.weight_format("mlp"), glm.weight_format("attention")) == ("bf16", "fp8_block")
    with pytest.raises(KernelsightError, match=r"names 61 of the 122 checkpoint modules of component 'mlp'"):
        _model("glm-4-32b-0414", quantization_config={**fp8, "modules_to_not_convert": ["mlp.gate_up_proj"]})


def test_command_r_runs_attention_and_mlp_from_one_layernorm():
    """Cohere's parallel block: one weight-only LayerNorm per layer (plus the final one), the LM head tied to the
    embedding whatever the config says, per-head q/k LayerNorm when use_qk_norm."""
    r = _model("command-r-v01", tie_word_embeddings=False)
    assert (r.norm, r.parallel_block, r.tied_embeddings, r.qk_norm) == ("layer", True, True, "none")
    calls = _calls(r)
    norms = {n: c for n, c in calls.items() if c.family == "norm"}
    assert {n: c.count for n, c in norms.items()} == {"add_layernorm": 40, "layernorm": 1}
    assert all(c.cols["op"] == "layer" for c in norms.values())
    llama_like = _calls(_model("command-r-v01", architectures=["LlamaForCausalLM"]))   # two norms a layer
    assert llama_like["add_rmsnorm"].count == 80
    assert _model("command-r-v01", use_qk_norm=True).qk_norm == "head"
    assert not _model("command-r-v01", attention_bias=True).attention_bias   # vLLM builds it without a bias


def test_command_r7b_slides_with_rope_on_three_layers_and_attends_globally_without_on_the_fourth():
    r7 = _model("command-r7b")
    assert [i for i, p in enumerate(r7.layer_plan()) if p.window == 0] == list(range(3, 32, 4))
    assert [i for i, p in enumerate(r7.layer_plan()) if not p.rope] == list(range(3, 32, 4))
    assert {k.name: (k.count, k.window) for k in r7.attention_kinds()} == {"sliding": (24, 4096), "full": (8, 0)}
    assert _calls(r7)["rope"].count == 24
    default = _model("command-r7b", sliding_window_pattern=None)   # Cohere2Config's default pattern: 4
    assert default.layer_plan() == r7.layer_plan()
