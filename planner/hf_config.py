"""A Hugging Face config.json -> an Architecture: the model's own transformers config class where
transformers is installed, else a light table of the class defaults published files rely on.

Pure: the caller reads the file (presets, the CLI).  Vision towers are priced from their own config, and an
omni model's towers (MiniCPM-o: image, audio, speech) from the flags and parts its config states;
layer kinds the model cannot price (state-space, linear attention) are refused by name.
"""

from __future__ import annotations

from typing import Any

import attrs

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError

# With transformers installed, config.json goes through the model's own config class first
# (AutoConfig's table), so class defaults a published file leaves out (Gemma 3's vocab_size and
# head counts, Llama 4's interleave step) and derived fields (layer_types, moe_layers) are the
# ones the model is built with. Without it (the planner-only install) _LIGHT_DEFAULTS supplies
# the same defaults for the families whose published files rely on them; a test holds the
# table to transformers' classes. Either way the numbers then pass through one mapping.

# config.json keys read as whole numbers (sizes, counts, ranks).
_INTEGER_KEYS = frozenset({
    "hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "n_routed_experts", "num_experts",
    "num_local_experts", "moe_intermediate_size", "intermediate_size", "n_shared_experts",
    "shared_expert_intermediate_size", "num_key_value_heads", "head_dim", "v_head_dim", "max_position_embeddings",
    "num_experts_per_tok", "experts_per_token", "first_k_dense_replace", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "intermediate_size_mlp", "interleave_moe_layer_step",
    "decoder_sparse_step", "depth", "out_hidden_size", "patch_size", "image_size", "temporal_patch_size",
    "spatial_merge_size", "in_channels", "num_channels", "num_position_embeddings", "projector_input_dim",
    "projector_output_dim", "vision_output_dim", "d_model", "encoder_layers", "encoder_ffn_dim", "num_mel_bins",
    "max_source_positions", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval", "query_num", "llm_dim", "num_audio_tokens", "num_text_tokens", "num_vq",
})

# model_type -> the family of its text stack, whichever wrapper (vision-language, Kimi's
# DeepSeek-V3 clone) holds it. An unlisted model_type keeps its own name.
_FAMILIES = {
    "qwen2": "qwen2", "qwen2_vl": "qwen2", "qwen2_vl_text": "qwen2", "qwen2_5_vl": "qwen2", "qwen2_5_vl_text": "qwen2",
    "minicpmo": "qwen2",  # MiniCPM-o 2.6: a Qwen2 text stack (remote code MiniCPM_o_2_6Config(Qwen2Config))
    "qwen2_moe": "qwen2_moe", "qwen3_next": "qwen3_next",
    "qwen3": "qwen3", "qwen3_vl": "qwen3", "qwen3_vl_text": "qwen3",
    "qwen3_moe": "qwen3_moe", "qwen3_vl_moe": "qwen3_moe", "qwen3_vl_moe_text": "qwen3_moe",
    "llama": "llama", "llama4": "llama4", "llama4_text": "llama4",
    "mistral": "mistral", "mixtral": "mixtral", "phi3": "phi3",
    "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3",
    "deepseek_v2": "deepseek_v3", "deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3",
    "glm4_moe": "glm4_moe", "gpt_oss": "gpt_oss", "glm4v": "glm4v", "glm4v_text": "glm4v",
    "mimo": "qwen2",
}
# The model types whose multi-token-prediction layers (num_nextn_predict_layers) rlplan prices when verl's
# model.mtp is on (arch.mtp_layers): MiMo's (configuration_mimo.py MiMoConfig, a Qwen2Config with that count).
_MTP_LAYER_TYPES = frozenset({"mimo"})
# Families whose routed experts' width is config.json's intermediate_size (no moe_intermediate_size key).
_EXPERT_WIDTH_IN_INTERMEDIATE_SIZE = frozenset({"gpt_oss", "mixtral", "llama4"})
_QK_NORM_FAMILIES = frozenset({"qwen3", "qwen3_moe", "gemma3", "qwen3_next"})  # a learned RMSNorm of head_dim on q and on k
# Pre/post norms around attention and around the MLP (GLM-4.1V: input, post_self_attn, post_attention, post_mlp).
_FOUR_NORM_FAMILIES = frozenset({"gemma2", "gemma3", "glm4v"})
# Families whose q/k/v projections carry a bias whatever config.json says: transformers builds them with bias=True
# (Qwen2's; Glm4vTextAttention, modeling_glm4v.py).
_QKV_BIAS_FAMILIES = frozenset({"qwen2", "qwen2_moe", "glm4v"})
_TIED_BY_DEFAULT = frozenset({"gemma2", "gemma3"})

