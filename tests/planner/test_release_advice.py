"""release_advice.newer_release: what a newer verl would give a request, said beside the plan, never in it."""

from __future__ import annotations

from rlplan.planner.commands.solve_commands import SolveFlags, solve_inputs
from rlplan.planner.release_advice import newer_release
from rlplan.planner.solver import solve_engines


def _solved(verl: str | None, **flags):
    inputs = solve_inputs(SolveFlags(verl_version=verl, quiet=True, **flags), None, lambda note: None)
    return inputs, solve_engines(inputs.request, inputs.engines, keep=1)


SMALL_GPUS = {"model": "qwen2.5-7b", "gpu": "rtx4090-24g", "gpus": 2, "prompt_len": 512, "response_len": 1024, "n": 8}


def test_a_7b_on_two_24gb_gpus_needs_the_lora_of_verl_0_4_and_the_plan_for_0_3_has_none():
    inputs, result = _solved("0.3.0.post1", **SMALL_GPUS)
    advice = newer_release(inputs.request, result, inputs.engines)
    assert advice is not None and advice.verl == "0.4.0" and "model.lora.rank" in advice.knobs
    assert advice.fits_only_there == (result.best is None)
    if result.plan is not None:
        assert not result.plan.model.lora.enabled and not result.plan.actor.offload_policy
    assert "on verl >= 0.4.0" in advice.text("0.3.0.post1", None)


def test_the_newest_release_and_a_release_lacking_nothing_the_request_needs_get_no_advice():
    inputs, result = _solved(None, **SMALL_GPUS)
    assert newer_release(inputs.request, result, inputs.engines) is None
    inputs, result = _solved("0.9.0", **SMALL_GPUS)
    assert newer_release(inputs.request, result, inputs.engines) is None


def test_solve_says_the_newer_release_beside_the_plan_in_json_and_text():
    import json

    from tests.planner.cli_runner import invoke

    words = ["solve", "--model", "qwen2.5-7b", "--gpus", "2", "--gpu", "rtx4090-24g", "--prompt-len", "512",
             "--response-len", "1024", "--n", "8", "--verl-version", "0.3.0.post1"]
    payload = json.loads(invoke(*words, "--json").output)
    assert payload["newer_release"]["verl"] == "0.4.0" and "on verl >= 0.4.0" in payload["newer_release"]["text"]
    if payload.get("plan"):
        assert payload["plan"]["model"]["lora"]["rank"] == 0
    assert "note: on verl >= 0.4.0" in invoke(*words).output


def test_an_explicit_lora_rank_on_a_release_without_lora_is_refused_naming_the_release_that_added_it():
    import pytest

    from rlplan.planner.errors import PlanError

    with pytest.raises(PlanError) as raised:
        _solved("0.3.0.post1", **{**SMALL_GPUS, "lora": "32"})
    assert raised.value.field == "--lora" and "0.4.0" in raised.value.message
