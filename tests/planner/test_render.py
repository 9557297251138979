"""Rendering plans for verl, SLURM and Ray jobs (planner/render.py), and the import round trip."""

from __future__ import annotations

import shutil
import subprocess

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.plan import ModelSection, Plan
from rlplan.planner.planfile import plan_to_dict
from rlplan.planner.presets import resolve_gpu, resolve_model
from rlplan.planner.render import plan_as_verl_runs_it, render_plan
from rlplan.planner.solver import SolveRequest, solve
from rlplan.planner.stack import DEFAULT_STACK, solve_pins
from rlplan.planner.verl_import import import_verl_script
from rlplan.planner.verl_keys import format_value
from tests.planner.plans import make_plan, without_inferred_range

H100 = resolve_gpu("h100-80g")
QWEN = resolve_model("qwen2.5-7b")
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to run rendered scripts")


def preset_plan(overrides: dict | None = None) -> Plan:
    plan = make_plan(QWEN.arch, overrides=overrides)
    plan = plan.evolve(model=attrs.evolve(plan.model, name=QWEN.name, path=QWEN.path, arch=QWEN.arch),
                       cluster=attrs.evolve(plan.cluster, gpu=H100))
    return plan


TINY_CONFIG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000}


def reimport(text: str, plan: Plan, local_config: dict | None = None) -> Plan:
    return import_verl_script(text, gpu=plan.cluster.gpu, host_memory_gib=plan.cluster.host_memory_gib, env={},
                              local_config_reader=lambda path: local_config).plan


optional_int = st.none() | st.integers(1, 64)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=20)


