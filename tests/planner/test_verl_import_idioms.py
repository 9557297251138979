"""`rlplan import verl` on the shell idioms verl's shipped launch scripts use (issue 44's table), one script each in
tests/data/verl_idioms (written here; its README maps them to the rows), through the CLI from that folder, as a
user imports from the root of a verl checkout."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rlplan.planner.memory import predict_memory
from rlplan.planner.planfile import plan_from_toml
from rlplan.planner.steptime import predict_step_time, verl_timing_seconds

IDIOMS = Path(__file__).resolve().parents[1] / "data" / "verl_idioms"


def imported(script: str, *flags: str, env: dict[str, str] | None = None) -> tuple[object, list[str]]:
    """(plan, warnings) of `rlplan import verl SCRIPT --gpu h100-80g --json` run in the idioms folder."""
    result = invoke_import(script, *flags, env=env)
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    return plan_from_toml(body["plan_toml"]), body["warnings"]


def invoke_import(script: str, *flags: str, env: dict[str, str] | None = None):
    from typer.testing import CliRunner

    from rlplan.planner.commands.cli import app

    cwd = os.getcwd()
    os.chdir(IDIOMS)
    try:
        result = CliRunner().invoke(app, ["import", "verl", script, "--gpu", "h100-80g", "--json", *flags],
                                    env=env)
    finally:
        os.chdir(cwd)
    assert "Traceback" not in result.output
    return result


def refusal(script: str, *flags: str, env: dict[str, str] | None = None) -> dict:
    result = invoke_import(script, *flags, env=env)
    assert result.exit_code == 2, result.output
    return json.loads(result.stdout)["error"]


# --- row 1: $(pwd) and the example's own Hydra config -------------------------------------------------------


def test_pwd_is_the_import_folder_and_the_examples_config_is_the_base_the_overrides_apply_to():
    plan, warnings = imported("pwd_config_path.sh")
    # From examples/demo/config/demo_grpo.yaml (under ppo_trainer), which the command's overrides leave alone.
    assert plan.rollout.name == "sglang" and plan.rollout.n == 4 and plan.rollout.gpu_memory_utilization == 0.6
    assert (plan.data.train_batch_size, plan.data.max_prompt_length, plan.data.max_response_length) == (64, 1024, 2048)
    assert plan.data.gen_batch_size == 64  # ${data.train_batch_size}, resolved
    assert plan.actor.lr == 1e-6 and plan.actor.ppo_mini_batch_size == 32
    assert any("demo_grpo.yaml" in warning and "ppo_trainer" in warning for warning in warnings)


def test_an_unreadable_config_says_which_keys_may_differ_from_ppo_trainer(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text((IDIOMS / "pwd_config_path.sh").read_text().replace("$PROJECT_DIR/examples", "/nowhere/examples"))
    plan, warnings = imported(str(script))
    (warning,) = [w for w in warnings if "not readable here" in w]
    assert "demo_grpo" in warning and "data.train_batch_size" in warning and "actor_rollout_ref.rollout.name" in warning
    assert plan.rollout.name == "vllm"  # verl's ppo_trainer default, said to possibly differ


# --- row 2: ${1:-vllm} --------------------------------------------------------------------------------------


def test_a_positional_default_is_the_script_run_with_no_arguments_and_arg_passes_them():
    plan, warnings = imported("positional_default.sh")
    assert plan.rollout.name == "vllm"
    assert any("$1 = 'vllm'" in warning and "--arg" in warning for warning in warnings)
    plan, _ = imported("positional_default.sh", "--arg", "sglang")
    assert plan.rollout.name == "sglang"


# --- row 3: $(date ...) and $(basename $MODEL_PATH) in names ------------------------------------------------


def test_command_output_reaching_only_names_passes_through_verbatim_with_one_warning():
    plan, warnings = imported("command_output_in_names.sh")
    name = plan.passthrough["trainer.experiment_name"]
    assert "grpo_Qwen2.5-0.5B-Instruct_$(date +%Y%m%d)" in name  # basename evaluated, date kept as written
    assert "$(date +%Y%m%d)" in plan.passthrough["trainer.default_local_dir"]
    (warning,) = [w for w in warnings if "cannot know" in w]
    assert "trainer.experiment_name" in warning and "trainer.default_local_dir" in warning


def test_command_output_in_a_priced_key_blocks_naming_the_variable_and_its_env(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("GPUS=$(nvidia-smi -L | wc -l)\n" + (IDIOMS / "remax_estimator.sh").read_text()
                      .replace("rollout.n=4", "rollout.n=4 trainer.n_gpus_per_node=$GPUS"))
    error = refusal(str(script))
    assert error["field"] == "trainer.n_gpus_per_node" and "$(nvidia-smi -L | wc -l)" in error["message"]
    assert "--env GPUS=" in error["fix"]
    plan, _ = imported(str(script), "--env", "GPUS=4")
    assert plan.cluster.gpus_per_node == 4


# --- row 4: unset $DATA_HOME, $RAY_DATA_HOME, $DIST_CKPT_PATH ----------------------------------------------


def test_unset_variables_reaching_only_data_and_checkpoint_paths_pass_through():
    plan, warnings = imported("unset_data_paths.sh")
    assert plan.passthrough["data.train_files"].strip("'") == "$DATA_HOME/gsm8k/train.parquet"
    assert "$DIST_CKPT_PATH" in plan.passthrough["trainer.default_local_dir"]
    assert plan.model.name == "qwen2.5-0.5b"  # the model folder's name, known though its parent is not
    assert any("cannot know" in w and "data.val_files" in w for w in warnings)


def test_an_unset_variable_in_a_priced_key_names_it_and_env_sets_it(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text((IDIOMS / "unset_data_paths.sh").read_text().replace("data.train_batch_size=64",
                                                                            "data.train_batch_size=$TBS"))
    error = refusal(str(script))
    assert error["field"] == "data.train_batch_size" and "$TBS" in error["message"] and "--env TBS=" in error["fix"]
    assert imported(str(script), "--env", "TBS=32")[0].data.train_batch_size == 32


# --- row 5: bash arrays ------------------------------------------------------------------------------------


def test_overrides_in_multi_line_bash_arrays_extended_with_plus_equals_are_read():
    plan, _ = imported("bash_arrays.sh")
    assert (plan.data.train_batch_size, plan.data.max_prompt_length, plan.data.max_response_length) == (64, 512, 1024)
    assert plan.actor.ppo_micro_batch_size_per_gpu == 4 and plan.rollout.log_prob_micro_batch_size_per_gpu == 4
    assert plan.rollout.n == 4


# --- row 6: estimators that change the step ----------------------------------------------------------------


def test_remax_prices_its_greedy_baseline_generation_in_time_and_leaves_the_memory_peak_to_the_rollout():
    remax, _ = imported("remax_estimator.sh")
    grpo = remax.evolve(algorithm=remax.algorithm.__class__(adv_estimator="grpo"))
    assert remax.algorithm.adv_estimator == "remax" and not remax.uses_critic
    memory = predict_memory(remax)
    # The baseline runs the same engine on the batch's prompts once each: fewer sequences than the rollout.
    assert memory.gpu_peak_bytes == predict_memory(grpo).gpu_peak_bytes
    step, grpo_step = predict_step_time(remax, memory), predict_step_time(grpo, predict_memory(grpo))
    baseline = step.phase_seconds["greedy_baseline"]
    assert 0 < baseline < step.phase_seconds["rollout"] + step.phase_seconds["weight_sync"]
    assert step.total_seconds == pytest.approx(grpo_step.total_seconds + baseline)
    assert verl_timing_seconds(step)["gen_max"] == baseline and "gen_max" not in verl_timing_seconds(grpo_step)


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus_baseline", "optimal_token_baseline", "gpg", "opo"])
def test_verls_other_estimators_import(tmp_path, estimator):
    script = tmp_path / "run.sh"
    script.write_text((IDIOMS / "remax_estimator.sh").read_text().replace("=remax", f"={estimator}"))
    plan, _ = imported(str(script))
    assert plan.algorithm.adv_estimator == estimator and not plan.uses_critic


# --- row 7: models that are no preset ----------------------------------------------------------------------


def test_a_local_sft_checkpoint_in_verls_layout_is_read_from_actor_huggingface():
    plan, warnings = imported("local_sft_checkpoint.sh")
    assert plan.model.arch.hidden_size == 896 and plan.model.arch.num_layers == 24
    assert any("actor/huggingface/config.json" in warning for warning in warnings)


def _cache_with(cache: Path, repo: str, config: dict, revision: str = "0123abcd") -> None:
    snapshot = cache / ("models--" + repo.replace("/", "--")) / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    refs = snapshot.parents[1] / "refs"
    refs.mkdir()
    (refs / "main").write_text(revision)


TINY = json.loads((IDIOMS / "models/sft/global_step_105/actor/huggingface/config.json").read_text())


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME", "HOME"])
def test_a_hub_id_no_preset_lists_is_read_offline_from_the_local_hugging_face_cache(tmp_path, variable):
    cache = {"HF_HUB_CACHE": tmp_path, "HF_HOME": tmp_path / "hub", "HOME": tmp_path / ".cache/huggingface/hub"}
    _cache_with(cache[variable], "example-org/tiny-llama-sft", TINY)
    env = {"HF_HUB_CACHE": None, "HUGGINGFACE_HUB_CACHE": None, "HF_HOME": None, "XDG_CACHE_HOME": None,
           variable: str(tmp_path)}
    plan, warnings = imported("hub_model_not_a_preset.sh", env=env)
    assert plan.model.arch.hidden_size == 896
    assert any("Hugging Face cache" in warning for warning in warnings)


def test_a_model_found_nowhere_gives_the_one_command_that_fetches_its_config(tmp_path):
    error = refusal("hub_model_not_a_preset.sh", env={"HF_HUB_CACHE": str(tmp_path)})
    assert "`hf download example-org/tiny-llama-sft config.json`" in error["fix"]


# --- item 1: the rest of the shell as bash reads it ---------------------------------------------------------


def test_the_scripts_folder_arithmetic_and_assigned_defaults_are_evaluated():
    plan, _ = imported("script_folder_and_arithmetic.sh")
    assert (plan.data.train_batch_size, plan.actor.ppo_mini_batch_size) == (64, 32)
    assert (plan.cluster.gpus_per_node, plan.cluster.nodes) == (8, 1)
    assert plan.data.train_files == (f"{IDIOMS}/data/train.parquet",)  # $(cd "$(dirname "$0")" && pwd)
    assert plan.data.val_files == ("./data/test.parquet",)  # $(dirname "$0") of a script given as its name


def test_the_verl_command_behind_ray_job_submit_is_found():
    plan, _ = imported("ray_job_submit.sh")
    assert plan.data.train_batch_size == 64 and plan.model.name == "qwen2.5-0.5b"


def test_a_backslash_before_a_space_and_a_comment_ends_the_command_as_bash_reads_it():
    error = refusal("backslash_comment.sh")
    assert error["field"] == "script" and "backslash followed by a space" in error["message"]


def test_importing_runs_no_command_a_touch_in_every_substitution_leaves_no_file(tmp_path, monkeypatch):
    started: list[object] = []

    def refuse(*args, **kwargs):
        started.append(args)
        raise AssertionError("the import started a process")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)
    plan, _ = imported("no_command_runs.sh", "--env", f"MARK_DIR={tmp_path}")
    assert list(tmp_path.iterdir()) == [] and started == []
    assert '$(touch "' in plan.passthrough["trainer.experiment_name"]


def test_a_set_environment_variable_reaching_only_a_data_path_is_kept_as_a_reference_not_refused():
    plan, warnings = imported("unset_data_paths.sh", env={"DATA_HOME": "/private/data"})
    assert "${oc.env:DATA_HOME}" in plan.passthrough["data.val_files"]
    assert "/private/data" not in repr(plan) and not any("/private/data" in w for w in warnings)


def test_a_token_budget_variable_named_max_token_is_a_count_read_as_the_script_sets_it():
    plan, warnings = imported("token_budget_variable.sh")
    assert plan.actor.ppo_max_token_len_per_gpu == 12288 and plan.rollout.max_num_batched_tokens == 12288
    assert not any("credential" in warning for warning in warnings)


def test_a_placeholder_model_path_cannot_run_as_shipped_and_the_variable_that_sets_it_is_named():
    error = refusal("placeholder_model_path.sh")
    assert error["field"] == "actor_rollout_ref.model.path"
    assert "placeholder" in error["message"] and "cannot run as shipped" in error["message"]
    plan, _ = imported("placeholder_model_path.sh", "--env", "MODEL=Qwen/Qwen2.5-0.5B-Instruct")
    assert plan.model.path == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize("path", ["<path_to_model>", "/mnt/your_ckpt/hf", "/path/to/model", "model_path",
                                  "REF_MODEL_PATH", "ckpt_dir"])
def test_each_placeholder_spelling_is_said_to_be_one(path):
    error = refusal("placeholder_model_path.sh", "--env", f"MODEL={path}")
    assert "cannot run as shipped" in error["message"]


def test_a_model_path_on_another_machine_is_no_placeholder_it_needs_input():
    error = refusal("placeholder_model_path.sh", "--env", "MODEL=/mnt/checkpoints/run7")
    assert "is not on this machine" in error["message"] and "cannot run as shipped" not in error["message"]


def test_an_empty_model_path_the_script_sets_cannot_run_as_shipped():
    error = refusal("empty_model_path.sh")
    assert error["field"] == "actor_rollout_ref.model.path" and "cannot run as shipped" in error["message"]


def test_a_backslash_space_break_is_said_to_leave_the_script_unable_to_run_as_shipped():
    assert "cannot run as shipped" in refusal("backslash_comment.sh")["message"]


# --- placement: a rollout on GPUs of its own (verl's one-step-off and fully async recipes) ----------------------


def _rendered_overrides(plan) -> set[str]:
    from rlplan.planner.render import verl_overrides

    return set(verl_overrides(plan))


def test_a_rollout_pool_of_its_own_is_read_into_the_plan_and_rendered_back_as_the_same_keys():
    plan, warnings = imported("split_rollout_one_step_off.sh")
    assert (plan.cluster.world_size, plan.rollout.pool.gpus, plan.rollout.pool.streams) == (6, 2, False)
    assert "rollout.nnodes" not in plan.passthrough and not any("colocated" in w for w in warnings)
    assert {"rollout.nnodes=1", "rollout.n_gpus_per_node=2", "trainer.n_gpus_per_node=6"} <= _rendered_overrides(plan)
    memory = predict_memory(plan)
    assert {p.name: p.pool for p in memory.phases}["rollout"] == "rollout"
    assert memory.phase("actor_update").bytes_of("kv_cache") == 0 < memory.phase("rollout").bytes_of("kv_cache")


def test_a_streamed_batch_is_priced_as_require_batches_mini_batches_and_rendered_back_as_zero():
    plan, warnings = imported("streamed_batch_fully_async.sh")
    assert plan.data.train_batch_size == 4 * 16 and plan.data.gen_batch_size is None and plan.rollout.pool.streams
    (warning,) = [w for w in warnings if "priced as the step's batch" in w]
    assert "4 x 16 = 64" in warning
    rendered = _rendered_overrides(plan)
    assert {"data.train_batch_size=0", "data.gen_batch_size=1", "async_training.require_batches=4",
            "rollout.n_gpus_per_node=4"} <= rendered
    assert not any(o.startswith("data.train_batch_size=64") for o in rendered)
    step = predict_step_time(plan, predict_memory(plan))
    assert step.overlapped and verl_timing_seconds(step)["step"] == step.total_seconds


def test_a_rollout_pool_and_a_streamed_batch_survive_import_render_import():
    from rlplan.planner.planfile import plan_to_dict
    from rlplan.planner.render import plan_as_verl_runs_it, render_plan, verl_overrides
    from rlplan.planner.verl_import import import_verl_script
    from tests.planner.plans import without_inferred_range

    for script in ("split_rollout_one_step_off.sh", "streamed_batch_fully_async.sh"):
        plan, _ = imported(script)
        again = import_verl_script(render_plan(plan, "verl"), gpu=plan.cluster.gpu,
                                   host_memory_gib=plan.cluster.host_memory_gib, env={},
                                   local_config_reader=lambda path: None).plan
        assert again.rollout.pool == plan.rollout.pool
        assert sorted(verl_overrides(again)) == sorted(verl_overrides(plan))
        assert plan_to_dict(without_inferred_range(again)) == plan_to_dict(without_inferred_range(
            plan_as_verl_runs_it(plan)))


# --- verl's SPIN and SPPO recipes: their own trainers, no advantage estimator -----------------------------------


def test_spin_is_priced_as_its_pair_update_with_the_reference_and_its_config_is_read_from_the_recipe_folder():
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.memory.heads import SPIN_PAIR_HEAD_BYTES

    plan, warnings = imported("spin_recipe.sh")
    assert (plan.algorithm.recipe, plan.algorithm.adv_estimator) == ("spin", None)
    assert plan.rollout.n == 2 and plan.rollout.gpu_memory_utilization == 0.5  # from the recipe's config
    assert plan.uses_reference and not plan.uses_critic
    update = plan_layout(plan).actor_update
    # 64 prompts x n 2 over 4 ranks, one optimizer step; 8 // 4 = 2 chosen + 2 rejected per micro batch, padded.
    assert (update.sequences_per_gpu, update.mini_batch_size_per_gpu, update.micro_batch_size_per_gpu) == (32, 32, 4)
    assert update.padded and update.tokens_per_micro_batch == 4 * 1024
    memory = predict_memory(plan)
    vocab = plan.model.arch.vocab_size
    assert memory.phase("actor_update").bytes_of("logits_head") >= SPIN_PAIR_HEAD_BYTES * 4 * 1024 * vocab
    assert memory.phase("ref_log_prob").peak_bytes > 0
    (said,) = [w for w in warnings if "SPIN recipe" in w]
    assert "ref_update_freq" in said and "not measured" in said


def test_sppo_is_a_ppo_step_without_critic_or_reference_through_the_modules_own_config():
    plan, warnings = imported("sppo_recipe.sh")
    assert (plan.algorithm.recipe, plan.algorithm.adv_estimator) == ("sppo", None)
    assert plan.rollout.name == "sglang" and plan.rollout.tensor_model_parallel_size == 2
    assert not plan.uses_reference and not plan.uses_critic
    from rlplan.planner.stack import SPIN_SPPO_RECIPES, holds

    # Imported away from a checkout, the stack is judged among the releases that ship the recipe.
    assert holds(SPIN_SPPO_RECIPES, plan.stack) and any("spin_sppo_recipes" in w for w in warnings)
    phases = {phase.name for phase in predict_memory(plan).phases}
    assert "actor_update" in phases and "ref_log_prob" not in phases and "critic_update" not in phases
    assert any("SPPO recipe" in w for w in warnings)


def test_a_recipe_plan_renders_the_recipes_module_and_survives_import_render_import():
    from rlplan.planner.render import render_plan
    from rlplan.planner.verl_import import import_verl_script

    for script, module in (("spin_recipe.sh", "recipe.spin.main_spin"), ("sppo_recipe.sh", "recipe.sppo.main_sppo")):
        plan, _ = imported(script, "--verl-version", "0.6.1")
        text = render_plan(plan, "verl")
        assert f"python3 -m {module} " in text and "adv_estimator" not in text
        again = import_verl_script(text, gpu=plan.cluster.gpu, host_memory_gib=plan.cluster.host_memory_gib, env={},
                                   local_config_reader=lambda path: None).plan
        assert again.algorithm == plan.algorithm


def test_a_null_estimator_under_a_trainer_rlplan_does_not_know_is_refused_by_name(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text((IDIOMS / "sppo_recipe.sh").read_text().replace("recipe.sppo.main_sppo",
                                                                      "recipe.mine.main_mine algorithm.adv_estimator=null"))
    error = refusal(str(script))
    assert error["field"] == "algorithm.adv_estimator" and "recipe.mine.main_mine" in error["message"]


# --- verl's model.mtp on the Megatron workers ---------------------------------------------------------------


def test_mtp_switches_become_the_plans_model_mtp_priced_and_rendered_back_for_verl_08():
    from rlplan.planner.errors import PlanError
    from rlplan.planner.render import render_plan
    from rlplan.planner.stack import StackSection

    plan, warnings = imported("mtp_megatron.sh", "--verl-version", "0.8.0")
    assert plan.model.mtp is not None and plan.model.mtp.train and plan.model.mtp_trained_layers == 2
    assert "actor_rollout_ref.model.mtp.enable" not in plan.passthrough
    assert plan.passthrough["actor_rollout_ref.model.mtp.mtp_loss_scaling_factor"] == "0.1"
    assert predict_memory(plan).phase("actor_update").bytes_of("actor_params") > 0
    (said,) = [w for w in warnings if w.startswith("model.mtp.enable")]
    assert "2 multi-token-prediction layer(s)" in said and "README says one" in said
    rendered = _rendered_overrides(plan)
    assert {"actor_rollout_ref.model.mtp.enable=True", "actor_rollout_ref.model.mtp.enable_train=True"} <= rendered
    with pytest.raises(PlanError) as older:
        render_plan(plan.evolve(stack=StackSection(verl="0.7.0")), "verl")
    assert older.value.field == "model.mtp"


def test_mtp_under_fsdp_cannot_run_and_mtp_off_is_the_dense_stack(tmp_path):
    script = tmp_path / "run.sh"
    fsdp = (IDIOMS / "mtp_megatron.sh").read_text().replace(" --config-path=config --config-name=ppo_megatron_trainer", "")
    script.write_text("\n".join(line for line in fsdp.splitlines() if ".megatron." not in line))
    error = refusal(str(script))
    assert error["field"] == "model.mtp" and "NotImplementedError" in error["message"]
    script.write_text((IDIOMS / "mtp_megatron.sh").read_text().replace("mtp.enable=True", "mtp.enable=False"))
    plan, _ = imported(str(script))
    assert plan.model.mtp is None and plan.model.mtp_layers == 0 and plan.model.arch.mtp_layers == 2
