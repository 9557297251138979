"""The Megatron training backend's memory per rank (verl's megatron workers over Megatron-Core): pure functions.

Where a rank's bytes go under Megatron's parallelism, on the most loaded rank:

- weights, gradients and the optimizer: the dense part of the model (attention, norms, dense and shared-expert
  MLPs, routers) is split over TP x PP, the routed experts over EP x ETP x PP; the first and last pipeline
  stages also hold the vocabulary-parallel embedding / output layer over TP. Megatron keeps bf16 weights, fp32
  gradients (its DDP grad buffer) and, per parameter, 12 bytes of fp32 master weights and Adam moments, which
  the distributed optimizer shards over the data-parallel group (DP x CP for dense parameters, the expert
  data-parallel group for experts): Megatron-Core's 18, or 6 + 12 / DP, bytes per parameter.
- activations: Korthikanti et al. (arXiv 2205.05198) Table 2 per layer, generalised to grouped KV heads and
  gated MLPs and to routed experts, split over TP with sequence parallelism (only the TP-split part without
  it) and over CP along the sequence; full recompute keeps each layer's input and one recomputed chunk. The
  first pipeline stage holds min(PP, micro batches) micro batches under 1F1B (the interleaved schedule
  PP x (1 + (PP - 1) / (PP x VPP))), the last one, and the vocabulary-parallel loss head's fp32 logits.

For a model Megatron-Core's own estimate covers (megatron/training/theoretical_memory_usage.py: ungated MLP,
multi-head attention, no experts) these functions give its numbers exactly
(tests/planner/test_memory_megatron.py); where they differ on purpose (gated MLPs, grouped KV heads, experts over EP, the loss head
on the last stage under PP) docs/accuracy.md section 6 lists by how much.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import attrs
from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.layout import PlanLayout, RoleBatchLayout
from rlplan.planner.memory.heads import LossHead
from rlplan.planner.memory.model_facts import cached_per_arch, lora_params, mixer_saved_bytes, model_facts
from rlplan.planner.memory.report import AllocationShape, Component, TrainerState
from rlplan.planner.plan import EngineRole, MegatronSection, Plan
from rlplan.planner.profile import Profile
from rlplan.planner.stack import MEGATRON_LOG_PROB_CLONES_LOGITS, MEGATRON_PP_STAGES_LOADED_FOR_ROLLOUT, holds

TrainedRole = Literal["actor", "critic"]

# Megatron-Core's bytes per parameter (theoretical_memory_usage.py): bf16 weight, fp32 gradient, and 12 bytes
# of optimizer state (fp32 master weight, Adam's two moments) the distributed optimizer shards over DP.
WEIGHT_BYTES = 2
GRAD_BYTES = 4
OPTIMIZER_BYTES = 12
# Of those, the fp32 master weight's 4: what the optimizer holds before its first step creates the moments.
MAIN_WEIGHT_SHARE_OF_ADAM = 4 / OPTIMIZER_BYTES
# Per token, the embedding's input ids (int64) and its dropout mask: Megatron's 8 s b + s b h per micro batch.
EMBEDDING_INPUT_BYTES = 8
# verl builds Megatron's TransformerConfig with hidden_dropout = getattr(hf_config, "hidden_dropout", 0.0) and
# the HF attention_dropout (verl/models/mcore/config_converter.py; mbridge's base config reads them alike): 0
# for the families rlplan models. Megatron's bias_dropout_add then calls torch.nn.functional.dropout with
# p = 0, which ATen returns as its input (aten/src/ATen/native/Dropout.cpp: the fused kernel needs 0 < p < 1,
# and _dropout returns the input when p == 0): no mask is saved. Megatron-Core's estimate keeps the masks.
VERL_SAVES_DROPOUT_MASKS = False


@frozen
class RankParameters:
    """Parameters (elements) one rank holds: the TP x PP-split dense part and the EP x ETP x PP-split experts."""

    dense: float
    experts: float

    @property
    def total(self) -> float:
        return self.dense + self.experts


@frozen
class RankState:
    """Bytes of one rank's training state."""

    weights: float
    grads: float
    optimizer: float
    # The larger of the dense and the expert parameters' optimizer state: Megatron keeps one optimizer per
    # group (a ChainedOptimizer over the dense and the expert-parallel ones) and steps them one after the other.
    largest_optimizer: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def routed_expert_params_per_layer(arch: Architecture) -> int:
    """The routed experts of one MoE layer (without router and shared expert, which stay with the dense part)."""
    if not arch.is_moe:
        return 0
    router = arch.hidden_size * arch.num_experts + (arch.num_experts if arch.expert_bias else 0)
    shared = 3 * arch.hidden_size * arch.shared_expert_intermediate_size
    return arch.moe_mlp_params - router - shared


def stage_share(arch: Architecture, engine: MegatronSection) -> float:
    """The share of the layers the most loaded pipeline stage holds: 1 / PP where PP divides the layers and the
    plan places none by hand, else MegatronSection.most_loaded_stage_layers of them (an unplaced uneven split,
    e.g. DeepSeek-V3's 61 layers, gives no stage fewer than the even split's largest: priced high, not low)."""
    return engine.most_loaded_stage_layers(arch.num_layers) / arch.num_layers


def parameters_on_most_loaded_rank(arch: Architecture, engine: MegatronSection, *,
                                   value_model: bool = False, mtp_layers: int = 0) -> RankParameters:
    """The elements the most loaded rank holds: its stage's layers and the embedding (first stage) or the output
    layer (last stage; both on one stage at PP 1, and Megatron keeps a copy of a tied embedding on the last).
    `value_model`: a critic, whose output layer verl's make_value_model replaces with LinearForLastLayer(hidden,
    1) (verl/models/mcore/bridge.py; mbridge's post_creation_callbacks alike). `mtp_layers`: the multi-token-
    prediction layers the model is built with (plan.ModelSection.mtp_layers), on the last stage."""
    sizes = (engine.tensor_model_parallel_size, engine.pipeline_model_parallel_size,
             engine.expert_model_parallel_size, engine.expert_tensor_size, stage_share(arch, engine))
    # The solver prices thousands of plans on a few layouts: one computation per (architecture, sizes).
    return cached_per_arch(arch, ("megatron_rank_params", sizes, value_model, mtp_layers),
                           lambda: _rank_parameters(arch, *sizes, value_model=value_model, mtp_layers=mtp_layers))


