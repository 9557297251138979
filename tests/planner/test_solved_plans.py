"""Solved plans are byte-identical on a fixed set of requests.

Restructuring the planner (issue 25) must not change what `rlplan solve` writes. Each request below is solved
through the command line, and its plan.toml and its `--json` result (without `evaluated`, the count of plans the
search looked at, which a faster search may change) are compared with the files in tests/data/solved_plans/.
When a change is meant to change plans, regenerate them and say why in the commit:

    python -m tests.planner.test_solved_plans
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlplan.planner.commands.cli import app

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "solved_plans"
_LENGTHS = ("--prompt-len", "1024", "--response-len", "2048")

# name -> solve flags: the README's request, a single consumer GPU, PPO with a critic at scale, an MoE model,
# SGLang, pins, expected lengths, and an infeasible request (its diagnosis and suggestions).
REQUESTS: dict[str, tuple[str, ...]] = {
    "readme_7b_8xh100": ("--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", *_LENGTHS),
    "1p5b_1x4090": ("--model", "qwen2.5-1.5b", "--gpus", "1", "--gpu", "rtx-4090", *_LENGTHS),
    "72b_ppo_64xh100": ("--model", "qwen2.5-72b", "--gpus", "64", "--gpu", "h100-80g", "--algo", "ppo",
                        "--lora", "off", *_LENGTHS),
    "30b_a3b_16xh100": ("--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-80g", "--lora", "off",
                        "--prompt-len", "2048", "--response-len", "8192"),
    "14b_sglang_8xa100": ("--model", "qwen2.5-14b", "--gpus", "8", "--gpu", "a100-80g", "--rollout", "sglang",
                          *_LENGTHS),
    "7b_pinned_tp2": ("--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--fix",
                      "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "--fix",
                      "actor_rollout_ref.model.enable_gradient_checkpointing=true", *_LENGTHS),
    "7b_expected_lengths": ("--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "1024",
                            "--response-len", "8192", "--expected-response-len", "2500",
                            "--expected-prompt-len", "400"),
    "70b_full_8xa100_40g_infeasible": ("--model", "llama-3.1-70b", "--gpus", "8", "--gpu", "a100-40g", "--lora",
                                       "off", *_LENGTHS),
}


def _stable_json(text: str) -> str:
    data = json.loads(text)
    data.pop("evaluated", None)
    data.pop("plan_file", None)  # where this run wrote it: a scratch folder
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def solve_outputs(name: str, directory: Path) -> dict[str, str]:
    """What `rlplan solve` writes for one request: the plan (when one fits) and the --json result."""
    runner = CliRunner()
    plan_path = directory / f"{name}.toml"
    result = runner.invoke(app, ["solve", *REQUESTS[name], "--json", "-o", str(plan_path)])
    assert result.exit_code in (0, 1), result.output
    outputs = {f"{name}.json": _stable_json(result.stdout)}
    if plan_path.exists():
        outputs[f"{name}.toml"] = plan_path.read_text()
    return outputs


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_solved_plan_is_byte_identical_to_the_recorded_one(name: str, tmp_path: Path) -> None:
    recorded = {path.name: path.read_text() for path in GOLDEN.glob(f"{name}.*")}
    assert recorded, f"no recorded outputs for {name}: run python -m tests.planner.test_solved_plans"
    assert solve_outputs(name, tmp_path) == recorded


def regenerate() -> None:
    import tempfile

    GOLDEN.mkdir(parents=True, exist_ok=True)
    for old in GOLDEN.glob("*.*"):
        if old.suffix in (".toml", ".json"):
            old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        for name in sorted(REQUESTS):
            for file_name, text in solve_outputs(name, Path(scratch)).items():
                (GOLDEN / file_name).write_text(text)
                print(f"wrote {GOLDEN / file_name}", file=sys.stderr)


if __name__ == "__main__":
    regenerate()
