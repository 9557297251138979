"""benchmarks/verl_shipped_scripts.py on a checkout made here: which scripts it counts as launch scripts, the
column each lands in, and its guard that counts any process the import tries to start."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.repo_scripts import load_script

BENCHMARK = load_script("benchmarks/verl_shipped_scripts.py")
RUN = "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct {}\n"


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "verl").mkdir()
    scripts = {
        "examples/ok.sh": RUN.format(
            "algorithm.adv_estimator=grpo actor_rollout_ref.rollout.name=vllm data.train_batch_size=64 "
            "actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 "
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 "
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.n=4"),
        "examples/needs_gpus.sh": RUN.format("trainer.n_gpus_per_node=$UNSET_GPUS"),
        "examples/bad_rule.sh": RUN.format("algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=1"),
        "examples/placeholder.sh": RUN.replace("Qwen/Qwen2.5-0.5B-Instruct", "/YOUR_MODEL_PATH").format(""),
        "recipe/x/run.sh": RUN.replace("verl.trainer.main_ppo", "recipe.x.main_x").format(""),
        "examples/sft.sh": "torchrun -m verl.trainer.fsdp_sft_trainer model.partial_pretrain=x\n",
        "examples/prepare.sh": "python3 examples/data_preprocess/gsm8k.py\n",
    }
    for name, text in scripts.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_launch_scripts_are_the_rl_trainers_under_examples_and_recipe(checkout):
    found = {str(path.relative_to(checkout)) for path in BENCHMARK.launch_scripts(checkout)}
    assert found == {"examples/ok.sh", "examples/needs_gpus.sh", "examples/bad_rule.sh", "examples/placeholder.sh",
                     "recipe/x/run.sh"}


def test_each_script_lands_in_the_column_of_what_import_and_validate_said(checkout):
    outcomes, attempts = BENCHMARK.run_checkout(checkout)
    column = {outcome.script: outcome.column for outcome in outcomes}
    assert column["examples/ok.sh"] in ("fits", "oom")
    assert column["examples/needs_gpus.sh"] == "input"
    assert column["examples/bad_rule.sh"] == "rule"
    assert column["examples/placeholder.sh"] == "shipped"
    assert attempts == []
    table = BENCHMARK.table({checkout.name: (outcomes, attempts)})
    assert f"| {checkout.name} | 5 |" in table


def test_a_script_that_cannot_run_as_shipped_counts_as_a_verdict_and_the_page_section_says_how_it_was_made(checkout):
    outcomes, attempts = BENCHMARK.run_checkout(checkout)
    count = {column: sum(o.column == column for o in outcomes) for column in ("fits", "oom", "shipped")}
    verdicts = sum(count.values())
    assert count["shipped"] == 1
    page = BENCHMARK.section({checkout.name: (outcomes, attempts)}, [checkout])
    assert page.startswith(BENCHMARK.SECTION_HEADING)
    assert f"| {checkout.name} | 5 | {count['fits']} | {count['oom']} | 1 | {verdicts} ({100 * verdicts / 5:.0f} %) |" \
        in page
    assert "no verl/version/version" in page and "cannot run as shipped" in page


def test_the_guard_refuses_and_counts_every_way_to_start_a_process():
    attempts: list[str] = []
    with BENCHMARK.no_commands(attempts):
        for start in (lambda: subprocess.run(["true"]), lambda: os.system("true")):
            with pytest.raises(BENCHMARK.CommandAttempted):
                start()
    assert len(attempts) == 2
    assert subprocess.run(["true"]).returncode == 0  # restored
