"""Importing verl launch scripts and Hydra override files (planner/verl_import.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlplan.planner.errors import PlanError
from rlplan.planner.memory.heads import resolved_loss_head
from rlplan.planner.presets import resolve_gpu
from rlplan.planner.render import render_plan
from rlplan.planner.rules import check_plan
from rlplan.planner.verl_import import import_verl_script

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "verl_scripts"
H100 = resolve_gpu("h100-80g")

# file -> (--env pins, environment, expected error rules or None for valid). Why: see the README there.
EXPECTED = {
    "grpo_lora_shell_vars.sh": ({"NGPUS": "8", "HOME": "/home/u"}, {}, {"actor_micro_batch_divides_mini"}),
    "ppo_offload_deprecated_globals.sh": ({"DATA_DIR": "/data"}, {}, None),
    "dynamic_bsz_ulysses.sh": ({}, {}, {"token_budget_fits_longest_sequence"}),
    "overrides_lora_valid.txt": ({}, {}, None),
    "trtllm_grpo_qwen2_7b.sh": ({"HOME": "/home/u"}, {}, None),
}


def load(text: str, env: dict[str, str] | None = None, environment: dict[str, str] | None = None,
         local_config=None):
    return import_verl_script(text, gpu=H100, host_memory_gib=512.0, env=env or {},
                              local_config_reader=lambda path: local_config, environment=environment or {})


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_scripts_get_their_documented_verdict(name):
    env, environment, expected = EXPECTED[name]
    result = load((SCRIPTS / name).read_text(), env, environment)
    errors = {violation.rule for violation in check_plan(result.plan).errors}
    assert errors == (expected or set())


def test_shell_variables_defaults_quotes_and_lists_resolve():
    result = load((SCRIPTS / "grpo_lora_shell_vars.sh").read_text(), {"NGPUS": "8", "HOME": "/home/u"})
    plan = result.plan
    assert plan.model.path == "Qwen/Qwen2.5-7B-Instruct" and plan.model.name == "qwen2.5-7b"
    assert plan.cluster.gpus_per_node == 8 and plan.cluster.host_memory_gib == 512.0
    assert plan.data.train_files == ("/home/u/data/gsm8k/train.parquet",)
    assert plan.data.val_files == ("/home/u/data/gsm8k/test.parquet", "/home/u/data/math/test.parquet")
    assert plan.trainer.experiment_name == "qwen2.5_7b_lora 64"
    assert plan.model.lora.rank == 64 and plan.rollout.sleep_level == 1 and plan.actor.lr == 3e-6
    assert set(result.passthrough_keys) == {"trainer.critic_warmup"}
    # The trackers are a plan key: `rlplan run` writes to them.
    assert plan.trainer.logger == ("console", "wandb")
    assert any("$@" in warning for warning in result.warnings)


def test_an_unset_variable_in_a_priced_key_is_an_error_naming_the_key_the_variable_and_its_env():
    with pytest.raises(PlanError) as error:
        load((SCRIPTS / "grpo_lora_shell_vars.sh").read_text(), {"HOME": "/home/u"})
    assert error.value.field == "trainer.n_gpus_per_node" and "$NGPUS" in error.value.message
    assert "--env NGPUS=" in error.value.fix


def test_env_pins_win_over_script_assignments_and_environment():
    script = "TBS=8\npython3 -m verl.trainer.main_ppo data.train_batch_size=$TBS trainer.nnodes=${NN:-3} " \
             "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n"
    assert load(script).plan.data.train_batch_size == 8
    assert load(script, {"TBS": "16"}).plan.data.train_batch_size == 16
    assert load(script, {"NN": "2"}, {"NN": "5"}).plan.cluster.nodes == 2
    # A modeled key's value from the environment would be copied into the plan: refused, naming the variable.
    with pytest.raises(PlanError) as error:
        load(script, environment={"NN": "2"})
    assert error.value.field == "trainer.nnodes" and "NN" in error.value.message and "--env NN=" in error.value.fix
    assert load(script).plan.cluster.nodes == 3


def test_deprecated_globals_stay_global_and_aliases_are_read():
    plan = load((SCRIPTS / "ppo_offload_deprecated_globals.sh").read_text(), {"DATA_DIR": "/d"}).plan
    assert plan.actor.ppo_micro_batch_size == 16 and plan.actor.ppo_micro_batch_size_per_gpu is None
    assert plan.rollout.log_prob_micro_batch_size == 64 and plan.rollout.log_prob_micro_batch_size_per_gpu is None
    assert plan.critic.param_offload and plan.critic.optimizer_offload and plan.uses_critic
    assert plan.cluster.nodes == 2 and plan.data.train_files == ("/d/train.parquet",)


def test_omitted_keys_take_verls_defaults_not_rlplans():
    plan = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\nactor_rollout_ref.rollout.name=vllm\n").plan
    assert plan.rollout.tensor_model_parallel_size == 2 and plan.rollout.gpu_memory_utilization == 0.5
    assert plan.rollout.max_num_seqs == 256 and plan.rollout.max_num_batched_tokens == 8192
    assert plan.rollout.load_format == "dummy" and plan.rollout.max_model_len is None
    assert plan.model.use_remove_padding and plan.model.gradient_checkpointing
    assert plan.actor.strategy == "fsdp" and plan.actor.ppo_max_token_len_per_gpu == 16384
    assert plan.algorithm.adv_estimator == "gae" and plan.uses_critic
    assert plan.critic.ppo_max_token_len_per_gpu == 32768 and plan.data.train_batch_size == 1024
    assert plan.trainer.output_dir == "checkpoints/verl_examples/gsm8k"


def test_log_prob_budgets_follow_the_actors_when_omitted():
    plan = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n"
                "actor_rollout_ref.actor.use_dynamic_bsz=true\n"
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000\n"
                "critic.ppo_max_token_len_per_gpu=50000\n").plan
    assert plan.rollout.log_prob_use_dynamic_bsz and plan.ref.log_prob_use_dynamic_bsz and plan.critic.use_dynamic_bsz
    assert plan.rollout.log_prob_max_token_len_per_gpu == 24000 == plan.ref.log_prob_max_token_len_per_gpu
    assert plan.critic.forward_max_token_len_per_gpu == 50000


def test_local_model_directory_reads_its_config():
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512,
              "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
              "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 2048}
    plan = load("actor_rollout_ref.model.path=/models/tiny\n", local_config=config).plan
    assert plan.model.name == "tiny" and plan.model.arch.hidden_size == 512 and plan.model.path == "/models/tiny"


@pytest.mark.parametrize(("path", "preset"), [
    ("/home/u/models/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("/data/models/Qwen3-VL-235B-A22B-Instruct", "qwen3-vl-235b-a22b"),  # verl's run_qwen3_vl-235b-megatron.sh
    ("/root/verl/models/MiMo-7B-RL", "mimo-7b"),  # verl's MTP example: its MTP layers priced when model.mtp is on
])
def test_unreadable_local_path_falls_back_to_the_preset_its_name_lists(path, preset):
    result = load(f"actor_rollout_ref.model.path={path}\n")
    assert result.plan.model.name == preset and result.plan.model.path == path
    assert any("not readable here" in warning for warning in result.warnings)


def test_an_unreadable_local_path_whose_folder_names_a_refused_release_gets_that_refusal(monkeypatch):
    from rlplan.planner import presets

    # models.toml prices every release it lists today; a refused one stands in (presets.toml `unsupported`).
    name, reason, repo_ids = "omni-9b", "its speech tower is not priced", ("example/Omni-9B-Instruct",)
    monkeypatch.setattr(presets, "unsupported_models", lambda: {name: (reason, repo_ids)})
    with pytest.raises(PlanError) as raised:
        load(f"actor_rollout_ref.model.path=/root/verl/models/{repo_ids[0].rsplit('/', 1)[-1]}\n")
    assert raised.value.field == "actor_rollout_ref.model.path"
    assert name in raised.value.message and reason in raised.value.message


@pytest.mark.parametrize(("text", "field"), [
    ("data.train_batch_size=abc\nactor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n", "data.train_batch_size"),
    ("actor_rollout_ref.rollout.name=trt_llm\nactor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n",
     "actor_rollout_ref.rollout.name"),
    ("data.train_batch_size=-4\nactor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n", "data.train_batch_size"),
    ("data.train_batch_size=8\n", "actor_rollout_ref.model.path"),
    ("actor_rollout_ref.model.path=/models/my-own-llm\n", "actor_rollout_ref.model.path"),
    ("python3 -m verl.trainer.main_ppo trainer.nnodes=$(cat n)\n", "trainer.nnodes"),
    ("python3 -m verl.trainer.main_ppo 'unterminated\n", "script"),
])
def test_bad_input_is_a_plan_error_naming_the_key(text, field):
    with pytest.raises(PlanError) as error:
        load(text)
    assert error.value.field == field


def test_tilde_and_plus_keys_pass_through_verbatim():
    result = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n~trainer.logger\n"
                  "+actor_rollout_ref.model.override_config.attention_dropout=0.\n")
    assert result.plan.passthrough == {"~trainer.logger": "",
                                       "+actor_rollout_ref.model.override_config.attention_dropout": "0."}


def test_logger_imports_as_the_trainer_trackers_and_renders_back():
    base = "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n"
    assert load(base).plan.trainer.logger == ("console", "wandb")  # verl's default
    plan = load(base + "trainer.logger=[console,tensorboard]\n").plan
    assert plan.trainer.logger == ("console", "tensorboard")
    assert load(base + "trainer.logger=mlflow\n").plan.trainer.logger == ("mlflow",)
    rendered = render_plan(plan, "verl")
    assert "'trainer.logger=[console,tensorboard]'" in rendered
    with pytest.raises(PlanError) as error:
        load(base + "trainer.logger=[console,nosuchtracker]\n")
    assert error.value.field == "trainer.logger"


@pytest.mark.parametrize(("spelling", "dtype"), [("bfloat16", "bf16"), ("bf16", "bf16"), ("float32", "fp32"),
                                               ("32", "fp32"), ("fp32", "fp32")])
def test_every_spelling_verls_precision_type_accepts_for_model_dtype_imports_as_the_plans(spelling, dtype):
    plan = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n"
                f"actor_rollout_ref.actor.fsdp_config.model_dtype={spelling}\n"
                f"actor_rollout_ref.ref.fsdp_config.model_dtype={spelling}\n").plan
    assert plan.actor.model_dtype == plan.ref.model_dtype == dtype
    assert not plan.passthrough


def test_head_and_dtype_keys_import_as_verl_runs_them():
    base = "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n"
    plan = load(base).plan
    assert plan.actor.model_dtype == "fp32" and plan.ref.model_dtype == "fp32"
    assert plan.actor.use_torch_compile and not plan.model.use_fused_kernels
    assert resolved_loss_head(plan) == "flash_attn_ce"
    plan = load(base + "actor_rollout_ref.model.use_fused_kernels=True\n"
                       "actor_rollout_ref.actor.use_torch_compile=False\n"
                       "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16\n"
                       "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16\n").plan
    assert resolved_loss_head(plan) == "fused" and not plan.actor.use_torch_compile
    assert plan.actor.model_dtype == "bf16" and plan.ref.model_dtype == "bf16"
    assert not plan.passthrough
    # fsdp_config.dtype: the dtype the passes compute in (verl's default bfloat16; float16 is verl's other choice).
    assert load(base).plan.actor.compute_dtype == "bfloat16"
    plan = load(base + "actor_rollout_ref.actor.fsdp_config.dtype=float16\n"
                       "actor_rollout_ref.ref.fsdp_config.dtype=float16\n").plan
    assert (plan.actor.compute_dtype, plan.ref.compute_dtype, plan.critic.compute_dtype) == (
        "float16", "float16", "bfloat16")



BRANCHING_SCRIPT = """cat > notes.txt <<END
it's a note: python3 -m verl.trainer.main_ppo data.train_batch_size=3
END
if [ "$BIG" = 1 ]; then
  TBS=64
