"""The engine and version rules (planner/rules/engines.py): what one rollout engine or training backend reads of
a plan, and keys a verl release no longer has."""

from __future__ import annotations

import pytest

from rlplan.planner.rules import check_plan
from tests.planner.plans import make_plan
from tests.planner.rules.megatron_plans import fixed, megatron_plan, rules_of


def test_lora_with_sleep_level_2_names_the_fix():
    plan = make_plan(overrides={"model.lora.rank": 32, "rollout.sleep_level": 2, "rollout.load_format": "safetensors"})
    violation = next(v for v in check_plan(plan).errors if v.rule == "adapter_sync_keeps_base_weights")
    assert violation.suggested == {"rollout.sleep_level": 1}


def test_grad_offload_is_refused_for_verl_0_9_and_unsetting_it_clears_it():
    plan = megatron_plan(actor__megatron__grad_offload=True)
    assert "megatron_grad_offload_is_not_in_verl_0_9" in rules_of(plan)
    assert "megatron_grad_offload_is_not_in_verl_0_9" not in rules_of(
        fixed(plan, "megatron_grad_offload_is_not_in_verl_0_9"))


@pytest.mark.parametrize(("strategy", "key"), [("megatron", "actor_rollout_ref.model.lora_rank"),
                                               ("fsdp2", "actor_rollout_ref.model.lora.rank")])
def test_the_other_backends_lora_keys_are_a_warning_that_verl_ignores_them(strategy, key):
    plan = make_plan(overrides={"actor.strategy": strategy}).evolve(passthrough={key: "32"})
    assert "lora_keys_the_backend_ignores" in rules_of(plan)
    assert "lora_keys_the_backend_ignores" not in rules_of(plan.evolve(passthrough={}))


def test_fsdp_knobs_on_a_megatron_plan_warn_and_the_fix_resets_them():
    plan = megatron_plan(actor__param_offload=True, actor__ulysses_sequence_parallel_size=2)
    assert "fsdp_knobs_on_a_megatron_plan" in rules_of(plan)
    assert "fsdp_knobs_on_a_megatron_plan" not in rules_of(fixed(plan, "fsdp_knobs_on_a_megatron_plan"))


def test_megatron_lora_with_peft_module_names_names_megatrons():
    plan = megatron_plan(model__lora__rank=16)  # target_modules stays peft's "all-linear"
    assert "megatron_lora_targets_megatron_modules" in rules_of(plan)
    repaired = fixed(plan, "megatron_lora_targets_megatron_modules")
    assert repaired.model.lora.target_modules == ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
    assert "megatron_lora_targets_megatron_modules" not in rules_of(repaired)


def _trtllm(**overrides):
    return make_plan(overrides={"rollout.name": "trtllm", "stack.verl": "0.8.0", **overrides})


def test_lora_with_trtllm_needs_the_adapter_merged_and_merging_clears_it():
    """verl starts TensorRT-LLM without adapters (trtllm_async_server.py), as it does SGLang."""
    lora = _trtllm(**{"model.lora.rank": 32, "rollout.load_format": "safetensors"})
    assert "trtllm_lora_needs_merged_adapter" in {v.rule for v in check_plan(lora).errors}
    merged = lora.evolve(passthrough={"actor_rollout_ref.model.lora.merge": "true"})
    assert "trtllm_lora_needs_merged_adapter" not in rules_of(merged)
    assert "trtllm_lora_needs_merged_adapter" not in rules_of(
        make_plan(overrides={"model.lora.rank": 32, "rollout.load_format": "safetensors"}))


@pytest.mark.parametrize(("verl", "refused"), [("0.7.0", True), ("0.7.1", False), ("0.9.1", False)])
def test_trtllm_is_refused_on_a_verl_before_0_7_1_and_the_fix_is_vllm(verl, refused):
    plan = _trtllm(**{"stack.verl": verl})
    assert ("trtllm_needs_verl_0_7_1" in {v.rule for v in check_plan(plan).errors}) == refused
    if refused:
        assert "trtllm_needs_verl_0_7_1" not in rules_of(fixed(plan, "trtllm_needs_verl_0_7_1"))


def test_enforce_eager_with_trtllm_is_a_warning_that_verl_ignores_it():
    eager = _trtllm(**{"rollout.enforce_eager": True})
    assert "trtllm_ignores_enforce_eager" in {v.rule for v in check_plan(eager).warnings}
    assert "trtllm_ignores_enforce_eager" not in rules_of(_trtllm())
    assert "trtllm_ignores_enforce_eager" not in rules_of(make_plan(overrides={"rollout.enforce_eager": True}))


_OVERRIDE = "+actor_rollout_ref.model.override_config."


def _with_override(plan, verl: str, *keys: str):
    from rlplan.planner.stack import StackSection

    written = dict(key.split("=", 1) if "=" in key else (key, "4") for key in keys)
    return plan.evolve(stack=StackSection(verl=verl), passthrough={_OVERRIDE + k: v for k, v in written.items()})


@pytest.mark.parametrize(("strategy", "verl", "keys", "fails"), [
    # update_model_config setattr's on getattr(hf_config, "rope_scaling"): a dict, or None.
    ("fsdp", "0.4.1", ("rope_scaling.factor",), True),
    ("fsdp", "0.5.0", ("rope_scaling={type:yarn,factor:4}",), True),  # a whole dict recurses alike
    ("fsdp", "0.7.0", ("rope_scaling.factor",), True),
    ("fsdp", "0.3.0.post1", ("rope_scaling.factor",), False),  # sets override_config's keys whole
    ("megatron", "0.5.0", ("model_config.rope_scaling.factor",), True),
    ("megatron", "0.5.0", ("rope_scaling.factor",), False),    # Megatron before v0.6.0 applies model_config.* only
    ("megatron", "0.6.1", ("rope_scaling.factor",), True),     # the rollout's HFModelConfig takes the whole dict
    ("megatron", "0.6.1", ("model_config.max_position_embeddings", "rope_scaling.factor"), False),
    # FSDP's trainer looks model_config up on the HF config, which has no such attribute.
    ("fsdp", "0.5.0", ("model_config.max_position_embeddings",), True),
    ("fsdp", "0.9.1", ("model_config.max_position_embeddings",), True),
    ("fsdp", "0.9.1", ("max_position_embeddings", "attention_dropout"), False),
])
def test_a_nested_override_config_key_verl_cannot_set_fails_at_start(strategy, verl, keys, fails):
    base = megatron_plan() if strategy == "megatron" else make_plan()
    plan = _with_override(base, verl, *keys)
    errors = [v for v in check_plan(plan).errors if v.rule == "override_config_key_is_settable"]
    assert bool(errors) is fails
    if errors and "model_config" in keys[0] and strategy == "fsdp":
        assert "+actor_rollout_ref.model.override_config.max_position_embeddings" in errors[0].fix
