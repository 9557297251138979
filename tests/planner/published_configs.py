"""config.json contents of current model families, as published on the Hugging Face Hub.

Each entry keeps the keys that set the architecture (and leaves out what the published file
leaves out, so class defaults are exercised: Gemma 3's text_config states no vocab_size or
head counts). Sources: the config.json of the repo named by each key.
"""

from __future__ import annotations

_SIGLIP_896 = {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model",
               "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}
_LLAMA4_VISION = {"hidden_size": 1408, "image_size": 336, "intermediate_size": 5632, "model_type": "llama4_vision_model",
                  "num_attention_heads": 16, "num_channels": 3, "num_hidden_layers": 34, "patch_size": 14,
                  "pixel_shuffle_ratio": 0.5, "projector_input_dim": 4096, "projector_output_dim": 4096,
                  "vision_output_dim": 4096}


def _llama4_text(experts: int, step: int, max_positions: int) -> dict:
    return {"model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "num_local_experts": experts, "num_experts_per_tok": 1, "interleave_moe_layer_step": step,
            "vocab_size": 202048, "max_position_embeddings": max_positions, "attention_chunk_size": 8192,
            "use_qk_norm": True, "attention_bias": False}


def _qwen2_5_vl(hidden, layers, heads, kv, width, vocab, tied) -> dict:
    return {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"], "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
            "intermediate_size": width, "vocab_size": vocab, "max_position_embeddings": 128000,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "tie_word_embeddings": tied,
            "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                              "num_heads": 16, "in_chans": 3, "out_hidden_size": hidden, "patch_size": 14,
                              "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                              "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                              "temporal_patch_size": 2}}


