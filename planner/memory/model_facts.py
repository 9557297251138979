"""Per-token and per-layer sizes of one architecture (memory-model.md section 2), derived once per
Architecture and cached: parameters, saved activation bytes per layer, forward transients, LoRA parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.plan import Plan

T = TypeVar("T")


@frozen
class ModelFacts:
    """Per-token and per-layer sizes of one architecture, derived once and cached."""

    params: int
    layer_params: int
    layers: int
    hidden: int
    vocab: int
    tied: bool
    # Saved bytes per token summed over all layers without recompute, and the largest single layer.
    activation_bytes_per_token: int
    layer_activation_bytes_per_token: int
    # No_grad forward temporaries per token, memory-model.md 2.5: 4h + 6I (I = active MLP width).
    forward_transient_bytes_per_token: int
    # Largest single weight tensor in elements (what one full_tensor() gathers at weight sync).
    largest_tensor: int
    critic_params: int
    # Parameters of routed experts (decode reads only the experts a batch touches).
    routed_expert_params: int
    # Forward FLOPs per token: matmuls, plus attention per token of context (arch.forward_flops_per_token).
    matmul_flops_per_token: float
    attention_flops_per_context_token: float

    def forward_flops_per_token(self, context_len: float) -> float:
        return self.matmul_flops_per_token + self.attention_flops_per_context_token * context_len


def linear_attention_saved_elements(arch: Architecture) -> int:
    """Elements one Gated DeltaNet layer saves per token for its backward (transformers' Qwen3NextGatedDeltaNet
    with fla's chunked kernels, Megatron-Core's GatedDeltaNet alike): in_proj_qkvz's output (q, k, v and the gate
    z), in_proj_ba's (beta and the decay input), the conv's output and its SiLU (the kernel's q, k, v), the
    kernel's output, the gated norm's output (out_proj's input)."""
    conv, value = arch.linear_attention_conv_dim, arch.linear_num_value_heads * arch.linear_value_head_dim
    return (conv + value) + 2 * arch.linear_num_value_heads + 2 * conv + 2 * value


def mixer_saved_bytes(arch: Architecture, attention: float) -> float:
    """A decoder layer's token-mixer activations per token, as the mean over the layers: `attention` (bf16 bytes
    of an attention layer, as the caller's backend saves them) plus gated attention's gate (the gate half of
    q_proj's output and its sigmoid), and a linear-attention layer's saved elements in bf16 (Qwen3-Next)."""
    if arch.attention_output_gate:
        attention += 4 * arch.q_width
    if not arch.linear_attention_layers:
        return attention
    linear = 2 * linear_attention_saved_elements(arch)
    return (arch.num_full_attention_layers * attention + arch.linear_attention_layers * linear) / arch.num_layers


def _layer_activation_bytes(arch: Architecture, mlp_width: int, routed: bool) -> int:
    """Saved bytes per token of one HF decoder layer in bf16 with fp32 RMSNorm inputs (memory-model.md 2.2)."""
    h = arch.hidden_size
    nh = arch.num_attention_heads
    # Each RMSNorm: fp32 input, fp32 rsqrt, bf16 normed and weighted outputs.
    norms = arch.norms_per_layer * (8 * h + 4)
    if arch.is_mla:
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        attention = 4 * nh * qk_head + 4 * nh * arch.v_head_dim + 2 * arch.kv_width + 2 * arch.q_lora_rank
    else:
        attention = 4 * arch.q_width + 4 * arch.kv_width
    attention += 4 * nh
    if arch.qk_norm:
        attention += 6 * (arch.q_width + arch.kv_width)
    attention = int(mixer_saved_bytes(arch, attention))
    mlp = 8 * mlp_width
    if routed:
        # fp32 router probabilities, and the hidden states permuted to and from the chosen experts.
        mlp += 6 * arch.num_experts + 4 * arch.num_experts_per_token * h
    return norms + attention + mlp


# Caches keyed by architecture identity: the solver evaluates thousands of plans sharing one
# Architecture, and hashing its thirty fields would cost more than the arithmetic it saves.
_BY_ARCH: dict[tuple[int, object], tuple[Architecture, object]] = {}


def _cached(arch: Architecture, key: object, compute: Callable[[], T]) -> T:
    entry = _BY_ARCH.get((id(arch), key))
    if entry is not None and entry[0] is arch:
        return entry[1]  # type: ignore[return-value]
    if len(_BY_ARCH) > 1024:
        _BY_ARCH.clear()
    value = compute()
    _BY_ARCH[(id(arch), key)] = (arch, value)
    return value


def cached_per_arch(arch: Architecture, key: object, compute: Callable[[], T]) -> T:
    """`compute()` once per architecture and hashable `key` (the backends' per-layout sizes share this cache)."""
    return _cached(arch, key, compute)


def model_facts(arch: Architecture) -> ModelFacts:
    return _cached(arch, None, lambda: _model_facts(arch))


def _model_facts(arch: Architecture) -> ModelFacts:
    h = arch.hidden_size
    dense = _layer_activation_bytes(arch, arch.intermediate_size, routed=False)
    active_moe_width = arch.num_experts_per_token * arch.moe_intermediate_size + arch.shared_expert_intermediate_size
    moe = _layer_activation_bytes(arch, active_moe_width, routed=True) if arch.is_moe else 0
    total = arch.num_dense_layers * dense + arch.num_moe_layers * moe
    widest_mlp = active_moe_width if arch.num_moe_layers and not arch.num_dense_layers else arch.intermediate_size
    largest_tensor = max(arch.vocab_size * h, arch.intermediate_size * h)
    routed = 0
    if arch.is_moe:
        # transformers fuses each MoE layer's experts into one 3-D gate_up tensor.
        largest_tensor = max(largest_tensor, arch.num_experts * 2 * arch.moe_intermediate_size * h)
        routed = arch.num_moe_layers * arch.num_experts * 3 * h * arch.moe_intermediate_size
    return ModelFacts(
        params=arch.total_params,
        layer_params=arch.largest_layer_params,
        layers=arch.num_layers,
        hidden=h,
        vocab=arch.vocab_size,
        tied=arch.tie_word_embeddings,
        activation_bytes_per_token=total,
        layer_activation_bytes_per_token=max(dense if arch.num_dense_layers else 0, moe),
        forward_transient_bytes_per_token=4 * h + 6 * widest_mlp,
        largest_tensor=largest_tensor,
        critic_params=arch.total_params - arch.lm_head_params + h,
        routed_expert_params=routed,
        matmul_flops_per_token=arch.forward_flops_per_token(0),
        attention_flops_per_context_token=arch.forward_flops_per_token(1) - arch.forward_flops_per_token(0),
    )


def lora_params(plan: Plan) -> int:
    lora = plan.model.lora
    if not lora.enabled:
        return 0
    arch = plan.model.arch
    targets = "all-linear" if lora.target_modules == ("all-linear",) else lora.target_modules
    return _cached(arch, (lora.rank, targets), lambda: arch.lora_params(lora.rank, targets))