@st.composite
def schema_plans(draw) -> Plan:
    """Plans with random valid knobs in every mapped section (no solver needed)."""
    dynamic = draw(st.booleans())
    overrides = {
        "data.train_batch_size": draw(st.integers(1, 1024)),
        "data.max_prompt_length": draw(st.integers(16, 4096)),
        "data.max_response_length": draw(st.integers(16, 8192)),
        "data.train_files": draw(st.lists(names, max_size=3)),
        "data.truncation": draw(st.sampled_from(["error", "left", "right"])),
        "data.filter_overlong_prompts": draw(st.booleans()),
        "data.seed": draw(st.integers(0, 99)),
        "model.lora.rank": draw(st.sampled_from([0, 8, 32, 128])),
        "model.lora.alpha": draw(st.integers(1, 64)),
        "model.lora.target_modules": draw(st.sampled_from([["all-linear"], ["q_proj", "v_proj"]])),
        "model.gradient_checkpointing": draw(st.booleans()),
        "model.activation_offload": draw(st.booleans()),
        "actor.strategy": draw(st.sampled_from(["fsdp", "fsdp2"])),
        "actor.ppo_mini_batch_size": draw(st.integers(1, 256)),
        "actor.use_dynamic_bsz": dynamic,
        "actor.ppo_max_token_len_per_gpu": draw(st.integers(1024, 65536)),
        "actor.ulysses_sequence_parallel_size": draw(st.sampled_from([1, 2, 4])),
        "actor.fsdp_size": draw(st.sampled_from([-1, 2, 8])),
        "actor.param_offload": draw(st.booleans()),
        "actor.optimizer_offload": draw(st.booleans()),
        "actor.offload_policy": draw(st.booleans()),
        "critic.offload_policy": draw(st.booleans()),
        "actor.use_torch_compile": draw(st.booleans()),
        "actor.model_dtype": draw(st.sampled_from(["fp32", "bf16"])),
        "ref.model_dtype": draw(st.sampled_from(["fp32", "bf16"])),
        "model.use_fused_kernels": draw(st.booleans()),
        "actor.lr": draw(st.floats(1e-8, 1e-3)),
        "actor.lr_warmup_steps": draw(st.integers(0, 100)),
        "actor.use_kl_loss": draw(st.booleans()),
        "actor.loss_agg_mode": draw(st.sampled_from(["token-mean", "seq-mean-token-sum"])),
        "ref.param_offload": draw(st.booleans()),
        "ref.log_prob_use_dynamic_bsz": dynamic,
        "rollout.n": draw(st.integers(1, 16)),
        "rollout.tensor_model_parallel_size": draw(st.sampled_from([1, 2, 4])),
        "rollout.gpu_memory_utilization": draw(st.floats(0.1, 0.95)),
        "rollout.max_num_seqs": draw(st.integers(1, 1024)),
        "rollout.max_num_batched_tokens": draw(st.integers(256, 65536)),
        "rollout.max_model_len": draw(st.none() | st.integers(1024, 32768)),
        "rollout.enforce_eager": draw(st.booleans()),
        "rollout.layered_summon": draw(st.booleans()),
        "rollout.load_format": draw(st.sampled_from(["dummy", "safetensors", "auto"])),
        "rollout.log_prob_use_dynamic_bsz": dynamic,
        "rollout.agent_num_workers": draw(st.integers(1, 16)),
        "critic.enable": draw(st.none() | st.booleans()),
        "critic.ppo_mini_batch_size": draw(optional_int),
        "critic.forward_micro_batch_size_per_gpu": draw(optional_int),
        "critic.ppo_max_token_len_per_gpu": draw(st.integers(1024, 65536)),
        "algorithm.adv_estimator": draw(st.sampled_from(["grpo", "gae", "rloo", "reinforce_plus_plus"])),
        "algorithm.use_kl_in_reward": draw(st.booleans()),
        "trainer.experiment_name": draw(names),
        "trainer.output_dir": draw(names),
        "trainer.total_training_steps": draw(optional_int),
        "trainer.max_checkpoints_to_keep": draw(optional_int),
        "reward.function": draw(st.sampled_from(["", "rewards/math.py:score"])),
        "trainer.logger": draw(st.sampled_from([("console",), ("console", "wandb"), ("tensorboard", "mlflow"), ()])),
    }
    plan = preset_plan({k: v for k, v in overrides.items() if v is not None})
    micro, log_prob_micro = draw(st.integers(1, 32)), draw(st.integers(1, 32))
    use_global = draw(st.booleans())
    actor = attrs.evolve(plan.actor, ppo_micro_batch_size=micro if use_global else None,
                         ppo_micro_batch_size_per_gpu=None if use_global else micro)
    rollout = attrs.evolve(plan.rollout, log_prob_micro_batch_size=log_prob_micro if use_global else None,
                           log_prob_micro_batch_size_per_gpu=None if use_global else log_prob_micro)
    plan = plan.evolve(actor=actor, rollout=rollout,
                       passthrough=draw(st.sampled_from([{}, {"trainer.critic_warmup": "0",
                                                              "+actor_rollout_ref.model.override_config.x": "1"}])))
    return plan.evolve(cluster=attrs.evolve(plan.cluster, nodes=draw(st.integers(1, 4)),
                                            gpus_per_node=draw(st.sampled_from([1, 2, 4, 8]))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema_plans(), st.sampled_from(["script", "overrides"]))
def test_render_then_import_gives_back_the_plan_verl_runs(plan, fmt):
    if fmt == "overrides" and any("\n" in s or "\r" in s for s in (plan.trainer.experiment_name,
                                                                    plan.trainer.output_dir, *plan.data.train_files)):
        with pytest.raises(PlanError):
            render_plan(plan, "verl", fmt)
        return
    back = reimport(render_plan(plan, "verl", fmt), plan)
    assert plan_to_dict(without_inferred_range(back)) == plan_to_dict(plan_as_verl_runs_it(plan))


@pytest.mark.parametrize(("verl", "level"), [("0.5.0", 1), ("0.6.1", 2)])
def test_a_plan_rendered_for_a_release_runs_at_the_sleep_level_that_release_picks(verl, level):
    """verl up to 0.5 calls sleep(level=1) whatever the plan says; 0.6+ on vLLM 0.8.5+ sleeps at level 2."""
    plan = preset_plan({"rollout.sleep_level": 3 - level})
    plan = plan.evolve(stack=attrs.evolve(plan.stack, verl=verl, vllm=None))
    assert plan_as_verl_runs_it(plan).rollout.sleep_level == level


def test_render_fixes_what_verl_defaults_badly():
    plan = preset_plan({"model.lora.rank": 32, "rollout.load_format": "dummy"})
    plan = plan.evolve(rollout=attrs.evolve(plan.rollout, max_model_len=None))
    script = render_plan(plan, "verl")
    assert "actor_rollout_ref.rollout.max_model_len=1536 " in script
    assert "actor_rollout_ref.rollout.load_format=safetensors " in script
    assert "ppo_micro_batch_size_per_gpu=2" in script and "actor.ppo_micro_batch_size=" not in script


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["qwen2.5-0.5b", "qwen2.5-7b"]), st.sampled_from([(1, 4), (1, 8), (2, 8)]),
       st.sampled_from([256, 1024]), st.sampled_from([512, 2048]), st.sampled_from([32, 128]),
       st.integers(2, 8), st.sampled_from(["grpo", "gae"]))