# A composite (vision-language) model_type -> the model types of its text and vision parts.
_PART_TYPES = {
    "gemma3": ("gemma3_text", "siglip_vision_model"),
    "llama4": ("llama4_text", "llama4_vision_model"),
    "qwen2_5_vl": ("qwen2_5_vl_text", "qwen2_5_vl_vision"),
    "qwen3_vl": ("qwen3_vl_text", "qwen3_vl_vision"),
    "qwen3_vl_moe": ("qwen3_vl_moe_text", "qwen3_vl_moe_vision"),
    "glm4v": ("glm4v_text", "glm4v_vision"),
}

# transformers' class defaults (5.x) for the keys this reader uses, per model type, where
# published config files leave them out. test_light_defaults_are_the_transformers_class_defaults
# compares every entry with the class.
_LIGHT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131072, "tie_word_embeddings": True, "attention_bias": False},
    "siglip_vision_model": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                            "num_channels": 3, "image_size": 224, "patch_size": 16},
    "llama4_text": {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
                    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
                    "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                    "tie_word_embeddings": False, "attention_bias": False},
    "llama4_vision_model": {"hidden_size": 768, "intermediate_size": 5632, "num_hidden_layers": 34,
                            "num_channels": 3, "image_size": 448, "patch_size": 14, "projector_input_dim": 4096,
                            "projector_output_dim": 4096, "vision_output_dim": 7680},
    "mixtral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False},
    "qwen2_5_vl_vision": {"depth": 32, "hidden_size": 3584, "intermediate_size": 3420, "in_channels": 3,
                          "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2,
                          "out_hidden_size": 3584},
    "qwen3_vl_vision": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "in_channels": 3,
                        "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 3584,
                        "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]},
    "qwen3_vl_moe_vision": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "in_channels": 3,
                            "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                            "out_hidden_size": 3584, "num_position_embeddings": 2304,
                            "deepstack_visual_indexes": [8, 16, 24]},
    "whisper": {"d_model": 384, "encoder_layers": 4, "encoder_ffn_dim": 1536, "num_mel_bins": 80,
                "max_source_positions": 1500},
    "glm4v_vision": {"depth": 24, "hidden_size": 1536, "intermediate_size": 13696, "in_channels": 3, "image_size": 336,
                     "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 4096,
                     "attention_bias": False},
}

# Attention kinds whose layers keep an ordinary KV cache. Sliding-window and chunked layers are
# priced as full attention: vLLM keeps less for them, so this errs towards fewer sequences.
_KV_CACHE_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
# Keys that only state-space / linear-attention hybrids carry.
_RECURRENT_LAYER_KEYS = ("linear_num_value_heads", "linear_conv_kernel_dim", "mamba_d_state", "ssm_state_size",
                         "mamba_n_heads", "attn_layer_period", "hybrid_override_pattern")
_UNPRICED_TOWERS = ("audio_config", "speech_config", "vision_encoder_config")
# Families whose linear-attention layers are priced (Qwen3-Next's Gated DeltaNet: transformers' Qwen3NextConfig
# layer_types "linear_attention", every full_attention_interval-th layer being full attention).
_LINEAR_ATTENTION_FAMILIES = frozenset({"qwen3_next"})
_LINEAR_ATTENTION_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                          "linear_value_head_dim", "linear_conv_kernel_dim")


def _transformers_config_classes() -> Any:
    """transformers' model_type -> config class table, or None on a planner-only install.

    Imported here, never at module import: `solve` with a preset must not pay for (or need) transformers.
    """
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return None
    return CONFIG_MAPPING


def _through_transformers(config: dict[str, Any], model_type: str, strict: bool) -> dict[str, Any] | None:
    """config.json as its transformers config class fills it in; None where transformers cannot read it."""
    classes = _transformers_config_classes()
    if classes is None or model_type not in classes:
        if strict:
            raise LookupError(f"transformers has no config class for {model_type!r}")
        return None
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # rope and deprecation notices are not the user's business here
    try:
        return classes[model_type].from_dict(dict(config)).to_dict()
    except Exception:
        # A file transformers rejects (wrong types, broken values) gets the light reader's named error.
        if strict:
            raise
        return None
    finally:
        hf_logging.set_verbosity(verbosity)