else
  TBS=16
fi
python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \\
  data.train_batch_size=$TBS trainer.n_gpus_per_node=8 actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
  trainer.wandb_key=$SECRET actor_rollout_ref.acotr.ppo_epochs=2 actor_rollout_ref.rollout.n=4 \\
  actor_rollout_ref.rollout.n=5
"""


def test_a_verl_line_inside_a_heredoc_is_not_the_command_and_its_quote_does_not_break_lexing():
    result = load(BRANCHING_SCRIPT, environment={"SECRET": "hunter2"})
    assert result.plan.data.train_batch_size == 16
    assert not any("runs verl 2 times" in warning for warning in result.warnings)


def test_a_branch_on_an_unset_variable_is_taken_as_bash_takes_it_and_the_warning_names_the_variable():
    result = load(BRANCHING_SCRIPT, environment={"SECRET": "hunter2"})
    assert result.plan.data.train_batch_size == 16
    assert any("branches" in warning and "--env BIG=" in warning for warning in result.warnings)
    assert load(BRANCHING_SCRIPT, {"BIG": "1"}, {"SECRET": "x"}).plan.data.train_batch_size == 64
    assert load(BRANCHING_SCRIPT, {"TBS": "64"}, {"SECRET": "x"}).plan.data.train_batch_size == 64


def test_a_branch_rlplan_cannot_decide_reads_both_in_order_and_env_picks_the_value():
    script = BRANCHING_SCRIPT.replace('[ "$BIG" = 1 ]', '[ -f /etc/big ]')
    result = load(script, environment={"SECRET": "hunter2"})
    assert result.plan.data.train_batch_size == 16
    assert any("cannot decide" in warning and "--env TBS=" in warning for warning in result.warnings)


def test_a_key_set_twice_warns_and_a_misspelled_key_gets_did_you_mean():
    result = load(BRANCHING_SCRIPT, environment={"SECRET": "hunter2"})
    assert any("actor_rollout_ref.rollout.n is set twice" in warning for warning in result.warnings)
    assert result.plan.rollout.n == 5
    assert any("did you mean actor_rollout_ref.actor.ppo_epochs" in warning for warning in result.warnings)


def test_an_environment_secret_is_kept_as_a_reference_not_copied_into_the_plan():
    result = load(BRANCHING_SCRIPT, environment={"SECRET": "hunter2"})
    assert result.plan.passthrough["trainer.wandb_key"] == "${oc.env:SECRET}"
    assert "hunter2" not in repr(result.plan)
    # Asked for with --env, the value is the user's to persist.
    assert load(BRANCHING_SCRIPT, {"SECRET": "given"}).plan.passthrough["trainer.wandb_key"] == "given"


def test_offload_policy_imports_from_verls_fsdp_config_keys():
    base = "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\nalgorithm.adv_estimator=gae\n"
    plan = load(base).plan
    assert not plan.actor.offload_policy and not plan.critic.offload_policy
    plan = load(base + "actor_rollout_ref.actor.strategy=fsdp2\ncritic.strategy=fsdp2\n"
                       "actor_rollout_ref.actor.fsdp_config.offload_policy=True\n"
                       "critic.fsdp.offload_policy=true\n").plan
    assert plan.actor.offload_policy and plan.critic.offload_policy
    assert not plan.passthrough


def test_an_integer_past_pythons_text_limit_is_bad_input_naming_its_key():
    digits = "1" + "0" * 5000
    script = ("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
              f"+foo.bar={digits} data.train_batch_size={{}}\n")
    for value in (digits, "1" + "0" * 400):
        with pytest.raises(PlanError) as error:
            load(script.format(value))
        assert error.value.field == "data.train_batch_size" and "below 2**63" in error.value.fix


SECRET = "s3cr3t-Value_42"
HEAD = "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
SECRET_SPELLINGS = [
    HEAD + "trainer.wandb_key=${WANDB_API_KEY:-}",
    HEAD + "trainer.wandb_key=${WANDB_API_KEY:-default}",
    HEAD + "trainer.wandb_key=${WANDB_API_KEY:=x}",
    "KEY=$WANDB_API_KEY\n" + HEAD + "trainer.wandb_key=$KEY",
    'export KEY="${WANDB_API_KEY}"\nOTHER=pre-$KEY\n' + HEAD + '"+trainer.token=${OTHER}"',
    HEAD + "trainer.wandb_key=\"$WANDB_API_KEY\"'-x'",
    HEAD + "'+trainer.a'=\"${WANDB_API_KEY}\"",
    HEAD + "trainer.experiment_name=$WANDB_API_KEY",
    HEAD + "trainer.project_name=${WANDB_API_KEY}",
    HEAD + "data.train_files=$WANDB_API_KEY/train.parquet",
    HEAD + "trainer.experiment_name='${oc.env:WANDB_API_KEY}'",
    HEAD + "trainer.experiment_name='${oc.env:WANDB_API_KEY,x}'",
    HEAD + "data.train_batch_size=$((NUMBER * 2))",
    HEAD + "data.train_batch_size=$NUMBER",
    "TBS=${NUMBER}\n" + HEAD + "data.train_batch_size=$TBS",
]


@pytest.mark.parametrize("script", SECRET_SPELLINGS)
def test_no_value_from_the_environment_reaches_the_plan_or_its_render_unless_passed_with_env(script):
    """Invariant: whatever the spelling, an environment value is in no plan, rendered script, warning or
    error; a refusal names the variable; with --env the value is the user's to persist."""
    from rlplan.planner.planfile import plan_to_toml
    from rlplan.planner.render import render_plan

    environment = {"WANDB_API_KEY": SECRET, "NUMBER": "4242"}
    try:
        result = load(script, environment=environment)
    except PlanError as error:
        assert SECRET not in error.paragraph() and "4242" not in error.paragraph()
        assert "WANDB_API_KEY" in error.paragraph() or "NUMBER" in error.paragraph()
    else:
        written = plan_to_toml(result.plan)
        rendered = render_plan(result.plan, "verl", "script")
        for text in (written, rendered, *result.warnings):
            assert SECRET not in text and "4242" not in text
        assert "${oc.env:WANDB_API_KEY" in written
    pinned = load(script, environment, environment).plan
    assert SECRET in plan_to_toml(pinned) or "4242" in plan_to_toml(pinned) or "8484" in plan_to_toml(pinned)


