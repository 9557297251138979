"""Stack inference (planner/stack_inference.py): what a script shows of the verl and vLLM it was written for, and
where the verdict differs across the range it leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlplan.planner.presets import resolve_gpu
from rlplan.planner.stack import DEFAULT_VERL
from rlplan.planner.stack_inference import infer_stack, script_exports, span_text, verdicts_across
from rlplan.planner.verl_import import import_verl_script

H100 = resolve_gpu("h100-80g")
SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "verl_scripts"
BASE = ("algorithm.adv_estimator=grpo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
        "actor_rollout_ref.rollout.name=vllm ")


def load(text: str, versions=(None, None, None), env=None):
    return import_verl_script(text, gpu=H100, host_memory_gib=2048.0, env=env or {}, local_config_reader=lambda p: None,
                              environment={}, versions=versions)


def command(*overrides: str, exports: str = "") -> str:
    return exports + "python3 -m verl.trainer.main_ppo " + BASE + " ".join(overrides) + "\n"


def test_a_commented_out_export_does_not_count():
    text = "# export VLLM_USE_V1=0\nexport FOO=1 # VLLM_ATTENTION_BACKEND=XFORMERS\n" + command()
    assert script_exports(text) == {"FOO": "1"}
    assert load(text).plan.stack.vllm_engine is None


def test_an_xformers_export_selects_v0_on_a_verl_that_installs_a_vllm_with_it():
    result = load(command(exports="VLLM_ATTENTION_BACKEND=XFORMERS "))  # a command prefix, not an export
    stack = result.plan.stack
    assert (stack.vllm_engine, stack.vllm, stack.verl) == ("v0", "0.8.5", "0.8.0")
    assert any("VLLM_ATTENTION_BACKEND=XFORMERS" in w and "judged as verl 0.3.0.post1-0.8.0" in w
               for w in result.warnings)
    # --verl-version keeps the V0 choice; --vllm-version to a vLLM without V0 drops it.
    flagged = load(command(exports="export VLLM_USE_V1=0\n"), ("0.4.1", None, None)).plan.stack
    assert (flagged.verl, flagged.vllm_engine) == ("0.4.1", "v0")
    assert load(command(exports="export VLLM_USE_V1=0\n"), (None, "0.11.0", None)).plan.stack.vllm_engine is None


def test_an_estimator_only_newer_releases_register_dates_the_script():
    inferred = infer_stack({"algorithm.adv_estimator": "gpg"}, command(), "fsdp", "vllm")
    assert inferred is not None
    assert (inferred.stack.verl_oldest, inferred.stack.verl) == ("0.5.0", DEFAULT_VERL)
    assert "`algorithm.adv_estimator=gpg`: the estimator arrived in 0.5.0" in inferred.reasons[0]


def test_an_older_spelling_dates_the_script_as_written_not_as_read():
    result = load(command("critic.model.fsdp_config.param_offload=True"))
    assert result.plan.critic.param_offload  # read as critic.fsdp.param_offload
    assert (result.plan.stack.verl_oldest, result.plan.stack.verl) == ("0.3.0.post1", "0.7.1")
    assert any("`critic.model.fsdp_config.param_offload` was removed in 0.8.0" in w for w in result.warnings)


def test_contradicting_evidence_is_judged_on_the_releases_that_agree_with_most_and_said():
    # A script from verl's main between releases: rollout.mode=sync (refused from 0.7.0) beside two keys 0.7.1
    # added. The releases that agree with the most are 0.7.1 on; the contradiction is named.
    inferred = infer_stack({"actor_rollout_ref.rollout.mode": "sync",
                            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": "512",
                            "actor_rollout_ref.actor.fsdp_config.seed": "1"}, command(), "fsdp", "vllm")
    assert inferred is not None
    assert (inferred.stack.verl_oldest, inferred.stack.verl) == ("0.7.1", DEFAULT_VERL)
    assert "these do not hold on verl 0.7.1-0.9.1: `actor_rollout_ref.rollout.mode=sync`" in inferred.reasons[1]


def test_the_version_flag_overrules_the_inference_and_leaves_no_range():
    text = command("actor_rollout_ref.rollout.multi_stage_wake_up=true")
    assert load(text).plan.stack.verl_oldest == "0.4.1"
    flagged = load(text, ("0.6.0", None, None)).plan.stack
    assert (flagged.verl, flagged.verl_oldest) == ("0.6.0", None)


def test_verls_megatron_examples_with_grad_offload_are_judged_on_the_releases_that_have_it_and_validate():
    result = load((SCRIPTS / "megatron_moe_qwen3_30b_a3b.sh").read_text(),
                  env={"HOME": "/home/u", "TEST_FILE": "/data/aime-2024.parquet"})
    stack = result.plan.stack
    assert (stack.verl_oldest, stack.verl) == ("0.5.0", "0.9.0")
    assert any("`actor_rollout_ref.actor.megatron.grad_offload` arrived in 0.4.0 and was removed in 0.9.1" in w
               for w in result.warnings)
    from rlplan.planner.rules import check_plan

    assert "megatron_grad_offload_is_not_in_verl_0_9" not in {v.rule for v in check_plan(result.plan).errors}
    # Megatron's spelling of the context override is read: the model's context is the script's prompt + response.
    assert result.plan.model.arch.max_position_embeddings == 10240


def test_where_the_rules_judge_the_range_apart_both_verdicts_are_given():
    # 60 x 4 / 8 = 30 sequences per GPU in log-prob micro batches of 7: the legacy worker (<= 0.7.1) runs a short
    # last one; the engine worker (0.8.0 on) asserts.
    text = command("data.train_batch_size=64", "actor_rollout_ref.rollout.n=4",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                   "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=7",
                   "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
                   "actor_rollout_ref.rollout.multi_stage_wake_up=true", "trainer.n_gpus_per_node=8")
    lines = verdicts_across(load(text).plan)
    assert len(lines) >= 1
    assert "on 0.4.1-0.7.1 valid" in lines[0] and "on 0.8.0-0.9.1 refused by log_prob_micro_batch_divides_batch" \
        in lines[0]


@pytest.mark.parametrize(("version_file", "release"), [("0.4.1\n", "0.4.1"), ("0.7.0.dev", "0.7.0"),
                                                       ("0.8.0.dev\n", "0.8.0"), ("0.3.0.post1", "0.3.0.post1")])
def test_the_verl_a_checkout_runs_decides_the_release_over_the_keys(version_file, release):
    # rollout.mode=sync is refused from 0.7.0 on: the keys alone say <= 0.6.1, the checkout's version decides.
    inferred = infer_stack({"actor_rollout_ref.rollout.mode": "sync"}, command(), "fsdp", "vllm", version_file)
    assert inferred is not None
    assert (inferred.stack.verl, inferred.stack.verl_oldest) == (release, None)
    assert f"verl/version/version says {version_file.strip()}" in inferred.reasons[0]


@pytest.mark.parametrize("version_file", [None, "", "0.12.0.dev", "not a version"])
def test_a_folder_without_a_known_verl_release_is_no_evidence(version_file):
    assert infer_stack({"algorithm.adv_estimator": "grpo"}, command(), "fsdp", "vllm", version_file) is None


def test_an_import_from_the_root_of_a_verl_checkout_is_judged_on_its_release(tmp_path):
    # The agent loop splits the batch over its workers from 0.7.0 on (0.5.0-0.6.1 only for rollout.mode=async):
    # 10 x 5 = 50 sequences over 8 workers asserts on 0.9.1, runs on a 0.6.1 checkout's sync rollout.
    (tmp_path / "verl" / "version").mkdir(parents=True)
    (tmp_path / "verl" / "version" / "version").write_text("0.6.1\n")
    from rlplan.planner.rules import check_plan
    from rlplan.planner.verl_import import ScriptContext

    text = command("data.train_batch_size=10", "actor_rollout_ref.rollout.n=5",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=10", "trainer.n_gpus_per_node=1")

    def read(path: str) -> str | None:
        return Path(path).read_text() if Path(path).is_file() else None

    here = import_verl_script(text, gpu=H100, host_memory_gib=2048.0, env={}, local_config_reader=lambda p: None,
                              environment={}, context=ScriptContext(cwd=str(tmp_path), read_text=read))
    assert here.plan.stack.verl == "0.6.1"
    assert "agent_loop_chunks_evenly" not in {v.rule for v in check_plan(here.plan).errors}
    elsewhere = load(text).plan
    assert elsewhere.stack.verl == DEFAULT_VERL
    assert "agent_loop_chunks_evenly" in {v.rule for v in check_plan(elsewhere).errors}


def _verl_tree(root: Path, version: str, trainer_yaml: str) -> None:
    (root / "verl" / "version").mkdir(parents=True)
    (root / "verl" / "version" / "version").write_text(version + "\n")
    (root / "verl" / "trainer" / "config").mkdir(parents=True)
    (root / "verl" / "trainer" / "config" / "ppo_trainer.yaml").write_text(trainer_yaml)


@pytest.mark.parametrize(("version", "legacy_default", "engine_worker"),
                         [("0.8.0.dev", "auto", False), ("0.8.0.dev", "disable", True), ("0.8.0", "auto", True),
                          ("0.7.0.dev", "auto", False)])
def test_a_tree_between_releases_is_judged_with_its_own_worker_switch(tmp_path, version, legacy_default,
                                                                       engine_worker):
    """verl's main between v0.7.x and v0.8.0 (version text 0.8.0.dev) still defaulted trainer.use_legacy_worker_impl
    to auto, the legacy worker, which turns the deprecated global micro-batch keys into per-GPU ones; v0.8.0's engine
    worker ignores them (rule deprecated_global_micro_batch_keys refuses). A release's own tree adds nothing."""
    from rlplan.planner.rules import check_plan
    from rlplan.planner.verl_import import ScriptContext

    _verl_tree(tmp_path, version, f"trainer:\n  use_legacy_worker_impl: {legacy_default}\n  nnodes: 1\n")
    text = command("data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size=16",
                   "trainer.n_gpus_per_node=1")

    def read(path: str) -> str | None:
        return Path(path).read_text() if Path(path).is_file() else None

    result = import_verl_script(text, gpu=H100, host_memory_gib=2048.0, env={}, local_config_reader=lambda p: None,
                                environment={}, context=ScriptContext(cwd=str(tmp_path), read_text=read))
    assert result.plan.stack.verl == version.removesuffix(".dev")
    # Kept only where it decides the worker: the v0.7.0 tag's tree also says .dev, and auto is 0.7.0's own default.
    from_tree = result.plan.passthrough.get("trainer.use_legacy_worker_impl")
    assert from_tree == (legacy_default if version == "0.8.0.dev" and legacy_default == "auto" else None)
    assert "trainer.nnodes" not in result.plan.passthrough  # only the switches behaviours read
    refused = "deprecated_global_micro_batch_keys" in {v.rule for v in check_plan(result.plan).errors}
    assert refused == engine_worker


