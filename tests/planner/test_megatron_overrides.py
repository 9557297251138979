"""The uneven pipeline and the CPU optimizer: typed engine fields, read once from verl's dict-valued keys at the
edge (import, an older plan file) and written back by render."""

from __future__ import annotations

import json

import attrs
import pytest

from rlplan.planner.errors import PlanError
from rlplan.planner.megatron_overrides import lift_megatron_overrides, megatron_override_keys
from rlplan.planner.memory.megatron import cpu_optimizer_fraction
from rlplan.planner.plan import MegatronSection
from rlplan.planner.planfile import plan_from_toml, plan_to_toml
from rlplan.planner.render import verl_overrides
from tests.planner.cli_runner import invoke
from tests.planner.plans import make_plan

STAGE = "actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_"
OPTIM = "actor_rollout_ref.actor.optim.override_optimizer_config."
CRITIC_OPTIM = "critic.optim.override_optimizer_config."


def megatron(**passthrough: str):
    return make_plan(overrides={"actor.strategy": "megatron", "model.path": "Qwen/Qwen2.5-7B-Instruct"}
                     ).evolve(passthrough=passthrough)


def test_the_keys_leave_the_passthrough_for_the_roles_typed_fields():
    plan = lift_megatron_overrides(megatron(**{
        f"+{STAGE}first_pipeline_stage": "4", f"+{STAGE}last_pipeline_stage": "'1'",
        f"+{OPTIM}optimizer_cpu_offload": "True", f"++{OPTIM}optimizer_offload_fraction": "1.",
        f"+{CRITIC_OPTIM}optimizer_cpu_offload": "false", "+trainer.other": "x"}))
    engine = plan.actor.mcore
    assert (engine.num_layers_in_first_pipeline_stage, engine.num_layers_in_last_pipeline_stage) == (4, 1)
    assert (engine.optimizer_cpu_offload, engine.optimizer_offload_fraction) == (True, 1.0)
    assert plan.engine("critic").optimizer_cpu_offload is False
    assert plan.passthrough == {"+trainer.other": "x"}
    # verl's reference follows the actor's override_transformer_config.
    assert plan.engine("ref").num_layers_in_first_pipeline_stage == 4
    assert cpu_optimizer_fraction(plan, "actor") == 1.0 and cpu_optimizer_fraction(plan, "critic") == 0.0


def test_render_writes_the_same_verl_keys_back_with_double_plus():
    plan = lift_megatron_overrides(megatron(**{
        f"+{STAGE}first_pipeline_stage": "4", f"+{OPTIM}optimizer_cpu_offload": "True",
        f"+{OPTIM}optimizer_offload_fraction": "0.5"}))
    rendered = verl_overrides(plan)
    assert f"++{STAGE}first_pipeline_stage=4" in rendered
    assert f"++{OPTIM}optimizer_cpu_offload=True" in rendered
    assert f"++{OPTIM}optimizer_offload_fraction=0.5" in rendered
    assert not any("last_pipeline_stage" in line for line in rendered)
    # Rendered and imported back, the same plan.
    assert lift_megatron_overrides(megatron(**dict(line.split("=", 1) for line in megatron_override_keys(plan)))
                                   ).actor == plan.actor


def test_an_older_plan_file_with_the_keys_as_passthrough_reads_into_the_fields():
    text = plan_to_toml(megatron(**{f"+{OPTIM}optimizer_cpu_offload": "True",
                                    f"+{OPTIM}optimizer_offload_fraction": "0.25"}))
    plan = plan_from_toml(text)
    assert plan.actor.mcore.cpu_optimizer_fraction == 0.25 and not plan.passthrough
    assert plan_from_toml(plan_to_toml(plan)) == plan


def test_an_fsdp_plan_keeps_them_as_passthrough():
    plan = make_plan().evolve(passthrough={f"+{OPTIM}optimizer_cpu_offload": "True"})
    assert lift_megatron_overrides(plan) == plan
    assert megatron_override_keys(plan) == []