def _qwen3_vl(text: dict, vision_depth: int, vision_hidden: int, vision_width: int, deepstack: list[int],
              model_type: str = "qwen3_vl") -> dict:
    return {"model_type": model_type, "tie_word_embeddings": text.pop("tie_word_embeddings"), "text_config": text,
            "vision_config": {"depth": vision_depth, "hidden_size": vision_hidden, "intermediate_size": vision_width,
                              "num_heads": 16, "in_channels": 3, "out_hidden_size": text["hidden_size"],
                              "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                              "num_position_embeddings": 2304, "deepstack_visual_indexes": deepstack}}


def _qwen3_vl_moe(hidden: int, layers: int, heads: int, width: int, expert_width: int) -> dict:
    """Qwen3-VL's MoE releases: 4 KV heads of 128, 128 experts top-8 in every layer, and the 27-deep tower."""
    return _qwen3_vl(
        {"model_type": "qwen3_vl_moe_text", "hidden_size": hidden, "num_hidden_layers": layers,
         "num_attention_heads": heads, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": width,
         "moe_intermediate_size": expert_width, "num_experts": 128, "num_experts_per_tok": 8,
         "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 262144,
         "tie_word_embeddings": False},
        27, 1152, 4304, [8, 16, 24], model_type="qwen3_vl_moe")


PUBLISHED_CONFIGS: dict[str, dict] = {
    # google/gemma-3-{1b,4b,12b,27b}-it
    "google/gemma-3-1b-it": {"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26,
                             "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                             "intermediate_size": 6912, "vocab_size": 262144, "max_position_embeddings": 32768,
                             "sliding_window": 512, "sliding_window_pattern": 6},
    "google/gemma-3-4b-it": {"model_type": "gemma3", "mm_tokens_per_image": 256, "vision_config": _SIGLIP_896,
                             "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                                             "intermediate_size": 10240, "num_hidden_layers": 34,
                                             "sliding_window": 1024}},
    "google/gemma-3-12b-it": {"model_type": "gemma3", "mm_tokens_per_image": 256, "vision_config": _SIGLIP_896,
                              "text_config": {"model_type": "gemma3_text", "hidden_size": 3840,
                                              "intermediate_size": 15360, "num_attention_heads": 16,
                                              "num_hidden_layers": 48, "num_key_value_heads": 8,
                                              "sliding_window": 1024}},
    "google/gemma-3-27b-it": {"model_type": "gemma3", "mm_tokens_per_image": 256, "vision_config": _SIGLIP_896,
                              "text_config": {"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376,
                                              "intermediate_size": 21504, "num_attention_heads": 32,
                                              "num_hidden_layers": 62, "num_key_value_heads": 16,
                                              "query_pre_attn_scalar": 168, "sliding_window": 1024}},
    # meta-llama/Llama-4-Scout-17B-16E-Instruct, meta-llama/Llama-4-Maverick-17B-128E-Instruct
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": {"model_type": "llama4", "text_config": _llama4_text(16, 1, 10485760),
                                                  "vision_config": _LLAMA4_VISION},
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": {"model_type": "llama4",
                                                      "text_config": _llama4_text(128, 2, 1048576),
                                                      "vision_config": _LLAMA4_VISION},
    # mistralai/Mixtral-8x7B-Instruct-v0.1, mistralai/Mixtral-8x22B-Instruct-v0.1
    "mistralai/Mixtral-8x7B-Instruct-v0.1": {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
                                             "num_attention_heads": 32, "num_key_value_heads": 8,
                                             "intermediate_size": 14336, "num_local_experts": 8,
                                             "num_experts_per_tok": 2, "vocab_size": 32000,
                                             "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "mistralai/Mixtral-8x22B-Instruct-v0.1": {"model_type": "mixtral", "hidden_size": 6144, "num_hidden_layers": 56,
                                              "num_attention_heads": 48, "num_key_value_heads": 8,
                                              "intermediate_size": 16384, "num_local_experts": 8,
                                              "num_experts_per_tok": 2, "vocab_size": 32768,
                                              "max_position_embeddings": 65536, "tie_word_embeddings": False},
    # mistralai/Mistral-Small-24B-Instruct-2501
    "mistralai/Mistral-Small-24B-Instruct-2501": {"model_type": "mistral", "hidden_size": 5120, "num_hidden_layers": 40,
                                                  "num_attention_heads": 32, "num_key_value_heads": 8,
                                                  "head_dim": 128, "intermediate_size": 32768, "vocab_size": 131072,
                                                  "max_position_embeddings": 32768, "tie_word_embeddings": False},
    # microsoft/phi-4
    "microsoft/phi-4": {"model_type": "phi3", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
                        "num_key_value_heads": 10, "intermediate_size": 17920, "vocab_size": 100352,
                        "max_position_embeddings": 16384, "tie_word_embeddings": False},
    # deepseek-ai/DeepSeek-V2-Lite-Chat
    "deepseek-ai/DeepSeek-V2-Lite-Chat": {"model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27,
                                          "num_attention_heads": 16, "num_key_value_heads": 16,
                                          "intermediate_size": 10944, "moe_intermediate_size": 1408,
                                          "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
                                          "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": None,
                                          "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                                          "v_head_dim": 128, "vocab_size": 102400, "max_position_embeddings": 163840,
                                          "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
                                          "tie_word_embeddings": False, "attention_bias": False},
    # zai-org/GLM-4.5, zai-org/GLM-4.5-Air
    "zai-org/GLM-4.5": {"model_type": "glm4_moe", "hidden_size": 5120, "num_hidden_layers": 92,
                        "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
                        "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160,
                        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                        "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "use_qk_norm": True,
                        "attention_bias": True, "vocab_size": 151552, "max_position_embeddings": 131072,
                        "tie_word_embeddings": False},
    "zai-org/GLM-4.5-Air": {"model_type": "glm4_moe", "hidden_size": 4096, "num_hidden_layers": 46,
                            "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
                            "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 128,
                            "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
                            "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "use_qk_norm": False,
                            "attention_bias": True, "vocab_size": 151552, "max_position_embeddings": 131072,
                            "tie_word_embeddings": False},
    # moonshotai/Kimi-K2-Instruct (DeepSeek-V3's architecture under its own model_type)
    "moonshotai/Kimi-K2-Instruct": {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
                                    "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 64,
                                    "num_key_value_heads": 64, "intermediate_size": 18432,
                                    "moe_intermediate_size": 2048, "n_routed_experts": 384, "n_shared_experts": 1,
                                    "num_experts_per_tok": 8, "first_k_dense_replace": 1, "q_lora_rank": 1536,
                                    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                                    "v_head_dim": 128, "vocab_size": 163840, "max_position_embeddings": 131072,
                                    "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
                                    "tie_word_embeddings": False},
    # Qwen/Qwen3-Coder-30B-A3B-Instruct, Qwen/Qwen3-Coder-480B-A35B-Instruct
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
                                          "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                                          "intermediate_size": 6144, "moe_intermediate_size": 768,
                                          "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                                          "mlp_only_layers": [], "vocab_size": 151936,
                                          "max_position_embeddings": 262144, "tie_word_embeddings": False},
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": {"model_type": "qwen3_moe", "hidden_size": 6144, "num_hidden_layers": 62,
                                            "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
                                            "intermediate_size": 8192, "moe_intermediate_size": 2560,
                                            "num_experts": 160, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                                            "mlp_only_layers": [], "vocab_size": 151936,
                                            "max_position_embeddings": 262144, "tie_word_embeddings": False},
    # Qwen/Qwen2.5-VL-{3B,7B,32B,72B}-Instruct (flat files: text numbers at the top)
    # Models verl's own examples train (presets/models.toml names the copies these were read from).
    "deepseek-ai/deepseek-llm-7b-chat": {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                         "hidden_size": 4096, "num_hidden_layers": 30, "num_attention_heads": 32,
                                         "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 102400,
                                         "max_position_embeddings": 4096, "tie_word_embeddings": False,
                                         "attention_bias": False},
    "deepseek-ai/deepseek-coder-6.7b-instruct": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                                                 "num_attention_heads": 32, "num_key_value_heads": 32,
                                                 "intermediate_size": 11008, "vocab_size": 32256,
                                                 "max_position_embeddings": 16384, "tie_word_embeddings": False,
                                                 "rope_scaling": {"factor": 4.0, "type": "linear"}},
    "Qwen/Qwen1.5-MoE-A2.7B": {"model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24,
                               "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
                               "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                               "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
                               "vocab_size": 151936, "max_position_embeddings": 8192, "tie_word_embeddings": False},
    "moonshotai/Moonlight-16B-A3B": {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
                                     "hidden_size": 2048, "intermediate_size": 11264, "moe_intermediate_size": 1408,
                                     "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                                     "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
                                     "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": None,
                                     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                                     "vocab_size": 163840, "max_position_embeddings": 8192,
                                     "tie_word_embeddings": False},
    "ByteDance-Seed/Seed-OSS-36B-Instruct": {"model_type": "seed_oss", "hidden_size": 5120, "num_hidden_layers": 64,
                                             "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
                                             "intermediate_size": 27648, "vocab_size": 155136,
                                             "max_position_embeddings": 524288, "tie_word_embeddings": False,
                                             "attention_bias": True, "attention_out_bias": False},
    "Qwen/Qwen2.5-VL-3B-Instruct": _qwen2_5_vl(2048, 36, 16, 2, 11008, 151936, True),
    "Qwen/Qwen2.5-VL-7B-Instruct": _qwen2_5_vl(3584, 28, 28, 4, 18944, 152064, False),
    "Qwen/Qwen2.5-VL-32B-Instruct": _qwen2_5_vl(5120, 64, 40, 8, 27648, 152064, False),
    "Qwen/Qwen2.5-VL-72B-Instruct": _qwen2_5_vl(8192, 80, 64, 8, 29568, 152064, False),
    # Qwen/Qwen3-VL-{4B,8B}-Instruct, Qwen/Qwen3-VL-30B-A3B-Instruct
    "Qwen/Qwen3-VL-4B-Instruct": _qwen3_vl(
        {"model_type": "qwen3_vl_text", "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728, "vocab_size": 151936,
         "max_position_embeddings": 262144, "tie_word_embeddings": True}, 24, 1024, 4096, [5, 11, 17]),
    "Qwen/Qwen3-VL-8B-Instruct": _qwen3_vl(
        {"model_type": "qwen3_vl_text", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
         "max_position_embeddings": 262144, "tie_word_embeddings": False}, 27, 1152, 4304, [8, 16, 24]),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": _qwen3_vl_moe(2048, 48, 32, 6144, 768),
    # zai-org/GLM-4.1V-9B-Thinking
    "zai-org/GLM-4.1V-9B-Thinking": {
        "model_type": "glm4v", "architectures": ["Glm4vForConditionalGeneration"],
        "text_config": {"model_type": "glm4v_text", "hidden_size": 4096, "num_hidden_layers": 40,
                        "num_attention_heads": 32, "num_key_value_heads": 2, "intermediate_size": 13696,
                        "vocab_size": 151552, "attention_bias": True, "partial_rotary_factor": 0.5,
                        "max_position_embeddings": 65536, "tie_word_embeddings": False},
        "vision_config": {"model_type": "glm4v", "depth": 24, "hidden_size": 1536, "intermediate_size": 13696,
                          "num_heads": 12, "image_size": 336, "patch_size": 14, "in_channels": 3,
                          "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 4096,
                          "attention_bias": False, "hidden_act": "silu"}},
    # Qwen/Qwen3-VL-235B-A22B-Instruct
    "Qwen/Qwen3-VL-235B-A22B-Instruct": _qwen3_vl_moe(4096, 94, 64, 12288, 1536),
    # openbmb/MiniCPM-o-2_6: the architecture keys of its config.json as the remote code and its readers state them
    # (no copy of the file is on this machine): Qwen2.5-7B's text numbers with a 151700-row vocabulary, the SigLIP
    # of MiniCPM_o_2_6Config.default_vision_config with its 27 layers kept, whisper-medium's encoder numbers
    # ("same as openai/whisper-medium", configuration_minicpm.py), ChatTTS's defaults but llm_dim 3584.
    "openbmb/MiniCPM-o-2_6": {
        "model_type": "minicpmo", "architectures": ["MiniCPMO"], "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 151700,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "query_num": 64, "image_size": 448,
        "drop_vision_last_layer": False, "init_vision": True, "init_audio": True, "init_tts": True,
        "audio_pool_step": 2,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "image_size": 980,
                          "intermediate_size": 4304, "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14},
        "audio_config": {"model_type": "whisper", "d_model": 1024, "encoder_layers": 24, "encoder_attention_heads": 16,
                         "encoder_ffn_dim": 4096, "num_mel_bins": 80, "max_source_positions": 1500},
        "tts_config": {"model_type": "conditional_chattts", "llm_dim": 3584}},
}

# Qwen/Qwen3-Next-80B-A3B-Instruct: 36 Gated DeltaNet layers beside 12 gated-attention ones (full_attention_interval).
QWEN3_NEXT_80B_A3B = {
    "model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 262144, "tie_word_embeddings": False,
}
PUBLISHED_CONFIGS["Qwen/Qwen3-Next-80B-A3B-Instruct"] = QWEN3_NEXT_80B_A3B
