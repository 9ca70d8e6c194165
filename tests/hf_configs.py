"""config.json of architectures no shipped model uses, transcribed from the models' Hugging Face cards (the
fields vLLM reads; values as published): the tests build these models straight from their configs."""
from __future__ import annotations

GLM_45_AIR = {  # zai-org/GLM-4.5-Air
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "partial_rotary_factor": 0.5, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "moe_intermediate_size": 1408, "norm_topk_prob": True, "num_attention_heads": 96, "n_group": 1, "topk_group": 1,
    "n_routed_experts": 128, "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_qk_norm": False, "vocab_size": 151552,
}
GLM_45 = {**GLM_45_AIR,  # zai-org/GLM-4.5
          "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160,
          "first_k_dense_replace": 3, "num_hidden_layers": 92, "routed_scaling_factor": 2.5, "use_qk_norm": True}
DEEPSEEK_V2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite
    "architectures": ["DeepseekV2ForCausalLM"], "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "scoring_func": "softmax", "topk_group": 1, "topk_method": "greedy", "first_k_dense_replace": 1,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400,
}
QWEN15_MOE = {  # Qwen/Qwen1.5-MoE-A2.7B
    "architectures": ["Qwen2MoeForCausalLM"], "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "max_window_layers": 21, "num_attention_heads": 16, "num_hidden_layers": 24,
    "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
    "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False,
}
GEMMA3_27B = {  # google/gemma-3-27b-it: the language model's text_config names only what differs from the defaults
    "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}
GEMMA3_1B = {  # google/gemma-3-1b-it
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144,
}
CONFIGS = {"glm-4.5-air": GLM_45_AIR, "glm-4.5": GLM_45, "deepseek-v2-lite": DEEPSEEK_V2_LITE,
           "qwen1.5-moe-a2.7b": QWEN15_MOE, "gemma-3-27b": GEMMA3_27B, "gemma-3-1b": GEMMA3_1B}