def test_an_override_of_max_position_embeddings_is_the_models_context_and_stays_in_the_script():
    """DAPO's Qwen2.5-Math-7B runs at 2k + 8k tokens with override_config.max_position_embeddings=32768 (verl
    applies it to the HF config); against the stock 4096 the plan would be refused."""
    key = "+actor_rollout_ref.model.override_config.max_position_embeddings"
    script = ("actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B\nactor_rollout_ref.rollout.name=vllm\n"
              "data.max_prompt_length=2048\ndata.max_response_length=8192\n")
    stock = load(script).plan
    raised = load(script + f"{key}=32768\n").plan
    assert stock.model.arch.max_position_embeddings == 4096
    assert raised.model.arch.max_position_embeddings == 32768
    assert raised.passthrough[key] == "32768"
    assert key in render_plan(raised, "verl")
    with pytest.raises(PlanError) as error:
        load(script + f"{key}=lots\n")
    assert error.value.field == "actor_rollout_ref.model.override_config.max_position_embeddings"


def test_a_dapo_generation_batch_imports_as_a_plan_key():
    plan = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\ndata.train_batch_size=512\n"
                "data.gen_batch_size=1536\n").plan
    assert plan.data.gen_batch_size == 1536
    assert "data.gen_batch_size" not in plan.passthrough
    assert "data.gen_batch_size=1536" in render_plan(plan, "verl")


