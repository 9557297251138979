"""The engine and version rules: what one rollout engine (vLLM, SGLang, TensorRT-LLM) or training backend (FSDP, Megatron)
reads of a plan and what it ignores, and keys a verl release no longer has.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from rlplan.planner.knobs import knob_value
from rlplan.planner.plan import ENGINE_TITLES, Plan, RolloutEngine
from rlplan.planner.rules.registry import RuleContext, Violation, passthrough_value, rule
from rlplan.planner.stack import (
    LORA_RANK_UNROUNDED,
    MEGATRON_GRAD_OFFLOAD_ABSENT,
    OVERRIDE_CONFIG_RECURSES,
    ROLLOUT_HF_MODEL_CONFIG,
    holds,
    in_range,
    vllm_lora_ranks,
)
from rlplan.planner.verl_keys import ROLLOUT_ENGINE_SINCE

# vLLM's MaxLoRARanks [V10]: the adapter rank is rounded up to one of these (vllm.config.lora
# LoraConfig.max_lora_rank; its import path moves between vLLM versions, so the set is kept here).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@rule("config", "[V10] vLLM serves LoRA ranks up to 512")
def _lora_rank_within_vllm_limit(ctx: RuleContext) -> Iterator[Violation]:
    rank = ctx.plan.model.lora.rank
    # verl checks it only for vLLM (verl/utils/config.py validate_config: get_vllm_max_lora_rank).
    if ctx.plan.rollout.name == "vllm" and rank > VLLM_LORA_RANKS[-1]:
        yield ctx.violation(
            f"model.lora.rank = {rank} exceeds vLLM's largest LoRA rank ({VLLM_LORA_RANKS[-1]}).",
            f"set model.lora.rank <= {VLLM_LORA_RANKS[-1]}", model__lora__rank=VLLM_LORA_RANKS[-1],
        )


@rule("runtime", "verl before 0.6.1 hands vLLM the LoRA rank itself: it must be a rank vLLM takes",
      applies=LORA_RANK_UNROUNDED)
def _lora_rank_is_one_vllm_takes(ctx: RuleContext) -> Iterator[Violation]:
    """vLLM's LoRAConfig refuses a max_lora_rank outside its set (ValueError at engine start); verl 0.4.0-0.6.0
    passes model.lora_rank as it is (stack.LORA_RANK_UNROUNDED), later releases round it up."""
    plan, rank = ctx.plan, ctx.plan.model.lora.rank
    ranks = vllm_lora_ranks(plan.stack)
    if plan.rollout.name == "vllm" and plan.model.lora.enabled and rank not in ranks:
        better = next((r for r in ranks if r >= rank), ranks[-1])
        yield ctx.violation(
            f"model.lora.rank = {rank} is not one of the ranks vLLM {plan.stack.version_of('vllm')} takes "
            f"({', '.join(map(str, ranks))}), and verl {plan.stack.verl} passes it unrounded as max_lora_rank.",
            f"set model.lora.rank = {better}", model__lora__rank=better,
        )


# verl's switch that merges LoRA adapters into the base weights before each sync.
LORA_MERGE_KEY = "actor_rollout_ref.model.lora.merge"


@rule("runtime",
      "[R9] SGLang receives full weights only: LoRA with SGLang needs model.lora.merge")
def _sglang_lora_needs_merged_adapter(ctx: RuleContext) -> Iterator[Violation]:
    """verl (b178a3cd) gives SGLang no LoRA arguments (sglang_rollout/async_sglang_server.py server args),
    and SGLangRollout.update_weights (sglang_rollout/sglang_rollout.py) loads every pushed tensor by name
    into the base model.  After the first sync verl pushes adapter tensors only
    (fsdp_workers.py rollout_mode: collect_lora_params with base_sync_done), unless model.lora.merge
    is set (engine_workers.py update_weights: `peft_merge` skips the adapter-only sync), so the
    adapter must be merged into the base weights before the sync.
    """
    yield from _unmerged_adapter(ctx, "sglang")


def _unmerged_adapter(ctx: RuleContext, engine: RolloutEngine) -> Iterator[Violation]:
    """A LoRA plan on `engine`, which verl starts without adapters, unless verl merges the adapter into the base
    weights before each sync (model.lora.merge)."""
    plan = ctx.plan
    merged = (plan.model.lora.merge if plan.model.lora.merge is not None
              else passthrough_value(plan, LORA_MERGE_KEY, "false").lower() == "true")
    if plan.rollout.name == engine and plan.model.lora.enabled and not merged:
        title = ENGINE_TITLES[engine]
        yield ctx.violation(
            f"model.lora.rank = {plan.model.lora.rank} with the {title} rollout: {title} serves no adapters, so "
            "after the first sync it would receive LoRA tensors it has no place for.",
            f"merge the adapter before each sync: add {LORA_MERGE_KEY}=true to the plan's passthrough "
            "(or use the vLLM rollout)",
        )


@rule("runtime",
      "[R9] TensorRT-LLM receives full weights only: LoRA with TensorRT-LLM needs model.lora.merge")
def _trtllm_lora_needs_merged_adapter(ctx: RuleContext) -> Iterator[Violation]:
    """verl gives TensorRT-LLM no LoRA arguments (trtllm_rollout/trtllm_async_server.py launch_server llm_kwargs,
    main 0.8.0.dev and v0.8.0) and ServerAdapter.update_weights (trtllm_rollout.py) hands every pushed tensor to
    the engine by name, so after the first sync's adapter-only push (as with SGLang above) the engine would get
    LoRA tensors its base model has no place for, unless model.lora.merge merges them first."""
    yield from _unmerged_adapter(ctx, "trtllm")


@rule("config", "verl builds the TensorRT-LLM rollout from 0.7.1")
def _trtllm_needs_verl_0_7_1(ctx: RuleContext) -> Iterator[Violation]:
    """verl before 0.7.1 has no trtllm_rollout/ and refuses rollout.name=trtllm (verl_keys.ROLLOUT_ENGINE_SINCE)."""
    plan, since = ctx.plan, ROLLOUT_ENGINE_SINCE["trtllm"]
    if plan.rollout.name == "trtllm" and since is not None and not in_range(plan.stack.verl, since, None):
        yield ctx.violation(
            f"rollout.name = trtllm, but verl {plan.stack.verl} has no TensorRT-LLM rollout (verl added it in "
            f"{since}).", f"target verl >= {since} (stack.verl / --verl-version), or set rollout.name = \"vllm\"",
            rollout__name="vllm",
        )


@rule("rlplan", "rollout.enforce_eager has no effect with TensorRT-LLM")
def _trtllm_ignores_enforce_eager(ctx: RuleContext) -> Iterator[Violation]:
    """verl always gives TensorRT-LLM a CudaGraphConfig (batch sizes up to max_num_seqs, or
    cudagraph_capture_sizes) for the rollout, whatever enforce_eager says (trtllm_async_server.py launch_server,
    main 0.8.0.dev, v0.8.0, v0.9.0): the graphs are captured and priced."""
    if ctx.plan.rollout.name == "trtllm" and ctx.plan.rollout.enforce_eager:
        yield ctx.violation(
            "rollout.enforce_eager = true, but verl does not pass it to TensorRT-LLM, which captures CUDA graphs "
            "up to max_num_seqs anyway.",
            "drop rollout.enforce_eager, or set cuda_graph_config under "
            "actor_rollout_ref.rollout.engine_kwargs.trtllm in the passthrough", severity="warning",
        )


# The vLLM engine keys verl does not pass to SGLang (sglang_rollout/async_sglang_server.py server args
# name mem_fraction_static, disable_cuda_graph, tp_size, dp_size, max_running_requests and no others of
# these), so SGLang runs its own defaults (chunked_prefill_size, radix cache) whatever the plan says.
SGLANG_IGNORED_ROLLOUT_KEYS = ("max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
                               "layered_summon")


@rule("rlplan", "[R9] vLLM-only rollout keys have no effect with SGLang")
def _sglang_ignores_vllm_keys(ctx: RuleContext) -> Iterator[Violation]:
    """verl's async_sglang_server.py builds SGLang's ServerArgs from gpu_memory_utilization
    (mem_fraction_static), enforce_eager (disable_cuda_graph), tensor/data parallel size and max_num_seqs
    (max_running_requests); chunked prefill, prefix caching and max_num_batched_tokens are vLLM arguments
    (vllm_rollout/vllm_async_server.py) that SGLang only gets through engine_kwargs.sglang.
    """
    rollout = ctx.plan.rollout
    if rollout.name != "sglang":
        return
    defaults = type(rollout)(n=rollout.n)
    changed = [key for key in SGLANG_IGNORED_ROLLOUT_KEYS if getattr(rollout, key) != getattr(defaults, key)]
    if changed:
        yield ctx.violation(
            f"rollout.{', rollout.'.join(changed)} {'is' if len(changed) == 1 else 'are'} vLLM engine arguments "
            "that verl does not pass to SGLang; SGLang runs its own defaults.",
            "set SGLang's own knobs (chunked_prefill_size, disable_radix_cache) under "
            "actor_rollout_ref.rollout.engine_kwargs.sglang in the passthrough, or drop these keys",
            severity="warning",
        )


# Where a verl script turns on SGLang's dp-attention and sets the rollout's data-parallel size.
SGLANG_DP_ATTENTION_KEY = "actor_rollout_ref.rollout.engine_kwargs.sglang.enable_dp_attention"


ROLLOUT_DP_KEY = "actor_rollout_ref.rollout.data_parallel_size"


@rule("rlplan",
      "[R9] SGLang drops dp-attention when verl's rollout data_parallel_size is 1")
def _sglang_dp_attention_needs_rollout_dp(ctx: RuleContext) -> Iterator[Violation]:
    """verl passes tp_size = tensor_model_parallel_size x data_parallel_size and dp_size =
    data_parallel_size (sglang_rollout/async_sglang_server.py), so SGLang's `tp_size % dp_size == 0`
    always holds; but SGLang's ServerArgs._handle_data_parallelism sets enable_dp_attention = False
    when dp_size == 1, silently.
    """
    wanted = passthrough_value(ctx.plan, SGLANG_DP_ATTENTION_KEY, "false").lower() == "true"
    dp_text = passthrough_value(ctx.plan, ROLLOUT_DP_KEY, "1")
    # A value rlplan cannot read (an interpolation) is not judged.
    dp = int(dp_text) if dp_text.isdigit() else None
    if ctx.plan.rollout.name == "sglang" and wanted and dp is not None and dp <= 1:
        yield ctx.violation(
            f"{SGLANG_DP_ATTENTION_KEY} is on, but the rollout's data_parallel_size is {dp}: SGLang turns "
            "dp-attention off when dp_size is 1.",
            f"set {ROLLOUT_DP_KEY} > 1 (SGLang then runs TP = tensor_model_parallel_size x data_parallel_size), "
            "or drop the key", severity="warning",
        )


@rule("rlplan",
      "an adapter-only LoRA sync (or layered summon) needs vLLM sleep level 1, which keeps the base weights")
def _adapter_sync_keeps_base_weights(ctx: RuleContext) -> Iterator[Violation]:
    rollout = ctx.plan.rollout
    keeps_base = ctx.plan.model.lora.enabled or rollout.layered_summon
    if rollout.name == "vllm" and keeps_base and rollout.free_cache_engine and rollout.sleep_level == 2:
        yield ctx.violation(
            "sleep level 2 discards vLLM's base weights, but with LoRA (or layered_summon) only adapters are pushed "
            "after the first sync; verl silently forces level 1, which keeps a host copy of the weights.",
            "set rollout.sleep_level = 1", rollout__sleep_level=1,
        )


@rule("rlplan",
      "LoRA and layered_summon expect vLLM to load the base itself (load_format = safetensors)")
def _lora_loads_base_from_disk(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.rollout.layered_summon and plan.rollout.load_format == "dummy":
        yield ctx.violation(
            "rollout.layered_summon gathers and pushes one layer at a time on top of a base vLLM loaded itself, "
            "but load_format = dummy gives vLLM random weights.",
            'set rollout.load_format = "safetensors"', rollout__load_format="safetensors",
        )
    elif plan.model.lora.enabled and plan.rollout.load_format == "dummy":
        yield ctx.violation(
            "with LoRA and load_format = dummy the first sync pushes the whole base model; verl's docs require "
            "safetensors.",
            'set rollout.load_format = "safetensors"', severity="warning", rollout__load_format="safetensors",
        )


@rule("config", "verl's Megatron engine has megatron.grad_offload only from 0.4.0 to 0.9.0",
      applies=MEGATRON_GRAD_OFFLOAD_ABSENT)
def _megatron_grad_offload_is_not_in_verl_0_9(ctx: RuleContext) -> Iterator[Violation]:
    """verl 0.9.1 verl/workers/config/engine.py McoreEngineConfig has no grad_offload field (0.5.0-0.9.0 have it,
    and 0.4.x's ppo_megatron_trainer.yaml): hydra refuses the override, and added with `+` the dataclass raises
    TypeError. verl 0.3.0.post1's YAML has no actor.megatron.grad_offload either."""
    for role in ("actor", "critic"):
        engine = getattr(ctx.plan, role).megatron
        if ctx.plan.is_megatron and engine is not None and engine.grad_offload is not None:
            yield ctx.violation(f"{role}.megatron.grad_offload is set, a key verl {ctx.plan.stack.verl}'s Megatron "
                                "engine does not have (verl 0.4.0-0.9.0 do): hydra refuses the override.",
                                f"unset {role}.megatron.grad_offload",
                                **{f"{role}__megatron__grad_offload": None})


# peft's LoRA keys (FSDP) and Megatron-Bridge's (model.lora.*): each backend reads only its own.
PEFT_LORA_KEYS = tuple(f"actor_rollout_ref.model.{name}" for name in (
    "lora_rank", "lora_alpha", "target_modules", "exclude_modules", "lora_adapter_path"))


BRIDGE_LORA_KEYS = tuple(f"actor_rollout_ref.model.lora.{name}" for name in (
    "rank", "alpha", "target_modules", "exclude_modules", "type", "adapter_path"))


@rule("rlplan", "LoRA keys of the other backend are ignored (peft's model.lora_* vs Megatron-Bridge's model.lora.*)")
def _lora_keys_the_backend_ignores(ctx: RuleContext) -> Iterator[Violation]:
    """verl's Megatron workers build Megatron-Bridge's LoRA from model.lora.* (verl/workers/config/
    megatron_peft.py) and never read peft's model.lora_rank / lora_alpha; the FSDP workers build peft from
    model.lora_rank and read only model.lora.merge of the other namespace."""
    plan = ctx.plan
    ignored = PEFT_LORA_KEYS if plan.is_megatron else BRIDGE_LORA_KEYS
    found = [key for key in ignored if passthrough_value(plan, key, "") != ""]
    if found:
        own = "model.lora.rank / alpha / target_modules" if plan.is_megatron else "model.lora_rank / lora_alpha"
        yield ctx.violation(
            f"{', '.join(found)} {'is' if len(found) == 1 else 'are'} ignored by verl's "
            f"{'Megatron' if plan.is_megatron else 'FSDP'} workers, which read LoRA from {own}.",
            f"set the plan's model.lora fields instead and remove {found[0]} from the passthrough",
            severity="warning")


# FSDP plan fields verl's Megatron workers never read, with the value that means "unused".
FSDP_ONLY_FIELDS: dict[str, Any] = {
    "actor.param_offload": False, "actor.optimizer_offload": False, "actor.offload_policy": False,
    "actor.fsdp_size": -1, "actor.ulysses_sequence_parallel_size": 1, "ref.param_offload": False,
    "critic.param_offload": False, "critic.optimizer_offload": False, "critic.offload_policy": False,
    "critic.ulysses_sequence_parallel_size": 1, "rollout.layered_summon": False,
}


@rule("rlplan", "FSDP-only knobs on a Megatron plan do nothing")
def _fsdp_knobs_on_a_megatron_plan(ctx: RuleContext) -> Iterator[Violation]:
    """ppo_megatron_trainer.yaml has no fsdp_config, ulysses or layered-summon keys (a render leaves them out):
    offload and sequence splitting are Megatron's own knobs there (<role>.megatron.*)."""
    plan = ctx.plan
    if not plan.is_megatron:
        return
    set_fields = {name: unused for name, unused in FSDP_ONLY_FIELDS.items() if knob_value(plan, name) != unused}
    if set_fields:
        yield ctx.violation(
            f"{', '.join(set_fields)} {'is an FSDP knob' if len(set_fields) == 1 else 'are FSDP knobs'} that verl's "
            "Megatron workers never read.",
            "use the Megatron equivalents (actor.megatron.param_offload / optimizer_offload, context_parallel_size)",
            severity="warning", **{name.replace(".", "__"): unused for name, unused in set_fields.items()})


@rule("rlplan", "Megatron-Bridge LoRA targets Megatron's module names, not peft's")
def _megatron_lora_targets_megatron_modules(ctx: RuleContext) -> Iterator[Violation]:
    """Megatron-Bridge matches target_modules against Megatron module names (linear_qkv, linear_proj,
    linear_fc1, linear_fc2; the MLA projections for DeepSeek); peft's "all-linear" or q_proj names match
    nothing, leaving no adapter to train."""
    plan = ctx.plan
    lora = plan.model.lora
    if plan.is_megatron and lora.enabled and any(name == "all-linear" or name.endswith("_proj") and
                                                 not name.startswith("linear_") for name in lora.target_modules):
        mla = plan.model.arch.is_mla
        names = (["linear_kv_down_proj", "linear_kv_up_proj", "linear_q_down_proj", "linear_q_up_proj",
                  "linear_proj", "linear_fc1", "linear_fc2"] if mla
                 else ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"])
        yield ctx.violation(f"model.lora.target_modules = {list(lora.target_modules)} are peft's names; "
                            "Megatron-Bridge matches Megatron's module names.",
                            f"set model.lora.target_modules = {names}", model__lora__target_modules=tuple(names))


_OVERRIDE_CONFIG = re.compile(r"^[+~]*(actor_rollout_ref|critic)\.model\.override_config\.(.+)$")


def _override_config_failure(plan: Plan, owner: str, path: list[str], nested_set: bool) -> str:
    """Why update_model_config raises on override_config's `path` for the plan's backend and release ("" where it
    does not): the trainer's HF config takes override_config's own keys under FSDP and only model_config's under
    Megatron; from v0.6.0 the rollout's HFModelConfig takes model_config's where set, else the whole dict
    (stack.ROLLOUT_HF_MODEL_CONFIG)."""
    applied = [path]  # as FSDP's trainer applies it
    if plan.is_megatron:
        applied = [path[1:]] if path[0] == "model_config" else []
    if owner == "actor_rollout_ref" and holds(ROLLOUT_HF_MODEL_CONFIG, plan.stack):
        applied.append(path[1:] if nested_set and path[0] == "model_config" else [] if nested_set else path)
    for keys in applied:
        if len(keys) > 1 and keys[0] == "rope_scaling":
            return ("getattr(hf_config, 'rope_scaling') is a dict (or None where config.json has none), and setattr "
                    f"of {keys[1]} on it raises AttributeError")
        if len(keys) > 1 and keys[0] == "model_config":
            return ("the HF config has no attribute model_config (that spelling is the Megatron worker's), so "
                    "getattr raises AttributeError")
    return ""


@rule("worker", "a nested override_config key verl applies by setattr on a dict or a missing attribute fails",
      applies=OVERRIDE_CONFIG_RECURSES)
def _override_config_key_is_settable(ctx: RuleContext) -> Iterator[Violation]:
    """verl/utils/model.py update_model_config (stack.OVERRIDE_CONFIG_RECURSES) walks a nested override with
    getattr on the HF config and setattr on what it finds: `override_config.rope_scaling.factor` sets an attribute
    of a dict (or of None), and `override_config.model_config.*` under FSDP looks up an attribute the HF config
    lacks; either raises AttributeError while the worker builds the model (fsdp_workers.py
    _build_model_optimizer; megatron_workers.py _init_hf_config_and_tf_config; HFModelConfig.__post_init__)."""
    plan = ctx.plan
    # A dict value (`override_config.rope_scaling={type:yarn,factor:4}`) recurses alike: its keys are one level down.
    found = [(match.group(1), match.group(2).split(".") + (["{...}"] if value.strip("'\" ").startswith("{") else []),
              key) for key, value in plan.passthrough.items() if (match := _OVERRIDE_CONFIG.match(key))]
    nested_set = any(owner == "actor_rollout_ref" and path[0] == "model_config" for owner, path, _ in found)
    for owner, path, key in found:
        why = _override_config_failure(plan, owner, path, nested_set)
        if why:
            flat = f"{owner}.model.override_config.{'.'.join(path[1:])}"
            fix = (f"spell it +{flat}" if path[0] == "model_config" and not plan.is_megatron and
                   path[1] != "rope_scaling" else "edit rope_scaling in the model's config.json (a copy of the model "
                   f"folder) and drop {key.lstrip('+~')}")
            yield ctx.violation(
                f"{key.lstrip('+~')}: verl {plan.stack.verl} applies override_config with update_model_config "
                f"(verl/utils/model.py), where {why} while the worker builds the model, so the script fails at "
                "start.", fix)