def test_a_script_without_dated_keys_shows_nothing():
    assert infer_stack({"algorithm.adv_estimator": "grpo"}, command(), "fsdp", "vllm") is None


@pytest.mark.parametrize(("releases", "text"), [(["0.4.0", "0.4.1", "0.5.0"], "0.4.0-0.5.0"),
                                                (["0.9.1"], "0.9.1"), (["0.4.0", "0.7.0"], "0.4.0, 0.7.0")])
def test_a_span_of_consecutive_releases_reads_as_a_range(releases, text):
    assert span_text(releases) == text


def test_what_the_trainer_needs_dates_the_script_to_the_releases_that_have_it():
    from rlplan.planner.stack import SPIN_SPPO_RECIPES, VERL_RELEASES

    inferred = infer_stack({}, "", "fsdp", "vllm", needs=(SPIN_SPPO_RECIPES,))
    assert inferred is not None and SPIN_SPPO_RECIPES.holds_for(inferred.stack.verl)
    assert inferred.stack.verl_oldest == next(r for r in VERL_RELEASES if SPIN_SPPO_RECIPES.holds_for(r))
    assert infer_stack({}, "", "fsdp", "vllm") is None  # nothing shown, nothing judged
    pinned = infer_stack({}, "", "fsdp", "vllm", installed="0.5.0", needs=(SPIN_SPPO_RECIPES,))
    assert pinned is not None and pinned.stack.verl == "0.5.0"


