"""A model's architecture, as the memory and time models need it.

Everything is derived from the numbers of a Hugging Face ``config.json`` (GQA,
tied embeddings, gated MLP width, MoE experts, MLA ranks, vocabulary), never
from a parameter count alone: two models of the same size can differ by 2x in
KV bytes per token or in logits memory.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.validators import field_check

# Projection names peft's "all-linear" reaches in HF decoder layers, by role.
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


_positive = field_check("model.arch", lambda value: not value <= 0, "must be a positive integer, got {value}.",
                        "set {field} to the value in the model's config.json")
_non_negative = field_check("model.arch", lambda value: not value < 0, "must be >= 0, got {value}.",
                            "set {field} to 0 or to the value in the model's config.json")


def heads_split_evenly(heads: int, kv_heads: int, n: int) -> bool:
    """n ranks each take heads / n attention heads, and the KV heads either split (kv_heads % n == 0) or
    are copied to several ranks (n % kv_heads == 0): verl's Ulysses check and vLLM's attention asserts
    (rules R5, R8). The runtime's Ulysses attention asks it of an HF config."""
    return heads % n == 0 and (kv_heads % n == 0 or n % kv_heads == 0)


@frozen(kw_only=True)
class Architecture:
    """A decoder-only transformer, described by its config.json numbers."""

    family: str
    hidden_size: int = attrs.field(validator=_positive)
    num_layers: int = attrs.field(validator=_positive)
    num_attention_heads: int = attrs.field(validator=_positive)
    num_kv_heads: int = attrs.field(validator=_positive)
    head_dim: int = attrs.field(validator=_positive)
    intermediate_size: int = attrs.field(validator=_positive)
    vocab_size: int = attrs.field(validator=_positive)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = attrs.field(default=32768, validator=_positive)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = attrs.field(default=2, validator=_non_negative)
    # Mixture of experts: 0 experts means a dense model.
    num_experts: int = attrs.field(default=0, validator=_non_negative)
    num_experts_per_token: int = attrs.field(default=0, validator=_non_negative)
    moe_intermediate_size: int = attrs.field(default=0, validator=_non_negative)
    shared_expert_intermediate_size: int = attrs.field(default=0, validator=_non_negative)
    first_dense_layers: int = attrs.field(default=0, validator=_non_negative)
    expert_bias: bool = False
    # Multi-head latent attention (DeepSeek-V2/V3): 0 kv_lora_rank means standard attention.
    q_lora_rank: int = attrs.field(default=0, validator=_non_negative)
    kv_lora_rank: int = attrs.field(default=0, validator=_non_negative)
    qk_nope_head_dim: int = attrs.field(default=0, validator=_non_negative)
    qk_rope_head_dim: int = attrs.field(default=0, validator=_non_negative)
    v_head_dim: int = attrs.field(default=0, validator=_non_negative)
    # A vision-language model's image encoder and projector: trained and stored with the text stack
    # (weights, gradients, optimizer state) but outside every text token's path.
    vision_params: int = attrs.field(default=0, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        if not self.is_mla and self.num_attention_heads % self.num_kv_heads != 0:
            raise PlanError(
                field="model.arch.num_kv_heads",
                message=(
                    f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                    f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention."
                ),
                fix="copy num_key_value_heads from the model's config.json",
            )
        if self.num_experts and not 0 < self.num_experts_per_token <= self.num_experts:
            raise PlanError(
                field="model.arch.num_experts_per_token",
                message=(
                    f"an MoE model with {self.num_experts} experts needs 1 <= num_experts_per_token "
                    f"<= {self.num_experts}, got {self.num_experts_per_token}."
                ),
                fix="copy num_experts_per_tok from the model's config.json",
            )
        if self.num_experts and self.moe_intermediate_size <= 0:
            raise PlanError(
                field="model.arch.moe_intermediate_size",
                message="an MoE model needs the width of one expert's MLP.",
                fix="copy moe_intermediate_size (or intermediate_size for gpt-oss) from config.json",
            )
        if self.first_dense_layers > self.num_layers:
            raise PlanError(
                field="model.arch.first_dense_layers",
                message=f"{self.first_dense_layers} dense layers exceed num_layers ({self.num_layers}).",
                fix="copy first_k_dense_replace from the model's config.json",
            )

    # --- shape facts -------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def splits_heads(self, n: int, *, latent_kv: bool = False) -> bool:
        """Whether n ranks can share the attention heads (Ulysses sp, or the rollout engine's TP).

        `latent_kv`: the engine keeps MLA's compressed KV whole on every rank (vLLM's and SGLang's
        MLA attention), so for an MLA model only the query heads must split.
        """
        if latent_kv and self.is_mla:
            return self.num_attention_heads % n == 0
        return heads_split_evenly(self.num_attention_heads, self.num_kv_heads, n)

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def q_width(self) -> int:
        """Width of the attention output before o_proj (nh * head_dim, or nh * v_head_dim for MLA)."""
        if self.is_mla:
            return self.num_attention_heads * self.v_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of one of K or V per token (n_kv * head_dim); the MLA latent for MLA models."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.num_kv_heads * self.head_dim

    # --- parameter counts -------------------------------------------------
    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def attention_params(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            nh = self.num_attention_heads
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * qk_head
            else:
                q = h * nh * qk_head
            kv = (
                h * (self.kv_lora_rank + self.qk_rope_head_dim)
                + self.kv_lora_rank
                + self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)
            )
            return q + kv + nh * self.v_head_dim * h
        q = h * self.q_width
        kv = 2 * h * self.kv_width
        params = q + kv + self.q_width * h
        if self.qkv_bias:
            params += self.q_width + 2 * self.kv_width
        if self.o_bias:
            params += h
        if self.qk_norm:
            params += 2 * self.head_dim
        if self.family == "gpt_oss":
            params += self.num_attention_heads  # attention sinks
        return params

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def _expert_params(self, experts: int) -> int:
        per_expert = 3 * self.hidden_size * self.moe_intermediate_size
        if self.expert_bias:
            per_expert += 2 * self.moe_intermediate_size + self.hidden_size
        router = self.hidden_size * self.num_experts + (self.num_experts if self.expert_bias else 0)
        shared = 3 * self.hidden_size * self.shared_expert_intermediate_size
        return experts * per_expert + router + shared

    @property
    def moe_mlp_params(self) -> int:
        return self._expert_params(self.num_experts) if self.is_moe else 0

    @property
    def norm_params_per_layer(self) -> int:
        return self.norms_per_layer * self.hidden_size

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.dense_mlp_params + self.norm_params_per_layer

    @property
    def moe_layer_params(self) -> int:
        return self.attention_params + self.moe_mlp_params + self.norm_params_per_layer if self.is_moe else 0

    @property
    def largest_layer_params(self) -> int:
        """N_L: what one FSDP all-gather of a decoder layer unshards."""
        return max(self.dense_layer_params if self.num_dense_layers else 0, self.moe_layer_params)

    @property
    def total_params(self) -> int:
        return (
            self.embedding_params
            + self.lm_head_params
            + self.num_dense_layers * self.dense_layer_params
            + self.num_moe_layers * self.moe_layer_params
            + self.hidden_size  # final norm
            + self.vision_params
        )

    @property
    def active_params(self) -> int:
        """Parameters one text token passes through: routed experts count only their top-k."""
        if not self.is_moe:
            return self.total_params - self.vision_params
        active_moe_layer = (
            self.attention_params + self._expert_params(self.num_experts_per_token) + self.norm_params_per_layer
        )
        return (
            self.embedding_params
            + self.lm_head_params
            + self.num_dense_layers * self.dense_layer_params
            + self.num_moe_layers * active_moe_layer
            + self.hidden_size
        )

    @property
    def active_matmul_params(self) -> int:
        """Parameters in matmuls one token pays FLOPs for (the input embedding is a lookup)."""
        head = self.vocab_size * self.hidden_size
        return self.active_params - self.embedding_params - self.lm_head_params + head

    def lora_params(self, rank: int, target_modules: tuple[str, ...] | str = "all-linear") -> int:
        """Adapter parameters: r * (in + out) per targeted linear, summed over layers.

        Routed experts are fused 3-D parameters in current transformers MoE blocks, which
        peft's all-linear does not reach; shared experts and dense MLPs are reached.
        """
        if rank <= 0:
            return 0
        wanted = set(ATTENTION_PROJECTIONS + MLP_PROJECTIONS) if target_modules == "all-linear" else set(target_modules)
        h = self.hidden_size
        per_layer_attention = 0
        if self.is_mla:
            # q_a/q_b/kv_a/kv_b/o: treat the q_* and kv_* pieces as q_proj/k_proj/v_proj targets.
            nh = self.num_attention_heads
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            shapes = {
                "q_proj": (h, nh * qk_head) if not self.q_lora_rank else (h + nh * qk_head, 2 * self.q_lora_rank),
                "k_proj": (h, self.kv_lora_rank + self.qk_rope_head_dim),
                "v_proj": (self.kv_lora_rank, nh * (self.qk_nope_head_dim + self.v_head_dim)),
                "o_proj": (nh * self.v_head_dim, h),
            }
        else:
            shapes = {
                "q_proj": (h, self.q_width),
                "k_proj": (h, self.kv_width),
                "v_proj": (h, self.kv_width),
                "o_proj": (self.q_width, h),
            }
        for name, (fan_in, fan_out) in shapes.items():
            if name in wanted:
                per_layer_attention += rank * (fan_in + fan_out)
        mlp_pairs = {"gate_proj": (h, 1), "up_proj": (h, 1), "down_proj": (1, h)}

        def mlp_lora(width: int) -> int:
            total = 0
            for name, (fan_in, fan_out) in mlp_pairs.items():
                if name in wanted and width:
                    total += rank * ((fan_in if fan_in != 1 else width) + (fan_out if fan_out != 1 else width))
            return total

        dense = self.num_dense_layers * (per_layer_attention + mlp_lora(self.intermediate_size))
        moe = self.num_moe_layers * (per_layer_attention + mlp_lora(self.shared_expert_intermediate_size))
        return dense + moe

    # --- per-token sizes --------------------------------------------------
    def kv_cache_bytes_per_token(self, tensor_parallel_size: int = 1, dtype_bytes: int = 2) -> int:
        """Per-rank KV bytes per token, as vLLM sizes its cache.

        K and V heads are split over TP ranks and replicated once TP exceeds n_kv.
        MLA caches one latent (kv_lora_rank + rope dims) per token, replicated on every rank.
        """
        if self.is_mla:
            return self.num_layers * self.kv_width * dtype_bytes
        kv_heads_per_rank = max(1, self.num_kv_heads // tensor_parallel_size)
        return 2 * self.num_layers * kv_heads_per_rank * self.head_dim * dtype_bytes

    def forward_flops_per_token(self, context_len: int) -> float:
        """Forward FLOPs for one token attending to `context_len` earlier tokens."""
        matmul = 2.0 * self.active_matmul_params
        qk_dim = (self.qk_nope_head_dim + self.qk_rope_head_dim) if self.is_mla else self.head_dim
        v_dim = self.v_head_dim if self.is_mla else self.head_dim
        attention = 2.0 * self.num_layers * self.num_attention_heads * (qk_dim + v_dim) * context_len
        return matmul + attention


# --- reading config.json ----------------------------------------------------------
#
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
    "glm4_moe": "glm4_moe", "gpt_oss": "gpt_oss",
}
# Families whose routed experts' width is config.json's intermediate_size (no moe_intermediate_size key).
_EXPERT_WIDTH_IN_INTERMEDIATE_SIZE = frozenset({"gpt_oss", "mixtral", "llama4"})
_QK_NORM_FAMILIES = frozenset({"qwen3", "qwen3_moe", "gemma3"})  # a learned RMSNorm of head_dim on q and on k
_FOUR_NORM_FAMILIES = frozenset({"gemma2", "gemma3"})  # pre/post norms around attention and around the MLP
_TIED_BY_DEFAULT = frozenset({"gemma2", "gemma3"})

# A composite (vision-language) model_type -> the model types of its text and vision parts.
_PART_TYPES = {
    "gemma3": ("gemma3_text", "siglip_vision_model"),
    "llama4": ("llama4_text", "llama4_vision_model"),
    "qwen2_5_vl": ("qwen2_5_vl_text", "qwen2_5_vl_vision"),
    "qwen3_vl": ("qwen3_vl_text", "qwen3_vl_vision"),
    "qwen3_vl_moe": ("qwen3_vl_moe_text", "qwen3_vl_moe_vision"),
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
                      "rlplan prices the vision towers of gemma3, llama4, qwen2_5_vl, qwen3_vl and qwen3_vl_moe only.")
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
        qkv_bias=bool(get("attention_bias", family == "qwen2")) or family in ("qwen2", "qwen2_moe"),
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


_VISION_TOWERS = {
    "gemma3": _gemma3_vision_params,
    "llama4": _llama4_vision_params,
    "qwen2_5_vl": _qwen2_5_vl_vision_params,
    "qwen3_vl": _qwen3_vl_vision_params,
    "qwen3_vl_moe": _qwen3_vl_vision_params,
}
