"""A model's architecture, as the memory and time models need it.

Everything is derived from the numbers of a Hugging Face ``config.json`` (GQA,
tied embeddings, gated MLP width, MoE experts, MLA ranks, vocabulary), never
from a parameter count alone: two models of the same size can differ by 2x in
KV bytes per token or in logits memory.
hf_config.py reads a config.json into one.
"""

from __future__ import annotations

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


# Field metadata: a plan file writes the field only where it differs from its default (a feature few models have,
# so plans of the others read as before it existed; planfile.plan_to_dict).
WRITTEN_WHEN_SET = {"written_when_set": True}


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
    # config.json's rope_scaling, which verl's rollout and vLLM read beside max_position_embeddings (rules
    # max_model_len_within_model): its rope_type (older files: type; "" where the file has none, so a plan of a
    # model without it reads as before), its factor (1.0 where it states none: the mrope of Qwen2-VL), and the
    # original_max_position_embeddings it states (YaRN, Llama 3's; 0 where it states none).
    rope_scaling_type: str = attrs.field(default="", metadata=WRITTEN_WHEN_SET)
    rope_scaling_factor: float = attrs.field(
        default=1.0, metadata=WRITTEN_WHEN_SET,
        validator=field_check("model.arch", lambda value: not value <= 0, "must be a positive number, got {value}.",
                              "set {field} to rope_scaling.factor in the model's config.json"))
    rope_original_max_position_embeddings: int = attrs.field(default=0, validator=_non_negative,
                                                             metadata=WRITTEN_WHEN_SET)
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
    # Gated attention (Qwen3-Next): q_proj also writes a per-head output gate, so it is twice as wide.
    attention_output_gate: bool = attrs.field(default=False, metadata=WRITTEN_WHEN_SET)
    # Linear-attention layers (Qwen3-Next's Gated DeltaNet) in place of attention in that many decoder layers: no
    # KV cache, a fixed-size state per sequence (a short convolution's window and a heads x key x value matrix).
    linear_attention_layers: int = attrs.field(default=0, validator=_non_negative, metadata=WRITTEN_WHEN_SET)
    linear_num_key_heads: int = attrs.field(default=0, validator=_non_negative, metadata=WRITTEN_WHEN_SET)
    linear_num_value_heads: int = attrs.field(default=0, validator=_non_negative, metadata=WRITTEN_WHEN_SET)
    linear_key_head_dim: int = attrs.field(default=0, validator=_non_negative, metadata=WRITTEN_WHEN_SET)
    linear_value_head_dim: int = attrs.field(default=0, validator=_non_negative, metadata=WRITTEN_WHEN_SET)
    linear_conv_kernel_dim: int = attrs.field(default=0, validator=_non_negative, metadata=WRITTEN_WHEN_SET)
    # A vision-language model's image encoder and projector: trained and stored with the text stack
    # (weights, gradients, optimizer state) but outside every text token's path.
    vision_params: int = attrs.field(default=0, validator=_non_negative)
    # Multi-token-prediction layers the checkpoint ships beside the stack (config.json num_nextn_predict_layers):
    # verl keeps and trains them only where the plan turns model.mtp on (plan.MtpSection); otherwise it sets the
    # count to 0 and builds the stack alone. None: the checkpoint has none rlplan prices.
    mtp_layers: int | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))

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
        linear_shape = (self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                        self.linear_value_head_dim, self.linear_conv_kernel_dim)
        if self.linear_attention_layers and (self.linear_attention_layers >= self.num_layers or min(linear_shape) <= 0):
            raise PlanError(
                field="model.arch.linear_attention_layers",
                message=(
                    f"{self.linear_attention_layers} linear-attention layers need fewer than num_layers "
                    f"({self.num_layers}) and positive linear_num_key_heads, linear_num_value_heads, "
                    "linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim."
                ),
                fix="copy the linear_* keys and the layer types from the model's config.json",
            )
        if self.first_dense_layers > self.num_layers:
            raise PlanError(
                field="model.arch.first_dense_layers",
                message=f"{self.first_dense_layers} dense layers exceed num_layers ({self.num_layers}).",
                fix="copy first_k_dense_replace from the model's config.json",
            )

    # --- context facts -----------------------------------------------------
    @property
    def rope_scaled(self) -> bool:
        """config.json has a rope_scaling (verl's rollouts test `getattr(hf_config, "rope_scaling", None)`)."""
        return bool(self.rope_scaling_type)

    @property
    def rope_scaled_positions(self) -> int:
        """max_position_embeddings x rope_scaling.factor: the length verl 0.5.x-0.6.x's rollouts hold prompt +
        response to for a rope-scaled model (vllm_rollout_spmd.py vLLMRollout.__init__, v0.5.0 line 127, v0.6.1
        line 184; sglang_rollout.py _verify_config alike), whatever the rope type."""
        return int(self.max_position_embeddings * self.rope_scaling_factor) if self.rope_scaled \
            else self.max_position_embeddings

    def vllm_derived_max_model_len(self, *, gemma3_prescaled: bool = True, yarn_prescaled: bool = False) -> int:
        """The longest max_model_len vLLM's ModelConfig takes for this config without VLLM_ALLOW_LONG_MAX_MODEL_LEN
        (_get_and_verify_max_len): the positions, times rope_scaling.factor except for the su / longrope / llama3
        types (already scaled), counted from original_max_position_embeddings for YaRN. What differs by vLLM release
        is two flags (stack.VLLM_GEMMA3_POSITIONS_PRESCALED, VLLM_YARN_POSITIONS_PRESCALED; the rule
        max_model_len_within_model sets them from the plan's stack): `gemma3_prescaled`, a Gemma 3 config's
        positions taken unscaled (vLLM from 0.8.0); `yarn_prescaled`, YaRN's positions taken as they stand (vLLM
        from 0.30.0). The defaults are vLLM 0.8.0-0.29's."""
        if (not self.rope_scaled or self.rope_scaling_type in ("su", "longrope", "llama3")
                or (gemma3_prescaled and "gemma3" in self.family)
                or (yarn_prescaled and self.rope_scaling_type == "yarn")):
            return self.max_position_embeddings
        base = self.max_position_embeddings
        if self.rope_scaling_type == "yarn" and self.rope_original_max_position_embeddings:
            base = self.rope_original_max_position_embeddings
        return int(base * self.rope_scaling_factor)

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
        Linear-attention layers split their key and value heads too, whole (vLLM's Gated DeltaNet layer and
        MambaStateShapeCalculator divide them by TP and assert it divides).
        """
        if self.linear_attention_layers and (self.linear_num_key_heads % n or self.linear_num_value_heads % n):
            return False
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
        q = h * self.q_width * (2 if self.attention_output_gate else 1)
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
    def num_full_attention_layers(self) -> int:
        """Decoder layers with attention (and a KV cache): all but the linear-attention ones."""
        return self.num_layers - self.linear_attention_layers

    @property
    def linear_attention_conv_dim(self) -> int:
        """Channels of a Gated DeltaNet layer's short convolution: q and k (key width each) and v."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim)

    @property
    def linear_attention_params(self) -> int:
        """One Gated DeltaNet mixer (transformers' Qwen3NextGatedDeltaNet): in_proj_qkvz (q, k, v and the output
        gate z), in_proj_ba (beta and the decay's input, one each per value head), the depthwise conv (no bias),
        dt_bias and A_log per value head, the gated RMSNorm over a value head, out_proj."""
        h, value = self.hidden_size, self.linear_num_value_heads * self.linear_value_head_dim
        in_proj = h * (self.linear_attention_conv_dim + value) + h * 2 * self.linear_num_value_heads
        return (in_proj + self.linear_attention_conv_dim * self.linear_conv_kernel_dim
                + 2 * self.linear_num_value_heads + self.linear_value_head_dim + value * h)

    @property
    def linear_attention_correction(self) -> int:
        """What the linear-attention layers' mixers weigh beyond the attention the per-layer counts assume."""
        return self.linear_attention_layers * (self.linear_attention_params - self.attention_params)

    def linear_attention_state_elements(self, tensor_parallel_size: int = 1) -> int:
        """One sequence's recurrent state in one linear-attention layer on one rank (vLLM's
        MambaStateShapeCalculator.gated_delta_net_state_shape): the conv window (kernel - 1 steps of the conv
        channels) and the heads x key x value matrix, both split over TP."""
        t = tensor_parallel_size
        conv = (self.linear_conv_kernel_dim - 1) * (self.linear_attention_conv_dim // t)
        return conv + (self.linear_num_value_heads // t) * self.linear_key_head_dim * self.linear_value_head_dim

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
    def mtp_layer_params(self) -> int:
        """One multi-token-prediction layer as Megatron-Core builds it (multi_token_prediction.py
        MultiTokenPredictionLayer; MiMo's MiMoMTPLayers alike): a dense decoder layer, the 2h -> h projection of the
        normed embedding beside the normed hidden state (eh_proj, no bias) and three RMSNorms (the embedding's,
        the hidden state's, the final one); the embedding and the output layer are the model's own."""
        return self.dense_layer_params + 2 * self.hidden_size * self.hidden_size + 3 * self.hidden_size

    @property
    def moe_layer_params(self) -> int:
        return self.attention_params + self.moe_mlp_params + self.norm_params_per_layer if self.is_moe else 0

    @property
    def largest_layer_params(self) -> int:
        """N_L: what one FSDP all-gather of a decoder layer unshards."""
        largest = max(self.dense_layer_params if self.num_dense_layers else 0, self.moe_layer_params)
        return largest + max(0, self.linear_attention_params - self.attention_params if self.linear_attention_layers
                             else 0)

    @property
    def total_params(self) -> int:
        return (
            self.embedding_params
            + self.lm_head_params
            + self.num_dense_layers * self.dense_layer_params
            + self.num_moe_layers * self.moe_layer_params
            + self.hidden_size  # final norm
            + self.vision_params
            + self.linear_attention_correction
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
            + self.linear_attention_correction
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

        K and V heads of the attention layers (linear-attention layers keep none) are split over TP ranks and
        replicated once TP exceeds n_kv.
        MLA caches one latent (kv_lora_rank + rope dims) per token, replicated on every rank.
        """
        if self.is_mla:
            return self.num_layers * self.kv_width * dtype_bytes
        kv_heads_per_rank = max(1, self.num_kv_heads // tensor_parallel_size)
        return 2 * self.num_full_attention_layers * kv_heads_per_rank * self.head_dim * dtype_bytes

    def forward_flops_per_token(self, context_len: int) -> float:
        """Forward FLOPs for one token attending to `context_len` earlier tokens."""
        matmul = 2.0 * self.active_matmul_params
        qk_dim = (self.qk_nope_head_dim + self.qk_rope_head_dim) if self.is_mla else self.head_dim
        v_dim = self.v_head_dim if self.is_mla else self.head_dim
        attention = 2.0 * self.num_full_attention_layers * self.num_attention_heads * (qk_dim + v_dim) * context_len
        return matmul + attention
