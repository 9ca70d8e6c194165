"""Model configs, parallel layouts and KV-cache sizing: shipped files, published numbers, bad input."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from kernelsight.predictor.errors import KernelsightError
from kernelsight.predictor.hardware import load_hardware
from kernelsight.sim.engine_profile import load_engine, vllm_batch_defaults
from kernelsight.sim.kv_cache import SlidingGroups
from kernelsight.sim.memory import GiB, kv_cache_blocks, kv_groups, memory_plan
from kernelsight.sim.model import ModelConfig, from_hf, list_models, load_hf_config, load_model, model_dir
from kernelsight.sim.parallel import ParallelConfig, load_parallel, shard, weight_bytes_per_gpu


PROVENANCE = ("name", "hf_repo", "hf_config")

# Published parameter counts (model cards): total and, for MoE, activated per token (None: the card gives a
# rounded figure only). Llama-4's totals include the vision encoder, which the text config leaves out (~1 %).
PUBLISHED = {
    "llama3.1-8b": (8.03e9, None),
    "llama3.1-70b": (70.6e9, None),
    "llama3.1-405b": (405.9e9, None),
    "qwen3-8b": (8.2e9, None),
    "qwen3-32b": (32.8e9, None),
    "mistral-7b": (7.25e9, None),
    "gemma2-9b": (9.24e9, None),
    "phi-4": (14.7e9, None),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "qwen3-30b-a3b-fp8": (30.5e9, 3.3e9),
    "qwen3-235b-a22b": (235e9, 22e9),
    "qwen3-235b-a22b-fp8": (235e9, 22e9),
    "qwen3-235b-a22b-nvfp4": (235e9, 22e9),
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "mixtral-8x22b": (141e9, 39e9),
    "gpt-oss-20b": (20.91e9, 3.61e9),
    "gpt-oss-120b": (116.83e9, 5.13e9),
    "minimax-m2.5": (230e9, None),
    "deepseek-v3": (671e9, 37e9),
    "deepseek-r1": (671e9, 37e9),
    "deepseek-v3.1-nvfp4": (671e9, 37e9),
    "kimi-k2": (1.03e12, None),  # the Hub's safetensors count; the card rounds it to 1T total, 32B active
    "llama4-scout": (109e9, 17e9),
    "llama4-maverick": (400e9, 17e9),
}
# OpenAI counts a token's active parameters without the input embedding (a lookup, not a matmul).
ACTIVE_WITHOUT_EMBEDDING = ("gpt-oss-20b", "gpt-oss-120b")

LLAMA_8B_HF = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 128256,
}


def test_every_shipped_model_loads_and_matches_its_config_json():
    names = list_models()
    assert {"llama3.1-8b", "llama3.1-70b", "qwen3-8b", "qwen3-32b", "mistral-7b", "gemma2-9b", "phi-4",
            "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b"} <= set(names)
    compared = 0
    for name in names:
        model = load_model(name)
        assert model.name == name
        if model.hf_config is None:
            continue
        reference = load_hf_config(model_dir() / model.hf_config).as_dict()
        ours = model.as_dict()
        for field in PROVENANCE:
            ours.pop(field), reference.pop(field)
        assert ours == reference, name
        compared += 1
    assert compared >= 9


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_model_cards(name):
    total, active = PUBLISHED[name]
    model = load_model(name)
    assert model.num_params() == pytest.approx(total, rel=0.02)
    if model.moe is None:
        assert model.active_params() == model.num_params()
    if active is not None:
        ours = model.active_params()
        if name in ACTIVE_WITHOUT_EMBEDDING:
            ours -= model.param_counts()["embedding"]
        assert ours == pytest.approx(active, rel=0.02)


def test_fp8_checkpoints_set_weight_and_kv_dtypes(tmp_path):
    # ModelOpt layout: <stem>_config.json + <stem>_hf_quant_config.json (as in conf/model/hf), and the
    # plain config.json + hf_quant_config.json of a downloaded checkpoint directory.
    quant = {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
    (tmp_path / "nvidia--Llama-3.1-8B-FP8_config.json").write_text(json.dumps(LLAMA_8B_HF))
    (tmp_path / "nvidia--Llama-3.1-8B-FP8_hf_quant_config.json").write_text(json.dumps(quant))
    m = load_model(tmp_path / "nvidia--Llama-3.1-8B-FP8_config.json")
    assert (m.weight_dtype, m.kv_dtype, m.hf_repo) == ("fp8", "fp8", "nvidia/Llama-3.1-8B-FP8")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({**LLAMA_8B_HF, "quantization_config": {"quant_method": "fp8"}}))
    m = load_model(ckpt)
    assert (m.weight_dtype, m.kv_dtype) == ("fp8", "bf16")
    assert load_model("llama3.1-70b-fp8").kv_dtype == "fp8"
    # FP8 weights halve the linear layers, not the 16-bit embedding and LM head
    bf16, fp8 = load_model("llama3.1-70b"), load_model("llama3.1-70b-fp8")
    par = load_parallel("tp4")
    table = 2 * 2 * bf16.vocab * bf16.hidden / 4
    assert weight_bytes_per_gpu(fp8, par) == pytest.approx((weight_bytes_per_gpu(bf16, par) - table) / 2 + table,
                                                           rel=1e-3)


def test_hf_parsing_follows_vllm_defaults():
    m = from_hf({**LLAMA_8B_HF, "num_key_value_heads": None, "torch_dtype": "float32"}, "x--y", "mem")
    assert (m.kv_heads, m.head_dim, m.weight_dtype) == (32, 128, "bf16")
    gemma = from_hf({"architectures": ["Gemma2ForCausalLM"], "hidden_size": 3584, "num_attention_heads": 16,
                     "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
                     "num_hidden_layers": 42, "max_position_embeddings": 8192, "hidden_act": "gelu_pytorch_tanh",
                     "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096,
                     "final_logit_softcapping": 30.0, "torch_dtype": "float32"}, "google--gemma-2-9b", "mem")
    shipped = load_model("gemma2-9b").as_dict()
    ours = gemma.as_dict()
    for field in PROVENANCE:
        ours.pop(field), shipped.pop(field)
    assert ours == shipped
    kinds = {k.name: (k.count, k.window) for k in gemma.attention_kinds()}
    assert kinds == {"sliding": (21, 4096), "full": (21, 0)}


def test_unsupported_architecture_is_refused_by_name(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_8B_HF, "architectures": ["Qwen3NextForCausalLM"]}))
    with pytest.raises(KernelsightError, match="'Qwen3NextForCausalLM' is not supported: its Gated DeltaNet "
                                               "linear-attention layers have no measured kernel family") as e:
        load_model(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    with pytest.raises(KernelsightError, match=r"'Qwen9ForCausalLM' is not supported \(did you mean"):
        from_hf({**LLAMA_8B_HF, "architectures": ["Qwen9ForCausalLM"]}, "x", "cfg")
    with pytest.raises(KernelsightError, match=r"^cfg: architecture \['x'\] is not supported"):
        from_hf({**LLAMA_8B_HF, "architectures": [["x"]]}, "x", "cfg")  # a list where a class name belongs
    with pytest.raises(KernelsightError, match="'quantization_config.quant_method' = 'bitsandbytes' is not supported"):
        from_hf({**LLAMA_8B_HF, "quantization_config": {"quant_method": "bitsandbytes"}}, "x", "cfg")


def _yaml_error(tmp_path, **changes) -> str:
    data = load_model("llama3.1-8b").as_dict()
    for key, value in changes.items():
        if value is None and key.startswith("drop_"):
            data.pop(key.removeprefix("drop_"))
        else:
            data[key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(KernelsightError) as e:
        load_model(path)
    message = str(e.value)
    assert "\n" not in message and "bad.yaml" in message
    return message


def test_bad_model_yaml_gets_one_line_naming_file_and_field(tmp_path):
    assert "unknown field 'hidden_sise'" in _yaml_error(tmp_path, hidden_sise=4096)
    assert "missing field 'vocab'" in _yaml_error(tmp_path, drop_vocab=None)
    assert "'kv_heads'" in _yaml_error(tmp_path, kv_heads=5)
    assert "'sliding_layers'" in _yaml_error(tmp_path, sliding_window=4096)
    assert "'moe'" in _yaml_error(tmp_path, moe={"experts": 8, "top_k": 2, "intermediate": 1024})
    assert "'architecture'" in _yaml_error(tmp_path, architecture="GPT2LMHeadModel")
    assert "'layers'" in _yaml_error(tmp_path, layers=-3)
    with pytest.raises(KernelsightError, match="unknown model 'llama3.1-8'.*did you mean 'llama3.1-8b'"):
        load_model("llama3.1-8")


def test_tensor_parallel_shards_and_kv_head_replication():
    llama70 = load_model("llama3.1-70b")
    s = shard(llama70, ParallelConfig("tp16", tp=16))
    assert (s.heads, s.kv_heads) == (4, 1)  # 8 KV heads over 16 GPUs: each keeps one (replicated)
    with pytest.raises(KernelsightError, match="tp=4 does not divide the 10 KV heads"):
        shard(load_model("phi-4"), load_parallel("tp4"))
    gqa12 = ModelConfig(**{**vars(load_model("llama3.1-8b")), "heads": 48, "kv_heads": 12})
    with pytest.raises(KernelsightError, match="tp=16 is not a multiple of the 12 KV heads"):
        shard(gqa12, ParallelConfig("tp16", tp=16))
    with pytest.raises(KernelsightError, match="tp=3 does not divide the 32 attention heads"):
        shard(load_model("llama3.1-8b"), ParallelConfig("tp3", tp=3))
    with pytest.raises(KernelsightError, match="ep=16 does not divide the 8 experts"):
        shard(load_model("mixtral-8x7b"), ParallelConfig("x", tp=16, ep=16))
    with pytest.raises(KernelsightError, match="'ep' = 4 must divide tp x attention_dp = 2"):
        ParallelConfig.from_mapping({"name": "x", "tp": 2, "ep": 4}, "conf/parallel/x.yaml")
    with pytest.raises(KernelsightError, match="unknown field 'tensor_parallel'"):
        ParallelConfig.from_mapping({"name": "x", "tensor_parallel": 2}, "conf/parallel/x.yaml")
    assert load_parallel("default") == ParallelConfig("default", source="conf/parallel/default.yaml")


def test_weight_bytes_per_gpu():
    llama = load_model("llama3.1-8b")
    assert weight_bytes_per_gpu(llama, load_parallel("default")) == 2 * llama.num_params()
    # vLLM logs "Model loading took 14.99 GiB" for Llama-3.1-8B in bf16 (weights plus small buffers)
    assert weight_bytes_per_gpu(llama, load_parallel("default")) / GiB == pytest.approx(14.99, abs=0.05)
    tp2 = weight_bytes_per_gpu(llama, load_parallel("tp2"))
    assert tp2 == pytest.approx(weight_bytes_per_gpu(llama, load_parallel("default")) / 2, rel=0.01)
    # expert parallelism moves whole experts, tensor parallelism slices them: same bytes per GPU
    qwen = load_model("qwen3-30b-a3b")
    assert weight_bytes_per_gpu(qwen, load_parallel("tp4_ep4")) == pytest.approx(
        weight_bytes_per_gpu(qwen, load_parallel("tp4")), rel=1e-9)
    # pipeline stages hold half the layers; the first keeps the embedding, the last the LM head
    pp = weight_bytes_per_gpu(load_model("llama3.1-70b"), ParallelConfig("pp2", tp=2, pp=2))
    assert pp == pytest.approx(weight_bytes_per_gpu(load_model("llama3.1-70b"), load_parallel("tp4")),
                               rel=0.02)


def test_kv_blocks_of_llama_8b_on_h100_match_vllm_logs():
    """vLLM start-up logs for Llama-3(.1)-8B in bf16 on one 80 GB H100, gpu_memory_utilization 0.9,
    block size 16, found with the search tool (quoted in public repositories and NVIDIA's NVCF NIM docs):
      V0 profiling: "total_gpu_memory (79.15GiB) x gpu_memory_utilization (0.90) = 71.23GiB ... model weights
        take 14.99GiB; non_torch_memory takes 0.11GiB; PyTorch activation peak memory takes 1.20GiB; the rest
        of the memory reserved for KV Cache is 54.93GiB." -> "# GPU blocks: 28123, # CPU blocks: 2048"
      NVCF llama3-8b-instruct NIM example log (vLLM 0.4.1): "# GPU blocks: 27793"
    i.e. about 28,000 blocks (448k tokens)."""
    hw = load_hardware("h100_sxm")
    plan = memory_plan(load_model("llama3.1-8b"), hw, load_engine("vllm_v1"), load_parallel("default"))
    assert plan.blocks == pytest.approx(28_000, rel=0.10)
    assert plan.total / GiB == pytest.approx(79.15, abs=0.2)
    assert plan.activations / GiB == pytest.approx(1.2, abs=0.3)
    assert plan.block_bytes == 16 * 32 * 2 * 8 * 128 * 2


def test_kv_blocks_scale_with_memory_dtype_and_layout():
    hw, engine = load_hardware("h100_sxm"), load_engine("vllm_v1")
    llama = load_model("llama3.1-8b")
    bf16 = kv_cache_blocks(llama, hw, engine, load_parallel("default"))
    fp8 = kv_cache_blocks(ModelConfig(**{**vars(llama), "kv_dtype": "fp8"}), hw, engine, load_parallel("default"))
    assert fp8 == pytest.approx(2 * bf16, rel=0.001)
    h200 = kv_cache_blocks(llama, load_hardware("h200_sxm"), engine, load_parallel("default"))
    assert h200 > 1.9 * bf16  # 141 GB instead of 80 GB, the same 16.7 GiB of weights and activations
    # 70B at TP2 barely fits: a few GiB of KV cache, as vLLM reports
    plan = memory_plan(load_model("llama3.1-70b"), hw, engine, load_parallel("tp2"))
    assert 1 < plan.kv_cache / GiB < 5


@pytest.mark.parametrize("name, size, groups, window, chunked, parallel", [
    ("gpt-oss-120b", 18, 1, 128, False, "default"),    # 18 sliding + 18 full layers: one group each
    ("gemma2-9b", 21, 1, 4096, False, "default"),
    ("gemma-3-27b", 10, 6, 1024, False, "default"),    # 52 sliding, 10 full: groups of 10, the last one padded
    ("gemma-3-1b", 4, 6, 512, False, "default"),       # 22 sliding, 4 full
    ("llama4-scout", 12, 3, 8192, True, "tp8"),        # 36 chunked local attention, 12 NoPE full layers
])
def test_local_attention_layers_form_vllm_hybrid_kv_groups(name, size, groups, window, chunked, parallel):
    """vLLM's hybrid allocator (kv_cache_utils._get_kv_cache_groups_uniform_page_size): a block spans one
    group's layers, so the pool has layers / group size times the blocks of one spanning every layer; the
    sliding (or chunked) groups keep only their window (chunk). Off (--disable-hybrid-kv-cache-manager)
    every layer keeps every token, as in models without local attention."""
    hw, par = load_hardware("h100_sxm"), load_parallel(parallel)
    engine = load_engine("vllm_v1").on_gpu(hw)
    model = load_model(name)
    budget = engine.scheduler.max_num_batched_tokens
    assert kv_groups(model, engine) == (size, SlidingGroups(groups, window, budget, chunked))
    hybrid = memory_plan(model, hw, engine, par)
    off = replace(engine, scheduler=replace(engine.scheduler, hybrid_kv_cache=False))
    assert kv_groups(model, off) == (model.layers, None)
    assert hybrid.blocks == pytest.approx(memory_plan(model, hw, off, par).blocks * model.layers / size, rel=1e-3)
    assert kv_groups(load_model("llama3.1-8b"), engine) == (32, None)


def test_model_that_does_not_fit_is_one_line_with_the_numbers():
    with pytest.raises(KernelsightError) as e:
        memory_plan(load_model("llama3.1-70b"), load_hardware("h100_sxm"), load_engine("vllm_v1"),
                    load_parallel("default"))
    message = str(e.value)
    assert "\n" not in message
    assert "does not fit on h100_sxm: 131.4 GiB of weights per GPU at tp=1" in message
    assert "71.3 GiB usable" in message
    assert "at least parallel.tp=2)" in message   # 131.4 GiB over two GPUs fits 71.3 each
    with pytest.raises(KernelsightError, match=r"at least parallel.tp=4\)"):  # 199 GiB: two GPUs are not enough
        memory_plan(load_model("glm-4.5-air"), load_hardware("h100_sxm"), load_engine("vllm_v1"),
                    load_parallel("default"))


def test_engine_profile_schema_refuses_bad_values(tmp_path):
    engine = yaml.safe_load((model_dir().parent / "engine" / "vllm_v1.yaml").read_text())
    assert load_engine("vllm_v1").scheduler.max_num_batched_tokens is None     # auto: set per GPU
    path = tmp_path / "e.yaml"
    engine["scheduler"]["max_num_seqs"] = "many"
    path.write_text(yaml.safe_dump(engine))
    with pytest.raises(KernelsightError, match="'scheduler.max_num_seqs' = 'many': must be an integer or 'auto'"):
        load_engine(path)
    engine["scheduler"]["max_num_seqs"] = "auto"
    engine["scheduler"]["gpu_memory_utilization"] = 1.5
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(engine))
    with pytest.raises(KernelsightError, match="'scheduler.gpu_memory_utilization' = 1.5: must be in"):
        load_engine(path)
    engine["scheduler"]["gpu_memory_utilization"] = 0.9
    engine["cuda_graph"]["capture_sizes"] = [1, 4, 2]
    path.write_text(yaml.safe_dump(engine))
    with pytest.raises(KernelsightError, match="strictly increasing"):
        load_engine(path)
    engine["cuda_graph"]["capture_sizes"] = [1, 2, 4]
    engine["frontend"]["jitter_ms"] = -3
    path.write_text(yaml.safe_dump(engine))
    with pytest.raises(KernelsightError, match="'frontend.jitter_ms' = -3"):
        load_engine(path)
    del engine["frontend"]
    path.write_text(yaml.safe_dump(engine))
    with pytest.raises(KernelsightError, match="frontend"):
        load_engine(path)


@pytest.mark.parametrize("gpu, limits", [("h100_sxm", (8192, 1024)), ("h200_sxm", (8192, 1024)),
                                         ("mi300x", (8192, 1024)), ("b200_sxm", (8192, 1024)),
                                         ("a100_sxm", (2048, 256)), ("l40s", (2048, 256)), ("l4", (2048, 256))])
def test_batch_limits_left_auto_take_vllm_serve_defaults_per_gpu(gpu, limits):
    """EngineArgs.get_batch_defaults (OPENAI_API_SERVER): GPUs of >= 70 GiB that are not A100s get 8192
    tokens and 1024 sequences, the others 2048 and 256; a limit given keeps its value."""
    hw = load_hardware(gpu)
    assert vllm_batch_defaults(hw) == limits
    engine = load_engine("vllm_v1").on_gpu(hw)
    assert (engine.scheduler.max_num_batched_tokens, engine.scheduler.max_num_seqs) == limits
    given = replace(load_engine("vllm_v1"), scheduler=replace(load_engine("vllm_v1").scheduler,
                                                              max_num_batched_tokens=4096)).on_gpu(hw)
    assert (given.scheduler.max_num_batched_tokens, given.scheduler.max_num_seqs) == (4096, limits[1])
    assert given.on_gpu(hw) is given


def test_a_given_limit_that_conflicts_with_the_gpu_default_is_one_line():
    engine = load_engine("vllm_v1")
    many = replace(engine, scheduler=replace(engine.scheduler, max_num_seqs=4096))
    with pytest.raises(KernelsightError, match=r"max_num_batched_tokens = 2048 \(vLLM's default on l40s\) must be "
                                               r">= scheduler.max_num_seqs = 4096; set both"):
        many.on_gpu(load_hardware("l40s"))


def _hf_error(tmp_path, **changes) -> str:
    """The one-line error of loading LLAMA_8B_HF with `changes` (None deletes a key) from a config.json."""
    config = {k: v for k, v in {**LLAMA_8B_HF, **changes}.items() if v is not None or k not in changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(KernelsightError) as e:
        load_model(tmp_path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message, message
    return message


def test_hf_config_fields_are_type_checked_in_one_line_naming_the_field(tmp_path):
    assert "field 'num_hidden_layers' = -4: must be >= 1" in _hf_error(tmp_path, num_hidden_layers=-4)
    assert "field 'hidden_size' = 0: must be >= 1" in _hf_error(tmp_path, hidden_size=0)
    assert "field 'num_hidden_layers' = '32': must be an integer" in _hf_error(tmp_path, num_hidden_layers="32")
    assert "field 'num_hidden_layers' = True: must be an integer" in _hf_error(tmp_path, num_hidden_layers=True)
    assert "field 'vocab_size' = 3.5: must be an integer" in _hf_error(tmp_path, vocab_size=3.5)
    assert "missing field 'max_position_embeddings'" in _hf_error(tmp_path, max_position_embeddings=None)
    assert "field 'tie_word_embeddings' = 'no': must be true or false" in _hf_error(tmp_path,
                                                                                    tie_word_embeddings="no")
    assert "field 'hidden_act' = ['silu']" in _hf_error(tmp_path, hidden_act=["silu"])
    assert "field 'sliding_window' = -1" in _hf_error(tmp_path, architectures=["MistralForCausalLM"],
                                                      sliding_window=-1)
    assert "field 'quantization_config' = 'fp8': must be a mapping" in _hf_error(tmp_path,
                                                                                 quantization_config="fp8")
    assert "field 'torch_dtype' = {}" in _hf_error(tmp_path, torch_dtype={})
    assert "field 'architectures'" in _hf_error(tmp_path, architectures="LlamaForCausalLM")
    mixtral = {"architectures": ["MixtralForCausalLM"], "num_local_experts": 8, "num_experts_per_tok": 2}
    assert "missing field 'num_local_experts'" in _hf_error(tmp_path, **{**mixtral, "num_local_experts": None})
    assert "field 'num_experts_per_tok' = 9: exceeds num_local_experts = 8" in _hf_error(
        tmp_path, **{**mixtral, "num_experts_per_tok": 9})


def test_hf_head_sizes_must_be_consistent(tmp_path):
    assert "field 'num_key_value_heads' = 5: does not divide num_attention_heads = 32" in _hf_error(
        tmp_path, num_key_value_heads=5)
    assert "field 'num_key_value_heads' = 64" in _hf_error(tmp_path, num_key_value_heads=64)
    assert "field 'hidden_size' = 4100: not divisible by num_attention_heads = 32" in _hf_error(tmp_path,
                                                                                                hidden_size=4100)
    # an explicit head_dim (Gemma-2, Qwen3) need not be hidden / heads
    m = from_hf({**LLAMA_8B_HF, "hidden_size": 4100, "head_dim": 128}, "x", "mem")
    assert (m.hidden, m.head_dim) == (4100, 128)


def test_yaml_counts_refuse_strings_bools_and_fractions(tmp_path):
    assert "field 'layers' = '32': must be an integer" in _yaml_error(tmp_path, layers="32")
    assert "field 'layers' = True: must be an integer" in _yaml_error(tmp_path, layers=True)
    assert "field 'heads' = 3.5: must be an integer" in _yaml_error(tmp_path, heads=3.5)
    assert "field 'vocab' = inf: must be an integer" in _yaml_error(tmp_path, vocab=float("inf"))


def test_rope_scaling_sets_the_context_limit_as_vllm_derives_it():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    qwen = from_hf({**LLAMA_8B_HF, "max_position_embeddings": 40960, "rope_scaling": yarn}, "x", "mem")
    assert (qwen.max_position, qwen.context_limit) == (40960, 131072)  # yarn scales the original length
    dynamic = from_hf({**LLAMA_8B_HF, "max_position_embeddings": 4096,
                       "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "x", "mem")  # legacy 'type' key
    assert dynamic.context_limit == 8192 and dynamic.derived_max_model_len == 8192
    llama = load_model("llama3.1-8b")  # rope_type llama3: max_position_embeddings is already the long context
    assert llama.context_limit == llama.max_position == 131072 and llama.derived_max_model_len is None
    with pytest.raises(KernelsightError, match=r"mem: field 'rope_scaling.factor' = -2: must be > 0"):
        from_hf({**LLAMA_8B_HF, "rope_scaling": {"rope_type": "linear", "factor": -2}}, "x", "mem")
    with pytest.raises(KernelsightError, match=r"missing field 'rope_scaling.original_max_position_embeddings'"):
        from_hf({**LLAMA_8B_HF, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "x", "mem")


def test_transformers_5_rope_parameters_set_the_context_limit_as_rope_scaling_does():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    qwen = from_hf({**LLAMA_8B_HF, "max_position_embeddings": 40960, "rope_parameters": yarn}, "x", "mem")
    assert qwen.context_limit == 131072
    per_type = {"full_attention": yarn, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert from_hf({**LLAMA_8B_HF, "max_position_embeddings": 40960, "rope_parameters": per_type},
                   "x", "mem").context_limit == 131072
    plain = from_hf({**LLAMA_8B_HF, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, "x", "mem")
    assert plain.context_limit == 131072 and plain.derived_max_model_len is None
    with pytest.raises(KernelsightError, match=r"mem: field 'rope_parameters.full_attention.factor' = 0: must be > 0"):
        from_hf({**LLAMA_8B_HF, "rope_parameters": {"full_attention": {**yarn, "factor": 0}}}, "x", "mem")


def test_max_model_len_follows_vllms_rule():
    import warnings

    from kernelsight.sim.context import exceeds_max_model_len, resolve_max_model_len

    llama = load_model("llama3.1-8b")
    assert resolve_max_model_len(llama, None) == 131072
    assert resolve_max_model_len(llama, 4096) == 4096
    with pytest.raises(KernelsightError) as e:
        resolve_max_model_len(llama, 200_000)
    message = str(e.value)
    assert "\n" not in message and "max_model_len=200000" in message and "131072" in message
    assert "allow_long_max_model_len=true" in message and "conf/model/llama3.1-8b.yaml" in message
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_max_model_len(llama, 200_000, allow_long_max_model_len=True) == 200_000
    assert len(caught) == 1 and "200000" in str(caught[0].message)
    for bad, needle in ((True, "max_model_len=True"), ("4096", "max_model_len='4096'"), (1, "max_model_len=1"),
                        (4096.5, "max_model_len=4096.5")):
        with pytest.raises(KernelsightError, match=needle):
            resolve_max_model_len(llama, bad)
    with pytest.raises(KernelsightError, match="allow_long_max_model_len='yes': must be true or false"):
        resolve_max_model_len(llama, 4096, allow_long_max_model_len="yes")
    # per request: prompt + output tokens above max_model_len is rejected, as vLLM's server does
    assert exceeds_max_model_len(4000, 97, 4096) and not exceeds_max_model_len(4000, 96, 4096)
    assert exceeds_max_model_len(4096, 1, 4096) and not exceeds_max_model_len(10**6, 1, None)


@pytest.mark.parametrize("changes, message", [
    ({"tp": True}, "parallel.tp=True: must be an integer >= 1"),
    ({"tp": 0}, "parallel.tp=0: must be an integer >= 1"),
    ({"pp": -2}, "parallel.pp=-2: must be an integer >= 1"),
    ({"ep": "2"}, "parallel.ep='2': must be an integer >= 1"),
    ({"dp": 2.0}, "parallel.dp=2.0: must be an integer >= 1"),
    ({"tp": 2, "ep": 4}, "field 'ep' = 4 must divide tp x attention_dp = 2"),
    ({"link": "nvlnk"}, "parallel.link='nvlnk': must be one of nvlink, pcie, net (did you mean 'nvlink'?)"),
    ({"net_gbs_per_gpu": 0}, "parallel.net_gbs_per_gpu=0: must be a number > 0"),
])
def test_parallel_layout_sizes_are_checked_however_it_is_built(changes, message):
    with pytest.raises(KernelsightError) as e:
        ParallelConfig("x", **changes)
    assert str(e.value) == message or str(e.value).startswith(message), str(e.value)
    with pytest.raises(KernelsightError, match=r"conf/parallel/x.yaml: field 'tp' = True: must be an integer"):
        ParallelConfig.from_mapping({"name": "x", "tp": True}, "conf/parallel/x.yaml")
    with pytest.raises(KernelsightError, match="pp=81 exceeds the 80 layers"):
        shard(load_model("llama3.1-70b"), ParallelConfig("x", tp=8, pp=81))


# -- the architectures of MoE, MLA and hybrid-attention models, and weight formats -----------------------------

def _raw(model) -> dict:
    """The shipped model's config.json (Llama-4: its text_config, with the top level's keys beside it)."""
    raw = json.loads((model_dir() / model.hf_config).read_text())
    return {**raw, **raw.get("text_config", {})}


def _card(name: str) -> dict:
    """The config.json a shipped model was written from (conf/model/hf), as the file holds it."""
    return json.loads((model_dir() / load_model(name).hf_config).read_text())


# Fields of the new architectures' YAML files against the raw config.json, key by key (independent of the parser).
RAW_FIELDS = {
    "GptOssForCausalLM": {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                          "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "vocab": "vocab_size",
                          "sliding_window": "sliding_window", "attention_bias": "attention_bias",
                          "moe.experts": "num_local_experts", "moe.top_k": "num_experts_per_tok",
                          "moe.intermediate": "intermediate_size"},
    "MiniMaxM2ForCausalLM": {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                             "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "rotary_dim": "rotary_dim",
                             "vocab": "vocab_size", "max_position": "max_position_embeddings",
                             "moe.experts": "num_local_experts", "moe.top_k": "num_experts_per_tok",
                             "moe.intermediate": "intermediate_size", "moe.scoring": "scoring_func"},
    "DeepseekV3ForCausalLM": {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                              "intermediate": "intermediate_size", "vocab": "vocab_size",
                              "max_position": "max_position_embeddings", "mla.q_lora_rank": "q_lora_rank",
                              "mla.kv_lora_rank": "kv_lora_rank", "mla.qk_nope_head_dim": "qk_nope_head_dim",
                              "mla.qk_rope_head_dim": "qk_rope_head_dim", "mla.v_head_dim": "v_head_dim",
                              "moe.experts": "n_routed_experts", "moe.top_k": "num_experts_per_tok",
                              "moe.intermediate": "moe_intermediate_size", "moe.first_dense": "first_k_dense_replace",
                              "moe.scoring": "scoring_func"},
    "Llama4ForConditionalGeneration": {"hidden": "hidden_size", "layers": "num_hidden_layers",
                                       "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
                                       "head_dim": "head_dim", "vocab": "vocab_size",
                                       "max_position": "max_position_embeddings",
                                       "attention_chunk": "attention_chunk_size", "moe.experts": "num_local_experts",
                                       "moe.top_k": "num_experts_per_tok", "moe.intermediate": "intermediate_size",
                                       "moe.shared_intermediate": "intermediate_size",
                                       "moe.every": "interleave_moe_layer_step"},
    "MixtralForCausalLM": {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                           "moe.experts": "num_local_experts", "moe.intermediate": "intermediate_size"},
    "Qwen3MoeForCausalLM": {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                            "moe.experts": "num_experts", "moe.intermediate": "moe_intermediate_size"},
    "LlamaForCausalLM": {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                         "kv_heads": "num_key_value_heads", "intermediate": "intermediate_size", "vocab": "vocab_size"},
}
NEW_MODELS = ("gpt-oss-20b", "gpt-oss-120b", "minimax-m2.5", "deepseek-v3", "deepseek-r1", "kimi-k2",
              "deepseek-v3.1-nvfp4", "llama4-scout", "llama4-maverick", "mixtral-8x22b", "qwen3-30b-a3b-fp8",
              "qwen3-235b-a22b-nvfp4", "llama3.1-405b")


@pytest.mark.parametrize("name", NEW_MODELS)
def test_new_architectures_take_their_sizes_from_config_json(name):
    model = load_model(name)
    raw = _raw(model)
    yaml_form = model.as_dict()
    for field, key in RAW_FIELDS[model.architecture].items():
        section, _, sub = field.partition(".")
        ours = yaml_form[section][sub] if sub else yaml_form[field]
        assert ours == raw[key], (name, field, key)
    if model.mla:  # vLLM's MLA: one KV head whose row is the latent plus the rotary key
        assert (model.kv_heads, model.head_dim) == (1, raw["kv_lora_rank"] + raw["qk_rope_head_dim"])
        assert model.moe.shared_intermediate == raw["n_shared_experts"] * raw["moe_intermediate_size"]
        assert (model.dense_layers, model.moe_layers) == (raw["first_k_dense_replace"],
                                                          raw["num_hidden_layers"] - raw["first_k_dense_replace"])


# Model cards' counts (total, active) of the models built from these configs, and what their active count leaves
# out: GLM counts neither the embedding nor the LM head, DeepSeek-V2-Lite not the embedding, Qwen1.5-MoE both in.
MORE_ARCHITECTURES = {
    "glm-4.5": (355e9, 32e9, ("embedding", "lm_head")),  # the total holds the MTP layer, which vLLM skips (~1 %)
    "glm-4.5-air": (106e9, 12e9, ("embedding", "lm_head")),
    "deepseek-v2-lite": (15.7e9, 2.4e9, ("embedding",)),
    "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9, ()),
}


def test_gemma3_from_its_sparse_config_json_and_its_five_local_layers_to_one_global():
    big = from_hf(_card("gemma-3-27b"), "g27", "g27/config.json")   # text_config lists only what differs
    assert big.num_params() == pytest.approx(27.4e9, rel=0.01)         # the card's count, vision tower included
    assert big.param_counts()["vision"] == pytest.approx(0.42e9, rel=0.03)  # SigLIP-So400m and its projector
    assert (big.vocab, big.tied_embeddings, big.activation, big.qk_norm, big.sandwich_norms) == (
        262208, True, "gelu_tanh_mul", "head", True)
    assert big.context_limit == 131072   # vLLM: Gemma-3's linear rope_scaling is already in max_position
    assert [i for i, p in enumerate(big.layer_plan()) if p.window == 0] == list(range(5, 62, 6))
    assert {k.name: (k.count, k.window) for k in big.attention_kinds()} == {"sliding": (52, 1024), "full": (10, 0)}
    small = from_hf(_card("gemma-3-1b"), "g1", "g1/config.json")
    assert small.num_params() == pytest.approx(1.0e9, rel=0.01) and small.vision_params == 0
    types = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(26)]
    assert from_hf({**_card("gemma-3-1b"), "layer_types": types}, "g1", "g1/config.json") == small
    with pytest.raises(KernelsightError, match=r"g1/config.json: field 'layer_types': sliding_attention on layers"):
        from_hf({**_card("gemma-3-1b"), "layer_types": ["full_attention"] * 3 + ["sliding_attention"] * 23},
                "g1", "g1/config.json")


@pytest.mark.parametrize("name", sorted(MORE_ARCHITECTURES))
def test_more_moe_architectures_from_their_config_json(name):
    raw = _card(name)
    model = from_hf(raw, name, f"{name}/config.json")
    total, active, left_out = MORE_ARCHITECTURES[name]
    counts = model.param_counts()
    assert model.num_params() == pytest.approx(total, rel=0.02)
    assert model.active_params() - sum(counts[k] for k in left_out) == pytest.approx(active, rel=0.04)
    arch = raw["architectures"][0]
    if arch == "Glm4MoeForCausalLM":  # GQA with a q/k/v bias, RoPE on half of head_dim, DeepSeek's MoE block
        assert (model.head_dim, model.rotary_dim, model.attention_bias) == (128, 64, True)
        assert model.qk_norm == ("head" if raw["use_qk_norm"] else "none")
        assert counts["attn_bias"] == raw["num_hidden_layers"] * (96 + 2 * 8) * 128  # no o_proj bias
        assert (model.moe.scoring, model.moe.shared_intermediate) == ("sigmoid", raw["moe_intermediate_size"])
        assert (model.dense_layers, model.intermediate) == (raw["first_k_dense_replace"], raw["intermediate_size"])
    elif arch == "DeepseekV2ForCausalLM":  # MLA without a query latent, softmax-scored experts
        assert (model.mla.q_lora_rank, model.kv_heads, model.head_dim) == (0, 1, 512 + 64)
        assert (model.moe.scoring, model.moe.shared_intermediate) == ("softmax", 2 * 1408)
    else:  # Qwen2-MoE: the shared expert behind a sigmoid gate, q/k/v bias, every layer a MoE layer
        assert model.moe.shared_gate and model.moe.shared_intermediate == raw["shared_expert_intermediate_size"]
        assert (model.moe_layers, model.intermediate, model.attention_bias) == (24, 0, True)


def test_qwen_moe_sparse_step_interleaves_dense_layers_and_listed_ones_are_refused():
    model = from_hf({**_card("qwen1.5-moe-a2.7b"), "decoder_sparse_step": 2}, "q", "q/config.json")
    assert [i for i, p in enumerate(model.layer_plan()) if p.moe] == list(range(1, 24, 2))
    assert model.intermediate == _card("qwen1.5-moe-a2.7b")["intermediate_size"]
    with pytest.raises(KernelsightError, match=r"q/config.json: field 'mlp_only_layers'"):
        from_hf({**_card("qwen1.5-moe-a2.7b"), "mlp_only_layers": [0, 3]}, "q", "q/config.json")
    with pytest.raises(KernelsightError, match=r"g/config.json: field 'partial_rotary_factor'"):
        from_hf({**_card("glm-4.5-air"), "partial_rotary_factor": 0.01}, "g", "g/config.json")


def test_layer_plans_of_hybrid_attention_and_interleaved_moe():
    oss = load_model("gpt-oss-120b")
    raw = _raw(oss)
    assert [p.window for p in oss.layer_plan()] == [128 if t == "sliding_attention" else 0 for t in raw["layer_types"]]
    assert {k.name: (k.count, k.window) for k in oss.attention_kinds()} == {"sliding": (18, 128), "full": (18, 0)}
    scout, maverick = load_model("llama4-scout"), load_model("llama4-maverick")
    # transformers' default no_rope_layers: every 4th layer (3, 7, ...) without RoPE, attending globally
    assert [i for i, p in enumerate(scout.layer_plan()) if not p.rope] == list(range(3, 48, 4))
    assert {k.name: (k.count, k.chunk) for k in scout.attention_kinds()} == {"chunked": (36, 8192), "full": (12, 0)}
    assert (scout.moe_layers, maverick.moe_layers, maverick.dense_layers) == (48, 24, 24)
    assert [i for i, p in enumerate(maverick.layer_plan()) if p.moe] == list(range(1, 48, 2))
    assert maverick.intermediate == _raw(maverick)["intermediate_size_mlp"]
    assert (scout.qk_norm, maverick.qk_norm) == ("head", "none")


def test_weight_formats_come_from_the_checkpoint_per_component():
    assert load_model("deepseek-v3").weight_dtype == "fp8_block"
    assert load_model("qwen3-235b-a22b-fp8").weight_dtype == "fp8_block"
    oss = load_model("gpt-oss-120b")  # mxfp4: vLLM quantizes the experts only
    assert {c: oss.weight_format(c) for c in oss.components()} == {
        "attention": "bf16", "attention_out": "bf16", "experts": "mxfp4"}
    nv = load_model("deepseek-v3.1-nvfp4")  # exclude_modules: q_a, q_b, kv_a, kv_b of every layer; o_proj is NVFP4
    assert {c: nv.weight_format(c) for c in nv.components()} == {
        "attention": "bf16", "attention_out": "nvfp4", "mlp": "nvfp4", "experts": "nvfp4", "shared_experts": "nvfp4"}
    assert nv.kv_dtype == "fp8"
    qwen = load_model("qwen3-235b-a22b-nvfp4")  # exclude_modules: router gates and lm_head only
    assert {qwen.weight_format(c) for c in qwen.components()} == {"nvfp4"} and qwen.kv_dtype == "fp8"
    assert load_model("minimax-m2.5").weight_dtype == "fp8_block"  # gate / lm_head left out: not components


def _quantized(quant: dict, base: dict | None = None) -> ModelConfig:
    return from_hf({**(base or LLAMA_8B_HF), "quantization_config": quant}, "x--y", "cfg.json")


QWEN_MOE_HF = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_attention_heads": 32,
               "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 4, "num_experts": 8,
               "num_experts_per_tok": 2, "moe_intermediate_size": 768, "vocab_size": 1000,
               "max_position_embeddings": 4096, "hidden_act": "silu", "torch_dtype": "bfloat16"}


def test_quantization_methods_map_to_weight_formats_as_vllm_reads_them():
    assert _quantized({"quant_method": "fp8", "activation_scheme": "dynamic"}).weight_dtype == "fp8"
    assert _quantized({"quant_method": "fp8", "weight_block_size": [128, 128]}).weight_dtype == "fp8_block"
    assert _quantized({"quant_method": "awq", "bits": 4, "group_size": 128}).weight_dtype == "w4a16"
    assert _quantized({"quant_method": "gptq", "bits": 4, "group_size": 128}).weight_dtype == "w4a16"
    opt = _quantized({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                      "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]})
    assert (opt.weight_dtype, opt.kv_dtype) == ("nvfp4", "fp8")

    def ct(weights, acts, **extra):
        return {"quant_method": "compressed-tensors", "format": "x", **extra,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}
    fp8_act = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
    assert _quantized(ct({"num_bits": 8, "type": "float", "strategy": "channel"}, fp8_act)).weight_dtype == "fp8"
    assert _quantized(ct({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
                         fp8_act)).weight_dtype == "fp8_block"
    assert _quantized(ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
                         None)).weight_dtype == "w4a16"
    fp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}
    m = _quantized(ct(fp4, {**fp4, "dynamic": "local"}, ignore=["lm_head", "re:.*self_attn.*"]))
    assert (m.weight_dtype, m.weight_format("attention"), m.weight_format("attention_out")) == ("nvfp4", "bf16", "bf16")
    # groups per component: int4 experts, fp8 attention
    moe = _quantized({"quant_method": "compressed-tensors", "config_groups": {
        "experts": {"targets": ["re:.*mlp.experts.*"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                                   "group_size": 128}},
        "attention": {"targets": ["re:.*self_attn.*"], "input_activations": fp8_act,
                      "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}},
        "ignore": ["lm_head"]}, QWEN_MOE_HF)
    assert {c: moe.weight_format(c) for c in moe.components()} == {
        "attention": "fp8", "attention_out": "fp8", "experts": "w4a16"}
    # modules_to_not_convert keeps a component 16-bit when it names it in every layer
    kept = _quantized({"quant_method": "fp8", "weight_block_size": [128, 128],
                       "modules_to_not_convert": ["model.layers.*.self_attn.o_proj", "lm_head"]})
    assert (kept.weight_format("attention"), kept.weight_format("attention_out")) == ("fp8_block", "bf16")


def test_memory_uses_each_components_bytes_and_mlas_latent_cache():
    from kernelsight.predictor.dtypes import BYTES
    oss = load_model("gpt-oss-120b")
    par = load_parallel("tp8")
    c = oss.param_counts()
    h, tp = oss.hidden, 8
    expected = (c["experts"] * BYTES["mxfp4"] / tp + c["expert_bias"] * 2 / tp  # experts over the 8 GPUs
                + (c["attn_q"] + c["attn_o"]) * 2 / tp + c["attn_kv"] * 2 / 8  # one of 8 KV heads per GPU
                + c["attn_bias"] * 2 + c["attn_sinks"] * 4 / tp + c["router"] * 2 + c["norms"] * 2
                + 2 * 2 * 201088 * h / tp)  # embedding and LM head (vocab padded to 64: 201088 already is)
    assert weight_bytes_per_gpu(oss, par) == pytest.approx(expected, rel=1e-9)
    # the same model in bf16 throughout: the experts are 2 / 0.53 times heavier, the rest the same
    bf16 = ModelConfig(**{**vars(oss), "weight_dtype": "bf16", "weight_formats": None})
    assert weight_bytes_per_gpu(bf16, par) - weight_bytes_per_gpu(oss, par) == pytest.approx(
        c["experts"] * (2 - BYTES["mxfp4"]) / tp, rel=1e-9)
    # MLA: one latent row (kv_lora_rank + qk_rope_head_dim) per token and layer, whole on every TP rank
    engine = load_engine("vllm_v1")
    from kernelsight.sim.memory import kv_block_bytes
    ds = load_model("deepseek-v3")
    for tp in (1, 8):
        assert kv_block_bytes(ds, engine, ParallelConfig("x", tp=tp)) == 16 * 61 * (512 + 64) * 2
    # weights of DeepSeek-V3 on 8 GPUs: ~671 GB of fp8 over 8, plus the replicated down-projections and the
    # 16-bit W_UK / W_UV copies vLLM keeps for the absorbed decode
    per_gpu = weight_bytes_per_gpu(ds, load_parallel("tp8_ep8")) / GiB
    assert 78 < per_gpu < 82
    plan = memory_plan(ds, load_hardware("h200_sxm"), engine, load_parallel("tp8_ep8"))
    assert plan.kv_tokens > 500_000  # the latent cache is small: about 70 KB per token over 61 layers


def test_hf_quantization_problems_are_one_line_naming_file_and_field(tmp_path):
    assert "field 'quantization_config.quant_method' = 'bitsandbytes' is not supported" in _hf_error(
        tmp_path, quantization_config={"quant_method": "bitsandbytes"})
    assert "missing field 'quantization_config.quant_method'" in _hf_error(tmp_path, quantization_config={"bits": 4})
    assert "field 'quantization_config.weight_block_size' = [128]: must be a list of two integers" in _hf_error(
        tmp_path, quantization_config={"quant_method": "fp8", "weight_block_size": [128]})
    assert "field 'quantization_config.weight_block_size' = [64, 64]: only 128x128 blocks" in _hf_error(
        tmp_path, quantization_config={"quant_method": "fp8", "weight_block_size": [64, 64]})
    assert "field 'quantization_config.bits' = 8" in _hf_error(
        tmp_path, quantization_config={"quant_method": "gptq", "bits": 8, "group_size": 128})
    assert "field 'quantization_config.config_groups' = 'all'" in _hf_error(
        tmp_path, quantization_config={"quant_method": "compressed-tensors", "config_groups": "all"})
    assert "field 'quantization_config.config_groups.g.weights.num_bits' = 8" in _hf_error(
        tmp_path, quantization_config={"quant_method": "compressed-tensors", "config_groups": {"g": {
            "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "int"}}}})
    assert "field 'quantization_config.modules_to_not_convert' = 'lm_head': must be a list of strings" in _hf_error(
        tmp_path, quantization_config={"quant_method": "fp8", "modules_to_not_convert": "lm_head"})
    # a component excluded in some layers only: formats per layer are not modelled
    assert "field 'quantization_config.ignored_layers' names 3 of the 96 checkpoint modules of component " \
           "'attention'" in _hf_error(
        tmp_path, quantization_config={"quant_method": "fp8", "ignored_layers": ["model.layers.0.self_attn.q_proj",
                                                                              "model.layers.0.self_attn.k_proj",
                                                                              "model.layers.0.self_attn.v_proj"]})
    assert "'mxfp4': vLLM applies it to MoE experts only" in _hf_error(tmp_path,
                                                                       quantization_config={"quant_method": "mxfp4"})


def _arch_error(tmp_path, shipped: str, **changes) -> str:
    """The one-line error of a shipped model's config.json with `changes` (None deletes a key)."""
    raw = json.loads((model_dir() / load_model(shipped).hf_config).read_text())
    config = {k: v for k, v in {**raw, **changes}.items() if v is not None or k not in changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(KernelsightError) as e:
        load_model(tmp_path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message, message
    return message


def test_hf_architecture_problems_are_one_line_naming_file_and_field(tmp_path):
    types = ["sliding_attention", "full_attention"] * 12
    assert "field 'layer_types' has 23 entries, num_hidden_layers = 24" in _arch_error(
        tmp_path, "gpt-oss-20b", layer_types=types[:23])
    assert "field 'layer_types': entry 'local_attention' is not one of" in _arch_error(
        tmp_path, "gpt-oss-20b", layer_types=["local_attention"] * 24)
    assert "field 'layer_types': sliding_attention on layers [0, 1]; sliding layers are modelled" in _arch_error(
        tmp_path, "gpt-oss-20b", layer_types=["sliding_attention"] * 2 + ["full_attention"] * 22)
    assert "field 'qk_rope_head_dim' = 63: RoPE rotates pairs" in _arch_error(tmp_path, "deepseek-v3",
                                                                            qk_rope_head_dim=63)
    assert "field 'num_key_value_heads' = 8: MLA derives" in _arch_error(tmp_path, "deepseek-v3",
                                                                        num_key_value_heads=8)
    assert "missing field 'kv_lora_rank'" in _arch_error(tmp_path, "deepseek-v3", kv_lora_rank=None)
    assert "field 'first_k_dense_replace' = 70: exceeds num_hidden_layers = 61" in _arch_error(
        tmp_path, "deepseek-v3", first_k_dense_replace=70)
    assert "field 'moe_layer_freq' = 2" in _arch_error(tmp_path, "deepseek-v3", moe_layer_freq=2)
    assert "field 'text_config.no_rope_layers'" in _arch_error(
        tmp_path, "llama4-scout", text_config={**_raw(load_model("llama4-scout"))["text_config"],
                                               "no_rope_layers": [1, 0] * 10})
    assert "field 'rotary_dim' = 129" in _arch_error(tmp_path, "minimax-m2.5", rotary_dim=129)
    assert "missing field 'text_config'" in _arch_error(tmp_path, "llama4-scout", text_config=None)


def test_bad_mla_and_format_yaml_gets_one_line_naming_file_and_field(tmp_path):
    def error(shipped, **changes):
        data = {**load_model(shipped).as_dict(), **changes}
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(KernelsightError) as e:
            load_model(path)
        assert "\n" not in str(e.value) and "bad.yaml" in str(e.value)
        return str(e.value)
    assert "field 'head_dim': 192: MLA's cached row is mla.kv_lora_rank + mla.qk_rope_head_dim = 576" in error(
        "deepseek-v3", head_dim=192)
    assert "field 'kv_heads': 128: MLA caches one latent" in error("deepseek-v3", kv_heads=128)
    assert "field 'mla'" in error("llama3.1-8b", mla=load_model("deepseek-v3").as_dict()["mla"])
    assert "field 'weight_formats.experts' = 'int3'" in error("gpt-oss-20b", weight_formats={"experts": "int3"})
    assert "field 'weight_formats.mlp': this model has no mlp" in error("gpt-oss-20b", weight_formats={"mlp": "bf16"})
    assert "field 'intermediate'" in error("llama4-maverick", intermediate=0)
    assert "field 'moe.first_dense'" in error("deepseek-v3", moe={**load_model("deepseek-v3").as_dict()["moe"],
                                                                   "first_dense": 61})


def test_served_on_a_gpu_without_bf16_runs_fp16_as_vllm_does():
    from kernelsight.predictor.dtypes import compute_dtype

    v100, h100 = load_hardware("v100_sxm"), load_hardware("h100_sxm")
    llama = load_model("llama3.1-8b")
    assert llama.served_on(h100) is llama
    served = llama.served_on(v100)   # vLLM's dtype='auto': the GPU's first supported dtype, fp16
    assert (served.act_dtype, served.weight_dtype, served.kv_dtype) == ("fp16", "fp16", "fp16")
    one = ParallelConfig("x")
    assert weight_bytes_per_gpu(served, one) == weight_bytes_per_gpu(llama, one)   # 2 bytes a weight either way
    gemma = load_model("gemma2-9b").served_on(v100)  # vLLM keeps Gemma-2 off fp16: fp32
    assert (gemma.act_dtype, gemma.kv_dtype) == ("fp32", "fp32")
    # int4 weight-only runs in fp16 there (AWQ / GPTQ kernels); FP8 needs fp8 tensor cores or Ampere's Marlin
    assert compute_dtype("w4a16", v100.supported_dtypes) == "fp16"
    assert compute_dtype("fp8", v100.supported_dtypes) == "bf16" and compute_dtype("bf16", ("fp16",)) == "bf16"
    assert compute_dtype("fp8", h100.supported_dtypes) == "fp8"
    int4 = replace(llama, weight_dtype="w4a16").served_on(v100)
    assert (int4.weight_dtype, int4.act_dtype, int4.kv_dtype) == ("w4a16", "fp16", "fp16")
    with pytest.raises(KernelsightError, match=r"llama3.1-70b-fp8 on v100_sxm: its fp8 attention weights need fp8 "
                                               r"tensor cores .* vLLM refuses this checkpoint there"):
        load_model("llama3.1-70b-fp8").served_on(v100)
    assert from_hf(_card("gemma-3-1b"), "g1", "g1/config.json").served_on(v100).act_dtype == "fp32"
    with pytest.raises(KernelsightError, match="has no bf16 peak"):   # the plain dtype is never swapped silently
        v100.peak_flops("bf16")


# Vision-language checkpoints: the fields of their published config.json that the reader uses, and the model
# cards' parameter counts (the Hub's safetensors totals, vision tower included).
_QWEN3_VL_VISION = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
                    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                    "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]}
VISION_LANGUAGE_CARDS = {
    "Qwen/Qwen2.5-VL-7B-Instruct": ({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "hidden_size": 3584, "intermediate_size": 18944,
        "max_position_embeddings": 128000, "num_attention_heads": 28, "num_hidden_layers": 28,
        "num_key_value_heads": 4, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 152064, "use_sliding_window": False, "sliding_window": 32768,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                          "spatial_merge_size": 2, "temporal_patch_size": 2}}, 8.29e9, 0.676e9, None),
    "Qwen/Qwen3-VL-8B-Instruct": ({
        "architectures": ["Qwen3VLForConditionalGeneration"], "tie_word_embeddings": False,
        "text_config": {"hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 262144,
                        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "head_dim": 128,
                        "hidden_act": "silu", "dtype": "bfloat16", "vocab_size": 151936,
                        "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20],
                                         "mrope_interleaved": True}},
        "vision_config": {**_QWEN3_VL_VISION, "out_hidden_size": 4096}}, 8.77e9, 0.576e9, None),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": ({
        "architectures": ["Qwen3VLMoeForConditionalGeneration"], "tie_word_embeddings": False,
        "text_config": {"hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 262144,
                        "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128,
                        "hidden_act": "silu", "dtype": "bfloat16", "vocab_size": 151936, "num_experts": 128,
                        "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                        "mlp_only_layers": []},
        "vision_config": {**_QWEN3_VL_VISION, "out_hidden_size": 2048}}, 31.1e9, 0.538e9, 3.3e9),
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": ({
        "architectures": ["Mistral3ForConditionalGeneration"], "spatial_merge_size": 2, "torch_dtype": "bfloat16",
        "text_config": {"hidden_size": 5120, "intermediate_size": 32768, "max_position_embeddings": 131072,
                        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "head_dim": 128,
                        "hidden_act": "silu", "vocab_size": 131072, "tie_word_embeddings": False,
                        "model_type": "mistral"},
        "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                          "num_attention_heads": 16, "head_dim": 64, "patch_size": 14, "image_size": 1540,
                          "num_channels": 3, "model_type": "pixtral"}}, 24.0e9, 0.439e9, None),
}


