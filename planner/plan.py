"""The plan: a self-contained, declarative description of one RL fine-tuning run.

A plan carries the resolved model architecture, the cluster, the workload in
verl's units (train_batch_size and ppo_mini_batch_size in prompts, rollout n)
and every knob of actor, reference, critic and rollout.  Key names follow
verl's where verl has one, so a verl user recognises them and the renderer maps
them one to one.

Value classes only: reading and writing TOML lives in ``planner.planfile``;
rules live in ``planner.rules``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs import field, frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster
from rlplan.planner.stack import (
    LEN_FROM_MODEL_ALWAYS,
    LEN_FROM_SEQUENCES,
    REFERENCE_ALWAYS_RUNS,
    StackSection,
    check_engine,
    holds,
)
from rlplan.planner.validators import at_least, field_check

SCHEMA_VERSION = 1

# verl's advantage estimators (`AdvantageEstimator` and `register_adv_est`, verl/trainer/ppo/core_algos.py;
# ray_trainer.py before v0.4.1): the plan field's values. ESTIMATORS says what each changes in a step; which
# release has which is read from each release's sources (verl_inventory.estimators_of; tests/planner/
# test_verl_inventory.py holds ESTIMATORS to the inventory's union), and render refuses one its target lacks.
Algorithm = Literal["grpo", "gae", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo",
                    "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized", "optimal_token_baseline",
                    "tir_optimal_token_baseline", "gdpo"]


@frozen(kw_only=True)
class EstimatorFacts:
    """What an advantage estimator changes in a step: a critic (GAE: verl's need_critic), a baseline from
    the other responses of the same prompt (needs rollout.n >= 2), a greedy baseline generation per batch
    (ReMax: verl's `gen_max`, a second generate_sequences of the batch's prompts with do_sample=False)."""

    critic: bool = False
    group: bool = False
    greedy_baseline: bool = False


ESTIMATORS: dict[str, EstimatorFacts] = {
    "gae": EstimatorFacts(critic=True),
    "grpo": EstimatorFacts(group=True),
    "rloo": EstimatorFacts(group=True),
    "reinforce_plus_plus": EstimatorFacts(),
    "remax": EstimatorFacts(greedy_baseline=True),
    "reinforce_plus_plus_baseline": EstimatorFacts(group=True),
    "opo": EstimatorFacts(group=True),
    "grpo_passk": EstimatorFacts(group=True),
    "gpg": EstimatorFacts(group=True),
    "rloo_vectorized": EstimatorFacts(group=True),
    "grpo_vectorized": EstimatorFacts(group=True),
    "optimal_token_baseline": EstimatorFacts(group=True),
    "tir_optimal_token_baseline": EstimatorFacts(group=True),
    # Group reward-decoupled normalization (core_algos.py compute_gdpo_outcome_advantage, from 0.7.1).
    "gdpo": EstimatorFacts(group=True),
}
# verl's recipes whose own trainer computes no advantages (their configs set algorithm.adv_estimator: null) and
# whose step rlplan prices: the plan's `algorithm.recipe`. RECIPES says what each changes in a step, read from
# the recipe's code at verl v0.4.1, v0.5.0, v0.6.1 and v0.7.0 (recipe/<name>/, the same step at every tag).
Recipe = Literal["spin", "sppo"]


@frozen(kw_only=True)
class RecipeFacts:
    """What a recipe's trainer changes in a verl step (beside: no critic, no advantage estimator).

    `module` is the entry point (`python3 -m <module>`, its own `@hydra.main` config). `reference` says whether
    the recipe builds the reference whatever the KL switches say. `pair_update` is SPIN's online-DPO update
    (recipe/spin/dp_actor.py update_policy_dpo_with_ref): each micro batch of `ppo_micro_batch_size_per_gpu`
    chosen sequences runs forward beside as many rejected ones, padded (the model called on the batch's
    input_ids, no remove padding), both halves' logits and activations held until one backward; the whole
    per-rank pair batch is one optimizer step (no mini batches), and SPIN's own head (core_algos.get_batch_logps:
    a shifted copy of the logits and torch's cross entropy under bf16 autocast) replaces verl's."""

    module: str
    reference: bool = False
    pair_update: bool = False


RECIPES: dict[str, RecipeFacts] = {
    # recipe/spin/main_spin.py maps Role.RefPolicy unconditionally; spin_trainer.fit_dpo: generate, the actor's
    # log-prob pass, the reference's, the reward, the preference of each adjacent pair, update_actor_dpo.
    "spin": RecipeFacts(module="recipe.spin.main_spin", reference=True, pair_update=True),
    # recipe/sppo/main_sppo.py: a reference only under a KL switch; sppo_ray_trainer.fit: PPO's step without a
    # critic, the advantage a softmean baseline over the batch on the driver; dp_actor.update_policy: verl's
    # _forward_micro_batch (temperature, entropy when entropy_coeff != 0) per micro batch of each mini batch.
    "sppo": RecipeFacts(module="recipe.sppo.main_sppo"),
}
# The estimators rlplan's own runtime computes (runtime/algorithms): what `solve --algo` offers.
RUNTIME_ESTIMATORS = ("grpo", "gae", "rloo", "reinforce_plus_plus")
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KlLossType = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
LoadFormat = Literal["dummy", "safetensors", "auto"]
# The roles verl builds with an engine of their own (Plan.engine).
EngineRole = Literal["actor", "ref", "critic"]
Truncation = Literal["error", "left", "right", "middle", "filter"]
# The kernel that turns the actor's logits into log-probs (memory.py prices each from its own
# allocations): "auto" is what verl would run for the plan (planner.memory.heads.resolved_loss_head).
LossHead = Literal["auto", "flash_attn_ce", "torch_logprob", "fused", "chunked", "naive"]
# verl's fsdp_config.model_dtype: the dtype FSDP holds the shards in (compute runs in ComputeDtype).
ModelDtype = Literal["fp32", "bf16"]
# verl's fsdp_config.dtype: the dtype a role's forward and backward compute in (FSDP's MixedPrecision
# param_dtype; gradients are reduced in fp32). verl 0.9 accepts bfloat16 (its default) and float16;
# rlplan's runtime computes in bfloat16 or float32 (fp32 on CPUs without native bf16, hardware.CpuRates).
ComputeDtype = Literal["bfloat16", "float16", "float32"]
# The training backend (verl: actor_rollout_ref.actor.strategy; ref and critic follow it in a rendered plan).
Strategy = Literal["fsdp", "fsdp2", "megatron"]
# Megatron-Core's activation recompute (TransformerConfig.recompute_granularity / recompute_method).
RecomputeGranularity = Literal["full", "selective"]
RecomputeMethod = Literal["uniform", "block"]
# Megatron-Bridge's PEFT flavours (verl: model.lora.type).
MegatronLoraType = Literal["lora", "vlm_lora", "canonical_lora", "dora"]
# trtllm: TensorRT-LLM, verl's rollout from 0.7.1 (verl/workers/rollout/trtllm_rollout/, ROLLOUT_ENGINE_SINCE).
RolloutEngine = Literal["vllm", "sglang", "trtllm"]
ENGINE_TITLES: dict[str, str] = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
# verl's experiment trackers (verl.utils.tracking.Tracking.supported_backend, verl 0.9); the bundled
# runtime writes console, tensorboard, wandb and mlflow, and refuses the others before a run starts.
VERL_LOGGERS = ("console", "tensorboard", "wandb", "mlflow", "swanlab", "vemlp_wandb", "clearml", "trackio",
                "file", "rl_insight")


def _names(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """verl spells one tracker as a string and several as a list."""
    return (value,) if isinstance(value, str) else tuple(value)


def _known_loggers(instance: object, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    unknown = [name for name in value if name not in VERL_LOGGERS]
    if unknown:
        raise PlanError(
            field="trainer.logger",
            message=f"names tracker(s) verl does not know: {', '.join(map(repr, unknown))}.",
            fix=f"use some of {', '.join(VERL_LOGGERS)} (the bundled runtime writes console, tensorboard, "
                "wandb and mlflow)",
        )


def _fraction(section: str):
    return field_check(section, lambda value: 0.0 < value <= 1.0,  # also false for NaN
                       "is a fraction of GPU memory and must lie in (0, 1], got {value}.",
                       "set {field} between 0.3 and 0.9")


@frozen(kw_only=True)
class LoraConfig:
    """LoRA on the actor. rank 0 = full fine-tuning.

    FSDP runs peft (verl: actor_rollout_ref.model.lora_rank / lora_alpha / target_modules); Megatron runs
    Megatron-Bridge's own LoRA (verl: actor_rollout_ref.model.lora.*), which reads rank, alpha and
    target_modules under its own keys and these Megatron-only fields (None: verl's default, unset).
    """

    rank: int = field(default=0, validator=at_least(0, "model.lora"))
    alpha: int = field(default=16, validator=at_least(1, "model.lora"))
    target_modules: tuple[str, ...] = ("all-linear",)
    type: MegatronLoraType | None = None
    exclude_modules: tuple[str, ...] | None = None
    # Merge the adapter into the base weights before each sync (false: vLLM gets the adapter deltas).
    merge: bool | None = None
    adapter_path: str | None = None

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@frozen(kw_only=True)
class MtpSection:
    """verl's model.mtp (verl/workers/config/model.py MtpConfig, hf_model.yaml; verl main at 0.8.0.dev), present
    where `enable` is set: the Megatron workers keep the checkpoint's multi-token-prediction layers
    (arch.mtp_layers) in the actor's and the reference's models (megatron_workers.py
    _init_hf_config_and_tf_config; without it num_nextn_predict_layers is set to 0). `train` (enable_train) adds
    their losses to the actor's update (model_forward.py passes the labels, mtp_patch.py computes each depth's
    output layer and loss); the no_grad passes never run them. `rollout` (enable_rollout) is the engine's
    speculative decoding with them, which rlplan does not price."""

    train: bool = False
    rollout: bool = False


@frozen(kw_only=True)
class ModelSection:
    name: str
    arch: Architecture
    # Where the weights live: a local directory, or a hub repo id kept for rendering only.
    path: str = ""
    lora: LoraConfig = LoraConfig()
    gradient_checkpointing: bool = True
    activation_offload: bool = False
    use_remove_padding: bool = True
    # verl's model.use_fused_kernels: the lm_head fused with the log-prob, never holding full logits.
    use_fused_kernels: bool = False
    # verl's model.mtp when enabled (None: off, the checkpoint's MTP layers dropped).
    mtp: MtpSection | None = None

    @property
    def mtp_layers(self) -> int:
        """The multi-token-prediction layers verl builds into the trained model: the checkpoint's, when model.mtp
        is on; 0 otherwise."""
        return (self.arch.mtp_layers or 0) if self.mtp is not None else 0

    @property
    def mtp_trained_layers(self) -> int:
        """The MTP depths whose losses the actor's update runs (model.mtp.enable_train)."""
        return self.mtp_layers if self.mtp is not None and self.mtp.train else 0


@frozen(kw_only=True)
class DataSection:
    train_batch_size: int = field(validator=at_least(1, "data"))
    max_prompt_length: int = field(validator=at_least(1, "data"))
    max_response_length: int = field(validator=at_least(1, "data"))
    train_files: tuple[str, ...] = ()
    val_files: tuple[str, ...] = ()
    prompt_key: str = "prompt"
    truncation: Truncation = "error"
    filter_overlong_prompts: bool = True
    shuffle: bool = True
    seed: int = 1
    # Mean tokens per sequence the data really has (rlplan only); None = the maximum, the worst case.
    expected_prompt_length: int | None = field(default=None, validator=at_least(1, "data"))
    expected_response_length: int | None = field(default=None, validator=at_least(1, "data"))
    # Prompts each step generates (verl's data.gen_batch_size): DAPO-style recipes generate 3x the train
    # batch and keep the groups that carry a signal; None = train_batch_size.
    gen_batch_size: int | None = field(default=None, validator=at_least(1, "data"))

    def __attrs_post_init__(self) -> None:
        for name, maximum in (("prompt", self.max_prompt_length), ("response", self.max_response_length)):
            expected = getattr(self, f"expected_{name}_length")
            if expected is not None and expected > maximum:
                raise PlanError(
                    field=f"data.expected_{name}_length",
                    message=f"is a mean length and cannot exceed max_{name}_length {maximum}, got {expected}.",
                    fix=f"set data.expected_{name}_length to at most {maximum}, or leave it unset (= the maximum)",
                )

    @property
    def max_sequence_length(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def expected_sequence_length(self) -> int:
        """Mean prompt + response tokens; the maxima where the plan states no expectation."""
        prompt = self.expected_prompt_length if self.expected_prompt_length is not None else self.max_prompt_length
        response = (self.expected_response_length if self.expected_response_length is not None
                    else self.max_response_length)
        return prompt + response


def uneven_stage_layers(layers: int, pp: int) -> tuple[int, int] | None:
    """(first, last) stage layers where PP does not divide the layers, as verl's DeepSeek recipe places them: the
    middle stages take ceil(layers / PP), the first and last the rest (the first the larger share: the last also
    holds the loss head); None when even, or when the rest leaves an end stage no layer."""
    if pp == 1 or layers % pp == 0:
        return None
    middle = -(-layers // pp)
    rest = layers - (pp - 2) * middle
    if rest < 2:
        return None
    return rest - rest // 2, rest // 2


@frozen(kw_only=True)
class MegatronSection:
    """One role's Megatron-Core engine (verl: <role>.megatron.*, verl/workers/config/engine.py McoreEngineConfig).

    Parallel sizes as Megatron's parallel_state groups them: a rank's dense layers are split over tensor (TP)
    x pipeline (PP) ranks, its experts over expert (EP) x expert-tensor (ETP) ranks; the rest of the world is
    data (and context, CP) parallel. Recompute is Megatron's TransformerConfig knobs, which verl passes
    through override_transformer_config. Checks between these and the model or the world are rules.
    """

    tensor_model_parallel_size: int = field(default=1, validator=at_least(1, "megatron"))
    pipeline_model_parallel_size: int = field(default=1, validator=at_least(1, "megatron"))
    # None: no interleaved (virtual) pipeline; Megatron's model chunks per pipeline rank otherwise.
    virtual_pipeline_model_parallel_size: int | None = field(default=None, validator=at_least(1, "megatron"))
    context_parallel_size: int = field(default=1, validator=at_least(1, "megatron"))
    expert_model_parallel_size: int = field(default=1, validator=at_least(1, "megatron"))
    # None: the experts take the dense layers' TP (Megatron's default).
    expert_tensor_parallel_size: int | None = field(default=None, validator=at_least(1, "megatron"))
    sequence_parallel: bool = True
    use_distributed_optimizer: bool = True
    param_offload: bool = False
    # None: unset (verl 0.9.1 has no key for it; gradients stay on the GPU).
    grad_offload: bool | None = None
    optimizer_offload: bool = False
    recompute_granularity: RecomputeGranularity | None = None
    recompute_method: RecomputeMethod | None = None
    recompute_num_layers: int | None = field(default=None, validator=at_least(1, "megatron"))
    recompute_modules: tuple[str, ...] = ("core_attn",)
    # Build the model through mbridge / Megatron-Bridge (vanilla_mbridge false: Megatron-Bridge, needed for its LoRA).
    use_mbridge: bool = True
    vanilla_mbridge: bool = False
    use_dist_checkpointing: bool = False
    # An uneven pipeline: the layers Megatron-Core places on the first and the last stage (TransformerConfig
    # num_layers_in_first/last_pipeline_stage, through verl's override_transformer_config); None: that stage
    # takes the even split's share. The middle stages share the rest (rule megatron_layers_divide_pipeline).
    num_layers_in_first_pipeline_stage: int | None = field(default=None, validator=at_least(1, "megatron"))
    num_layers_in_last_pipeline_stage: int | None = field(default=None, validator=at_least(1, "megatron"))
    # Megatron-Core's CPU optimizer (OptimizerConfig optimizer_cpu_offload, HybridDeviceOptimizer, through verl's
    # <role>.optim.override_optimizer_config): the share `optimizer_offload_fraction` (None: Megatron's 1.0) of the
    # optimizer state it keeps and steps on the host for the whole step. Not verl's between-phase
    # `optimizer_offload`. None: unset (off).
    optimizer_cpu_offload: bool | None = None
    optimizer_offload_fraction: float | None = field(default=None, validator=at_least(0.0, "megatron", 1.0))

    def __attrs_post_init__(self) -> None:
        # Megatron-Core's TransformerConfig.__post_init__ refuses these combinations before building anything.
        granularity, method, layers = self.recompute_granularity, self.recompute_method, self.recompute_num_layers
        if granularity == "full" and (method is None or layers is None):
            raise PlanError(field="megatron.recompute_granularity", message="is full, and Megatron-Core's "
                            "TransformerConfig then needs both recompute_method (uniform or block) and "
                            f"recompute_num_layers; got {method} and {layers}.",
                            fix='set megatron.recompute_method = "uniform" and megatron.recompute_num_layers = 1')
        if granularity == "selective" and layers is not None:
            raise PlanError(field="megatron.recompute_num_layers", message="is set with selective recompute, which "
                            "Megatron-Core's TransformerConfig refuses (it recomputes recompute_modules in every "
                            "layer).", fix="unset megatron.recompute_num_layers")

    @property
    def uneven_pipeline(self) -> bool:
        """Layers placed on the first or last stage by hand (Megatron then splits only the middle stages)."""
        return self.num_layers_in_first_pipeline_stage is not None or self.num_layers_in_last_pipeline_stage is not None

    def most_loaded_stage_layers(self, num_layers: int) -> int:
        """The layers the most loaded pipeline stage holds: ceil(layers / PP) where the plan places none by hand
        (an uneven split priced high rather than low), else the larger of the placed end stages and the middle
        stages' even share (Megatron-Core's TransformerConfig splits the rest over them)."""
        pp = self.pipeline_model_parallel_size
        if not self.uneven_pipeline or pp == 1:
            return -(-num_layers // pp)
        ends = [n for n in (self.num_layers_in_first_pipeline_stage, self.num_layers_in_last_pipeline_stage)
                if n is not None]
        middle_stages, middle_layers = pp - len(ends), max(num_layers - sum(ends), 0)
        middle = -(-middle_layers // middle_stages) if middle_stages > 0 else 0
        return max([*ends, middle])

    def stage_layer_counts(self, num_layers: int) -> tuple[int, ...]:
        """Each pipeline stage's layers as Megatron-Core places them (transformer_block.py
        get_num_layers_to_build): the placed end stages their counts, the other stages the rest split evenly
        (floor: a rest that does not divide is rule megatron_layers_divide_pipeline's)."""
        pp = self.pipeline_model_parallel_size
        first, last = self.num_layers_in_first_pipeline_stage, self.num_layers_in_last_pipeline_stage
        if not self.uneven_pipeline or pp == 1:
            return (num_layers // pp,) * pp
        placed = [n for n in (first, last) if n is not None]
        middle = max(num_layers - sum(placed), 0) // max(pp - len(placed), 1)
        counts = [middle] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return tuple(counts)

    @property
    def cpu_optimizer_fraction(self) -> float:
        """The share of the optimizer state Megatron-Core's CPU optimizer keeps in host RAM for the whole step
        (0: no CPU optimizer)."""
        if not self.optimizer_cpu_offload:
            return 0.0
        return 1.0 if self.optimizer_offload_fraction is None else self.optimizer_offload_fraction

    @property
    def expert_tensor_size(self) -> int:
        """The experts' tensor-parallel size: ETP, or TP where ETP is unset (Megatron's default)."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def model_parallel_size(self) -> int:
        """Ranks one copy of the dense layers spans: TP x PP (x CP, which splits the sequence, not the weights)."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def data_parallel_size(self, world: int) -> int:
        """Megatron's DP: the world over TP x PP x CP (0 where it does not divide; rule megatron_world_divides)."""
        group = self.model_parallel_size * self.context_parallel_size
        return world // group if world % group == 0 else 0

    def expert_data_parallel_size(self, world: int) -> int:
        """The experts' DP: the world over EP x ETP x PP (0 where it does not divide)."""
        group = self.expert_model_parallel_size * self.expert_tensor_size * self.pipeline_model_parallel_size
        return world // group if world % group == 0 else 0


@frozen(kw_only=True)
class ActorSection:
    """The policy under training (verl: actor_rollout_ref.actor.*)."""

    ppo_mini_batch_size: int = field(validator=at_least(1, "actor"))
    strategy: Strategy = "fsdp2"
    ppo_micro_batch_size_per_gpu: int | None = field(default=None, validator=at_least(1, "actor"))
    # Deprecated global key, kept so imported scripts normalize exactly as in verl.
    ppo_micro_batch_size: int | None = field(default=None, validator=at_least(1, "actor"))
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = field(default=16384, validator=at_least(1, "actor"))
    ppo_epochs: int = field(default=1, validator=at_least(1, "actor"))
    shuffle: bool = False
    ulysses_sequence_parallel_size: int = field(default=1, validator=at_least(1, "actor"))
    fsdp_size: int = -1
    param_offload: bool = False
    optimizer_offload: bool = False
    # verl's fsdp_config.offload_policy (FSDP2's CPUOffloadPolicy): params, grads and AdamW state live in
    # host RAM and the optimizer steps on the CPU; verl then ignores param_offload / optimizer_offload.
    offload_policy: bool = False
    entropy_from_logits_with_chunking: bool = False
    entropy_checkpointing: bool = False
    # verl wraps entropy_from_logits in torch.compile unless this is false (verl default true).
    use_torch_compile: bool = True
    loss_head: LossHead = "auto"
    model_dtype: ModelDtype = "fp32"
    compute_dtype: ComputeDtype = "bfloat16"
    lr: float = field(default=1e-6, validator=at_least(0.0, "actor"))
    weight_decay: float = field(default=0.01, validator=at_least(0.0, "actor"))
    lr_warmup_steps: int = field(default=0, validator=at_least(0, "actor"))
    grad_clip: float = field(default=1.0, validator=at_least(0.0, "actor"))
    clip_ratio_low: float = field(default=0.2, validator=at_least(0.0, "actor"))
    clip_ratio_high: float = field(default=0.2, validator=at_least(0.0, "actor"))
    clip_ratio_c: float = field(default=3.0, validator=at_least(1.0, "actor"))
    loss_agg_mode: LossAggMode = "token-mean"
    use_kl_loss: bool = False
    kl_loss_coef: float = field(default=0.001, validator=at_least(0.0, "actor"))
    kl_loss_type: KlLossType = "low_var_kl"
    entropy_coeff: float = 0.0
    # Megatron's engine knobs; None on an FSDP plan (and on a Megatron plan: Megatron's defaults, `mcore`).
    megatron: MegatronSection | None = None

    @property
    def mcore(self) -> MegatronSection:
        return self.megatron or MegatronSection()


@frozen(kw_only=True)
class RefSection:
    """The frozen reference policy (verl: actor_rollout_ref.ref.*). With LoRA it is the actor, adapter off."""

    param_offload: bool = False
    # verl's ref.fsdp_config.model_dtype: fp32 with the default YAML (verl-rules.md N8).
    model_dtype: ModelDtype = "fp32"
    compute_dtype: ComputeDtype = "bfloat16"
    log_prob_micro_batch_size_per_gpu: int | None = field(default=None, validator=at_least(1, "ref"))
    log_prob_micro_batch_size: int | None = field(default=None, validator=at_least(1, "ref"))
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = field(default=16384, validator=at_least(1, "ref"))
    # On a Megatron plan: the reference's own parallel sizes (verl defaults them to the actor's).
    megatron: MegatronSection | None = None


def _whole(section: str):
    return field_check(section, lambda value: type(value) is int, "counts GPUs and must be a whole number, got {value}.",
                       "set {field} to a whole number")


@frozen(kw_only=True)
class RolloutPool:
    """GPUs of the rollout's own: verl's async recipes (recipe/one_step_off_policy, recipe/fully_async_policy at
    v0.6.1 and v0.7.0) run with actor_rollout_ref.hybrid_engine=False and give the engine the top-level
    `rollout.nnodes` x `rollout.n_gpus_per_node` GPUs beside the trainer's `trainer.nnodes` x
    `trainer.n_gpus_per_node`, of the cluster's GPU kind. The engine there never sleeps and no trainer state
    shares its GPUs."""

    nodes: int = field(validator=[at_least(1, "rollout.pool"), _whole("rollout.pool")])
    gpus_per_node: int = field(validator=[at_least(1, "rollout.pool"), _whole("rollout.pool")])
    # verl's fully async recipe: the rollouter streams prompts one at a time (it asserts data.train_batch_size == 0
    # and data.gen_batch_size == 1, v0.7.0 recipe/fully_async_policy/fully_async_rollouter.py) and the trainer takes
    # async_training.require_batches x ppo_mini_batch_size of them per step (fully_async_trainer.py
    # required_samples), which the plan's data.train_batch_size holds; render writes verl's 0 back.
    streams: bool = False

    @property
    def gpus(self) -> int:
        """The GPUs the rollout's engines share between them."""
        return self.nodes * self.gpus_per_node


@frozen(kw_only=True)
class RolloutSection:
    """The rollout engine, vLLM, SGLang or TensorRT-LLM (verl: actor_rollout_ref.rollout.*).

    With SGLang verl passes gpu_memory_utilization as mem_fraction_static and max_num_seqs as
    max_running_requests (verl sglang_rollout/async_sglang_server.py, the server args). With TensorRT-LLM it passes
    gpu_memory_utilization as KvCacheConfig.free_gpu_memory_fraction, max_num_seqs as max_batch_size and
    max_num_batched_tokens as max_num_tokens (trtllm_rollout/trtllm_async_server.py launch_server).
    """

    n: int = field(validator=at_least(1, "rollout"))
    name: RolloutEngine = "vllm"
    tensor_model_parallel_size: int = field(default=1, validator=at_least(1, "rollout"))
    gpu_memory_utilization: float = field(default=0.5, validator=_fraction("rollout"))
    max_num_seqs: int = field(default=256, validator=at_least(1, "rollout"))
    max_num_batched_tokens: int = field(default=8192, validator=at_least(1, "rollout"))
    max_model_len: int | None = field(default=None, validator=at_least(1, "rollout"))
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    free_cache_engine: bool = True
    sleep_level: Literal[1, 2] = 2
    # Wake the weights, sync, offload the trainer, then wake the KV cache, so the KV cache is not
    # resident during the sync.  Off: weights and KV cache are resumed together before the sync.
    multi_stage_wake_up: bool = True
    layered_summon: bool = False
    load_format: LoadFormat = "dummy"
    # The engine's weights and KV cache. It should compute in the dtype the trainer's forward does
    # (actor.compute_dtype), or it samples from rounded weights the trainer never scores
    # (rules: rollout_dtype_matches_cpu_trainer).
    dtype: ComputeDtype = "bfloat16"
    temperature: float = field(default=1.0, validator=at_least(0.0, "rollout"))
    top_p: float = field(default=1.0, validator=_fraction("rollout"))
    top_k: int = -1
    # Keep sampling past the end-of-sequence token, so every response is max_response_length tokens: verl's
    # knob for throughput runs, where each step must carry the same tokens. The tokens after an EOS are
    # scored and trained like the rest (verl's agent loop masks none of them).
    ignore_eos: bool = False
    log_prob_micro_batch_size_per_gpu: int | None = field(default=None, validator=at_least(1, "rollout"))
    log_prob_micro_batch_size: int | None = field(default=None, validator=at_least(1, "rollout"))
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = field(default=16384, validator=at_least(1, "rollout"))
    agent_num_workers: int = field(default=8, validator=at_least(1, "rollout"))
    update_weights_bucket_megabytes: int = field(default=2048, validator=at_least(1, "rollout"))
    # Where the engine runs: None on the trainer's GPUs (colocated, verl's hybrid engine), else on a pool of its own.
    pool: RolloutPool | None = None

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the engine's weights and KV cache."""
        return 4 if self.dtype == "float32" else 2


@frozen(kw_only=True)
class CriticSection:
    """The value model for PPO/GAE (verl: critic.*). Used iff `enable`, or when enable is unset and adv is gae."""

    enable: bool | None = None
    ppo_mini_batch_size: int | None = field(default=None, validator=at_least(1, "critic"))
    ppo_micro_batch_size_per_gpu: int | None = field(default=None, validator=at_least(1, "critic"))
    ppo_micro_batch_size: int | None = field(default=None, validator=at_least(1, "critic"))
    forward_micro_batch_size_per_gpu: int | None = field(default=None, validator=at_least(1, "critic"))
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = field(default=32768, validator=at_least(1, "critic"))
    forward_max_token_len_per_gpu: int = field(default=32768, validator=at_least(1, "critic"))
    ppo_epochs: int = field(default=1, validator=at_least(1, "critic"))
    ulysses_sequence_parallel_size: int = field(default=1, validator=at_least(1, "critic"))
    param_offload: bool = False
    optimizer_offload: bool = False
    # critic.fsdp.offload_policy, as the actor's.
    offload_policy: bool = False
    compute_dtype: ComputeDtype = "bfloat16"
    gradient_checkpointing: bool = True
    use_remove_padding: bool = True
    lr: float = field(default=1e-5, validator=at_least(0.0, "critic"))
    cliprange_value: float = field(default=0.5, validator=at_least(0.0, "critic"))
    grad_clip: float = field(default=1.0, validator=at_least(0.0, "critic"))
    # On a Megatron plan: the critic's engine (verl's critic.megatron, with its own defaults).
    megatron: MegatronSection | None = None


@frozen(kw_only=True)
class AlgorithmSection:
    # A verl recipe whose own trainer runs the step (RECIPES); None: verl's PPO trainer (main_ppo).
    recipe: Recipe | None = None
    # None exactly when a recipe runs the step: the recipes' configs set verl's key to null.
    adv_estimator: Algorithm | None = field(
        default=attrs.Factory(lambda section: None if section.recipe else "grpo", takes_self=True))
    norm_adv_by_std_in_grpo: bool = True
    # rlplan extension: GRPO baseline without the sample itself (NeMo-RL's default).
    grpo_leave_one_out: bool = False
    gamma: float = 1.0
    lam: float = 1.0
    use_kl_in_reward: bool = False
    kl_penalty: KlLossType = "kl"
    kl_coef: float = 0.001

    def __attrs_post_init__(self) -> None:
        if (self.adv_estimator is None) != (self.recipe is not None):
            raise PlanError(field="algorithm.adv_estimator",
                            message=f"is {self.adv_estimator} with algorithm.recipe {self.recipe}: verl's SPIN and "
                            "SPPO recipes run their own step with no advantage estimator (their configs set it to "
                            "null), and verl's PPO trainer needs one.",
                            fix="set algorithm.recipe and leave adv_estimator out, or leave recipe out and set an "
                                "estimator")

    @property
    def name(self) -> str:
        """The step's algorithm in words: the estimator, or the recipe whose trainer runs it."""
        return self.adv_estimator or f"verl's {self.recipe} recipe"

    @property
    def estimator(self) -> EstimatorFacts:
        """What the step's advantage changes: the estimator's facts; a recipe's trainer has none of them."""
        return EstimatorFacts() if self.adv_estimator is None else ESTIMATORS[self.adv_estimator]


@frozen(kw_only=True)
class RewardSection:
    """Rule-based rewards: by data_source from the registry, or one user function `module:function`."""

    function: str = ""


@frozen(kw_only=True)
class TrainerSection:
    total_epochs: int = field(default=1, validator=at_least(1, "trainer"))
    total_training_steps: int | None = field(default=None, validator=at_least(1, "trainer"))
    save_freq: int = -1
    test_freq: int = -1
    output_dir: str = "runs/rlplan"
    project_name: str = "rlplan"
    experiment_name: str = "run"
    # Where per-step metrics go beside metrics.jsonl (verl's trainer.logger).
    logger: tuple[str, ...] = field(default=("console",), converter=_names, validator=_known_loggers)
    seed: int = 1
    balance_batch: bool = True
    # PYTORCH_CUDA_ALLOC_CONF the job's processes start with (None: unset, torch's defaults); the caching
    # allocator's replay (memory.allocator_trace) reads expandable_segments and max_split_size_mb from it.
    pytorch_cuda_alloc_conf: str | None = None
    val_before_train: bool = False
    max_checkpoints_to_keep: int | None = field(default=None, validator=at_least(1, "trainer"))


@frozen(kw_only=True)
class Prediction:
    """What `solve` predicted; informational, `validate` recomputes it."""

    gpu_peak_gib: float
    host_peak_gib: float
    step_time_s: float
    phase_peak_gib: dict[str, float] = field(factory=dict)
    phase_seconds: dict[str, float] = field(factory=dict)
    profile: str = "default"


@frozen(kw_only=True)
class Plan:
    model: ModelSection
    cluster: Cluster
    data: DataSection
    actor: ActorSection
    rollout: RolloutSection
    ref: RefSection = RefSection()
    critic: CriticSection = CriticSection()
    algorithm: AlgorithmSection = AlgorithmSection()
    reward: RewardSection = RewardSection()
    trainer: TrainerSection = TrainerSection()
    # The verl and engine versions the plan is for: they select version-dependent defaults, rules and memory
    # (planner/stack.py; docs/verl-versions.md).
    stack: StackSection = StackSection()
    prediction: Prediction | None = None
    # verl keys rlplan does not model, kept verbatim from an import and rendered back unchanged.
    passthrough: dict[str, str] = field(factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __attrs_post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise PlanError(
                field="schema_version",
                message=f"this rlplan reads plan schema version {SCHEMA_VERSION}, the file says {self.schema_version}.",
                fix=f"re-solve the plan with this rlplan, or set schema_version = {SCHEMA_VERSION} after checking it",
            )
        check_engine(self.stack, self.rollout.name)
        if self.rollout.pool is not None and self.cluster.gpu.is_cpu:
            raise PlanError(field="rollout.pool", message="puts the rollout on GPUs of its own, but the cluster is a "
                            "CPU machine: rlplan's runtime starts one engine beside the trainer ranks there.",
                            fix="remove the [rollout.pool] table (the rollout then shares the machine)")
        self._check_mtp()
        if self.algorithm.recipe is not None and (self.is_megatron or self.rollout.pool is not None):
            raise PlanError(field="algorithm.recipe",
                            message=f"is {self.algorithm.recipe}, whose priced step is its FSDP worker's on the "
                            "trainer's GPUs (recipe/spin/fsdp_workers.py, recipe/sppo/sppo_worker.py); its Megatron "
                            "path or a rollout on GPUs of its own is not modeled.",
                            fix='set actor.strategy = "fsdp" (or "fsdp2") and remove [rollout.pool]')
        if self.actor.strategy != "megatron":
            for role in ("actor", "ref", "critic"):
                if getattr(self, role).megatron is not None:
                    raise PlanError(
                        field=f"{role}.megatron",
                        message=f"holds Megatron's engine knobs, but actor.strategy is {self.actor.strategy!r}: "
                                "verl would build an FSDP model and never read them.",
                        fix=f'set actor.strategy = "megatron", or remove the [{role}.megatron] table',
                    )

    def _check_mtp(self) -> None:
        """What verl asserts of model.mtp (megatron_workers.py _init_hf_config_and_tf_config; fsdp_workers.py raises
        NotImplementedError, verl main) and what rlplan does not price."""
        mtp = self.model.mtp
        if mtp is None:
            return
        if not self.model.arch.mtp_layers:
            raise PlanError(field="model.mtp", message=f"is on, but {self.model.name}'s architecture states no "
                            "multi-token-prediction layers (arch.mtp_layers, its config's num_nextn_predict_layers, "
                            "which rlplan reads for MiMo): verl asserts at least one, and rlplan prices those it knows.",
                            fix="remove [model.mtp] (verl's model.mtp.enable=False), or set model.arch.mtp_layers "
                                "from the model's config.json")
        if not self.is_megatron:
            raise PlanError(field="model.mtp", message=f"is on with actor.strategy {self.actor.strategy!r}: verl's FSDP "
                            "worker raises NotImplementedError (\"MTP is not supported in FSDP\"), so the script "
                            "cannot run as shipped.", fix='set actor.strategy = "megatron", or remove [model.mtp]')
        if mtp.rollout:
            raise PlanError(field="model.mtp.rollout", message="turns on the rollout engine's speculative decoding "
                            "with the MTP layers, whose draft weights, KV cache and step time rlplan does not price.",
                            fix="set model.mtp.rollout = false (verl's model.mtp.enable_rollout=False)")

    # --- facts every consumer needs, derived once here --------------------
    @property
    def is_megatron(self) -> bool:
        """verl's Megatron workers train every role (megatron_workers.py); the bundled runtime never runs it."""
        return self.actor.strategy == "megatron"

    @property
    def rollout_is_split(self) -> bool:
        """The rollout runs on a pool of its own (RolloutPool), not on the trainer's GPUs."""
        return self.rollout.pool is not None

    @property
    def rollout_gpus(self) -> int:
        """The GPUs the rollout's engines share: its own pool's, else the trainer's (colocated)."""
        pool = self.rollout.pool
        return pool.gpus if pool is not None else self.cluster.world_size

    @property
    def rollout_gpus_per_node(self) -> int:
        pool = self.rollout.pool
        return pool.gpus_per_node if pool is not None else self.cluster.gpus_per_node

    @property
    def uses_critic(self) -> bool:
        """verl's need_critic: critic.enable if set, else adv_estimator == gae; a recipe's trainer builds no critic
        (sppo_ray_trainer.py: use_critic = False; main_spin.py maps no Role.Critic)."""
        if self.algorithm.recipe is not None:
            return False
        if self.critic.enable is not None:
            return self.critic.enable
        return self.algorithm.estimator.critic

    @property
    def uses_reference(self) -> bool:
        """verl's need_reference_policy: a KL term in the loss or in the reward; before verl 0.4 always
        (stack.REFERENCE_ALWAYS_RUNS)."""
        recipe = self.algorithm.recipe
        return (self.actor.use_kl_loss or self.algorithm.use_kl_in_reward
                or (recipe is not None and RECIPES[recipe].reference)
                or holds(REFERENCE_ALWAYS_RUNS, self.stack, self.rollout.name))

    def engine(self, role: EngineRole) -> MegatronSection:
        """A role's Megatron engine, derived here once for every reader (memory, step time, rules, layout, render,
        report): its own `megatron` section where the plan sets one, else what verl builds. The reference takes
        the actor's parallel sizes and param offload (ppo_megatron_trainer.yaml's ref.megatron.* `oc.select`
        defaults: verl_keys.REF_FOLLOWS_ACTOR) and Megatron's defaults for the rest; the critic takes Megatron's
        defaults."""
        if role == "actor":
            return self.actor.mcore
        if role == "critic":
            return self.critic.megatron or MegatronSection()
        if self.ref.megatron is not None:
            return self.ref.megatron
        from rlplan.planner.verl_keys import REF_FOLLOWS_ACTOR

        actor = self.actor.mcore
        # ref.megatron.override_transformer_config follows the actor's too (verl v0.7.0
        # verl/trainer/config/ref/megatron_ref.yaml `oc.select`): the uneven pipeline's placement with it.
        return MegatronSection(**{name: getattr(actor, name) for name in REF_FOLLOWS_ACTOR},
                               num_layers_in_first_pipeline_stage=actor.num_layers_in_first_pipeline_stage,
                               num_layers_in_last_pipeline_stage=actor.num_layers_in_last_pipeline_stage)

    @property
    def reference_is_actor(self) -> bool:
        """With LoRA the reference is the actor with its adapter disabled: no separate model."""
        return self.model.lora.enabled

    @property
    def verl_max_model_len(self) -> int:
        """The context the plan's verl starts vLLM with (rule R7): from v0.7.1 rollout.max_model_len, else the
        model's max_position_embeddings (vllm_async_server.py); v0.7.0 always the latter; before v0.7.0
        rollout.max_model_len, else prompt + response (vllm_rollout_spmd.py; stack.LEN_FROM_SEQUENCES).
        rlplan's memory model and runtime use prompt + response where it is unset (`memory.rollout_max_model_len`),
        which is why render writes the value out."""
        if holds(LEN_FROM_MODEL_ALWAYS, self.stack):
            return self.model.arch.max_position_embeddings
        if holds(LEN_FROM_SEQUENCES, self.stack):
            return self.rollout.max_model_len or self.data.max_sequence_length
        return self.rollout.max_model_len or self.model.arch.max_position_embeddings

    @property
    def fitting_max_model_len(self) -> int:
        """The max_model_len a plan should ask for: its longest sequence, within what the model was trained on."""
        return min(self.data.max_sequence_length, self.model.arch.max_position_embeddings)

    def evolve(self, **changes: Any) -> Plan:
        return attrs.evolve(self, **changes)
