"""verl's own Megatron example scripts import, render and import back to the same plan, key for key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlplan.planner.planfile import plan_to_dict
from rlplan.planner.presets import resolve_gpu
from rlplan.planner.render import plan_as_verl_runs_it, render_plan
from rlplan.planner.rules import check_plan
from rlplan.planner.shell_lexer import shell_commands
from rlplan.planner.verl_import import Override, import_verl_script
from tests.planner.plans import without_inferred_range

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "verl_scripts"
H100 = resolve_gpu("h100-80g")

# file -> --env pins (the MoE script reads its test set from a variable it never sets).
MEGATRON_SCRIPTS = {
    "megatron_dense_qwen2_7b.sh": {"HOME": "/home/u"},
    "megatron_dense_lora_qwen2_7b.sh": {"HOME": "/home/u"},
    "megatron_moe_qwen3_30b_a3b.sh": {"HOME": "/home/u", "TEST_FILE": "/data/aime-2024.parquet"},
    "megatron_moe_lora_qwen3_30b_a3b.sh": {"HOME": "/home/u"},
}


def load(text: str, env: dict[str, str] | None = None):
    return import_verl_script(text, gpu=H100, host_memory_gib=2048.0, env=env or {},
                              local_config_reader=lambda path: None, environment={})


@pytest.mark.parametrize("name", sorted(MEGATRON_SCRIPTS))
def test_verls_megatron_examples_import_as_megatron_plans_and_render_back_to_the_same_plan(name):
    result = load((SCRIPTS / name).read_text(), MEGATRON_SCRIPTS[name])
    plan = result.plan
    assert plan.is_megatron and plan.actor.megatron is not None
    rendered = render_plan(plan, "verl")
    assert "--config-name=ppo_megatron_trainer" in rendered
    back = load(rendered)
    # The range of releases a script's keys allow (stack.verl_oldest) is what the import inferred, not part of the
    # plan: the render writes the keys of the plan's verl, whose range starts elsewhere.
    assert plan_to_dict(without_inferred_range(back.plan)) == plan_to_dict(without_inferred_range(plan_as_verl_runs_it(plan)))
    assert back.plan.passthrough == plan.passthrough


@pytest.mark.parametrize("name", sorted(MEGATRON_SCRIPTS))
def test_every_key_a_megatron_example_sets_is_in_its_render_with_the_value_verl_reads(name):
    original = load((SCRIPTS / name).read_text(), MEGATRON_SCRIPTS[name])
    rendered = render_plan(original.plan, "verl")
    written = {Override.parse(word.strip("'")).key for command in shell_commands(rendered) for word in command
               if "=" in word and not word.startswith("--")}
    text = (SCRIPTS / name).read_text()
    overrides = [Override.parse(argument) for argument in _script_overrides(text, MEGATRON_SCRIPTS[name])]
    # A key set to null is verl's default for the optional keys a render leaves out (virtual pipeline size).
    lost = {override.key for override in overrides if override.key not in written and override.value != "null"}
    assert lost == set()


def _script_overrides(text: str, env: dict[str, str]) -> list[str]:
    from rlplan.planner.verl_import import ScriptContext, _command_from_script

    found = _command_from_script(text, env, {}, ScriptContext(), [])
    assert found is not None
    return list(found.overrides)


def test_the_moe_example_reads_tp_pp_cp_ep_etp_offload_and_recompute_for_actor_and_reference():
    plan = load((SCRIPTS / "megatron_moe_lora_qwen3_30b_a3b.sh").read_text(), {"HOME": "/h"}).plan
    actor, ref = plan.actor.mcore, plan.ref.megatron
    assert (actor.tensor_model_parallel_size, actor.pipeline_model_parallel_size, actor.context_parallel_size,
            actor.expert_model_parallel_size, actor.expert_tensor_size) == (2, 2, 2, 4, 1)
    assert actor.param_offload and actor.grad_offload and actor.optimizer_offload
    assert (actor.recompute_granularity, actor.recompute_method, actor.recompute_num_layers) == ("full", "uniform", 1)
    assert ref is not None and ref.expert_model_parallel_size == 4 and ref.param_offload
    # Megatron-Bridge's LoRA namespace, with its defaults where the script is silent.
    lora = plan.model.lora
    assert (lora.rank, lora.alpha, lora.type, lora.merge) == (32, 64, "lora", False)
    assert lora.target_modules == ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def test_the_dense_lora_example_reads_megatron_bridges_lora_and_tp_4_for_actor_and_reference():
    plan = load((SCRIPTS / "megatron_dense_lora_qwen2_7b.sh").read_text(), {"HOME": "/h"}).plan
    assert (plan.model.lora.rank, plan.model.lora.alpha) == (16, 32)
    # verl's Megatron LoRA default targets, Megatron's module names (not peft's all-linear).
    assert set(plan.model.lora.target_modules) == {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}
    assert plan.actor.mcore.tensor_model_parallel_size == 4 and plan.actor.mcore.pipeline_model_parallel_size == 1
    assert plan.ref.megatron is not None and plan.ref.megatron.tensor_model_parallel_size == 4
    report = check_plan(plan)
    assert report.valid and not [v for v in report.violations if v.rule.startswith("megatron_")]


def test_the_reference_follows_the_actors_parallel_sizes_where_the_script_leaves_them_unset():
    text = ("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer.yaml "
            "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 "
            "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2\n")
    plan = load(text).plan
    assert plan.ref.megatron is not None
    assert plan.ref.megatron.tensor_model_parallel_size == 4
    assert plan.ref.megatron.virtual_pipeline_model_parallel_size == 2


def test_strategy_megatron_in_an_overrides_file_makes_a_megatron_plan_and_fsdp_keys_stay_passthrough():
    text = ("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\nactor_rollout_ref.actor.strategy=megatron\n"
            "actor_rollout_ref.model.lora_rank=16\nactor_rollout_ref.actor.fsdp_config.param_offload=true\n")
    result = load(text)
    assert result.plan.is_megatron
    assert result.plan.model.lora.rank == 0  # peft's key: verl's Megatron workers never read it
    assert result.plan.passthrough["actor_rollout_ref.model.lora_rank"] == "16"
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" in result.plan.passthrough
    assert any("only on an FSDP plan" in warning for warning in result.warnings)


def test_an_fsdp_plan_renders_no_megatron_key_and_a_megatron_plan_no_fsdp_config_key():
    fsdp = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n").plan
    assert fsdp.actor.megatron is None and "megatron" not in render_plan(fsdp, "verl")
    megatron = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n"
                    "actor_rollout_ref.actor.strategy=megatron\n").plan
    rendered = render_plan(megatron, "verl")
    assert "fsdp_config" not in rendered and "lora_rank" not in rendered and "ulysses" not in rendered
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1" in rendered
    assert "actor_rollout_ref.actor.megatron.seed=" in rendered  # the plan's seed, under Megatron's key


def test_a_bash_array_of_overrides_expands_element_by_element():
    text = ("ARGS=(\n  actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n  # a comment\n"
            "  data.train_batch_size=64\n)\npython3 -m verl.trainer.main_ppo \"${ARGS[@]}\" trainer.nnodes=1\n")
    plan = load(text).plan
    assert plan.data.train_batch_size == 64 and plan.model.path == "Qwen/Qwen2.5-7B-Instruct"


_LONG_RUN = ("actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B\nactor_rollout_ref.rollout.name=vllm\n"
             "data.max_prompt_length=2048\ndata.max_response_length=8192\n")
_FLAT = "actor_rollout_ref.model.override_config.max_position_embeddings"
_NESTED = "actor_rollout_ref.model.override_config.model_config.max_position_embeddings"


def _load_on(verl: str, backend: str, spelling: str):
    config = "actor_rollout_ref.actor.strategy=megatron\n" if backend == "megatron" else ""
    return import_verl_script(config + _LONG_RUN + f"+{spelling}=32768\n", gpu=H100, host_memory_gib=2048.0,
                              env={}, local_config_reader=lambda path: None, environment={},
                              versions=(verl, None, None))


@pytest.mark.parametrize(("verl", "backend", "spelling", "applied"), [
    # Before v0.6.0 the rollout takes the trainer's HF config: Megatron's applies only override_config.model_config.*
    ("0.4.1", "megatron", _FLAT, False), ("0.5.0", "megatron", _FLAT, False), ("0.5.0", "megatron", _NESTED, True),
    ("0.5.0", "fsdp", _FLAT, True), ("0.5.0", "fsdp", _NESTED, False),
    # From v0.6.0 the rollout's HFModelConfig takes model_config.* where set, else override_config.*: either.
    ("0.6.1", "megatron", _FLAT, True), ("0.7.0", "megatron", _NESTED, True), ("0.6.1", "fsdp", _NESTED, True),
])
def test_the_positions_override_applies_only_in_the_spelling_the_releases_backend_reads(verl, backend, spelling,
                                                                                        applied):
    result = _load_on(verl, backend, spelling)
    assert result.plan.is_megatron is (backend == "megatron") and result.plan.stack.verl == verl
    assert result.plan.model.arch.max_position_embeddings == (32768 if applied else 4096)
    ignored = [w for w in result.warnings if w.startswith(f"{spelling} is ignored")]
    assert bool(ignored) is not applied
    if ignored:
        assert (_NESTED if spelling == _FLAT else _FLAT) in ignored[0]
        # 2k + 8k on the stock 4096 positions: the run fails at start, where the flat spelling read as "fits".
        assert any(v.rule == "max_model_len_within_model" for v in check_plan(result.plan).errors)