def test_a_script_without_an_estimator_warns_that_verls_default_trains_a_critic():
    """verl's classic run_qwen2-7b.sh sets no adv_estimator: the plan is then GAE with a critic, said aloud."""
    result = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\nactor_rollout_ref.rollout.name=vllm\n")
    assert result.plan.uses_critic
    (warning,) = [w for w in result.warnings if "algorithm.adv_estimator" in w]
    assert "gae" in warning and "critic" in warning and "algorithm.adv_estimator=grpo" in warning
    explicit = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\nalgorithm.adv_estimator=grpo\n")
    assert not [w for w in explicit.warnings if "algorithm.adv_estimator" in w]


def test_a_micro_batch_pinned_under_dynamic_batch_size_warns_that_verl_ignores_it():
    base = "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\nalgorithm.adv_estimator=grpo\n" \
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4\n"
    dynamic = load(base + "actor_rollout_ref.actor.use_dynamic_bsz=true\n")
    (warning,) = [w for w in dynamic.warnings if "ppo_micro_batch_size_per_gpu" in w]
    assert "ignored" in warning and "use_dynamic_bsz" in warning
    assert not [w for w in load(base).warnings if "ignored by verl" in w]


def test_this_machines_pwd_in_a_script_warns_that_its_paths_are_frozen_and_env_unfreezes_them():
    script = ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_files=$PWD/data/train.parquet "
              "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n")
    frozen = load(script, environment={"PWD": "/home/me/verl"})
    assert frozen.plan.data.train_files == ("/home/me/verl/data/train.parquet",)
    (warning,) = [w for w in frozen.warnings if "$PWD" in w]
    assert "/home/me/verl" in warning and "--env PWD=" in warning
    pinned = load(script, env={"PWD": "/cluster/verl"}, environment={"PWD": "/home/me/verl"})
    assert pinned.plan.data.train_files == ("/cluster/verl/data/train.parquet",)
    assert not [w for w in pinned.warnings if "$PWD" in w]