@pytest.mark.parametrize("repo", sorted(VISION_LANGUAGE_CARDS))
def test_vision_language_checkpoints_serve_their_language_model_plus_the_towers_weights(repo):
    """A text request runs the language model alone: the same ModelConfig as its text config read on its own,
    plus the vision tower's weights (memory), whose count makes the card's total."""
    from kernelsight.sim.model import VISION_LANGUAGE

    config, total, vision, active = VISION_LANGUAGE_CARDS[repo]
    model = from_hf(config, repo.replace("/", "--"), f"{repo}/config.json")
    arch = VISION_LANGUAGE[config["architectures"][0]]
    text = config.get("text_config") or {k: v for k, v in config.items() if k != "vision_config"}
    alone = from_hf({"tie_word_embeddings": config.get("tie_word_embeddings", False), "torch_dtype": "bfloat16",
                     **text, "architectures": [arch]}, repo.replace("/", "--"), f"{repo}/config.json")
    assert model.architecture == arch and model == replace(alone, vision_params=model.vision_params)
    assert model.vision_params == pytest.approx(vision, rel=0.02)
    assert model.num_params() == pytest.approx(total, rel=0.01)
    if active:
        assert model.active_params() - model.param_counts()["vision"] == pytest.approx(active, rel=0.05)


