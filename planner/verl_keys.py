"""The one table between plan fields and verl's Hydra keys, and Hydra's value syntax.

Import (`planner.verl_import`) and render (`planner.render`) both read this table, so a
knob mapped here is mapped both ways.  Each entry names the plan field, verl's key and
verl's own default for it: the value of verl 0.9's ppo_trainer YAML, or, where that YAML
interpolates another key (`${oc.select:actor_rollout_ref.actor.use_dynamic_bsz}`), the
plan field it follows.  An import fills every key a script omits with that default, so
`rlplan validate` judges what verl would actually run, not rlplan's own defaults.

Plan fields with no verl key are listed in `RLPLAN_ONLY_FIELDS` with how an import sets
them.  The Hydra value codec at the bottom writes values so that Hydra reads back the
exact same value (quoting strings, escaping interpolations) and parses what users write.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from attrs import frozen

from rlplan.planner import verl_inventory
from rlplan.planner.errors import PlanError
from rlplan.planner.quoting import UnclosedQuote, unquoted
from rlplan.planner.verl_inventory import TrainerBackend

# str_list: one string or a list (verl spells one module/file as a string); list: always a list.
Kind = Literal["int", "float", "bool", "str", "str_list", "list"]
# Which of verl's trainer configs has the key: both, ppo_trainer.yaml (FSDP) or ppo_megatron_trainer.yaml.
# A plan field may have one key per backend (model.lora.rank is peft's model.lora_rank under FSDP and
# Megatron-Bridge's model.lora.rank under Megatron); a field with no key of the plan's backend is not rendered.
Backend = Literal["any", "fsdp", "megatron"]

ARF = "actor_rollout_ref"

# The model's context as verl's HF config takes it: FSDP applies model.override_config.* to the config it loads;
# verl's Megatron workers apply override_config.model_config.* (v0.4.1 single_controller/base/megatron/worker.py,
# v0.6.0 megatron_workers.py; from v0.6.0 HFModelConfig takes either spelling, verl/workers/config/model.py
# __post_init__).
CONTEXT_OVERRIDE_KEY = f"{ARF}.model.override_config.max_position_embeddings"
MEGATRON_CONTEXT_OVERRIDE_KEY = f"{ARF}.model.override_config.model_config.max_position_embeddings"
CONTEXT_OVERRIDE_KEYS = (CONTEXT_OVERRIDE_KEY, MEGATRON_CONTEXT_OVERRIDE_KEY)


@frozen
class Follows:
    """A verl default that is another plan field's value (a YAML interpolation)."""

    field: str


@frozen(kw_only=True)
class VerlKey:
    field: str
    # The newest release's spelling: what verl reads today, what the table is looked up by.
    key: str
    kind: Kind
    default: Any
    # The plan may leave it unset (None): then it is not rendered and verl's default applies.
    optional: bool = False
    backend: Backend = "any"
    # The same knob's older spellings, newest first (critic.fsdp.param_offload was
    # critic.model.fsdp_config.param_offload up to 0.7.x). Which releases have each spelling is not kept here: it is
    # read from verl's own configs per release (presets/verl_inventory.json, planner/verl_inventory.py). Import
    # reads every spelling; render writes the target release's.
    older: tuple[str, ...] = ()

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.key, *self.older)

    def trainer_configs(self) -> tuple[TrainerBackend, ...]:
        """The trainer configs whose table has this entry."""
        return ("fsdp", "megatron") if self.backend == "any" else (self.backend,)

    def spelling_for(self, version: str, backend: TrainerBackend) -> str | None:
        """How verl `version`'s trainer config of that backend spells the knob (the newest spelling it has);
        None where that release has no spelling of it."""
        return spelled(self.spellings, version, backend)

    def releases(self, backend: TrainerBackend) -> tuple[str, ...]:
        """The releases read whose trainer config of that backend has some spelling of the knob."""
        return tuple(release for release in verl_inventory.releases_read() if self.spelling_for(release, backend))


def _k(field: str, key: str, kind: Kind, default: Any, optional: bool = False, *, older: tuple[str, ...] = ()
       ) -> VerlKey:
    return VerlKey(field=field, key=key, kind=kind, default=default, optional=optional, older=older)


def _fsdp(field: str, key: str, kind: Kind, default: Any, optional: bool = False, *, older: tuple[str, ...] = ()
          ) -> VerlKey:
    """A key only ppo_trainer.yaml has (Hydra refuses it on the Megatron trainer's config)."""
    return VerlKey(field=field, key=key, kind=kind, default=default, optional=optional, backend="fsdp", older=older)


def _mcore(field: str, key: str, kind: Kind, default: Any, optional: bool = False) -> VerlKey:
    """A key of ppo_megatron_trainer.yaml, with that file's default."""
    return VerlKey(field=field, key=key, kind=kind, default=default, optional=optional, backend="megatron")