def test_a_recipes_rollout_pool_is_read_with_or_without_plus_and_the_other_key_takes_the_recipes_default():
    head = "python3 -m recipe.one_step_off_policy.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
    plain = load(head + "rollout.nnodes=2 rollout.n_gpus_per_node=4 algorithm.adv_estimator=grpo\n")
    assert (plain.plan.rollout.pool.nodes, plain.plan.rollout.pool.gpus_per_node) == (2, 4)
    plus = load(head + "+rollout.n_gpus_per_node=4 algorithm.adv_estimator=grpo\n").plan.rollout.pool
    assert (plus.nodes, plus.gpus_per_node) == (1, 4)  # one_step_off_ppo_trainer.yaml: nnodes 1
    assert load(head + "algorithm.adv_estimator=grpo\n").plan.rollout.pool is None
    with pytest.raises(PlanError) as error:
        load(head + "rollout.nnodes=two algorithm.adv_estimator=grpo\n")
    assert error.value.field == "rollout.nnodes"


def test_a_streamed_batch_without_a_rollout_pool_is_refused_with_why():
    with pytest.raises(PlanError) as error:
        load("python3 -m recipe.fully_async_policy.fully_async_main actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
             "data.train_batch_size=0 async_training.require_batches=4 algorithm.adv_estimator=grpo\n")
    assert error.value.field == "data.train_batch_size" and "rollout.n_gpus_per_node" in error.value.fix


