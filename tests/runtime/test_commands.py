"""`rlplan run` on bad input: exit 2, one paragraph naming the field, nothing that looks like a checkpoint."""

from __future__ import annotations

import attrs
import pytest

pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rlplan.runtime.tiny import ensure_tiny_model, write_toy_dataset

    root = tmp_path_factory.mktemp("commands")
    model_dir = ensure_tiny_model(root / "models")
    train_file, _ = write_toy_dataset(root / "data" / "train.parquet", 16)
    return root, model_dir, train_file


def _write_plan(path, plan) -> str:
    from rlplan.planner.planfile import plan_to_toml

    path.write_text(plan_to_toml(plan))
    return str(path)


def _run_bad(tmp_path, capsys, plan) -> str:
    from rlplan.planner.commands.commands_io import ExitCode
    from rlplan.runtime.commands import run_command

    output_dir = tmp_path / "out"
    code = run_command(_write_plan(tmp_path / "plan.toml", plan), resume=False, address=None, output_dir=str(output_dir), max_steps=None)
    printed = capsys.readouterr().out
    assert code == ExitCode.BAD_INPUT
    assert "Traceback" not in printed
    written = [p.name for p in output_dir.rglob("*")] if output_dir.exists() else []
    assert not any(name.startswith(("step-", ".tmp-step-")) or name == "checkpoints" for name in written), written
    return " ".join(printed.split())


def _plan(workspace, **changes):
    from rlplan.runtime.demo_workload import demo_plan

    root, model_dir, train_file = workspace
    plan = demo_plan(model_dir, train_file, root / "unused", steps=2)
    return plan.evolve(**changes) if changes else plan


def test_missing_model_directory(workspace, tmp_path, capsys):
    plan = _plan(workspace)
    plan = plan.evolve(model=attrs.evolve(plan.model, path=str(tmp_path / "no-such-model")))
    message = _run_bad(tmp_path, capsys, plan)
    assert "model.path" in message and "no-such-model" in message and "Fix:" in message