def test_solver_plans_round_trip(preset, nodes_gpus, prompt_len, response_len, train_batch_size, n, algorithm):
    model = resolve_model(preset)
    nodes, gpus_per_node = nodes_gpus
    request = SolveRequest(
        model=ModelSection(name=model.name, arch=model.arch, path=model.path),
        cluster=attrs.evolve(preset_plan().cluster, nodes=nodes, gpus_per_node=gpus_per_node),
        prompt_len=prompt_len, response_len=response_len, train_batch_size=train_batch_size, n=n,
        algorithm=algorithm)
    plan = solve(request).plan
    if plan is not None:
        assert plan_to_dict(without_inferred_range(reimport(render_plan(plan, "verl"), plan))) == plan_to_dict(
            plan_as_verl_runs_it(plan))


def bash_arguments(script: str) -> list[str]:
    """The argv bash itself hands to `python3` when it runs the script."""
    printer = 'python3() { printf "%s\\0" "$@"; }; source /dev/stdin'
    output = subprocess.run(["bash", "-c", printer], input=script.encode(), capture_output=True, check=True,
                            env={"PATH": "/usr/bin:/bin", "RAY_ADDRESS": "http://head:8265"})
    return output.stdout.decode().split("\0")[:-1]


hostile = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"),
                  min_size=1, max_size=40) | st.sampled_from(
    ["$(touch /tmp/rlplan-pwned)", "`id`", "a; rm -rf ~", "it's \"q\"", "${HOME}", "x\ny", "-rf", "a\\", "*", "~/m"])


@needs_bash
@settings(max_examples=40, deadline=None)
@given(hostile)
def test_hostile_strings_arrive_as_one_inert_word(text):
    plan = preset_plan({"trainer.experiment_name": text}).evolve(
        model=attrs.evolve(preset_plan().model, path=text))
    script = render_plan(plan, "verl")
    subprocess.run(["bash", "-n"], input=script.encode(), check=True)
    arguments = bash_arguments(script)
    assert f"trainer.experiment_name={format_value(text)}" in arguments
    assert f"actor_rollout_ref.model.path={format_value(text)}" in arguments
    back = reimport(script, plan, local_config=TINY_CONFIG)
    assert back.trainer.experiment_name == text and back.model.path == text


@needs_bash
@settings(max_examples=20, deadline=None)
@given(hostile)
def test_launch_scripts_quote_the_plan_path(path):
    plan = preset_plan({"trainer.experiment_name": path})
    for target in ("slurm", "ray-job"):
        script = render_plan(plan, target, plan_file=path)
        subprocess.run(["bash", "-n"], input=script.encode(), check=True)
        assert "rlplan run" in script


def test_slurm_starts_head_and_workers_and_runs_the_plan():
    plan = preset_plan().evolve(cluster=attrs.evolve(preset_plan().cluster, nodes=4, gpus_per_node=8))
    script = render_plan(plan, "slurm", plan_file="plans/my plan.toml")
    assert "#SBATCH --nodes=4" in script and "#SBATCH --gpus-per-node=8" in script
    assert "ray start --head" in script and 'ray start --address="$RAY_ADDRESS"' in script
    assert "PLAN='plans/my plan.toml'" in script and 'rlplan run "$PLAN"' in script


@needs_bash
def test_ray_job_entrypoint_survives_rays_own_shell():
    script = render_plan(preset_plan(), "ray-job", plan_file="/runs/a b/plan 1.toml")
    words = bash_arguments(script.replace("ray job submit", "python3"))
    assert words[words.index("--working-dir") + 1] == "/runs/a b"
    entrypoint = " ".join(words[words.index("--") + 1 :])
    assert bash_arguments(entrypoint.replace("rlplan run", "python3")) == ["plan 1.toml"]


@pytest.mark.parametrize(("target", "fmt", "field"), [("slurm", "overrides", "--format"), ("k8s", "script", "--target"),
                                                     ("verl", "yaml", "--format")])
def test_bad_target_or_format_is_a_plan_error(target, fmt, field):
    with pytest.raises(PlanError) as error:
        render_plan(preset_plan(), target, fmt)
    assert error.value.field == field