def _with_light_defaults(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    filled = {**_LIGHT_DEFAULTS.get(model_type, {}), **config}
    if model_type in _PART_TYPES and "hidden_size" not in config:
        text_type, vision_type = _PART_TYPES[model_type]
        for key, part_type in (("text_config", text_type), ("vision_config", vision_type)):
            part = config.get(key) or {}
            if isinstance(part, dict):
                filled[key] = {**_LIGHT_DEFAULTS.get(part_type, {}), **part}
    elif model_type in _PART_TYPES and isinstance(config.get("vision_config"), dict):
        # A flat file (Qwen2.5-VL's): the text numbers at the top, the vision tower nested.
        filled["vision_config"] = {**_LIGHT_DEFAULTS.get(_PART_TYPES[model_type][1], {}), **config["vision_config"]}
    return filled


def architecture_from_hf_config(config: dict[str, Any], source: str = "config.json",
                                read_with: str = "auto") -> Architecture:
    """Read an Architecture from a Hugging Face config.json dictionary.

    read_with: "auto" (transformers' config class when transformers is importable and knows the
    model_type, else the light reader), "light", or "transformers" (no fallback; for tests).
    """
    if not isinstance(config, dict):
        raise PlanError(field="model", message=f"{source} is a JSON {type(config).__name__}, not an object of "
                        "architecture numbers.", fix="point --model at a Hugging Face model's config.json")
    model_type = config.get("model_type", "")
    if not isinstance(model_type, str):
        raise PlanError(field="model.model_type", message=f"{source}'s model_type is not a string.",
                        fix="set model_type to the architecture name, e.g. \"qwen2\"")
    model_type = model_type.lower()
    # Class defaults fill in details, never the model's size: a file that does not state its width
    # and depth is not that model's config.json, whatever transformers would build from it.
    nested = "hidden_size" not in config and isinstance(config.get("text_config"), dict)
    _require(config["text_config"] if nested else config, ("hidden_size", "num_hidden_layers"), source)
    # Tying is read from what the file states, text part first: a composite file states it at the
    # top (Qwen3-VL-30B-A3B: false) while its text class defaults to true.
    stated_ties = [part.get("tie_word_embeddings") for part in ((config["text_config"], config) if nested else (config,))]
    # Read before transformers' config class, which rewrites a shared rope_scaling in place (Qwen2-VL's mrope).
    rope = rope_scaling_fields(config.get("rope_scaling"), source)
    filled = None
    if read_with != "light":
        filled = _through_transformers(config, model_type, strict=read_with == "transformers")
    if filled is None:
        filled = _with_light_defaults(config, model_type)
    arch = _architecture_from_filled(filled, model_type, source, stated_ties)
    return attrs.evolve(arch, **rope)


def rope_scaling_fields(rope_scaling: Any, source: str) -> dict[str, Any]:
    """config.json's top-level rope_scaling as Architecture fields: what verl's rollouts read with
    `getattr(model_hf_config, "rope_scaling", None)` (the top level, as written: transformers 5's config classes
    fold it into rope_parameters, which verl's releases never read). An empty or null one is none."""
    if not rope_scaling:
        return {}
    if not isinstance(rope_scaling, dict):
        raise PlanError(field="model.rope_scaling", message=f"{source}'s rope_scaling is {rope_scaling!r}, not an "
                        "object.", fix="set rope_scaling to the object in the model's config.json, or null")
    kind = rope_scaling.get("rope_type") or rope_scaling.get("type") or "default"
    factor = rope_scaling.get("factor", 1.0)
    original = rope_scaling.get("original_max_position_embeddings") or 0
    if not isinstance(kind, str) or isinstance(factor, bool) or not isinstance(factor, (int, float)) or \
            not factor > 0 or isinstance(original, bool) or not isinstance(original, (int, float)) or original < 0:
        raise PlanError(field="model.rope_scaling", message=f"{source}'s rope_scaling {rope_scaling!r} needs a "
                        "string rope_type, a positive factor and a whole original_max_position_embeddings.",
                        fix="correct rope_scaling in the model's config.json")
    return {"rope_scaling_type": kind.lower(), "rope_scaling_factor": float(factor),
            "rope_original_max_position_embeddings": int(original)}


def _refuse(source: str, feature: str, why: str) -> PlanError:
    return PlanError(
        field="model",
        message=f"{source} describes a model with {feature}, which rlplan does not model: {why}",
        fix="plan a model without it (`rlplan presets models` lists the supported ones); "
            "rlplan refuses rather than mis-cost the memory",
    )


def _linear_attention_layer_count(text: dict[str, Any], family: str, layers: int) -> int:
    """Qwen3-Next's Gated DeltaNet layers: those layer_types names "linear_attention", or (the published file
    states no layer_types) all but every full_attention_interval-th layer, as Qwen3NextConfig derives them."""
    if family not in _LINEAR_ATTENTION_FAMILIES:
        return 0
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return sum(1 for kind in layer_types[:layers] if kind == "linear_attention")
    interval = text.get("full_attention_interval") or 4
    interval = int(interval) if isinstance(interval, (int, float)) and not isinstance(interval, bool) else 4
    return sum(1 for index in range(layers) if (index + 1) % max(1, interval) != 0)


def _refuse_unmodelled_layers(text: dict[str, Any], source: str, family: str = "") -> None:
    if family in _LINEAR_ATTENTION_FAMILIES:
        return
    layer_types = text.get("layer_types") or ()
    odd = sorted({str(kind) for kind in layer_types} - _KV_CACHE_LAYER_TYPES) if isinstance(layer_types, list) else []
    recurrent_keys = [key for key in _RECURRENT_LAYER_KEYS if text.get(key) is not None]
    if odd or recurrent_keys:
        count = sum(1 for kind in layer_types if kind not in _KV_CACHE_LAYER_TYPES) if odd else None
        what = f"{count} of {len(layer_types)} layers of type {', '.join(odd)}" if odd else ", ".join(recurrent_keys)
        raise _refuse(
            source, f"linear-attention / state-space layers ({what})",
            "those layers keep a fixed-size recurrent state per sequence instead of a KV cache (Mamba hybrids), "
            "and the rollout memory model prices only KV caches and Qwen3-Next's Gated DeltaNet states.",
        )


def _require(config: dict[str, Any], keys: tuple[str, ...], source: str) -> None:
    missing = [key for key in keys if config.get(key) is None]
    if missing:
        raise PlanError(
            field="model",
            message=f"{source} lacks {', '.join(missing)}, so its architecture cannot be read.",
            fix="point --model at a decoder-only model's config.json, or use a preset (`rlplan presets models`)",
        )


def _layer_indices(value: Any) -> list[int]:
    return [int(index) for index in value] if isinstance(value, list) else []


def _architecture_from_filled(full: dict[str, Any], model_type: str, source: str,
                              stated_ties: list[Any]) -> Architecture:
    if full.get("is_encoder_decoder") is True:
        raise _refuse(source, "an encoder-decoder stack", "rlplan plans decoder-only policies.")
    text = full
    if "hidden_size" not in full and "text_config" in full:
        if not isinstance(full["text_config"], dict):
            raise PlanError(field="model.text_config", message=f"{source}'s text_config is not an object.",
                            fix="point --model at a Hugging Face model's config.json")
        text = full["text_config"]
    for key in _UNPRICED_TOWERS:
        if full.get(key) is not None and model_type not in _OMNI_TOWERS:
            raise _refuse(source, f"a non-text encoder ({key})", "its weights are not priced.")
    vision = full.get("vision_config")
    if vision is not None and model_type not in _VISION_TOWERS and model_type not in _OMNI_TOWERS:
        raise _refuse(source, f"a vision tower ({model_type or 'unnamed model_type'})",
                      f"rlplan prices the vision towers of {', '.join(sorted(_VISION_TOWERS))} only.")
    text_type = str(text.get("model_type") or model_type).lower()
    family = _FAMILIES.get(text_type, _FAMILIES.get(model_type, text_type or "llama"))
    _refuse_unmodelled_layers(text, source, family)
    _require(text, ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"), source)

    def whole(part: dict[str, Any], key: str, default: Any = 0) -> Any:
        value = part.get(key)
        if value is None:
            return default
        if isinstance(value, bool) and not isinstance(default, bool):
            value = int(value)
        if isinstance(default, bool) or key not in _INTEGER_KEYS:
            return value
        # Sizes and counts are whole numbers: "abc", NaN, 2048.9 or 7.5 experts are a broken file, not a model.
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
            value = int(value)
        if not isinstance(value, int) or abs(value) >= 2**63:
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:80] + "..."
            raise PlanError(field=f"model.{key}", message=f"{source} gives {key} = {shown}, not a whole number.",
                            fix=f"set {key} to the integer in the model's config.json")
        return value

    def get(key: str, default: Any = 0) -> Any:
        return whole(text, key, default)

    hidden = get("hidden_size")
    heads = get("num_attention_heads")
    layers = get("num_hidden_layers")
    if heads <= 0:
        raise PlanError(field="model.num_attention_heads", message=f"{source} gives {heads} attention heads.",
                        fix="set num_attention_heads to the model's positive head count")
    if not (get("head_dim", 0) or get("v_head_dim", 0)) and hidden % heads != 0:
        raise PlanError(field="model.hidden_size", message=f"{source}'s hidden_size {hidden} is not divisible by "
                        f"num_attention_heads {heads}, and no head_dim is given.",
                        fix="set head_dim, or correct hidden_size / num_attention_heads")
    num_experts = int(get("n_routed_experts", 0) or get("num_experts", 0) or get("num_local_experts", 0))
    is_mla = bool(get("kv_lora_rank", 0))
    moe_width = int(get("moe_intermediate_size", 0))
    dense_width = int(get("intermediate_size", 4 * hidden))
    if family in _EXPERT_WIDTH_IN_INTERMEDIATE_SIZE:
        moe_width = dense_width
    if family == "llama4":
        dense_width = int(get("intermediate_size_mlp", dense_width))
    shared = int(get("n_shared_experts", 0)) * moe_width
    if family in ("qwen2_moe", "qwen3_next", "llama4"):
        shared = int(get("shared_expert_intermediate_size", 0)) if family != "llama4" else moe_width
    dense_layers = _dense_layer_count(text, family, layers, num_experts, get) if num_experts else 0
    ties = [*stated_ties, text.get("tie_word_embeddings"), full.get("tie_word_embeddings")]
    tied = next((tie for tie in ties if tie is not None), family in _TIED_BY_DEFAULT)
    if model_type in _OMNI_TOWERS:
        vision_params = _OMNI_TOWERS[model_type](full, hidden, whole)
    else:
        vision_params = _VISION_TOWERS[model_type](vision, hidden, whole) if vision is not None else 0
    return Architecture(
        family=family,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=int(get("num_key_value_heads", heads)),
        # MLA's head_dim is its value width: transformers' DeepseekV2Config sets head_dim to the rope width.
        head_dim=int(get("v_head_dim", 0) if is_mla else 0) or int(get("head_dim", 0) or get("v_head_dim", 0)
                                                                    or hidden // heads),
        intermediate_size=dense_width,
        vocab_size=get("vocab_size"),
        tie_word_embeddings=bool(tied),
        max_position_embeddings=int(get("max_position_embeddings", 32768)),
        qkv_bias=bool(get("attention_bias", False)) or family in _QKV_BIAS_FAMILIES,
        o_bias=family == "gpt_oss" and bool(get("attention_bias", True)),
        qk_norm=family in _QK_NORM_FAMILIES or (family == "glm4_moe" and bool(get("use_qk_norm", False))),
        norms_per_layer=4 if family in _FOUR_NORM_FAMILIES else 2,
        num_experts=num_experts,
        num_experts_per_token=int(get("num_experts_per_tok", 0) or get("experts_per_token", 0)) if num_experts else 0,
        moe_intermediate_size=moe_width if num_experts else 0,
        shared_expert_intermediate_size=shared if num_experts else 0,
        first_dense_layers=dense_layers,
        expert_bias=family == "gpt_oss",
        q_lora_rank=int(get("q_lora_rank", 0)) if is_mla else 0,
        kv_lora_rank=int(get("kv_lora_rank", 0)),
        qk_nope_head_dim=int(get("qk_nope_head_dim", 0)) if is_mla else 0,
        qk_rope_head_dim=int(get("qk_rope_head_dim", 0)) if is_mla else 0,
        v_head_dim=int(get("v_head_dim", 0)) if is_mla else 0,
        **_linear_attention_fields(text, family, layers, get),
        vision_params=vision_params,
        mtp_layers=int(get("num_nextn_predict_layers", 0)) or None if model_type in _MTP_LAYER_TYPES else None,
    )


def _linear_attention_fields(text: dict[str, Any], family: str, layers: int, get: Any) -> dict[str, Any]:
    linear = _linear_attention_layer_count(text, family, layers)
    if not linear:
        return {}
    fields = {f"linear_{key[len('linear_'):]}": int(get(key, 0)) for key in _LINEAR_ATTENTION_KEYS}
    return {"linear_attention_layers": linear, "attention_output_gate": True, **fields}


def _dense_layer_count(text: dict[str, Any], family: str, layers: int, num_experts: int, get: Any) -> int:
    """Decoder layers of an MoE model that carry a dense MLP instead of experts.

    Architecture keeps only their number (first_dense_layers): parameter counts, memory and
    FLOPs depend on how many there are, not where; Llama 4 Maverick interleaves them.
    """
    if family == "llama4":
        moe_layers = _layer_indices(text.get("moe_layers"))
        if not moe_layers:
            step = max(1, int(get("interleave_moe_layer_step", 1)))
            moe_layers = list(range(step - 1, layers, step))
        return layers - len(set(moe_layers) & set(range(layers)))
    if family in ("qwen2_moe", "qwen3_moe", "qwen3_next"):
        step = max(1, int(get("decoder_sparse_step", 1)))
        dense_only = set(_layer_indices(text.get("mlp_only_layers")))
        return sum(1 for index in range(layers) if index in dense_only or (index + 1) % step != 0)
    return int(get("first_k_dense_replace", 0))


# --- vision towers -------------------------------------------------------------------
# Parameter counts of the image encoder plus the projector into the text stack, as transformers
# builds them (test_vision_tower_formula_matches_transformers counts the real modules).


def _qwen2_5_vl_vision_params(vision: dict[str, Any], text_hidden: int, whole: Any) -> int:
    h, i, depth = whole(vision, "hidden_size"), whole(vision, "intermediate_size"), whole(vision, "depth")
    patch, temporal = whole(vision, "patch_size"), whole(vision, "temporal_patch_size")
    merged = h * whole(vision, "spatial_merge_size") ** 2
    out = whole(vision, "out_hidden_size")
    patch_embed = whole(vision, "in_channels", 3) * temporal * patch * patch * h  # Conv3d, no bias
    block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * (h * i + i) + (i * h + h)  # RMSNorms, qkv, proj, SwiGLU
    merger = h + merged * merged + merged + merged * out + out
    return patch_embed + depth * block + merger


def _qwen3_vl_vision_params(vision: dict[str, Any], text_hidden: int, whole: Any) -> int:
    h, i, depth = whole(vision, "hidden_size"), whole(vision, "intermediate_size"), whole(vision, "depth")
    patch, temporal = whole(vision, "patch_size"), whole(vision, "temporal_patch_size")
    merged = h * whole(vision, "spatial_merge_size") ** 2
    out = whole(vision, "out_hidden_size")
    patch_embed = whole(vision, "in_channels", 3) * temporal * patch * patch * h + h
    positions = whole(vision, "num_position_embeddings") * h
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)  # LayerNorms, qkv, proj, GELU MLP

    def merger(norm_width: int) -> int:
        return 2 * norm_width + merged * merged + merged + merged * out + out

    deepstack = len(_layer_indices(vision.get("deepstack_visual_indexes")))
    return patch_embed + positions + depth * block + merger(h) + deepstack * merger(merged)


def _gemma3_vision_params(vision: dict[str, Any], text_hidden: int, whole: Any) -> int:
    """SigLIP encoder plus Gemma 3's projector (a matrix and an RMSNorm)."""
    h, i = whole(vision, "hidden_size"), whole(vision, "intermediate_size")
    patch, image = whole(vision, "patch_size"), whole(vision, "image_size")
    embeddings = whole(vision, "num_channels", 3) * patch * patch * h + h + (image // patch) ** 2 * h
    layer = 4 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h)
    head = 0
    if vision.get("vision_use_head", True):  # SigLIP's pooling head; Gemma 3 ships without it
        head = h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h)
    projector = h * text_hidden + h
    return embeddings + whole(vision, "num_hidden_layers") * layer + 2 * h + head + projector


