"""A Hugging Face config.json -> an Architecture: the model's own transformers config class where
transformers is installed, else a light table of the class defaults published files rely on.

Pure: the caller reads the file (presets, the CLI).  Vision towers are priced from their own config;
layer kinds the model cannot price (state-space, linear attention) are refused by name.
"""

from __future__ import annotations

from typing import Any

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
    "projector_output_dim", "vision_output_dim",
})

# model_type -> the family of its text stack, whichever wrapper (vision-language, Kimi's
# DeepSeek-V3 clone) holds it. An unlisted model_type keeps its own name.
_FAMILIES = {
    "qwen2": "qwen2", "qwen2_vl": "qwen2", "qwen2_vl_text": "qwen2", "qwen2_5_vl": "qwen2", "qwen2_5_vl_text": "qwen2",
    "qwen2_moe": "qwen2_moe",
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
_QK_NORM_FAMILIES = frozenset({"qwen3", "qwen3_moe", "gemma3"})  # a learned RMSNorm of head_dim on q and on k
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
    filled = None
    if read_with != "light":
        filled = _through_transformers(config, model_type, strict=read_with == "transformers")
    if filled is None:
        filled = _with_light_defaults(config, model_type)
    return _architecture_from_filled(filled, model_type, source, stated_ties)


def _refuse(source: str, feature: str, why: str) -> PlanError:
    return PlanError(
        field="model",
        message=f"{source} describes a model with {feature}, which rlplan does not model: {why}",
        fix="plan a model without it (`rlplan presets models` lists the supported ones); "
            "rlplan refuses rather than mis-cost the memory",
    )


def _refuse_unmodelled_layers(text: dict[str, Any], source: str) -> None:
    layer_types = text.get("layer_types") or ()
    odd = sorted({str(kind) for kind in layer_types} - _KV_CACHE_LAYER_TYPES) if isinstance(layer_types, list) else []
    recurrent_keys = [key for key in _RECURRENT_LAYER_KEYS if text.get(key) is not None]
    if odd or recurrent_keys:
        count = sum(1 for kind in layer_types if kind not in _KV_CACHE_LAYER_TYPES) if odd else None
        what = f"{count} of {len(layer_types)} layers of type {', '.join(odd)}" if odd else ", ".join(recurrent_keys)
        raise _refuse(
            source, f"linear-attention / state-space layers ({what})",
            "those layers keep a fixed-size recurrent state per sequence instead of a KV cache (Qwen3-Next's "
            "Gated DeltaNet, Mamba hybrids), and the rollout memory model prices only KV caches.",
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
        if full.get(key) is not None:
            raise _refuse(source, f"a non-text encoder ({key})", "its weights are not priced.")
    vision = full.get("vision_config")
    if vision is not None and model_type not in _VISION_TOWERS:
        raise _refuse(source, f"a vision tower ({model_type or 'unnamed model_type'})",
                      f"rlplan prices the vision towers of {', '.join(sorted(_VISION_TOWERS))} only.")
    _refuse_unmodelled_layers(text, source)
    text_type = str(text.get("model_type") or model_type).lower()
    family = _FAMILIES.get(text_type, _FAMILIES.get(model_type, text_type or "llama"))
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
    if family in ("qwen2_moe", "llama4"):
        shared = int(get("shared_expert_intermediate_size", 0)) if family == "qwen2_moe" else moe_width
    dense_layers = _dense_layer_count(text, family, layers, num_experts, get) if num_experts else 0
    ties = [*stated_ties, text.get("tie_word_embeddings"), full.get("tie_word_embeddings")]
    tied = next((tie for tie in ties if tie is not None), family in _TIED_BY_DEFAULT)
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
        vision_params=vision_params,
        mtp_layers=int(get("num_nextn_predict_layers", 0)) or None if model_type in _MTP_LAYER_TYPES else None,
    )


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
    if family in ("qwen2_moe", "qwen3_moe"):
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