@pytest.mark.parametrize(("key", "value", "said"), [
    (f"+{OPTIM}optimizer_offload_fraction", "nan", "between 0 and 1"),
    (f"+{OPTIM}optimizer_offload_fraction", "1.5", "between 0 and 1"),
    (f"+{OPTIM}optimizer_offload_fraction", "-0.1", "between 0 and 1"),
    (f"+{OPTIM}optimizer_offload_fraction", "half", "not a number"),
    (f"+{OPTIM}optimizer_cpu_offload", "maybe", "not true or false"),
    (f"+{STAGE}first_pipeline_stage", "0", ">= 1"),
    (f"+{STAGE}last_pipeline_stage", "2.5", "not a whole number"),
])
def test_a_bad_value_is_one_plan_error_naming_the_key_and_the_fix(key, value, said):
    with pytest.raises(PlanError) as error:
        lift_megatron_overrides(megatron(**{key: value}))
    assert error.value.field == key.lstrip("+") and said in error.value.message and error.value.fix


def test_a_fraction_out_of_range_or_nan_is_refused_on_the_field_itself():
    for fraction in (float("nan"), 1.01, -1.0, float("inf")):
        with pytest.raises(PlanError, match="optimizer_offload_fraction"):
            MegatronSection(optimizer_cpu_offload=True, optimizer_offload_fraction=fraction)
    assert MegatronSection(optimizer_cpu_offload=True).cpu_optimizer_fraction == 1.0
    assert MegatronSection(optimizer_offload_fraction=0.5).cpu_optimizer_fraction == 0.0


def test_a_placed_pipelines_most_loaded_stage_is_its_largest_stage():
    engine = MegatronSection(pipeline_model_parallel_size=16, num_layers_in_first_pipeline_stage=3,
                             num_layers_in_last_pipeline_stage=2)
    assert engine.most_loaded_stage_layers(61) == 4  # 3 + 14 x 4 + 2
    heavy_end = attrs.evolve(engine, num_layers_in_first_pipeline_stage=7, num_layers_in_last_pipeline_stage=None)
    assert heavy_end.most_loaded_stage_layers(61) == 7  # 7 + 15 x 3.6: the first stage sets the pace
    assert MegatronSection(pipeline_model_parallel_size=16).most_loaded_stage_layers(61) == 4


@pytest.mark.parametrize("fraction", ["nan", "1.5", "x"])
def test_import_of_a_script_with_a_bad_offload_fraction_exits_2_with_one_paragraph(tmp_path, fraction):
    script = tmp_path / "run.sh"
    script.write_text(
        "OFFLOAD_FRACTION=${OFFLOAD_FRACTION:-1.}\n"
        "python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer.yaml \\\n"
        "    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct actor_rollout_ref.actor.strategy=megatron \\\n"
        f"    +{OPTIM}optimizer_cpu_offload=True +{OPTIM}optimizer_offload_fraction=$OFFLOAD_FRACTION\n")
    args = ["import", "verl", str(script), "--gpu", "h100-80g", "--env", f"OFFLOAD_FRACTION={fraction}",
            "-o", str(tmp_path / "plan.toml")]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    text = "".join(result.output.split())  # the terminal wraps inside the long key
    assert "optimizer_offload_fraction" in text and "Fix:" in text and result.output.count("Fix:") == 1
    as_json = invoke(*args, "--json")
    assert as_json.exit_code == 2
    assert "optimizer_offload_fraction" in json.loads(as_json.stdout)["error"]["field"]
    fine = invoke(*args[:6], "OFFLOAD_FRACTION=0.5", *args[7:])
    assert fine.exit_code == 0, fine.output
    assert plan_from_toml((tmp_path / "plan.toml").read_text()).actor.mcore.cpu_optimizer_fraction == 0.5