def test_a_trtllm_rollout_dates_the_script_to_the_releases_that_build_it():
    inferred = infer_stack({"actor_rollout_ref.rollout.name": "trtllm"}, command(), "fsdp", "trtllm")
    assert inferred is not None
    assert (inferred.stack.verl_oldest, inferred.stack.verl) == ("0.7.1", DEFAULT_VERL)
    assert "`actor_rollout_ref.rollout.name=trtllm`: verl builds that rollout from 0.7.1" in inferred.reasons[0]
    assert infer_stack({"actor_rollout_ref.rollout.name": "sglang"}, command(), "fsdp", "sglang") is None


def test_a_range_whose_newer_vllm_refuses_to_start_says_so():
    """verl 0.5.0's vLLM (0.8.5) sizes its pool from the whole GPU and starts; verl 0.6.1's (0.11.0) refuses to
    start below util x GPU free: the range's memory verdict names the refusal on the release that has it."""
    from rlplan.planner.stack import StackSection
    from tests.planner.memory.test_rollout_versions import _one_gpu_full_tuning

    plan = _one_gpu_full_tuning(**{"rollout.gpu_memory_utilization": 0.8, "model.lora.rank": 32}).evolve(
        stack=StackSection(verl="0.6.1", verl_oldest="0.5.0"))
    [line] = verdicts_across(plan)
    assert "on verl 0.5.0 it fits" in line
    assert "on verl 0.6.1 it does not fit and vLLM 0.11.0 refuses to start" in line