# --- credentials a script sets itself (issue 41) ------------------------------------------------------------------

SCRIPT_SECRET = "wandb-pl4nted-9f8e7d"
HF_SECRET = "hf_" + "Pl4nted" * 5


@pytest.mark.parametrize("assignment", [f"export WANDB_API_KEY={SCRIPT_SECRET}", f"WANDB_API_KEY='{SCRIPT_SECRET}'",
                                        f"export WANDB_API_KEY\nWANDB_API_KEY={SCRIPT_SECRET}"])
def test_a_credential_the_script_sets_itself_reaches_no_plan_only_its_reference(assignment):
    from rlplan.planner.planfile import plan_to_toml
    from rlplan.planner.render import render_plan

    script = (f"{assignment}\nRUN=$WANDB_API_KEY-run\nexport TOKEN_SHAPED={HF_SECRET}\n"
              "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
              "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4 "
              "trainer.project_name=$WANDB_API_KEY trainer.experiment_name=$RUN "
              "+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN=$TOKEN_SHAPED "
              f"+ray_kwargs.ray_init.runtime_env.env_vars.OTHER_TOKEN={HF_SECRET}\n")
    result = import_verl_script(script, gpu=H100, host_memory_gib=2048.0, env={}, local_config_reader=lambda path: None)
    texts = [plan_to_toml(result.plan), render_plan(result.plan, "verl", "script"), *result.warnings]
    assert not [text for text in texts if SCRIPT_SECRET in text or HF_SECRET in text]
    toml = plan_to_toml(result.plan)
    assert '"${oc.env:WANDB_API_KEY}"' in toml and '"${oc.env:WANDB_API_KEY}-run"' in toml
    assert "${oc.env:TOKEN_SHAPED}" in toml and "${oc.env:OTHER_TOKEN}" in toml
    assert any("WANDB_API_KEY" in w and "credential" in w and "export" in w for w in result.warnings)