# (name, kind, verl's default, optional) of McoreEngineConfig's keys a plan models.
_ENGINE_KEYS: tuple[tuple[str, Kind, Any, bool], ...] = (
    ("tensor_model_parallel_size", "int", 1, False),
    ("pipeline_model_parallel_size", "int", 1, False),
    ("virtual_pipeline_model_parallel_size", "int", None, True),
    ("context_parallel_size", "int", 1, False),
    ("expert_model_parallel_size", "int", 1, False),
    ("expert_tensor_parallel_size", "int", None, True),
    ("sequence_parallel", "bool", True, False),
    ("use_distributed_optimizer", "bool", True, False),
    ("param_offload", "bool", False, False),
    # verl b178a3cd's Megatron examples set it; verl 0.9.1's McoreEngineConfig has no such field (rule
    # megatron_grad_offload_is_not_in_verl_0_9), so a plan renders it only where it is set.
    ("grad_offload", "bool", None, True),
    ("optimizer_offload", "bool", False, False),
    ("use_mbridge", "bool", True, False),
    ("vanilla_mbridge", "bool", False, False),
    ("use_dist_checkpointing", "bool", False, False),
)
# Megatron's recompute knobs, which verl passes to TransformerConfig through override_transformer_config.
_RECOMPUTE_KEYS: tuple[tuple[str, Kind, Any, bool], ...] = (
    ("recompute_granularity", "str", None, True),
    ("recompute_method", "str", None, True),
    ("recompute_num_layers", "int", None, True),
    ("recompute_modules", "list", ("core_attn",), False),
)
_REF_ENGINE_KEYS: tuple[tuple[str, Kind, bool], ...] = (
    ("tensor_model_parallel_size", "int", False),
    ("pipeline_model_parallel_size", "int", False),
    ("virtual_pipeline_model_parallel_size", "int", True),
    ("context_parallel_size", "int", False),
    ("expert_model_parallel_size", "int", False),
    ("expert_tensor_parallel_size", "int", True),
    ("param_offload", "bool", False),
)
# The reference fields ppo_megatron_trainer.yaml defaults to the actor's (ref.megatron.* oc.select).
REF_FOLLOWS_ACTOR = tuple(name for name, _, _ in _REF_ENGINE_KEYS)


def _engine_keys(role: str, prefix: str) -> tuple[VerlKey, ...]:
    engine = tuple(_mcore(f"{role}.megatron.{name}", f"{prefix}.{name}", kind, default, optional)
                   for name, kind, default, optional in _ENGINE_KEYS)
    recompute = tuple(_mcore(f"{role}.megatron.{name}", f"{prefix}.override_transformer_config.{name}", kind,
                             default, optional) for name, kind, default, optional in _RECOMPUTE_KEYS)
    return engine + recompute


def _log_prob_keys(section: Literal["ref", "rollout"]) -> tuple[VerlKey, ...]:
    """The four knobs of a forward-only log-prob pass, which verl's ref and rollout sections name alike; left
    unset, its dynamic-batch flag and token budget follow the actor's."""
    return (
        _k(f"{section}.log_prob_micro_batch_size_per_gpu", f"{ARF}.{section}.log_prob_micro_batch_size_per_gpu",
           "int", None, True),
        _k(f"{section}.log_prob_micro_batch_size", f"{ARF}.{section}.log_prob_micro_batch_size", "int", None, True),
        _k(f"{section}.log_prob_use_dynamic_bsz", f"{ARF}.{section}.log_prob_use_dynamic_bsz", "bool",
           Follows("actor.use_dynamic_bsz")),
        _k(f"{section}.log_prob_max_token_len_per_gpu", f"{ARF}.{section}.log_prob_max_token_len_per_gpu", "int",
           Follows("actor.ppo_max_token_len_per_gpu")),
    )