def test_leave_one_out_grpo_has_no_verl_form():
    with pytest.raises(PlanError) as error:
        render_plan(apply_knobs(preset_plan(), {"algorithm.grpo_leave_one_out": True}), "verl")
    assert error.value.field == "algorithm.grpo_leave_one_out"


@pytest.mark.parametrize("role", ["actor", "ref", "critic"])
def test_fp32_compute_has_no_verl_form_and_bf16_renders_as_verls_fsdp_dtype(role):
    # verl 0.9's FSDPEngineConfig asserts dtype in (bfloat16, float16); fp32 compute is the CPU runtime's alone.
    with pytest.raises(PlanError) as error:
        render_plan(apply_knobs(preset_plan(PPO), {f"{role}.compute_dtype": "float32"}), "verl")
    assert error.value.field == f"{role}.compute_dtype"
    key = {"actor": "actor_rollout_ref.actor.fsdp_config", "ref": "actor_rollout_ref.ref.fsdp_config",
           "critic": "critic.fsdp"}[role]
    assert f"{key}.dtype=bfloat16 " in render_plan(preset_plan(PPO), "verl")


PPO = {"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 2}


def test_a_plan_without_a_critic_renders_no_critic_block_and_a_ppo_plan_renders_it_whole():
    grpo = render_plan(preset_plan(), "verl")
    assert not [line for line in grpo.splitlines() if line.strip().startswith("critic.")]
    ppo = render_plan(preset_plan(PPO), "verl")
    assert "critic.ppo_micro_batch_size_per_gpu=2 " in ppo and "critic.optim.lr=" in ppo
    assert "critic.model.path=" in ppo and "critic.strategy=" in ppo


@pytest.mark.parametrize(("value", "text"), [
    ("~/data/x.parquet", "'~/data/x.parquet'"),  # Hydra reads `~` only as the delete prefix of a key
    ("123", "'123'"), ("true", "'true'"), ("a b", "'a b'"), ("${x}", "'\\${x}'"), ("it's", "'it\\'s'"),
    ("end\\", "'end\\\\'"), ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B"), (1e-06, "1e-06"), (None, "null"),
    (["a", "b c"], "[a,'b c']"),
])
def test_hydra_values_are_written_as_hydra_reads_them(value, text):
    assert format_value(value) == text


def _on_verl(verl: str, overrides: dict) -> Plan:
    """A plan for that verl, as `solve --verl-version` pins it (its defaults), with `overrides` on top."""
    return make_plan(overrides={"model.path": "Qwen/Qwen2.5-7B-Instruct",
                                **solve_pins(DEFAULT_STACK, verl, None, None), **overrides})


@pytest.mark.parametrize(("verl", "spelling"), [
    ("0.3.0.post1", "critic.model.fsdp_config"), ("0.7.1", "critic.model.fsdp_config"), ("0.8.0", "critic.fsdp"),
    ("0.9.1", "critic.fsdp")])
def test_render_writes_the_critic_offload_in_the_target_releases_spelling(verl, spelling):
    """verl 0.3-0.7 spell the critic's FSDP offload critic.model.fsdp_config.*, 0.8 on critic.fsdp.*."""
    overrides = render_plan(_on_verl(verl, {"algorithm.adv_estimator": "gae", "critic.param_offload": True,
                                            "critic.optimizer_offload": True}), "verl", "overrides").split("\n")
    assert f"{spelling}.param_offload=true" in overrides and f"{spelling}.optimizer_offload=true" in overrides
    other = "critic.fsdp." if spelling != "critic.fsdp" else "critic.model.fsdp_config."
    assert not [line for line in overrides if line.startswith(other)]


def test_render_refuses_a_knob_the_target_lacks_naming_the_release_that_added_it_and_its_spelling_there():
    with pytest.raises(PlanError) as raised:
        render_plan(_on_verl("0.3.0.post1", {"algorithm.adv_estimator": "gae", "critic.offload_policy": True}),
                    "verl", "overrides")
    assert raised.value.field == "critic.offload_policy"
    assert "verl added it in 0.4.0, spelled critic.model.fsdp_config.offload_policy" in raised.value.message
    with pytest.raises(PlanError) as raised:
        render_plan(_on_verl("0.4.0", {"actor.entropy_from_logits_with_chunking": True}), "verl", "overrides")
    assert "added it in 0.4.1, spelled actor_rollout_ref.actor.entropy_from_logits_with_chunking" in str(
        raised.value.message)


def test_the_reward_function_renders_in_the_target_releases_spelling():
    assert "\nreward.custom_reward_function.path=r.py" in "\n" + render_plan(
        _on_verl("0.7.1", {"reward.function": "r.py:score"}), "verl", "overrides")
    old = render_plan(_on_verl("0.7.0", {"reward.function": "r.py:score"}), "verl", "overrides").split("\n")
    assert "custom_reward_function.path=r.py" in old and "custom_reward_function.name=score" in old
    assert not [line for line in old if line.startswith("reward.")]


def test_an_older_spelling_imports_as_the_same_knob_and_shows_the_older_verl():
    script = ("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=gae "
              "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct critic.model.fsdp_config.param_offload=True "
              "actor_rollout_ref.rollout.name=vllm")
    result = import_verl_script(script, gpu=resolve_gpu("h100-80g"), host_memory_gib=1000, env={},
                                local_config_reader=lambda path: None)
    assert result.plan.critic.param_offload
    assert "critic.model.fsdp_config.param_offload" not in result.plan.passthrough
    # The old spelling dates the script before 0.8.0; nothing else in it is dated.
    assert result.plan.stack.verl == "0.7.1"


def test_every_estimator_of_a_release_renders_for_it_and_one_it_lacks_is_refused_naming_the_release():
    from rlplan.planner import verl_inventory

    for estimator in verl_inventory.estimators_of("0.5.0"):
        assert f"algorithm.adv_estimator={estimator}" in render_plan(
            _on_verl("0.5.0", {"algorithm.adv_estimator": estimator}), "verl", "overrides")
    with pytest.raises(PlanError) as raised:
        render_plan(_on_verl("0.4.1", {"algorithm.adv_estimator": "gpg"}), "verl", "overrides")
    assert raised.value.field == "algorithm.adv_estimator" and "added it in 0.5.0" in raised.value.message


def test_a_rollout_pool_renders_as_the_recipes_keys_and_a_colocated_plan_writes_none():
    import attrs

    from rlplan.planner.plan import RolloutPool
    from rlplan.planner.render import verl_overrides
    from tests.planner.plans import make_plan

    plan = make_plan(overrides={"model.path": "Qwen/Qwen2.5-7B-Instruct"})
    assert not [o for o in verl_overrides(plan) if o.startswith("rollout.n")]
    apart = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=2, gpus_per_node=4)))
    overrides = verl_overrides(apart)
    assert "rollout.nnodes=2" in overrides and "rollout.n_gpus_per_node=4" in overrides
    assert "data.train_batch_size=64" in overrides
    streamed = apart.evolve(rollout=attrs.evolve(apart.rollout, pool=RolloutPool(nodes=2, gpus_per_node=4,
                                                                                 streams=True)))
    assert "data.train_batch_size=0" in verl_overrides(streamed)