def test_a_priced_key_that_reads_a_credential_is_refused_naming_the_variable_not_its_value():
    script = (f"export MY_TOKEN={HF_SECRET}\npython3 -m verl.trainer.main_ppo "
              "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct data.train_batch_size=$MY_TOKEN\n")
    with pytest.raises(PlanError) as raised:
        import_verl_script(script, gpu=H100, host_memory_gib=2048.0, env={}, local_config_reader=lambda path: None)
    assert HF_SECRET not in str(raised.value) and "MY_TOKEN" in str(raised.value)


# rollout.name=sglang_async: verl 0.4.0/0.4.1's deprecated name of the sglang rollout (fsdp_workers._build_rollout).
SGLANG_ASYNC_SCRIPT = """python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\
  actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct data.train_batch_size=32 \\
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.rollout.name='sglang_async' \\
  trainer.n_gpus_per_node=4
"""


def test_sglang_async_imports_as_the_sglang_engine_naming_the_old_spelling_and_renders_what_04_accepts():
    result = load(SGLANG_ASYNC_SCRIPT)
    assert result.plan.rollout.name == "sglang"
    assert any("rollout.name=sglang_async is verl 0.4" in warning and "read as sglang" in warning
               for warning in result.warnings)
    for verl in ("0.3.0.post1", "0.4.1", "0.5.0"):
        plan = import_verl_script(SGLANG_ASYNC_SCRIPT, gpu=H100, host_memory_gib=512.0, env={},
                                  local_config_reader=lambda path: None, environment={},
                                  versions=(verl, None, None)).plan
        assert plan.stack.verl == verl
        rendered = render_plan(plan, "verl")
        assert "actor_rollout_ref.rollout.name=sglang " in rendered and "sglang_async" not in rendered


def test_a_trtllm_script_imports_as_a_trtllm_plan_judged_on_the_releases_that_have_it_and_renders_back():
    """verl builds the TensorRT-LLM rollout from 0.7.1 (verl_keys.ROLLOUT_ENGINE_SINCE); its engine_kwargs.trtllm
    pass through verbatim."""
    result = load((SCRIPTS / "trtllm_grpo_qwen2_7b.sh").read_text(), {"HOME": "/home/u"})
    plan = result.plan
    assert plan.rollout.name == "trtllm" and plan.rollout.tensor_model_parallel_size == 2
    assert (plan.stack.verl_oldest, plan.stack.trtllm) == ("0.7.1", None)
    assert any("`actor_rollout_ref.rollout.name=trtllm`: verl builds that rollout from 0.7.1" in warning
               for warning in result.warnings)
    rendered = render_plan(plan, "verl", "overrides")
    assert "actor_rollout_ref.rollout.name=trtllm" in rendered
    assert "+actor_rollout_ref.rollout.engine_kwargs.trtllm.batch_wait_timeout_iters=16" in rendered


@pytest.mark.parametrize(("versions", "level"), [
    (("0.5.0", None, None), 1), (("0.6.0", "0.8.4", None), 1), (("0.6.1", None, None), 2), (("0.9.1", None, None), 2),
])
def test_an_imported_script_sleeps_vllm_at_the_level_its_release_picks(versions, level):
    """verl up to 0.5 sleeps vLLM at level 1 (weights copied to host); from 0.6 on vLLM 0.8.5+, level 2."""
    plan = import_verl_script(SGLANG_ASYNC_SCRIPT.replace("'sglang_async'", "vllm"), gpu=H100, host_memory_gib=512.0,
                              env={}, local_config_reader=lambda path: None, environment={}, versions=versions).plan
    assert plan.rollout.name == "vllm" and plan.stack.verl == versions[0]
    assert plan.rollout.sleep_level == level