VERL_KEYS: tuple[VerlKey, ...] = (
    # --- model --------------------------------------------------------------
    _k("model.path", f"{ARF}.model.path", "str", None),
    _fsdp("model.lora.rank", f"{ARF}.model.lora_rank", "int", 0),
    _fsdp("model.lora.alpha", f"{ARF}.model.lora_alpha", "int", 16),
    _fsdp("model.lora.target_modules", f"{ARF}.model.target_modules", "str_list", ("all-linear",)),
    _k("model.gradient_checkpointing", f"{ARF}.model.enable_gradient_checkpointing", "bool", True),
    _k("model.activation_offload", f"{ARF}.model.enable_activation_offload", "bool", False),
    _k("model.use_remove_padding", f"{ARF}.model.use_remove_padding", "bool", True),
    _k("model.use_fused_kernels", f"{ARF}.model.use_fused_kernels", "bool", False),
    # --- cluster ------------------------------------------------------------
    _k("cluster.nodes", "trainer.nnodes", "int", 1),
    _k("cluster.gpus_per_node", "trainer.n_gpus_per_node", "int", 8),
    # --- data ---------------------------------------------------------------
    _k("data.train_batch_size", "data.train_batch_size", "int", 1024),
    _k("data.max_prompt_length", "data.max_prompt_length", "int", 512),
    _k("data.max_response_length", "data.max_response_length", "int", 512),
    _k("data.gen_batch_size", "data.gen_batch_size", "int", None, True),
    _k("data.train_files", "data.train_files", "str_list", ("~/data/rlhf/gsm8k/train.parquet",)),
    _k("data.val_files", "data.val_files", "str_list", ("~/data/rlhf/gsm8k/test.parquet",)),
    _k("data.prompt_key", "data.prompt_key", "str", "prompt"),
    _k("data.truncation", "data.truncation", "str", "error"),
    _k("data.filter_overlong_prompts", "data.filter_overlong_prompts", "bool", False),
    _k("data.shuffle", "data.shuffle", "bool", True),
    # verl's null seed leaves the sampler unseeded; a plan always carries one.
    _k("data.seed", "data.seed", "int", 1),
    # --- actor --------------------------------------------------------------
    _fsdp("actor.strategy", f"{ARF}.actor.strategy", "str", "fsdp"),
    _k("actor.ppo_mini_batch_size", f"{ARF}.actor.ppo_mini_batch_size", "int", 256),
    _k("actor.ppo_micro_batch_size_per_gpu", f"{ARF}.actor.ppo_micro_batch_size_per_gpu", "int", None, True),
    _k("actor.ppo_micro_batch_size", f"{ARF}.actor.ppo_micro_batch_size", "int", None, True),
    _k("actor.use_dynamic_bsz", f"{ARF}.actor.use_dynamic_bsz", "bool", False),
    _k("actor.ppo_max_token_len_per_gpu", f"{ARF}.actor.ppo_max_token_len_per_gpu", "int", 16384),
    _k("actor.ppo_epochs", f"{ARF}.actor.ppo_epochs", "int", 1),
    _k("actor.shuffle", f"{ARF}.actor.shuffle", "bool", False),
    _fsdp("actor.ulysses_sequence_parallel_size", f"{ARF}.actor.ulysses_sequence_parallel_size", "int", 1),
    _fsdp("actor.fsdp_size", f"{ARF}.actor.fsdp_config.fsdp_size", "int", -1),
    _fsdp("actor.param_offload", f"{ARF}.actor.fsdp_config.param_offload", "bool", False),
    _fsdp("actor.optimizer_offload", f"{ARF}.actor.fsdp_config.optimizer_offload", "bool", False),
    _fsdp("actor.offload_policy", f"{ARF}.actor.fsdp_config.offload_policy", "bool", False),
    _fsdp("actor.entropy_from_logits_with_chunking", f"{ARF}.actor.entropy_from_logits_with_chunking", "bool", False),
    _fsdp("actor.entropy_checkpointing", f"{ARF}.actor.entropy_checkpointing", "bool", False),
    _k("actor.use_torch_compile", f"{ARF}.actor.use_torch_compile", "bool", True),
    _fsdp("actor.model_dtype", f"{ARF}.actor.fsdp_config.model_dtype", "str", "fp32"),
    _fsdp("actor.compute_dtype", f"{ARF}.actor.fsdp_config.dtype", "str", "bfloat16"),
    _k("actor.lr", f"{ARF}.actor.optim.lr", "float", 1e-6),
    _k("actor.weight_decay", f"{ARF}.actor.optim.weight_decay", "float", 0.01),
    # verl's -1 means "use lr_warmup_steps_ratio", which defaults to 0: no warm-up.
    _k("actor.lr_warmup_steps", f"{ARF}.actor.optim.lr_warmup_steps", "int", 0),
    _fsdp("actor.grad_clip", f"{ARF}.actor.grad_clip", "float", 1.0),
    _k("actor.clip_ratio_low", f"{ARF}.actor.clip_ratio_low", "float", 0.2),
    _k("actor.clip_ratio_high", f"{ARF}.actor.clip_ratio_high", "float", 0.2),
    _k("actor.clip_ratio_c", f"{ARF}.actor.clip_ratio_c", "float", 3.0),
    _k("actor.loss_agg_mode", f"{ARF}.actor.loss_agg_mode", "str", "token-mean"),
    _k("actor.use_kl_loss", f"{ARF}.actor.use_kl_loss", "bool", False),
    _k("actor.kl_loss_coef", f"{ARF}.actor.kl_loss_coef", "float", 0.001),
    _k("actor.kl_loss_type", f"{ARF}.actor.kl_loss_type", "str", "low_var_kl"),
    _k("actor.entropy_coeff", f"{ARF}.actor.entropy_coeff", "float", 0.0),
    # --- reference ------------------------------------------------------------
    _fsdp("ref.param_offload", f"{ARF}.ref.fsdp_config.param_offload", "bool", False),
    _fsdp("ref.model_dtype", f"{ARF}.ref.fsdp_config.model_dtype", "str", "fp32"),
    _fsdp("ref.compute_dtype", f"{ARF}.ref.fsdp_config.dtype", "str", "bfloat16"),
    *_log_prob_keys("ref"),
    # --- rollout (verl passes these on to vLLM's engine arguments) ------------
    _k("rollout.n", f"{ARF}.rollout.n", "int", 1),
    _k("rollout.name", f"{ARF}.rollout.name", "str", "vllm"),
    _k("rollout.tensor_model_parallel_size", f"{ARF}.rollout.tensor_model_parallel_size", "int", 2),
    _k("rollout.gpu_memory_utilization", f"{ARF}.rollout.gpu_memory_utilization", "float", 0.5),
    _k("rollout.max_num_seqs", f"{ARF}.rollout.max_num_seqs", "int", 256),
    _k("rollout.max_num_batched_tokens", f"{ARF}.rollout.max_num_batched_tokens", "int", 8192),
    _k("rollout.max_model_len", f"{ARF}.rollout.max_model_len", "int", None, True),
    _k("rollout.enable_chunked_prefill", f"{ARF}.rollout.enable_chunked_prefill", "bool", True),
    _k("rollout.enable_prefix_caching", f"{ARF}.rollout.enable_prefix_caching", "bool", True),
    _k("rollout.enforce_eager", f"{ARF}.rollout.enforce_eager", "bool", False),
    _k("rollout.free_cache_engine", f"{ARF}.rollout.free_cache_engine", "bool", True),
    _fsdp("rollout.layered_summon", f"{ARF}.rollout.layered_summon", "bool", False),
    # verl's YAML default is false, but verl (b178a3cd) never reads the key: fsdp_workers.py
    # rollout_mode resumes "weights", syncs, then resumes "kv_cache" whenever free_cache_engine,
    # so a staged wake is what verl does when a script leaves it unset.
    _k("rollout.multi_stage_wake_up", f"{ARF}.rollout.multi_stage_wake_up", "bool", True),
    _k("rollout.load_format", f"{ARF}.rollout.load_format", "str", "dummy"),
    _k("rollout.dtype", f"{ARF}.rollout.dtype", "str", "bfloat16"),
    _k("rollout.temperature", f"{ARF}.rollout.temperature", "float", 1.0),
    _k("rollout.top_p", f"{ARF}.rollout.top_p", "float", 1.0),
    _k("rollout.top_k", f"{ARF}.rollout.top_k", "int", -1),
    _k("rollout.ignore_eos", f"{ARF}.rollout.ignore_eos", "bool", False),
    *_log_prob_keys("rollout"),
    _k("rollout.agent_num_workers", f"{ARF}.rollout.agent.num_workers", "int", 8),
    _k("rollout.update_weights_bucket_megabytes",
       f"{ARF}.rollout.checkpoint_engine.update_weights_bucket_megabytes", "int", 2048,
       older=(f"{ARF}.rollout.update_weights_bucket_megabytes",)),
    # --- critic ---------------------------------------------------------------
    _k("critic.enable", "critic.enable", "bool", None, True),
    _k("critic.ppo_mini_batch_size", "critic.ppo_mini_batch_size", "int", None, True),
    _k("critic.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu", "int", None, True),
    _k("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size", "int", None, True),
    _fsdp("critic.forward_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu", "int", None, True),
    _k("critic.use_dynamic_bsz", "critic.use_dynamic_bsz", "bool", Follows("actor.use_dynamic_bsz")),
    _k("critic.ppo_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu", "int", 32768),
    _k("critic.forward_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu", "int",
       Follows("critic.ppo_max_token_len_per_gpu")),
    _k("critic.ppo_epochs", "critic.ppo_epochs", "int", Follows("actor.ppo_epochs")),
    _fsdp("critic.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size", "int", 1),
    _fsdp("critic.param_offload", "critic.fsdp.param_offload", "bool", False,
          older=("critic.model.fsdp_config.param_offload",)),
    _fsdp("critic.optimizer_offload", "critic.fsdp.optimizer_offload", "bool", False,
          older=("critic.model.fsdp_config.optimizer_offload",)),
    _fsdp("critic.offload_policy", "critic.fsdp.offload_policy", "bool", False,
          older=("critic.model.fsdp_config.offload_policy",)),
    _fsdp("critic.compute_dtype", "critic.fsdp.dtype", "str", "bfloat16",
          older=("critic.model.fsdp_config.dtype",)),
    _fsdp("critic.gradient_checkpointing", "critic.model.enable_gradient_checkpointing", "bool", True),
    _fsdp("critic.use_remove_padding", "critic.model.use_remove_padding", "bool", True),
    _k("critic.lr", "critic.optim.lr", "float", 1e-5),
    _k("critic.cliprange_value", "critic.cliprange_value", "float", 0.5),
    _fsdp("critic.grad_clip", "critic.grad_clip", "float", 1.0),
    # --- algorithm ------------------------------------------------------------
    _k("algorithm.adv_estimator", "algorithm.adv_estimator", "str", "gae"),
    _k("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo", "bool", True),
    _k("algorithm.gamma", "algorithm.gamma", "float", 1.0),
    _k("algorithm.lam", "algorithm.lam", "float", 1.0),
    _k("algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward", "bool", False),
    _k("algorithm.kl_penalty", "algorithm.kl_penalty", "str", "kl"),
    _k("algorithm.kl_coef", "algorithm.kl_ctrl.kl_coef", "float", 0.001),
    # --- trainer --------------------------------------------------------------
    _k("trainer.total_epochs", "trainer.total_epochs", "int", 30),
    _k("trainer.total_training_steps", "trainer.total_training_steps", "int", None, True),
    _k("trainer.save_freq", "trainer.save_freq", "int", -1),
    _k("trainer.test_freq", "trainer.test_freq", "int", -1),
    _k("trainer.project_name", "trainer.project_name", "str", "verl_examples"),
    _k("trainer.experiment_name", "trainer.experiment_name", "str", "gsm8k"),
    _k("trainer.logger", "trainer.logger", "str_list", ("console", "wandb")),
    # verl's default is `checkpoints/${trainer.project_name}/${trainer.experiment_name}`; the
    # importer resolves that interpolation like any other.
    _k("trainer.output_dir", "trainer.default_local_dir", "str",
       "checkpoints/${trainer.project_name}/${trainer.experiment_name}"),
    # The seed of the actor engine (model init, dropout): the closest verl has to one run seed.
    _fsdp("trainer.seed", f"{ARF}.actor.fsdp_config.seed", "int", 42),
    _k("trainer.balance_batch", "trainer.balance_batch", "bool", True),
    _k("trainer.val_before_train", "trainer.val_before_train", "bool", True),
    _k("trainer.max_checkpoints_to_keep", "trainer.max_actor_ckpt_to_keep", "int", None, True),
    # --- the Megatron backend (ppo_megatron_trainer.yaml, verl/workers/config/engine.py McoreEngineConfig) ---
    _mcore("actor.strategy", f"{ARF}.actor.strategy", "str", "megatron"),
    _mcore("actor.compute_dtype", f"{ARF}.actor.megatron.dtype", "str", "bfloat16"),
    _mcore("actor.grad_clip", f"{ARF}.actor.optim.clip_grad", "float", 1.0),
    _mcore("ref.compute_dtype", f"{ARF}.ref.megatron.dtype", "str", "bfloat16"),
    _mcore("critic.compute_dtype", "critic.megatron.dtype", "str", "bfloat16"),
    _mcore("critic.grad_clip", "critic.optim.clip_grad", "float", 1.0),
    _mcore("trainer.seed", f"{ARF}.actor.megatron.seed", "int", 42),
    # Megatron-Bridge's LoRA (verl/workers/config/megatron_peft.py); peft's model.lora_* are ignored.
    _mcore("model.lora.rank", f"{ARF}.model.lora.rank", "int", 0),
    _mcore("model.lora.alpha", f"{ARF}.model.lora.alpha", "int", 32),
    _mcore("model.lora.target_modules", f"{ARF}.model.lora.target_modules", "list",
           ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")),
    _mcore("model.lora.type", f"{ARF}.model.lora.type", "str", "lora"),
    _mcore("model.lora.exclude_modules", f"{ARF}.model.lora.exclude_modules", "list", ()),
    _mcore("model.lora.merge", f"{ARF}.model.lora.merge", "bool", False),
    _mcore("model.lora.adapter_path", f"{ARF}.model.lora.adapter_path", "str", None, True),
    *(entry for role, prefix in (("actor", f"{ARF}.actor.megatron"), ("critic", "critic.megatron"))
      for entry in _engine_keys(role, prefix)),
    # verl's ref.megatron follows the actor's (oc.select) for these; its other knobs are fixed (forward only).
    *(_mcore(f"ref.megatron.{name}", f"{ARF}.ref.megatron.{name}", kind, Follows(f"actor.megatron.{name}"),
             optional=optional)
      for name, kind, optional in _REF_ENGINE_KEYS),
)



def _first_per(attribute: str) -> dict[str, VerlKey]:
    table: dict[str, VerlKey] = {}
    for entry in VERL_KEYS:
        table.setdefault(getattr(entry, attribute), entry)
    return table


# A field's FSDP key where it has one (the table lists them first), else its Megatron key.
BY_FIELD: dict[str, VerlKey] = _first_per("field")
# Every key of either backend; a key both configs share maps to the same field either way.
BY_KEY: dict[str, VerlKey] = _first_per("key")


def backend_of(strategy: str) -> TrainerBackend:
    return "megatron" if strategy == "megatron" else "fsdp"


def table_for(backend: Backend) -> dict[str, VerlKey]:
    """Each plan field's entry for that backend: its own key, or (a field the backend has no key for) the
    FSDP entry, whose default an import gives the field and which a render does not write (`has_key`)."""
    table: dict[str, VerlKey] = {}
    for entry in VERL_KEYS:
        if entry.backend == backend:
            table[entry.field] = entry
        elif entry.backend != "megatron" or backend == "megatron":
            table.setdefault(entry.field, entry)
    return table


def has_key(entry: VerlKey, backend: Backend) -> bool:
    """Whether verl's config for that backend has the entry's key."""
    return entry.backend in ("any", backend)


def backend_has(key: str, backend: Backend) -> bool:
    """Whether verl's config for that backend has the key (some entry of it does)."""
    return key in _KEYS_OF[backend]


_KEYS_OF: dict[Backend, frozenset[str]] = {
    backend: frozenset(entry.key for entry in VERL_KEYS if has_key(entry, backend)) for backend in ("fsdp", "megatron")}

# The user's reward function `path:name` is two verl keys: the `reward.` pair from verl 0.7.1, the top-level pair
# before (which 0.7.1 on still has, unread). Newest spelling first, as a VerlKey's.
REWARD_PATH_KEY = "reward.custom_reward_function.path"
REWARD_NAME_KEY = "reward.custom_reward_function.name"
REWARD_SPELLINGS: dict[str, tuple[str, ...]] = {
    REWARD_PATH_KEY: (REWARD_PATH_KEY, "custom_reward_function.path"),
    REWARD_NAME_KEY: (REWARD_NAME_KEY, "custom_reward_function.name"),
}
DEFAULT_REWARD_NAME = "compute_score"

# Older spellings, read by the importer as today's key: every table entry's, and the reward pair's.
KEY_ALIASES: dict[str, str] = {
    **{old: entry.key for entry in VERL_KEYS for old in entry.older},
    **{old: key for key, spellings in REWARD_SPELLINGS.items() for old in spellings[1:]},
}


# Older spellings of a key's value, read by the importer as today's value: key -> {old value: (value, why)}.
# rollout.name=sglang_async: verl v0.4.0 and v0.4.1 accept it as a deprecated name of sglang and build the same
# SGLangRollout for both (verl/workers/fsdp_workers.py _build_rollout and megatron_workers.py at v0.4.0 and v0.4.1:
# "'sglang_async' has been deprecated and merged into 'sglang'"); v0.3.0.post1 and v0.5.0 on know only sglang.
# A render writes today's value, which every release read accepts.
VALUE_ALIASES: dict[str, dict[str, tuple[str, str]]] = {
    f"{ARF}.rollout.name": {
        "sglang_async": ("sglang", "verl 0.4.0-0.4.1's deprecated name of the sglang rollout (the same SGLangRollout); "
                         "verl 0.3 and 0.5 on know only sglang"),
    },
}


# rollout.name values by the first verl release that builds them (None: every release read). trtllm: verl 0.7.1 adds
# verl/workers/rollout/trtllm_rollout/ (TRTLLMReplica registered as "trtllm" in rollout/replica.py, ServerAdapter
# for ("trtllm", "async") in rollout/base.py), read at the tags v0.7.0 (absent) and v0.7.1, v0.8.0, v0.9.0 (present)
# of verl-project/verl and in the 0.8.0.dev main of /work/wt/import-verl-main.
ROLLOUT_NAME_KEY = f"{ARF}.rollout.name"
ROLLOUT_ENGINE_SINCE: dict[str, str | None] = {"vllm": None, "sglang": None, "trtllm": "0.7.1"}


def value_alias(key: str, value: str) -> tuple[str, str] | None:
    """(today's value, why) when `value` is an older spelling of `key`'s value, else None."""
    aliases = VALUE_ALIASES.get(key)
    if not aliases:
        return None
    parsed = parse_value(value)
    return aliases.get(parsed) if isinstance(parsed, str) else None


def spelled(spellings: tuple[str, ...], version: str, backend: TrainerBackend) -> str | None:
    """The newest of these spellings that verl `version`'s trainer config of that backend has."""
    return next((key for key in spellings if verl_inventory.has_key(version, key, backend)), None)


# Keys a render also writes, for a consistent verl config, from the plan field named; an import
# drops them when they agree with that field and keeps them in passthrough otherwise.
# Dated keys whose value a verl without the key never reads, so render leaves them out there whatever the plan says
# (a key it lacks is otherwise refused unless the plan asks for what that verl does anyway).
UNREAD_WHERE_ABSENT = {
    # verl before 0.7.0 seeds no FSDP engine; from 0.7.0 fsdp_config.seed is read only by enable_full_determinism
    # (verl/workers/engine/fsdp/transformer_impl.py), which a plan does not switch on.
    "trainer.seed": "verl's FSDP actor has no seed before 0.7.0",
}

RENDER_ALSO = {
    # verl's ref and critic default their strategy to fsdp on their own.
    "critic.strategy": "actor.strategy",
    # rlplan's critic starts from the policy's weights, as verl's examples do.
    "critic.model.path": "model.path",
    "trainer.max_critic_ckpt_to_keep": "trainer.max_checkpoints_to_keep",
}

# Plan fields verl has no key for, and what an import sets them to.
RLPLAN_ONLY_FIELDS: dict[str, str] = {
    "model.name": "the model preset's name (or the local directory's), from the model path",
    "model.arch": "the preset's architecture, or the local config.json's",
    "cluster.gpu": "the --gpu flag",
    "cluster.host_memory_gib": "the --host-mem flag",
    "cluster.internode_gbps": "rlplan's default",
    "rollout.sleep_level": "what verl picks on the plan's stack (stack.verl_sleep_level): 1 up to verl 0.5 or under vLLM 0.8.5, "
                           "with LoRA adapters or layered_summon; else 2",
    "algorithm.grpo_leave_one_out": "false; verl has no leave-one-out GRPO baseline, so render refuses it",
    "prediction": "none; `rlplan validate` recomputes it",
    "actor.loss_head": "auto: the head verl runs for the plan (model.use_fused_kernels, use_remove_padding); chunked: rlplan's runtime",
    "data.expected_prompt_length": "the --expected-prompt-len flag (unset: max_prompt_length)",
    "data.expected_response_length": "the --expected-response-len flag (unset: max_response_length)",
    "trainer.pytorch_cuda_alloc_conf": "the script's `export PYTORCH_CUDA_ALLOC_CONF=...` (or --env), rendered back "
                                       "as that export",
}


# --- Hydra's override value syntax --------------------------------------------------------

# Characters Hydra accepts in an unquoted value with no meaning of their own.
_PLAIN_STRING = re.compile(r"[A-Za-z0-9_./+@%-][A-Za-z0-9_./+@%:-]*")
_INT = re.compile(r"[+-]?(0|[1-9][0-9_]*)")
_FLOAT = re.compile(r"[+-]?((\d[\d_]*)?\.\d[\d_]*([eE][+-]?\d+)?|\d[\d_]*\.([eE][+-]?\d+)?|\d[\d_]*[eE][+-]?\d+"
                    r"|inf|nan)", re.IGNORECASE)
# Hydra's escapes in an unquoted value: a backslash before one of these stands for it.
_UNQUOTED_ESCAPES = set("\\()[]{}:=, \t")


class HydraSyntaxError(ValueError):
    """A value Hydra's override grammar would not parse."""


def _reads_as_other_type(text: str) -> bool:
    lowered = text.lower()
    return lowered in ("null", "true", "false") or bool(_INT.fullmatch(text) or _FLOAT.fullmatch(text))


def _after_backslashes(text: str, start: int) -> tuple[int, str]:
    """Where the run of backslashes at `start` ends (`start` when there is none), and the character there ('' at the end).

    Quoting and unquoting both treat a backslash run by what follows it (a quote, `${`, the end).
    """
    end = start
    while end < len(text) and text[end] == "\\":
        end += 1
    return end, text[end:end + 1]


def _quote(text: str) -> str:
    """A single-quoted Hydra string that Hydra and OmegaConf read back as exactly `text`.

    Inside quotes Hydra treats backslashes as literal except in a run before a quote (or the
    closing quote), where each one must be doubled; OmegaConf then reads `${` as an
    interpolation unless escaped as `\\${`, and a backslash run before `${` is likewise doubled.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        j, nxt = _after_backslashes(text, i)
        run = text[i:j]
        if run:
            ends_before_special = j == len(text) or nxt == "'" or text.startswith("${", j)
            out.append(run * 2 if ends_before_special else run)
            i = j
            continue
        if text[i] == "'":
            out.append("\\'")
        elif text.startswith("${", i):
            out.append("\\$")
        else:
            out.append(text[i])
        i += 1
    return "'" + "".join(out) + "'"


def format_value(value: Any) -> str:
    """Python value -> Hydra override value text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(item) for item in value) + "]"
    text = str(value)
    if _PLAIN_STRING.fullmatch(text) and not _reads_as_other_type(text) and "${" not in text:
        return text
    return _quote(text)