def test_vision_language_problems_are_one_line_naming_file_and_field():
    config = VISION_LANGUAGE_CARDS["Qwen/Qwen3-VL-8B-Instruct"][0]
    bad = {**config, "vision_config": {**config["vision_config"], "depth": "27"}}
    with pytest.raises(KernelsightError, match=r"^vl/config.json: field 'vision_config.depth' = '27': must be an "
                                               r"integer$"):
        from_hf(bad, "vl", "vl/config.json")
    bad = {**config, "vision_config": {**config["vision_config"], "deepstack_visual_indexes": 8}}
    with pytest.raises(KernelsightError, match=r"field 'vision_config.deepstack_visual_indexes' = 8: must be a list"):
        from_hf(bad, "vl", "vl/config.json")
    with pytest.raises(KernelsightError, match=r"architecture 'Qwen3VLForCausalLM' is not supported .*; supported: .*"
                                               r"Qwen3VLForConditionalGeneration"):
        from_hf({**config, "architectures": ["Qwen3VLForCausalLM"]}, "vl", "vl/config.json")


ERNIE_21B = {  # baidu/ERNIE-4.5-21B-A3B-PT config.json: the fields the reader uses
    "architectures": ["Ernie4_5_MoeForCausalLM"], "hidden_size": 2560, "intermediate_size": 12288,
    "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4, "hidden_act": "silu",
    "max_position_embeddings": 131072, "vocab_size": 103424, "tie_word_embeddings": True, "use_bias": False,
    "torch_dtype": "bfloat16", "rope_theta": 500000, "moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536,
    "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_layer_interval": 1,
}