def test_offload_on_a_machine_without_an_accelerator(workspace, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the check is for machines without an accelerator; this one has CUDA")
    plan = _plan(workspace)
    plan = plan.evolve(actor=attrs.evolve(plan.actor, param_offload=True))
    message = _run_bad(tmp_path, capsys, plan)
    assert "actor.param_offload" in message and "set actor.param_offload = false" in message


def test_a_critic_split_unlike_the_actors_is_refused_before_anything_starts(workspace, tmp_path, capsys):
    plan = _plan(workspace)
    plan = plan.evolve(
        algorithm=attrs.evolve(plan.algorithm, adv_estimator="gae"),
        actor=attrs.evolve(plan.actor, ulysses_sequence_parallel_size=2),
        critic=attrs.evolve(plan.critic, enable=True, ulysses_sequence_parallel_size=1),
    )
    message = _run_bad(tmp_path, capsys, plan)
    assert "critic.ulysses_sequence_parallel_size" in message and "set critic.ulysses_sequence_parallel_size = 2" in message


def test_unknown_reward_function(workspace, tmp_path, capsys):
    pytest.importorskip("pyarrow")
    plan = _plan(workspace)
    plan = plan.evolve(reward=attrs.evolve(plan.reward, function="no_such_module_rlplan:score"))
    message = _run_bad(tmp_path, capsys, plan)
    assert "reward.function" in message and "no_such_module_rlplan" in message


def test_a_tracker_whose_library_is_missing_is_refused_before_the_run_starts(workspace, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets without the package
    plan = _plan(workspace)
    plan = plan.evolve(trainer=attrs.evolve(plan.trainer, logger=("console", "wandb")))
    message = _run_bad(tmp_path, capsys, plan)
    assert "trainer.logger" in message and "wandb package is not installed" in message
    assert "pip install -e '.[wandb]'" in message
    # Refused before the run starts: not even the plan-as-run is written.
    assert not (tmp_path / "out" / "plan.toml").exists()


def test_a_tracker_verl_writes_but_the_runtime_does_not_is_refused(workspace, tmp_path, capsys):
    plan = _plan(workspace)
    plan = plan.evolve(trainer=attrs.evolve(plan.trainer, logger=("swanlab",)))
    message = _run_bad(tmp_path, capsys, plan)
    assert "trainer.logger" in message and "swanlab" in message and "remove swanlab from trainer.logger" in message


def test_missing_plan_file(tmp_path, capsys):
    from rlplan.planner.commands.commands_io import ExitCode
    from rlplan.runtime.commands import run_command

    code = run_command(str(tmp_path / "absent.toml"), resume=False, address=None, output_dir=str(tmp_path / "out"), max_steps=None)
    assert code == ExitCode.BAD_INPUT
    assert "absent.toml" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_demo_plan_is_solved_for_this_machine_with_cpu_limits_pinned(tmp_path):
    from rlplan.planner.memory import predict_memory
    from rlplan.planner.rules import check_plan
    from rlplan.runtime.demo_workload import DEMO_CPU_PINS, demo_plan, solve_demo_plan
    from rlplan.runtime.tiny import ensure_tiny_model, write_toy_dataset

    model_dir = ensure_tiny_model(tmp_path / "model")
    train_file, _ = write_toy_dataset(tmp_path / "data" / "train.parquet", 16)
    workload = demo_plan(model_dir, train_file, tmp_path / "run", steps=2, algorithm="grpo_full")
    plan = solve_demo_plan(workload)
    assert check_plan(plan).valid
    assert predict_memory(plan).fits
    assert plan.prediction is not None
    assert plan.actor.param_offload is False and plan.rollout.tensor_model_parallel_size == 1
    assert plan.actor.use_dynamic_bsz and plan.actor.ppo_max_token_len_per_gpu >= plan.data.max_sequence_length
    assert set(DEMO_CPU_PINS) and plan.data.train_files == workload.data.train_files
    # The workload computes in fp32 with an eager engine; solved, it computes as this CPU is fastest, the engine
    # in the trainer's dtype, compiled wherever inductor finds its C++ compiler.
    from rlplan.planner.commands.this_machine import this_machine_compute_dtype
    from rlplan.runtime.platform import detect_platform

    assert {plan.actor.compute_dtype, plan.ref.compute_dtype, plan.rollout.dtype} == {this_machine_compute_dtype()}
    assert plan.rollout.enforce_eager is not detect_platform().supports_compiled_rollout


def test_run_json_prints_the_error_as_one_json_object_on_stdout_and_the_log_on_stderr(workspace, tmp_path, capsys):
    import json

    from rlplan.planner.commands.commands_io import ExitCode
    from rlplan.runtime.commands import run_command

    plan = _plan(workspace)
    plan = plan.evolve(model=attrs.evolve(plan.model, path=str(tmp_path / "no-such-model")))
    code = run_command(_write_plan(tmp_path / "plan.toml", plan), resume=False, address=None,
                       output_dir=str(tmp_path / "out"), max_steps=None, as_json=True)
    captured = capsys.readouterr()
    assert code == ExitCode.BAD_INPUT
    error = json.loads(captured.out)["error"]
    assert error["field"] == "model.path" and "no-such-model" in error["message"] and error["fix"]
    code = run_command(str(tmp_path / "absent.toml"), resume=False, address=None, output_dir=None, max_steps=None,
                       as_json=True)
    assert code == ExitCode.BAD_INPUT
    assert "absent.toml" in json.loads(capsys.readouterr().out)["error"]["message"]


def test_a_gpu_plan_on_this_cpu_machine_lists_every_blocking_error_at_once_machine_first(workspace, tmp_path, capsys):
    import json

    import torch

    from rlplan.planner.commands.commands_io import ExitCode
    from rlplan.planner.hardware import Cluster, GpuSpec
    from rlplan.runtime.commands import run_command

    if torch.cuda.is_available():
        pytest.skip("the check is for machines without an accelerator; this one has CUDA")
    plan = _plan(workspace)
    plan = plan.evolve(
        cluster=Cluster(gpu=GpuSpec(name="H100-80G", memory_gib=79.18), nodes=1, gpus_per_node=8),
        rollout=attrs.evolve(plan.rollout, free_cache_engine=True),
        model=attrs.evolve(plan.model, path=str(tmp_path / "no-such-model")),
    )
    message = _run_bad(tmp_path, capsys, plan)
    fields = ("cluster.gpu", "rollout.free_cache_engine", "model.path")
    assert all(f"error {field}:" in message for field in fields), message
    assert [message.index(f"error {field}:") for field in fields] == sorted(message.index(f"error {field}:")
                                                                            for field in fields)
    assert f"{message.count('error ')} problems block this run" in message
    assert "rlplan solve --device cpu --from" in message
    assert "typing." not in message
    code = run_command(_write_plan(tmp_path / "plan.toml", plan), resume=False, address=None,
                       output_dir=str(tmp_path / "out"), max_steps=None, as_json=True)
    payload = json.loads(capsys.readouterr().out)
    assert code == ExitCode.BAD_INPUT and payload["error"]["field"] == "cluster.gpu"
    listed = [error["field"] for error in payload["errors"]]
    assert set(fields) <= set(listed) and listed[0] == "cluster.gpu" and listed[-1] == "model.path"
    assert "--device cpu" in payload["fix_all"]


def demo_folder(root, workspace):
    """A folder as `rlplan demo --output-dir ROOT` leaves it (its model, data, solved plan and a run's metrics),
    without running the demo: the model and data as the demo writes them, the plan as it solves it, and
    metrics.jsonl records of the runtime's keys."""
    import json

    from rlplan.planner.planfile import plan_to_toml
    from rlplan.runtime.commands import DEMO_PROMPTS
    from rlplan.runtime.demo_workload import demo_plan, solve_demo_plan
    from rlplan.runtime.tiny import ensure_tiny_model, write_toy_dataset
    from tests.planner.test_charts import metrics_record

    model_dir = ensure_tiny_model(root / "model")
    train_file, _ = write_toy_dataset(root / "data" / "train.parquet", DEMO_PROMPTS)
    plan = solve_demo_plan(demo_plan(model_dir, train_file, root / "run", steps=3, algorithm="grpo_full"))
    (root / "plan.toml").write_text(plan_to_toml(plan))
    (root / "run").mkdir()
    (root / "run" / "plan.toml").write_text(plan_to_toml(plan))
    (root / "run" / "metrics.jsonl").write_text("".join(json.dumps(metrics_record(s)) + "\n" for s in (1, 2, 3)))
    return model_dir, train_file


def test_every_next_command_the_demo_prints_runs_as_printed(workspace, tmp_path, monkeypatch):
    """Issue 35 item 7: the demo's Next: commands failed as printed (a MODEL_DIR placeholder, a plan without
    train files, then a batch larger than the toy data set). Each runs here, from where the demo ran, through the
    CLI as typed: `rlplan run` through every up-front check (platform, model, data) to the step loop, which is
    stubbed (the live demo, tests/runtime/test_demo.py, runs steps)."""
    import importlib
    import shlex
    import types

    pytest.importorskip("altair", reason="the demo's next command `rlplan report` needs the charts extra")
    from typer.testing import CliRunner

    from rlplan.planner.commands.cli import app
    from rlplan.runtime.commands import demo_next_steps

    out = tmp_path / "runs" / "my demo"
    model_dir, train_file = demo_folder(out, workspace)
    started = []

    def step_loop(plan, platform, options, data, **_):
        started.append((plan, options, len(data.dataset)))
        return types.SimpleNamespace(plan_versus_actual=[], last_step=0, steps_done=0)

    # The module object `rlplan run` will import: another test may have re-imported rlplan.runtime (dropping
    # its `loop` attribute) while sys.modules keeps the module itself.
    monkeypatch.setattr(importlib.import_module("rlplan.runtime.loop"), "run_loop", step_loop)
    monkeypatch.chdir(tmp_path)
    lines = demo_next_steps(out.relative_to(tmp_path), model_dir.relative_to(tmp_path),
                            train_file.relative_to(tmp_path))
    commands = [shlex.split(line.split("   #")[0]) for line in lines if line.startswith("  rlplan ")]
    assert [words[1] for words in commands] == ["report", "explain", "solve", "run", "solve", "render"]
    for words in commands:
        result = CliRunner().invoke(app, words[1:])
        assert result.exit_code == 0, (shlex.join(words), result.output[-3000:])
    (plan, options, prompts), = started
    assert options.max_steps == 2 and prompts >= plan.data.train_batch_size
    assert (tmp_path / "run.sh").read_text().startswith("#!/usr/bin/env bash")
    assert (out / "run" / "report.html").is_file()
