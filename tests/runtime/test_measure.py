"""The CPU emulation of a training step: fake equals real, and the planner's prediction holds to it."""

from __future__ import annotations

import attrs
import pytest

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError
from rlplan.planner.presets import model_presets

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from rlplan.runtime.measure import (  # noqa: E402
    TrainingStep,
    measure_command,
    measure_training_step,
    training_step_of_plan,
)
from tests.planner.plans import make_plan  # noqa: E402

pytestmark = pytest.mark.runtime

TINY = Architecture(
    family="qwen2", hidden_size=128, num_layers=2, num_attention_heads=2, num_kv_heads=1, head_dim=64,
    intermediate_size=256, vocab_size=512, qkv_bias=True,
)


@pytest.mark.parametrize(
    "settings",
    [
        {"gradient_checkpointing": True},
        {"gradient_checkpointing": False, "calculate_entropy": True},
        {"lora_rank": 8, "lora_alpha": 16},
        {"phase": "logprob", "calculate_entropy": True},
    ],
    ids=["ac", "no-ac-entropy", "lora", "logprob"],
)
@pytest.mark.slow
def test_fake_measurement_equals_real_run_byte_for_byte(settings):
    _assert_fake_equals_real(TINY, settings)


TINY_MOE = Architecture(
    family="qwen3_moe", hidden_size=128, num_layers=2, num_attention_heads=2, num_kv_heads=1, head_dim=64,
    intermediate_size=256, vocab_size=512, qk_norm=True, num_experts=8, num_experts_per_token=2,
    moe_intermediate_size=64,
)


@pytest.mark.slow
def test_fake_measurement_of_an_moe_equals_its_real_run():
    # grouped_mm sizes its buffers by tokens x top-k, not by the (random) routing.
    _assert_fake_equals_real(TINY_MOE, {"gradient_checkpointing": True})


def _assert_fake_equals_real(arch, settings):
    fake = measure_training_step(arch, shard_size=2, tokens_per_micro_batch=128, **settings)
    real = measure_training_step(arch, shard_size=2, tokens_per_micro_batch=128, fake=False, **settings)
    assert fake.peak_bytes == real.peak_bytes
    assert fake.tracker_bytes == real.tracker_bytes
    assert fake.location == real.location


def test_breakdown_sums_to_the_peak_and_sharding_divides_the_state():
    two = measure_training_step(TINY, shard_size=2, tokens_per_micro_batch=64)
    four = measure_training_step(TINY, shard_size=4, tokens_per_micro_batch=64)
    assert sum(two.components.values()) == two.peak_bytes
    assert four.components["params"] * 2 == pytest.approx(two.components["params"], rel=0.02)


def test_gradient_accumulation_keeps_gradients_between_micro_batches():
    one = measure_training_step(TINY, shard_size=2, tokens_per_micro_batch=64, gradient_checkpointing=False)
    two = measure_training_step(TINY, shard_size=2, tokens_per_micro_batch=64, gradient_checkpointing=False,
                                micro_batches=2)
    assert two.peak_bytes > one.peak_bytes


def test_an_unverified_family_is_refused_with_the_supported_ones_named():
    gemma = attrs.evolve(TINY, family="gemma2")
    with pytest.raises(PlanError, match="cannot measure the 'gemma2' family"):
        TrainingStep(arch=gemma, shard_size=2, tokens_per_micro_batch=64)


def test_plan_step_takes_the_layouts_per_gpu_numbers():
    plan = make_plan(overrides={"actor.ppo_micro_batch_size_per_gpu": 2, "model.lora.rank": 16,
                                "actor.entropy_coeff": 0.01})
    step = training_step_of_plan(plan, "update")
    assert step.shard_size == 8
    assert step.tokens_per_micro_batch == 2 * 1536
    assert step.lora_rank == 16 and step.calculate_entropy
    assert step.micro_batches == 2
    assert training_step_of_plan(plan, "logprob").calculate_entropy


SMALL_QWEN = attrs.evolve(model_presets()["qwen2.5-0.5b"].arch, num_layers=4)


@pytest.mark.parametrize(
    "overrides",
    [
        {"actor.ppo_micro_batch_size_per_gpu": 1},
        {"actor.ppo_micro_batch_size_per_gpu": 1, "model.gradient_checkpointing": False},
    ],
    ids=["ac", "no-ac"],
)
@pytest.mark.slow
def test_planner_prediction_is_within_5_percent_of_the_measured_peak(overrides, tmp_path):
    """Measured the way users measure: `rlplan measure --json` in a fresh process.

    The tracker sees frees through weakref callbacks, so tensors in reference cycles are counted
    until Python's collector runs; deep in a long pytest session that timing differs from a fresh
    process (seen: -5.5 % vs -0.0 % for the same plan), so the comparison runs in its own process.
    """
    import json
    import subprocess
    import sys

    from rlplan.planner.planfile import plan_to_toml

    plan = make_plan(SMALL_QWEN, overrides={"actor.ppo_mini_batch_size": 2, **overrides})
    path = tmp_path / "plan.toml"
    path.write_text(plan_to_toml(plan))
    done = subprocess.run([sys.executable, "-m", "rlplan.planner.cli", "measure", str(path), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    comparison = json.loads(done.stdout)
    assert abs(comparison["error"]) <= 0.05, comparison


def test_measure_command_prints_json_and_rejects_a_missing_plan(tmp_path, capsys):
    from rlplan.planner.planfile import plan_to_toml

    path = tmp_path / "plan.toml"
    path.write_text(plan_to_toml(make_plan(attrs.evolve(SMALL_QWEN, num_layers=1))))
    assert measure_command(str(path), "logprob", json_output=True) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["planner_phase"] == "old_log_prob" and report["measured_bytes"] > 0
    assert measure_command(str(tmp_path / "missing.toml"), "update", json_output=False) == 2