def _llama4_vision_params(vision: dict[str, Any], text_hidden: int, whole: Any) -> int:
    h, i = whole(vision, "hidden_size"), whole(vision, "intermediate_size")
    patch, image = whole(vision, "patch_size"), whole(vision, "image_size")
    embeddings = h + ((image // patch) ** 2 + 1) * h + whole(vision, "num_channels", 3) * patch * patch * h
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
    projector_in = whole(vision, "projector_input_dim")
    adapter = i * projector_in + projector_in * whole(vision, "projector_output_dim")
    projector = whole(vision, "vision_output_dim") * text_hidden
    return embeddings + 4 * h + whole(vision, "num_hidden_layers") * layer + adapter + projector


def _glm4v_vision_params(vision: dict[str, Any], text_hidden: int, whole: Any) -> int:
    """GLM-4.1V's tower (transformers' Glm4vVisionModel): blocks whose SwiGLU is out_hidden_size wide, a Conv2d
    that merges spatial_merge_size^2 patches into the text width, and a merger whose SwiGLU is intermediate_size
    wide."""
    h, i, depth = whole(vision, "hidden_size"), whole(vision, "intermediate_size"), whole(vision, "depth")
    patch, temporal, merge = whole(vision, "patch_size"), whole(vision, "temporal_patch_size"), whole(
        vision, "spatial_merge_size")
    out = whole(vision, "out_hidden_size")
    positions = (whole(vision, "image_size") // patch) ** 2 * h
    patch_embed = whole(vision, "in_channels", 3) * temporal * patch * patch * h + h  # Conv3d with bias
    qkv_bias = 3 * h if whole(vision, "attention_bias", False) else 0
    block = 2 * h + (3 * h * h + qkv_bias) + h * h + 3 * h * out  # RMSNorms, qkv, proj (no bias), SwiGLU
    downsample = h * merge * merge * out + out  # Conv2d with bias
    merger = out * out + 2 * out + 3 * out * i  # proj (no bias), LayerNorm, SwiGLU
    return positions + patch_embed + depth * block + 2 * h + downsample + merger  # 2 h: post-conv and final norms


_VISION_TOWERS = {
    "gemma3": _gemma3_vision_params,
    "llama4": _llama4_vision_params,
    "qwen2_5_vl": _qwen2_5_vl_vision_params,
    "qwen3_vl": _qwen3_vl_vision_params,
    "qwen3_vl_moe": _qwen3_vl_vision_params,
    "glm4v": _glm4v_vision_params,
}


# --- omni towers ----------------------------------------------------------------------
# A model whose config.json describes several non-text towers (image, audio, speech); the function reads the whole
# file, since which towers exist is said at its top level. Architecture keeps them in vision_params: trained and
# stored with the text stack, outside every text token's path.

# ChatTTS's config class defaults (remote code configuration_minicpm.py MiniCPMConditionalTTSConfig, as published
# with openbmb/MiniCPM-o-2_6; transformers has no class for it): the keys the speech tower's weights depend on.
_CHATTTS_DEFAULTS = {"llm_dim": 2560, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 20,
                     "num_audio_tokens": 626, "num_text_tokens": 21178, "num_vq": 4, "use_mlp": True}
# MiniCPM_o_2_6Config.default_vision_config (remote code configuration_minicpm.py): the SigLIP it builds when
# config.json has no vision_config ("same as HuggingFaceM4/siglip-so400m-14-980-flash-attn2-navit").
_MINICPMO_VISION_DEFAULTS = {"hidden_size": 1152, "image_size": 980, "intermediate_size": 4304,
                             "num_hidden_layers": 27, "patch_size": 14, "num_channels": 3}
# The Llama stack inside ChatTTS is built from LlamaConfig(...) without a vocab_size, so its (unused) input
# embedding has LlamaConfig's default 32000 rows.
_CHATTTS_LLAMA_VOCAB = 32000
# ChatTTS's DVAE (remote code modeling_minicpmo.py DVAE, borrowed from 2noise/ChatTTS dvae.py) has fixed shapes:
# coef (100) + downsample convs (100->512 k3, 512->512 k4, biased) + encoder and decoder DVAEDecoder(idim 512, odim
# 1024 / 512, hidden 256, 12 ConvNeXt blocks of 256 -> 1024, bn_dim 128) + out_conv (512->100 k3, no bias) + GFSQ's
# two groups of 512 -> 4 -> 512 projections (vector_quantize_pytorch GroupedResidualFSQ, levels (5, 5, 5, 5)).
_CONVNEXT_256 = 256 * 7 + 256 + 2 * 256 + (256 * 1024 + 1024) + (1024 * 256 + 256) + 256
_DVAE_PARAMS = (100 + (100 * 512 * 3 + 512) + (512 * 512 * 4 + 512)
                + sum((512 * 128 * 3 + 128) + (128 * 256 * 3 + 256) + 12 * _CONVNEXT_256 + 256 * odim
                      for odim in (1024, 512))
                + 512 * 100 * 3 + 2 * ((512 * 4 + 4) + (4 * 512 + 512)))


def _navit_siglip_params(vision: dict[str, Any], layers: int, whole: Any) -> int:
    """MiniCPM's SigLIP (remote code modeling_navit_siglip.py SiglipVisionTransformer): patch conv with bias, one
    position per patch of the largest image, LayerNorm'd blocks, a post-LayerNorm and no pooling head."""
    h, i = whole(vision, "hidden_size"), whole(vision, "intermediate_size")
    patch, image = whole(vision, "patch_size"), whole(vision, "image_size")
    embeddings = whole(vision, "num_channels", 3) * patch * patch * h + h + (image // patch) ** 2 * h
    block = 4 * (h * h + h) + 4 * h + (h * i + i) + (i * h + h)
    return embeddings + layers * block + 2 * h


def _resampler_params(queries: int, embed: int, kv_dim: int) -> int:
    """MiniCPM-V 2.6's Resampler: learned queries, kv_proj (no bias) when the widths differ, torch's
    MultiheadAttention (packed in-projection and out-projection, biased), ln_q / ln_kv / ln_post and a square proj;
    its 2-D sin-cos positions are a buffer."""
    kv_proj = kv_dim * embed if kv_dim != embed else 0
    return queries * embed + kv_proj + (3 * embed * embed + 3 * embed) + (embed * embed + embed) + 6 * embed + embed * embed


def _whisper_encoder_params(audio: dict[str, Any], whole: Any) -> int:
    """transformers' WhisperEncoder (MiniCPMWhisperEncoder keeps its shapes): two biased convs, a position table,
    blocks whose k_proj alone has no bias, and a final LayerNorm."""
    d, f = whole(audio, "d_model"), whole(audio, "encoder_ffn_dim")
    convs = whole(audio, "num_mel_bins") * d * 3 + d + d * d * 3 + d
    block = (4 * d * d + 3 * d) + 4 * d + (d * f + f) + (f * d + d)
    return convs + whole(audio, "max_source_positions") * d + whole(audio, "encoder_layers") * block + 2 * d


def _chattts_params(tts: dict[str, Any], whole: Any) -> int:
    """ConditionalChatTTS (remote code modeling_minicpmo.py): the projector from the text width, code and text
    embeddings, weight-normed code heads, the DVAE and a Llama stack."""
    h, i, llm = whole(tts, "hidden_size"), whole(tts, "intermediate_size"), whole(tts, "llm_dim")
    vq, codes = whole(tts, "num_vq"), whole(tts, "num_audio_tokens")
    projector = (llm * h + h) + (h * h + h) if tts.get("use_mlp", True) else llm * h
    heads = vq * (h * codes + codes)  # weight_norm: weight_v plus one weight_g per output row
    llama = _CHATTTS_LLAMA_VOCAB * h + whole(tts, "num_hidden_layers") * (4 * h * h + 3 * h * i + 2 * h) + h
    return projector + vq * codes * h + whole(tts, "num_text_tokens") * h + heads + _DVAE_PARAMS + llama


def _minicpmo_tower_params(full: dict[str, Any], text_hidden: int, whole: Any) -> int:
    """MiniCPM-o 2.6 (remote code modeling_minicpmo.py MiniCPMO.__init__): the towers its init_vision / init_audio /
    init_tts flags build (each defaults to true in MiniCPM_o_2_6Config, and verl's fsdp_workers.py loads the model
    with the file's config as it is): SigLIP + resampler, Whisper's encoder + a two-layer projector from
    encoder_ffn_dim // 4, and ChatTTS."""
    total = 0
    if full.get("init_vision", True) is not False:
        vision = {**_MINICPMO_VISION_DEFAULTS, **(full.get("vision_config") or {})}
        layers = whole(vision, "num_hidden_layers") - (1 if full.get("drop_vision_last_layer", True) else 0)
        total += _navit_siglip_params(vision, layers, whole)
        total += _resampler_params(whole(full, "query_num", 64), text_hidden, whole(vision, "hidden_size"))
    if full.get("init_audio", True) is not False:
        audio = {**_LIGHT_DEFAULTS["whisper"], **(full.get("audio_config") or {})}
        out = whole(audio, "encoder_ffn_dim") // 4
        total += _whisper_encoder_params(audio, whole) + (out * text_hidden + text_hidden) + (
            text_hidden * text_hidden + text_hidden)
    if full.get("init_tts", True) is not False:
        total += _chattts_params({**_CHATTTS_DEFAULTS, **(full.get("tts_config") or {})}, whole)
    return total


_OMNI_TOWERS = {"minicpmo": _minicpmo_tower_params}