def test_ernie_moe_from_its_config_json():
    """ERNIE-4.5-21B-A3B: a dense first layer, then MoE layers of 64 experts (top 6) and two shared experts; the
    card's 21.8 B parameters (the Hub's count), about 3 B active."""
    model = from_hf(ERNIE_21B, "baidu--ERNIE-4.5-21B-A3B-PT", "ernie/config.json")
    assert (model.moe.experts, model.moe.top_k, model.moe.shared_intermediate, model.moe.first_dense) == (64, 6, 3072, 1)
    assert [p.moe for p in model.layer_plan()] == [False] + [True] * 27 and model.intermediate == 12288
    assert model.num_params() == pytest.approx(21.8e9, rel=0.01)
    assert model.active_params() == pytest.approx(3e9, rel=0.15)   # the card rounds it to 3 B
    with pytest.raises(KernelsightError, match=r"^ernie/config.json: field 'moe_layer_end_index' = 20: dense layers "
                                               r"after the MoE layers are not modelled"):
        from_hf({**ERNIE_21B, "moe_layer_end_index": 20}, "e", "ernie/config.json")
    with pytest.raises(KernelsightError, match=r"field 'moe_num_experts' = \[64, 64\]: must be an integer"):
        from_hf({**ERNIE_21B, "moe_num_experts": [64, 64]}, "e", "ernie/config.json")
    with pytest.raises(KernelsightError, match=r"field 'moe_k' = 65: exceeds moe_num_experts = 64"):
        from_hf({**ERNIE_21B, "moe_k": 65}, "e", "ernie/config.json")