def _unquote(body: str, quote: str) -> str:
    """Inverse of `_quote` (for either quote character)."""
    out: list[str] = []
    i = 0
    while i < len(body):
        j, nxt = _after_backslashes(body, i)
        run_length = j - i
        if run_length:
            if nxt == quote:
                out.append("\\" * (run_length // 2))
                if run_length % 2:
                    out.append(quote)
                    j += 1
            elif body.startswith("${", j):
                out.append("\\" * (run_length // 2))
                if run_length % 2:
                    out.append("${")
                    j += 2
            elif j == len(body):
                out.append("\\" * (run_length // 2))
            else:
                out.append("\\" * run_length)
            i = j
            continue
        if body[i] == quote:
            raise HydraSyntaxError(f"unescaped {quote} inside a quoted value")
        out.append(body[i])
        i += 1
    return "".join(out)


def _split_top_level(text: str) -> list[str]:
    """Split a list body at commas outside quotes and brackets."""
    parts: list[str] = []
    depth, start = 0, 0
    try:
        for i, char in unquoted(text, backslash_in_single_quotes=True):
            if char in "[{":
                depth += 1
            elif char in "]}":
                depth -= 1
            elif char == "," and depth == 0:
                parts.append(text[start:i])
                start = i + 1
    except UnclosedQuote:
        depth = -1
    if depth:
        raise HydraSyntaxError("unbalanced quotes or brackets")
    parts.append(text[start:])
    return parts


@frozen
class Interpolation:
    """An unquoted value containing `${...}`: resolved later against other keys or the environment."""

    text: str


# Python refuses to read an integer of more than 4300 digits from text (sys.get_int_max_str_digits).
MAX_INT_DIGITS = 4000


def parse_value(text: str) -> Any:
    """Hydra override value text -> Python value (str, int, float, bool, None, list, Interpolation)."""
    stripped = text.strip(" \t")
    if not stripped:
        return ""
    if stripped[0] == "[" and stripped.endswith("]"):
        body = stripped[1:-1]
        if not body.strip():
            return []
        return [parse_value(part) for part in _split_top_level(body)]
    if len(stripped) >= 2 and stripped[0] in "'\"" and stripped[-1] == stripped[0]:
        value = _unquote(stripped[1:-1], stripped[0])
        return Interpolation(value) if _has_interpolation(stripped[1:-1]) else value
    lowered = stripped.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.fullmatch(stripped):
        digits = stripped.replace("_", "")
        # Past Python's int-from-text limit no knob's value lies; kept as text, the key's own check names it.
        return int(digits) if len(digits) <= MAX_INT_DIGITS else stripped
    if _FLOAT.fullmatch(stripped):
        return float(stripped.replace("_", ""))
    if "${" in stripped:
        return Interpolation(stripped)
    out: list[str] = []
    i = 0
    while i < len(stripped):
        if stripped[i] == "\\" and i + 1 < len(stripped) and stripped[i + 1] in _UNQUOTED_ESCAPES:
            out.append(stripped[i + 1])
            i += 2
            continue
        out.append(stripped[i])
        i += 1
    return "".join(out)


def _has_interpolation(quoted_body: str) -> bool:
    """Whether a quoted body holds an unescaped `${` (an even run of backslashes before it)."""
    for match in re.finditer(r"(\\*)\$\{", quoted_body):
        if len(match.group(1)) % 2 == 0:
            return True
    return False


# verl's other spellings of a value, read as the plan's (verl/utils/torch_dtypes.py::PrecisionType accepts
# fp32 / float32 / 32 and bf16 / bfloat16 for fsdp_config.model_dtype).
_PRECISION_SPELLINGS = {"32": "fp32", "float32": "fp32", "bfloat16": "bf16"}
# verl <= 0.5's rollout.load_format defaults were dummy_dtensor (FSDP) and dummy_megatron: random weights the first
# sync overwrites, as dummy (verl/workers/rollout/vllm_rollout: `"dummy" if load_format.startswith("dummy")`).
_DUMMY_SPELLINGS = {"dummy_dtensor": "dummy", "dummy_megatron": "dummy", "dummy_hf": "dummy"}
VALUE_SPELLINGS: dict[str, dict[str, str]] = {
    "actor.model_dtype": _PRECISION_SPELLINGS,
    "ref.model_dtype": _PRECISION_SPELLINGS,
    "rollout.load_format": _DUMMY_SPELLINGS,
}
# verl's own integer defaults that mean what the plan's value means: optim.lr_warmup_steps -1 is "use
# lr_warmup_steps_ratio", whose default 0 is no warm-up (verl/utils/torch_functional.py, the optimizer builders).
INT_SPELLINGS: dict[str, dict[int, int]] = {"actor.lr_warmup_steps": {-1: 0}}
# The actor's warm-up ratio, a key rlplan keeps as passthrough: with it, the plan's lr_warmup_steps = 0 renders as
# verl's -1 (stack.VERL_WARMUP_STEPS_DEFAULT), which hands the warm-up to the ratio on every release's workers, where
# an explicit 0 switches the ratio off on the legacy FSDP worker (stack.WARMUP_ZERO_READS_RATIO).
WARMUP_RATIO_KEY = f"{ARF}.actor.optim.lr_warmup_steps_ratio"


def coerce(entry: VerlKey, value: Any, raw: str) -> Any:
    """A parsed Hydra value as the plan field's type, or a PlanError naming verl's key."""

    def bad(expected: str) -> PlanError:
        return PlanError(field=entry.key, message=f"expects {expected}, got {raw!r}.",
                         fix=f"set {entry.key} to {expected}")

    if value is None or (value == "None" and entry.optional and entry.kind != "str"):
        # verl 0.5's ppo_megatron_trainer.yaml writes `expert_tensor_parallel_size: None`, a string to OmegaConf.
        if entry.optional:
            return None
        if isinstance(entry.default, Follows):
            return entry.default
        raise bad(f"{'an integer' if entry.kind == 'int' else 'a value'} (verl has no null for it)")
    if entry.kind == "bool":
        if isinstance(value, bool):
            return value
        raise bad("true or false")
    # An integer past float's range is no knob's value (and math.isfinite cannot even take it).
    number = isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < 2**63
    if entry.kind == "int":
        if not number or not math.isfinite(value) or int(value) != value:
            raise bad("an integer below 2**63")
        return INT_SPELLINGS.get(entry.field, {}).get(int(value), int(value))
    if entry.kind == "float":
        if not number or not math.isfinite(value):
            raise bad("a finite number")
        return float(value)
    if entry.kind in ("str_list", "list"):
        items = value if isinstance(value, list) else [value]
        if any(isinstance(item, list | dict) or item is None for item in items):
            raise bad("a string or a list of strings")
        return tuple(raw_item if isinstance(raw_item, str) else format_value(raw_item) for raw_item in items)
    if isinstance(value, list | dict):
        raise bad("a string")
    # A number where a name is expected (experiment_name=7) is the text the user wrote.
    text = value if isinstance(value, str) else raw.strip()
    return VALUE_SPELLINGS.get(entry.field, {}).get(text, text)


def render_str_list(value: tuple[str, ...]) -> Any:
    """verl spells one module/file as a string and several (or none) as a list."""
    return value[0] if len(value) == 1 else list(value)


def rendered_value(entry: VerlKey, value: Any) -> Any:
    """A plan value as the entry's key takes it (a tuple as verl's string-or-list, or as a list)."""
    if entry.kind == "str_list":
        return render_str_list(value)
    if entry.kind == "list":
        return list(value)
    return value