def _rank_parameters(arch: Architecture, tp: int, pp: int, ep: int, etp: int, stage: float, *,
                     value_model: bool, mtp_layers: int = 0) -> RankParameters:
    experts_per_layer = routed_expert_params_per_layer(arch)
    layer_dense = (arch.num_dense_layers * arch.dense_layer_params
                   + arch.num_moe_layers * (arch.moe_layer_params - experts_per_layer) + arch.hidden_size
                   + arch.linear_attention_correction)
    output_layer = arch.hidden_size if value_model else arch.lm_head_params
    vocab_layers = arch.embedding_params + (output_layer if pp == 1 else 0)
    if mtp_layers:
        # Megatron-Core builds the MTP block on the last stage, and an embedding there too for its inputs
        # (gpt_model.py: `if self.pre_process or self.mtp_process`): that stage holds both vocabulary layers.
        vocab_layers = arch.embedding_params + output_layer + mtp_layers * arch.mtp_layer_params
    dense = (layer_dense * stage + vocab_layers) / tp
    experts = arch.num_moe_layers * experts_per_layer * stage / (ep * etp)
    return RankParameters(dense=dense, experts=experts)


def state_on_most_loaded_rank(arch: Architecture, engine: MegatronSection, world: int,
                              trainable_fraction: float = 1.0, *, value_model: bool = False,
                              mtp_layers: int = 0) -> RankState:
    """Weights, gradients and optimizer state of the most loaded rank.

    `trainable_fraction`: the share of parameters that train (a LoRA adapter's share; 1 for full fine-tuning):
    only they carry gradients and optimizer state. The distributed optimizer shards the 12 bytes over the dense
    data-parallel group (world / (TP x PP), which includes CP) and the experts' (world / (EP x ETP x PP)).
    `value_model`: a critic (parameters_on_most_loaded_rank).
    """
    params = parameters_on_most_loaded_rank(arch, engine, value_model=value_model, mtp_layers=mtp_layers)
    dense_dp = max(world // engine.model_parallel_size, 1)
    expert_dp = max(engine.expert_data_parallel_size(world), 1)
    shard = engine.use_distributed_optimizer
    dense = OPTIMIZER_BYTES * trainable_fraction * params.dense / (dense_dp if shard else 1)
    experts = OPTIMIZER_BYTES * trainable_fraction * params.experts / (expert_dp if shard else 1)
    return RankState(weights=WEIGHT_BYTES * params.total, grads=GRAD_BYTES * trainable_fraction * params.total,
                     optimizer=dense + experts, largest_optimizer=max(dense, experts))


# torch.optim.AdamW's multi-tensor (foreach) step, megatron-core's Adam where neither Transformer Engine's nor
# Apex's FusedAdam imports (megatron/core/optimizer/__init__.py falls back to torch.optim.AdamW): it takes
# sqrt(exp_avg_sq) of every parameter of the shard at once into new fp32 tensors (torch/optim/adamw.py,
# _multi_tensor_adamw: torch._foreach_sqrt(device_exp_avg_sqs), then divided and added in place), 4 bytes per
# parameter of the optimizer shard on the GPU beside the state. The fused kernels update in place (0), and the
# single-tensor loop holds that buffer for one parameter at a time. Measured: docs/accuracy.md 6b.
FOREACH_ADAMW_STEP_BYTES_PER_PARAM = 4
# Which Adam verl's Megatron workers step on a GPU: Megatron-Core's fused one, so no full-size temporaries.
# megatron/core/optimizer/__init__.py imports transformer_engine.pytorch.optimizers.FusedAdam first, Apex's
# FusedAdam next, torch.optim.AdamW only when neither imports (read at NVIDIA/Megatron-LM core_v0.11.0,
# core_v0.12.0 to core_v0.15.0 and core_v0.16.1), and a verl Megatron run has Transformer Engine: verl builds
# every model on TE's layer spec (verl/models/mcore/model_initializer.py get_gpt_decoder_block_spec(...,
# use_transformer_engine=True), read at v0.4.0, v0.4.1, v0.5.0, v0.6.1, v0.7.0 and main; v0.3.0.post1's own
# Megatron models predate it and its docs/start/install.rst installs TE). The fused kernel updates the shard's
# params and moments in place (multi_tensor_adam); around it the step scales the grads for clipping in place
# (clip_grads.py multi_tensor_applier(multi_tensor_scale)), counts zeros only under log_num_zeros_in_grad
# (OptimizerConfig's default False, which verl leaves), and the fp32 main grads are views of the DDP grad buffer
# verl builds with grad_reduce_in_fp32=True (verl/utils/megatron_utils.py line 140 at 9f4161e2; the same in
# v0.3.0.post1 to v0.7.0), so _copy_model_grads_to_main_grads' .float() of them
# (distrib_optimizer.py, and optimizer.py without the distributed optimizer) copies nothing. Priced at 0 for
# every verl release and both workers. torch's foreach AdamW is what the CPU twin runs (runtime/megatron_twin.py:
# no TE / Apex there), which benchmarks/megatron_twin.py prices with `optimizer_step_bytes(foreach=...)` of the
# case it measured: the twin's rows keep the torch path's temporaries.
VERL_MEGATRON_STEPS_FUSED_ADAM = True


def optimizer_step_bytes(optimizer_state_bytes: float, *, foreach: bool) -> float:
    """The optimizer step's temporaries beside the state, from the optimizer state of the largest group Megatron
    steps at once (RankState.largest_optimizer: OPTIMIZER_BYTES a parameter of its shard, all of it without the
    distributed optimizer): torch's foreach AdamW's fp32 sqrt(exp_avg_sq) of that group where `foreach` (torch's
    AdamW, the CPU twin's), none for the fused kernels verl's GPU runs step (VERL_MEGATRON_STEPS_FUSED_ADAM)."""
    if not foreach:
        return 0.0
    return FOREACH_ADAMW_STEP_BYTES_PER_PARAM * optimizer_state_bytes / OPTIMIZER_BYTES


def layer_activation_bytes_per_token(arch: Architecture, *, moe: bool, tp: int, etp: int,
                                     sequence_parallel: bool, gated: bool = True,
                                     dropout_masks: bool = True, rotary_outputs: bool = True) -> float:
    """Saved activation bytes per token of one layer (selective recompute / flash attention: no score matrix).

    Korthikanti Table 2 term by term: layer-norm inputs (2h each), the attention and MLP inputs (2h each),
    Q, K and V, the attention output, the fc1 output (twice as wide when gated) and the activation's output,
    and the two dropout masks (h bytes each). With a multi-head ungated MLP this is Megatron's 18 + 4 f / h.
    The parts outside the tensor-parallel regions split over TP only with sequence parallelism. The MoE block
    (router and routed experts) sees the rank's sequence-parallel shard too: Megatron-Core's token dispatchers
    take hidden_states [S/TP, B, H] ("num_local_tokens: S/TP*B"), the alltoall one permutes them, all-to-alls
    over EP and all-gathers over the expert-TP group (permute -> A2A(EP) -> AG(ETP),
    megatron/core/transformer/moe/token_dispatcher.py, read at NVIDIA/Megatron-LM 0014f137). So per token of
    the micro batch a rank holds k / TP routed copies (k / TP x ETP after the gather) of the full hidden width,
    whose fc1 / activation outputs are 1 / ETP as wide. `dropout_masks`: the two hidden-dropout masks, saved
    only where hidden_dropout > 0 (VERL_SAVES_DROPOUT_MASKS). `rotary_outputs`: the rotary Q and K core
    attention saves (False: Megatron-Core's theoretical estimate, which leaves them out).
    """
    h = arch.hidden_size
    masks = 2 * h if dropout_masks else 0  # the masks after attention and after the MLP, a byte per element
    replicated = 2 * h + 2 * h + 2 * h + 2 * h + masks  # LN1 in, QKV in, LN2 in, fc1 in, the dropout masks
    # The fused QKV output (the value, a view of it, keeps all of it alive in core attention), the attention
    # output, and the rotary Q and K: rotary embedding (TE's fused RoPE as Megatron's own) writes new tensors,
    # which core attention saves (2 q + 2 kv; measured, docs/accuracy.md 6b: left out before, -9 % a layer).
    attention = 2 * (arch.q_width + 2 * arch.kv_width) + 2 * arch.q_width
    if rotary_outputs:
        attention += 2 * (arch.q_width + arch.kv_width)
    if arch.qk_norm:
        # Megatron's SelfAttention.get_query_key_value_tensors splits the fused QKV output into views; the
        # query's reshape to [tokens, heads, head_dim] copies it (2 q), and q_layernorm / k_layernorm (TENorm:
        # TE's RMSNorm saves its input) keep that copy and the key view (so the whole QKV output).
        attention += 2 * arch.q_width
    attention = mixer_saved_bytes(arch, attention)  # gated attention's gate; Qwen3-Next's Gated DeltaNet layers
    # rlplan's architectures are gated (SwiGLU: arch.dense_mlp_params = 3 h I); ungated is Megatron's estimate.
    gate = 2 if gated else 1
    if moe:
        f, k = arch.moe_intermediate_size, arch.num_experts_per_token
        # Per token of the rank's shard: the ETP-gathered token copies (full width), fc1 and activation outputs.
        routed = k * (2 * h * etp + 2 * f * gate + 2 * f)
        shared = 2 * arch.shared_expert_intermediate_size * (gate + 1)
        router = 4 * arch.num_experts  # fp32 routing probabilities
        split = attention + shared
        # Megatron-Core's TransformerConfig refuses EP with TP > 1 and no sequence parallelism; priced unsplit there.
        shard = tp if sequence_parallel else 1
        return (replicated + routed + router) / shard + split / tp
    f = arch.intermediate_size
    split = attention + 2 * f * gate + 2 * f
    return replicated / (tp if sequence_parallel else 1) + split / tp


def in_flight_micro_batches(engine: MegatronSection, micro_batches: int) -> float:
    """Micro batches whose activations the first pipeline stage holds at once: min(PP, m) under 1F1B;
    PP x (1 + (PP - 1) / (PP x VPP)) under the interleaved schedule (Megatron's memory penalty)."""
    pp, vpp = engine.pipeline_model_parallel_size, engine.virtual_pipeline_model_parallel_size
    if vpp is not None and vpp > 1:
        return pp * (1 + (pp - 1) / (pp * vpp))
    return min(pp, max(micro_batches, 1))


@frozen
class StageActivations:
    """Activation bytes of the first and the last pipeline stage for one training step's peak.

    `first_layers` / `last_layers`: the saved activations of the stage's layers (and the first stage's embedding
    inputs) for the micro batches it holds, without the loss head; `first` / `last` add the head where it sits
    (the last stage; at PP 1 the one stage is both)."""

    first_layers: float
    last_layers: float
    loss_head: float
    single_stage: bool
    # Of the layers' bytes, the chunk full recompute rebuilds inside a backward (0 without recompute): absent
    # while the loss head runs, before the last layer's backward.
    recomputed: float = 0.0

    @property
    def at_loss_head(self) -> float:
        """The last stage's layer bytes while the loss head runs."""
        return self.last_layers - self.recomputed

    @property
    def first(self) -> float:
        return self.first_layers + (self.loss_head if self.single_stage else 0.0)

    @property
    def last(self) -> float:
        return self.last_layers + self.loss_head

    @property
    def layers_peak(self) -> float:
        return max(self.first_layers, self.last_layers)

    @property
    def peak(self) -> float:
        return max(self.first, self.last)


@functools.lru_cache(maxsize=256)
def _per_layer_bytes(arch: Architecture, tp: int, etp: int, sequence_parallel: bool, gated: bool,
                     dropout_masks: bool = True, rotary_outputs: bool = True) -> tuple[float, ...]:
    """Each layer's saved bytes per token (the solver prices thousands of plans on a few layouts: cached)."""
    return tuple(layer_activation_bytes_per_token(arch, moe=index >= arch.num_dense_layers and arch.is_moe, tp=tp,
                                                  etp=etp, sequence_parallel=sequence_parallel, gated=gated,
                                                  dropout_masks=dropout_masks, rotary_outputs=rotary_outputs)
                 for index in range(arch.num_layers))


def stage_activations(arch: Architecture, engine: MegatronSection, *, tokens_per_micro_batch: int,
                      micro_batches: int, gated: bool = True, dropout_masks: bool = True,
                      rotary_outputs: bool = True) -> StageActivations:
    """The saved activations a training step's first and last stages hold at their peak.

    `tokens_per_micro_batch`: one micro batch's tokens on this data-parallel rank (before CP splits them).
    Full recompute (granularity full) keeps each layer's input and the `recompute_num_layers` layers being
    recomputed; the loss head's fp32 vocabulary-parallel logits and their gradient sit on the last stage.
    """
    tp, pp = engine.tensor_model_parallel_size, engine.pipeline_model_parallel_size
    tokens = math.ceil(tokens_per_micro_batch / engine.context_parallel_size)
    sp = engine.sequence_parallel and tp > 1
    recompute = ((engine.recompute_method or "uniform", engine.recompute_num_layers or 1)
                 if engine.recompute_granularity == "full" else None)
    stage_layers = engine.most_loaded_stage_layers(arch.num_layers)
    # Per layout, not per token budget: the solver's budget search calls this thousands of times on a few layouts.
    kept, recomputed = cached_per_arch(
        arch, ("megatron_stage_bytes", tp, stage_layers, engine.expert_tensor_size, sp, gated, dropout_masks,
               rotary_outputs, recompute),
        lambda: _stage_bytes_per_token(arch, tp, stage_layers, engine.expert_tensor_size, sp, gated, dropout_masks,
                                       rotary_outputs, recompute))
    embedding_inputs = EMBEDDING_INPUT_BYTES + arch.hidden_size
    in_flight = in_flight_micro_batches(engine, micro_batches)
    # Every micro batch in flight keeps its saved tensors; a recomputed chunk exists for one micro batch at a
    # time, inside its backward (before: counted once per micro batch in flight, 16x under DeepSeek-V3's PP 16).
    first = tokens * (in_flight * (kept + embedding_inputs / tp) + recomputed)
    last = first if pp == 1 else tokens * (kept + recomputed)
    return StageActivations(first_layers=first, last_layers=last,
                            loss_head=loss_head_bytes(arch, tp=tp, tokens=tokens), single_stage=pp == 1,
                            recomputed=tokens * recomputed)


def _stage_bytes_per_token(arch: Architecture, tp: int, stage_layers: int, etp: int, sp: bool, gated: bool,
                           dropout_masks: bool, rotary_outputs: bool,
                           recompute: tuple[str, int] | None) -> tuple[float, float]:
    """Bytes per token of the most loaded stage's layers: what each micro batch keeps until its backward, and
    what one micro batch's backward recomputes at a time. Under full recompute (`recompute`: method and
    recompute_num_layers) as Megatron-Core's TransformerBlock._checkpointed_forward runs it (read at
    megatron-core 0.16.1): `uniform` checkpoints the stage in chunks of n layers, saving each chunk's input,
    and its backward recomputes one chunk at a time; `block` checkpoints the stage's first n layers one at a
    time (their inputs saved, one recomputed in backward) and keeps every other layer's activations."""
    per_layer = _per_layer_bytes(arch, tp, etp, sp, gated, dropout_masks, rotary_outputs)
    mean_layer = sum(per_layer) / len(per_layer)
    if recompute is None:
        return stage_layers * mean_layer, 0.0
    method, layers = recompute
    layer_input = 2 * arch.hidden_size / (tp if sp else 1)
    if method == "block":
        checkpointed = min(layers, stage_layers)
        return checkpointed * layer_input + (stage_layers - checkpointed) * mean_layer, max(per_layer)
    chunk = min(layers, stage_layers)
    return math.ceil(stage_layers / chunk) * layer_input, chunk * max(per_layer)


def loss_head_bytes(arch: Architecture, *, tp: int, tokens: int, outputs: int | None = None) -> float:
    """The vocabulary-parallel output layer's input and its fp32 logits over TP (Megatron's 4 s b h (1 + V / h)
    / TP, its estimate's output-layer and cross-entropy term). `outputs`: the output layer's width where it is
    not the vocabulary (a value model's 1)."""
    return tokens * 4 * (arch.hidden_size + (arch.vocab_size if outputs is None else outputs)) / tp


# Megatron-Core's vocab_parallel_cross_entropy, which verl's log-prob (vocab_parallel_log_probs_from_logits)
# calls on the output layer's bf16 logits: it takes them to fp32 (`vocab_parallel_logits.float()`, then max,
# exp and sum in place) while the caller still holds the bf16 logits, 2 + 4 bytes a token x vocab / TP at its
# peak; the backward writes the fp32 gradient into the saved softmax and casts it to bf16 (4 + 2 again).
# Megatron-Core's theoretical estimate counts the fp32 logits alone (4). Measured: docs/accuracy.md 6b.
CROSS_ENTROPY_BYTES_PER_TOKEN_VOCAB = 6


def cross_entropy_bytes(arch: Architecture, *, tp: int, tokens: int) -> float:
    """Megatron's vocabulary-parallel cross entropy at its peak: the bf16 logits beside their fp32 copy, and the
    output layer's input, over TP."""
    return tokens * (CROSS_ENTROPY_BYTES_PER_TOKEN_VOCAB * arch.vocab_size + 4 * arch.hidden_size) / tp


# verl's Megatron log-prob pass without grad and without fused kernels (verl/workers/actor/megatron_actor.py
# forward_backward_batch's logits_processor, v0.4.0-main; the engine worker's megatron/transformer_impl.py alike):
# GPTModel's bf16 vocabulary-parallel logits, divided by the temperature in place (v0.6.0 on), go to Megatron-Core's
# vocab_parallel_cross_entropy through verl's vocab_parallel_log_probs_from_logits (verl/utils/megatron/
# tensor_parallel.py), which holds their fp32 copy beside them: CROSS_ENTROPY_BYTES_PER_TOKEN_VOCAB, as in the
# update. With the entropy (the old-log-prob pass) verl from v0.6.0 first clones the logits (`logits_bak`, alive
# through the cross entropy: MEGATRON_LOG_PROB_CLONES_LOGITS), 2 more; vocab_parallel_entropy's own logits-sized
# temporary (the bf16 shifted logits, exp'd and divided in place; the product is a torch.compile'd reduction) is
# freed before the cross entropy starts, so it stays below: 2 + 2 (+ 2). Measured: docs/accuracy.md 6b.
ENTROPY_CLONE_BYTES_PER_TOKEN_VOCAB = 2


def forward_pass_bytes(arch: Architecture, *, tp: int, tokens: int, head_bytes_per_token_vocab: float,
                       vocab_parallel_head: bool, logits_cloned: bool) -> tuple[float, float]:
    """A no_grad forward's two moments on one rank, never held at once: (the layer transients over TP, the
    head). The head holds verl's head kernel's `head_bytes_per_token_vocab`, at least Megatron-Core's cross
    entropy over the vocabulary-parallel logits where the pass runs it (`vocab_parallel_head`: verl's log-prob
    without fused kernels) and the logits' clone (`logits_cloned`); nothing else: GPTModel returns the logits
    alone, and without grad the output layer's (all-gathered) input is freed before verl's head runs."""
    facts = model_facts(arch)
    per_token_vocab = head_bytes_per_token_vocab
    if vocab_parallel_head:
        megatron = CROSS_ENTROPY_BYTES_PER_TOKEN_VOCAB + (ENTROPY_CLONE_BYTES_PER_TOKEN_VOCAB if logits_cloned else 0)
        per_token_vocab = max(per_token_vocab, megatron)
    return tokens * facts.forward_transient_bytes_per_token / tp, per_token_vocab * tokens * facts.vocab / tp


# Per MTP depth, beside its decoder layer's saved activations: the depth's embedding and the hidden state it
# reads (2 h each, bf16), their normed concatenation that eh_proj saves (4 h) and eh_proj's output (2 h):
# 10 bytes a token per hidden unit (Megatron-Core multi_token_prediction.py MultiTokenPredictionLayer.forward).
MTP_INPUT_BYTES_PER_HIDDEN = 10
# Each depth's output layer and vocab-parallel cross entropy run in the forward (verl's mtp_patch.py
# compute_output_layer_and_language_model_loss, "without storing logits"): what stays for its backward is the
# fp32 softmax vocab_parallel_cross_entropy saves, 4 bytes a token x vocab / TP.
MTP_LOSS_BYTES_PER_TOKEN_VOCAB = 4


def mtp_activation_bytes(arch: Architecture, engine: MegatronSection, *, tokens: int, depths: int) -> float:
    """What the trained MTP depths hold on the last stage while the update's loss heads run: per depth a dense
    decoder layer's saved activations and its inputs (MTP_INPUT_BYTES_PER_HIDDEN), and its cross entropy's
    saved softmax (`tokens`: this rank's micro batch, after CP). Their backward runs before the stack's, so the
    layers' backward moment holds none of it. Priced without recompute (an upper bound where the engine
    recomputes: whether Megatron-Core's MTP layer honours recompute_granularity was not read)."""
    if not depths:
        return 0.0
    tp = engine.tensor_model_parallel_size
    sp = engine.sequence_parallel and tp > 1
    layer = layer_activation_bytes_per_token(arch, moe=False, tp=tp, etp=engine.expert_tensor_size,
                                             sequence_parallel=sp, dropout_masks=VERL_SAVES_DROPOUT_MASKS)
    inputs = MTP_INPUT_BYTES_PER_HIDDEN * arch.hidden_size / (tp if sp else 1)
    loss = MTP_LOSS_BYTES_PER_TOKEN_VOCAB * arch.vocab_size / tp
    return depths * tokens * (layer + inputs + loss)


def export_gather_bytes(arch: Architecture, engine: MegatronSection) -> float:
    """GPU bytes of the weight export's largest tensor in flight on one rank, bf16 as Megatron holds it.

    verl's per_tensor_generator (verl/utils/megatron_utils.py; mbridge's export_weights walks the same way)
    yields one tensor at a time: the owning pipeline stage broadcasts its TP shard to the other stages; a dense
    tensor is all-gathered over TP (TP shards: one full tensor) and concatenated (a second full tensor); a routed
    expert's linear_fc1 / fc2 is all-gathered over EP (EP experts' ETP shards at once), each over ETP (one full
    expert) and merged (another). The largest dense tensor is the embedding / output layer, the fused QKV or
    the fused gate+up of a dense MLP; an expert's is its fused gate+up (2 x moe_intermediate x hidden), not the
    3-D all-experts tensor transformers holds, which Megatron never builds.
    """
    h, tp = arch.hidden_size, engine.tensor_model_parallel_size
    largest_dense = max(arch.vocab_size * h, 2 * arch.intermediate_size * h, (arch.q_width + 2 * arch.kv_width) * h)
    dense = WEIGHT_BYTES * largest_dense * (2 + 1 / tp)
    if not arch.is_moe:
        return dense
    ep, etp = engine.expert_model_parallel_size, engine.expert_tensor_size
    expert = 2 * arch.moe_intermediate_size * h
    experts = WEIGHT_BYTES * expert * (1 / etp + ep / etp + 2)
    return max(dense, experts)


# --- the backend the step's phases price a Megatron plan through (memory.backend.TrainingBackend) ----------


def other_stages_weight_bytes(plan: Plan) -> int:
    """The bf16 weights of the pipeline stages a rank does not train, which verl's legacy hybrid engine loads onto
    every GPU to hand vLLM the whole model (stack.MEGATRON_PP_STAGES_LOADED_FOR_ROLLOUT, before v0.4.0): the
    model at the actor's TP and EP with no pipeline split, less the rank's own stage; 0 at PP 1 or from v0.4.0."""
    engine = _engine(plan, "actor")
    if engine.pipeline_model_parallel_size == 1 or not holds(MEGATRON_PP_STAGES_LOADED_FOR_ROLLOUT, plan.stack):
        return 0
    arch, mtp = plan.model.arch, plan.model.mtp_layers
    whole = attrs.evolve(engine, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None)
    return int(WEIGHT_BYTES * (parameters_on_most_loaded_rank(arch, whole, mtp_layers=mtp).total
                               - parameters_on_most_loaded_rank(arch, engine, mtp_layers=mtp).total))


def _engine(plan: Plan, role: TrainedRole) -> MegatronSection:
    """A role's Megatron engine (Plan.engine: verl's defaults where the plan leaves it unset)."""
    return plan.engine(role)


def trainable_fraction(plan: Plan, role: TrainedRole) -> float:
    """The share of parameters that train: a Megatron-Bridge LoRA adapter's (priced on the projections peft's
    all-linear reaches, which Megatron's linear_qkv / linear_proj / linear_fc1 / linear_fc2 are), or all."""
    if role == "critic" or not plan.model.lora.enabled:
        return 1.0
    arch = plan.model.arch
    return arch.lora_params(plan.model.lora.rank, "all-linear") / model_facts(arch).params


def cpu_optimizer_fraction(plan: Plan, role: TrainedRole) -> float:
    """The share of optimizer state Megatron-Core's CPU optimizer keeps in host RAM for the whole step (0: none):
    the role's engine's typed optimizer_cpu_offload and optimizer_offload_fraction."""
    return plan.engine(role).cpu_optimizer_fraction


class MegatronBackend:
    """verl's Megatron workers as the step's phases see them: Megatron-Core's persistent grad buffer and
    distributed optimizer, the pipeline's in-flight micro batches, and verl's offload of each between phases
    (megatron_workers.py: offload_megatron_model_to_cpu / offload_megatron_optimizer)."""

    def role_state(self, plan: Plan, role: TrainedRole, layout: PlanLayout) -> TrainerState:
        state = state_on_most_loaded_rank(plan.model.arch, _engine(plan, role), plan.cluster.world_size,
                                          trainable_fraction(plan, role), value_model=role == "critic",
                                          mtp_layers=plan.model.mtp_layers if role == "actor" else 0)
        # The distributed optimizer's step writes the updated fp32 shard back into the bf16 weights in place;
        # Megatron's grad buffer is reduce-scattered in place: neither needs a second copy. The Adam step's
        # own temporaries are optimizer_step_bytes's: none for the fused Adam verl's GPU runs step.
        step = optimizer_step_bytes(state.largest_optimizer, foreach=not VERL_MEGATRON_STEPS_FUSED_ADAM)
        return TrainerState(params=state.weights, grads=state.grads, optimizer=state.optimizer,
                            optimizer_step=step, reduce_scatter=0.0)

    def state_on_gpu(self, plan: Plan, role: TrainedRole, state: TrainerState) -> TrainerState:
        """verl loads every offloaded part back before the update, so a training step holds all of it, except
        the optimizer state Megatron's CPU optimizer keeps on the host (override_optimizer_config:
        optimizer_cpu_offload with optimizer_offload_fraction, Megatron-Core's HybridDeviceOptimizer)."""
        host_fraction = cpu_optimizer_fraction(plan, role)
        if not host_fraction:
            return state
        return attrs.evolve(state, optimizer=state.optimizer * (1 - host_fraction),
                            optimizer_step=state.optimizer_step * (1 - host_fraction))

    def resident_between_phases(self, plan: Plan, role: TrainedRole,
                                state_on_gpu: TrainerState) -> list[Component]:
        """Between phases the GPU keeps what the engine does not offload: weights (param_offload), the DDP
        grad buffer, which Megatron allocates once and keeps (grad_offload), and the optimizer state."""
        engine = _engine(plan, role)
        resident = []
        if not engine.param_offload:
            resident.append(Component(f"{role}_params", int(state_on_gpu.params), "resident"))
        if not (engine.grad_offload or engine.param_offload) and state_on_gpu.grads:
            resident.append(Component(f"{role}_grads", int(state_on_gpu.grads), "resident"))
        if not engine.optimizer_offload and state_on_gpu.optimizer:
            resident.append(Component(f"{role}_optimizer_state", int(state_on_gpu.optimizer), "resident"))
        return resident

    def resident_at_engine_start(self, plan: Plan, role: TrainedRole, state_on_gpu: TrainerState) -> int:
        """Megatron-Core allocates the DDP grad buffer when it wraps the model and the distributed optimizer its
        fp32 main weights when it is built (distrib_optimizer.py _build_model_and_main_param_groups: the shard's
        `clone().float()`); only Adam's moments wait for the first step. verl's init_model then offloads the
        weights and the grad buffer under param_offload (offload_megatron_model_to_cpu) and the main weights
        under optimizer_offload (offload_megatron_copy_params), before the engine is built (megatron_workers.py,
        read at v0.5.0). Before v0.4.0 the actor also holds the other pipeline stages' weights then
        (`other_stages_weight_bytes`)."""
        engine = _engine(plan, role)
        if engine.param_offload:
            model = 0.0
        else:
            model = state_on_gpu.params + state_on_gpu.grads
        main_weights = 0.0 if engine.optimizer_offload else state_on_gpu.optimizer * MAIN_WEIGHT_SHARE_OF_ADAM
        return int(model + main_weights + (other_stages_weight_bytes(plan) if role == "actor" else 0))

    def host_components(self, plan: Plan, role: TrainedRole, state: TrainerState, ranks: int) -> list[Component]:
        """The host keeps the params verl offloads and the optimizer state, offloaded between phases or kept
        there by Megatron's CPU optimizer; never gradients: verl's offload_megatron_model_to_cpu copies each DDP
        buffer's param_data to pinned host memory but only frees grad_data (storage().resize_(0)), and
        load_megatron_model_to_gpu re-allocates and zeroes it (verl/utils/megatron_utils.py, b178a3cd)."""
        engine = _engine(plan, role)
        optimizer_share = 1.0 if engine.optimizer_offload else cpu_optimizer_fraction(plan, role)
        return state.host_copies(role, ranks, params=engine.param_offload, grads=False, optimizer=optimizer_share)

    def reference_params_bytes(self, plan: Plan, layout: PlanLayout) -> int:
        # The reference is built with the same MTP layers (megatron_workers.py passes model.mtp.enable to every role).
        return int(WEIGHT_BYTES * parameters_on_most_loaded_rank(plan.model.arch, plan.engine("ref"),
                                                                 mtp_layers=plan.model.mtp_layers).total)

    def reference_params_on_host(self, plan: Plan) -> bool:
        return plan.engine("ref").param_offload

    def update_moments(self, plan: Plan, role: TrainedRole, state_on_gpu: TrainerState, batch: RoleBatchLayout,
                       head: LossHead | None, profile: Profile) -> list[tuple[str, list[Component]]]:
        """Every moment of the update's micro batch in the order it comes: the loss head's backward, the layers'
        backward as it starts, the optimizer step at the mini batch's end (update_components takes the largest,
        the allocator's replay walks them all).

        The first two hold the state and every layer's saved activations of the micro batches in flight.
        Autograd runs the head's backward first (Megatron's vocab-parallel cross entropy, then the backward of
        verl's in-place temperature division, megatron_actor.py logits_processor) and hands the output layer a
        [tokens, hidden] gradient; every logits-sized buffer is freed before the last transformer layer's
        backward starts (Megatron-Core GPTModel._postprocess, read at 0.20; verl b178a3cd): the head (verl's head
        kernel over the vocabulary-parallel logits, at least Megatron's fp32 logits) and one layer's backward
        workspace are never held at once. The head sits on the last pipeline stage, the in-flight micro
        batches on the first. The optimizer's step comes after them all (optimizer_step_bytes's temporaries beside
        the state)."""
        arch, engine = plan.model.arch, _engine(plan, role)
        tp, cp = engine.tensor_model_parallel_size, engine.context_parallel_size
        tokens = batch.tokens_per_micro_batch  # on this rank: after CP's split (the layout's sequence split)
        stages = stage_activations(arch, engine, tokens_per_micro_batch=tokens * cp,
                                   micro_batches=batch.micro_batches_per_mini,
                                   dropout_masks=VERL_SAVES_DROPOUT_MASKS)
        if role == "critic":
            # verl's make_value_model (verl/models/mcore/bridge.py; mbridge's post_creation_callbacks alike)
            # replaces the last stage's output layer with LinearForLastLayer(hidden, 1): one value per token.
            stages = attrs.evolve(stages, loss_head=loss_head_bytes(arch, tp=tp, tokens=tokens, outputs=1))
        verl_head = head.bytes_per_token_vocab * tokens * arch.vocab_size / tp if head is not None else 0.0
        megatron_head = stages.loss_head if role == "critic" else cross_entropy_bytes(arch, tp=tp, tokens=tokens)
        workspace = tokens * layer_activation_bytes_per_token(
            arch, moe=arch.is_moe, tp=tp, etp=engine.expert_tensor_size,
            sequence_parallel=engine.sequence_parallel and tp > 1, dropout_masks=VERL_SAVES_DROPOUT_MASKS)
        state = [Component(f"{role}_params", int(state_on_gpu.params)),
                 Component(f"{role}_grads", int(state_on_gpu.grads)),
                 Component(f"{role}_optimizer_state", int(state_on_gpu.optimizer))]
        depths = plan.model.mtp_trained_layers if role == "actor" else 0
        mtp = Component("mtp_activations", int(mtp_activation_bytes(arch, engine, tokens=tokens, depths=depths)))
        return [
            ("loss", [*state, Component("activations", int(stages.at_loss_head)),
                      Component("logits_head", int(max(verl_head, megatron_head))), *([mtp] if mtp.bytes else [])]),
            ("backward", [*state, Component("activations", int(stages.layers_peak)),
                          Component("layer_backward_workspace", int(workspace))]),
            # The step runs after every micro batch's activations are freed.
            ("optimizer_step", [*state, Component("optimizer_step_temporaries", int(state_on_gpu.optimizer_step))]),
        ]

    def update_components(self, plan: Plan, role: TrainedRole, state_on_gpu: TrainerState, batch: RoleBatchLayout,
                          head: LossHead | None, profile: Profile) -> tuple[str, list[Component]]:
        """The update's peak (update_moments): the loss head's backward or the layers' backward as it starts,
        whichever is larger (the loss on a tie), or the optimizer step where it exceeds both."""
        moments = dict(self.update_moments(plan, role, state_on_gpu, batch, head, profile))
        totals = {name: sum(c.bytes for c in components) for name, components in moments.items()}
        if totals["optimizer_step"] > max(totals["loss"], totals["backward"]):
            return "optimizer_step", moments["optimizer_step"]
        peak = "loss" if totals["loss"] >= totals["backward"] else "backward"
        return peak, moments[peak]

    def forward_moments(self, plan: Plan, *, tokens: int, head_bytes_per_token_vocab: float,
                        entropy: bool = False) -> list[tuple[str, list[Component]]]:
        """A no_grad forward's moments beside the parameters, in their order: the layer transients over TP, then
        at the head the vocabulary-parallel logits with what verl's log-prob holds beside them
        (forward_pass_bytes; no head with the fused kernels, which make no logits, and the critic's value head:
        head_bytes_per_token_vocab 0)."""
        layers_bytes, head_bytes = forward_pass_bytes(
            plan.model.arch, tp=plan.actor.mcore.tensor_model_parallel_size, tokens=tokens,
            head_bytes_per_token_vocab=head_bytes_per_token_vocab,
            vocab_parallel_head=head_bytes_per_token_vocab > 0,
            logits_cloned=entropy and holds(MEGATRON_LOG_PROB_CLONES_LOGITS, plan.stack, plan.rollout.name))
        moments = [("layers", [Component("forward_transients", int(layers_bytes))])]
        if int(head_bytes):
            moments.append(("head", [Component("logits_head", int(head_bytes))]))
        return moments

    def forward_components(self, plan: Plan, *, params_bytes: float, params_name: str, tokens: int,
                           head_bytes_per_token_vocab: float, entropy: bool = False) -> list[Component]:
        """A no_grad forward's peak: the parameters and the larger of its moments (forward_moments; the layers'
        on a tie)."""
        moments = self.forward_moments(plan, tokens=tokens, head_bytes_per_token_vocab=head_bytes_per_token_vocab,
                                       entropy=entropy)
        largest = max((c for _, components in moments for c in components), key=lambda component: component.bytes)
        return [Component(params_name, int(params_bytes)), largest]

    def allocation_shape(self, plan: Plan, role: EngineRole, batch: RoleBatchLayout | None) -> AllocationShape:
        """How the role's tensors reach the caching allocator (memory.allocator_trace replays them).

        Megatron-Core's DDP wraps each model chunk (VPP of them) and allocates, per chunk, one contiguous
        grad_data for the dense parameters and one for the experts, and with the distributed optimizer one
        param_data beside each (megatron/core/distributed/param_and_grad_buffer.py _ParamAndGradBuffer:
        torch.zeros(numel) each; buckets are views): single large allocations made at model build, zeroed in place
        between mini batches, freed only by verl's offload_megatron_model_to_cpu (storage().resize_(0)) and made
        again by load_megatron_model_to_gpu. A stage's saved activations are one set of tensors per layer and
        micro batch in flight (in_flight_micro_batches). The distributed optimizer builds its fp32 main weights
        with itself (resident_at_engine_start), Adam's moments come at the first step. verl's Megatron actor worker ends update_actor,
        compute_log_prob and compute_ref_log_prob with empty_cache, offloaded or not (megatron_workers.py, read at
        v0.4.1, v0.5.0, v0.6.1 and v0.7.0 and main of 2026: get_torch_device().empty_cache(), later
        aggressive_empty_cache); its critic worker's compute_values and update_critic flush only through the
        offload."""
        arch, engine = plan.model.arch, plan.engine(role)
        chunks = engine.virtual_pipeline_model_parallel_size or 1
        buffers = chunks * (2 if arch.is_moe else 1)
        in_flight = math.ceil(in_flight_micro_batches(engine, batch.micro_batches_per_mini)) if batch else 1
        layers = engine.most_loaded_stage_layers(arch.num_layers)
        # The loss moment is the last stage's (stage_activations: one micro batch there under PP > 1).
        at_loss = layers * (in_flight if engine.pipeline_model_parallel_size == 1 else 1)
        return AllocationShape(grad_buffers=buffers,
                               param_buffers=buffers if engine.use_distributed_optimizer else None,
                               activation_tensors=in_flight * layers, activation_tensors_at_loss=at_loss,
                               vocab_shards=engine.tensor_model_parallel_size,
                               optimizer_built_share=MAIN_WEIGHT_SHARE_OF_ADAM,
                               empties_cache_after_pass=role != "critic")

    def weight_sync_gather_bytes(self, plan: Plan, bucket_bytes: int) -> int:
        """The export's largest tensor in flight (`export_gather_bytes`) and one bucket for the engine; a
        Megatron-Bridge adapter that is not merged, with vLLM holding the base (load_format not dummy), sends
        only the adapter's tensors. Before v0.4.0 the sharding manager's __enter__ first loads the other pipeline
        stages' weights back and broadcasts them (`other_stages_weight_bytes`), held through the generation."""
        arch, engine, lora = plan.model.arch, plan.actor.mcore, plan.model.lora
        copy_bytes = plan.rollout.dtype_bytes
        if lora.enabled and not lora.merge and plan.rollout.load_format != "dummy":
            adapter = lora.rank * max(arch.hidden_size, arch.intermediate_size, arch.q_width)
            gathered = WEIGHT_BYTES * adapter * (2 + 1 / engine.tensor_model_parallel_size)
            return int(gathered + min(bucket_bytes, WEIGHT_BYTES * lora_params(plan)))
        params = model_facts(arch).params
        return int(export_gather_bytes(arch, engine) + min(bucket_bytes, copy_bytes * params)
                   + other_stages_weight_bytes(plan))


MEGATRON = MegatronBackend()