PHI4_MINI = {  # microsoft/Phi-4-mini-instruct config.json: the fields the reader uses
    "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 24, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "vocab_size": 200064,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48},
}


def test_partial_rotary_factor_sets_the_rotated_dims_as_vllms_llama_attention():
    model = from_hf(PHI4_MINI, "microsoft--Phi-4-mini-instruct", "phi/config.json")
    assert (model.head_dim, model.rotary_dim, model.context_limit) == (128, 96, 131072)
    assert model.num_params() == pytest.approx(3.84e9, rel=0.01)   # the card's 3.8 B (the Hub: 3.84 B)
    assert from_hf({**PHI4_MINI, "partial_rotary_factor": 1.0}, "p", "phi/config.json").rotary_dim is None
    with pytest.raises(KernelsightError, match=r"field 'partial_rotary_factor' = 0.01: 0.01 x head_dim 128 must give"):
        from_hf({**PHI4_MINI, "partial_rotary_factor": 0.01}, "p", "phi/config.json")


def test_vision_language_exclusion_lists_name_the_language_model_as_the_checkpoint_does():
    """FP8 checkpoints of vision-language models list unquantized modules under their own prefixes
    ('model.language_model.layers.' in Qwen-VL, 'language_model.model.layers.' in Mistral-3): they match."""
    base = VISION_LANGUAGE_CARDS["Qwen/Qwen3-VL-30B-A3B-Instruct"][0]
    mlp_layers = [f"{prefix}layers.{i}.self_attn" for prefix in ("model.language_model.",) for i in range(48)]
    quant = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
             "modules_to_not_convert": ["lm_head", "model.visual", *mlp_layers]}
    model = from_hf({**base, "quantization_config": quant}, "vl", "vl/config.json")
    assert model.weight_dtype == "fp8_block" and model.weight_formats.attention == "bf16"
    mistral = VISION_LANGUAGE_CARDS["mistralai/Mistral-Small-3.1-24B-Instruct-2503"][0]
    quant = {**quant, "modules_to_not_convert": ["language_model.model.layers.0.self_attn"]}
    with pytest.raises(KernelsightError, match="names 3 of the 120 checkpoint modules of component 'attention'"):
        from_hf({**mistral, "quantization_config": quant}, "m3", "m3/config.json")
