"""The memory rules (planner/rules/memory.py): the loss head a plan runs, FSDP2's offload policy, the lengths
the rollout engine is sized for and admits, and the response lengths the predictions assume."""

from __future__ import annotations

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.rules import check_plan
from tests.planner.plans import make_plan


def test_ignore_eos_with_a_shorter_expected_response_is_an_error_and_unsetting_it_clears_it():
    plan = make_plan(overrides={"rollout.ignore_eos": True, "data.expected_response_length": 256})
    violation = next(v for v in check_plan(plan).errors if v.rule == "ignore_eos_fills_every_response")
    assert "1024 tokens" in violation.message
    fixed = apply_knobs(plan, violation.suggested)
    assert fixed.data.expected_response_length is None
    assert "ignore_eos_fills_every_response" not in {v.rule for v in check_plan(fixed).violations}
    # Without ignore_eos a mean below the maximum is what the data says, not a contradiction.
    assert "ignore_eos_fills_every_response" not in {
        v.rule for v in check_plan(make_plan(overrides={"data.expected_response_length": 256})).violations}


def test_vllm_scheduler_rules():
    plan = make_plan(overrides={"rollout.max_num_batched_tokens": 128, "rollout.max_num_seqs": 256,
                                "rollout.enable_chunked_prefill": False, "stack.verl": "0.9.0"})
    messages = [v.message for v in check_plan(plan).errors if v.rule == "batched_tokens_cover_sequences"]
    assert len(messages) == 2
    # verl 0.9.1 raises max_num_batched_tokens to max_model_len itself: said, not refused.
    raised = check_plan(apply_knobs(plan, {"stack.verl": "0.9.1"}))
    assert [v.severity for v in raised.violations if v.rule == "batched_tokens_cover_sequences"] == ["error",
                                                                                                      "warning"]


def test_a_pinned_loss_head_the_config_does_not_run_is_a_warning_naming_the_fix():
    assert not [v for v in check_plan(make_plan()).warnings if v.rule == "loss_head_is_what_the_runtime_runs"]
    report = check_plan(make_plan(overrides={"actor.loss_head": "fused"}))
    warnings = [v for v in report.warnings if v.rule == "loss_head_is_what_the_runtime_runs"]
    assert report.valid and len(warnings) == 1 and "use_fused_kernels" in warnings[0].fix
    # Pinning the head the GPU config runs anyway is no warning.
    pinned = check_plan(make_plan(overrides={"actor.loss_head": "flash_attn_ce"}))
    assert all(v.rule != "loss_head_is_what_the_runtime_runs" for v in pinned.warnings)


def test_offload_policy_on_fsdp1_is_an_error_and_beside_phase_offloads_a_warning():
    fsdp1 = check_plan(make_plan(overrides={"actor.strategy": "fsdp", "actor.offload_policy": True}))
    [violation] = [v for v in fsdp1.violations if v.rule == "offload_policy_needs_fsdp2"]
    assert violation.severity == "error" and violation.suggested == {"actor.strategy": "fsdp2"}
    both = check_plan(make_plan(overrides={"actor.offload_policy": True, "actor.param_offload": True}))
    [warning] = [v for v in both.violations if v.rule == "offload_policy_supersedes_offloads"]
    assert warning.severity == "warning" and warning.suggested["actor.param_offload"] is False
    assert not [v for v in check_plan(make_plan(overrides={"actor.offload_policy": True})).violations
                if v.rule.startswith("offload_policy")]