def test_a_split_plan_renders_the_recipe_that_runs_it_where_its_verl_keeps_that_recipe():
    import attrs

    from rlplan.planner.plan import RolloutPool
    from rlplan.planner.render import render_plan
    from rlplan.planner.stack import StackSection
    from tests.planner.plans import make_plan

    plan = make_plan(overrides={"model.path": "Qwen/Qwen2.5-7B-Instruct"})
    assert "python3 -m verl.trainer.main_ppo \\\n" in render_plan(plan, "verl")
    apart = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=4)))
    assert "python3 -m verl.experimental.one_step_off_policy.main_ppo \\\n" in render_plan(apart, "verl")
    old = apart.evolve(stack=StackSection(verl="0.7.0"))
    assert "python3 -m recipe.one_step_off_policy.main_ppo \\\n" in render_plan(old, "verl")
    streamed = old.evolve(rollout=attrs.evolve(old.rollout, pool=RolloutPool(nodes=1, gpus_per_node=4, streams=True)))
    assert "python3 -m recipe.fully_async_policy.fully_async_main \\\n" in render_plan(streamed, "verl")


def test_a_trtllm_plan_renders_for_a_verl_that_has_the_rollout_and_is_refused_naming_the_release_before():
    rendered = render_plan(_on_verl("0.8.0", {"rollout.name": "trtllm"}), "verl", "overrides")
    assert "actor_rollout_ref.rollout.name=trtllm" in rendered
    with pytest.raises(PlanError) as raised:
        render_plan(_on_verl("0.7.0", {"rollout.name": "trtllm"}), "verl", "overrides")
    assert raised.value.field == "rollout.name" and "added it in 0.7.1" in raised.value.message
