"""planner/commands/solve_commands.py: `rlplan solve`'s flags as a value, and the --from merge as a pure function."""

from __future__ import annotations

import pytest

from rlplan.planner.commands.solve_commands import _COUNT_FLAGS as COUNT_FLAGS
from rlplan.planner.commands.solve_commands import (
    SolveFlags,
    gpu_cluster,
    request_from_flags,
    rollout_engines,
)
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.model_error import DEFAULT_HEADROOM
from rlplan.planner.plan import ModelSection
from rlplan.planner.presets import resolve_model
from rlplan.planner.profile import DEFAULT_PROFILE
from tests.planner.plans import make_plan

CLUSTER = Cluster(gpu=GpuSpec(name="test-gpu", memory_gib=80.0), nodes=1, gpus_per_node=8)


def _model() -> ModelSection:
    resolved = resolve_model("qwen2.5-0.5b")
    return ModelSection(name=resolved.name, path=resolved.path, arch=resolved.arch)


def _request(flags: SolveFlags, base=None):
    return request_from_flags(flags, base, model=_model(), cluster=CLUSTER, profile=DEFAULT_PROFILE,
                              headroom=DEFAULT_HEADROOM, pins={})


def test_a_flag_not_given_is_none_so_the_from_plan_keeps_its_value():
    base = apply_knobs(make_plan(), {"algorithm.adv_estimator": "gae", "rollout.n": 3})
    kept = _request(SolveFlags(), base)
    assert (kept.algorithm, kept.n, kept.prompt_len, kept.response_len, kept.train_batch_size,
            kept.ppo_mini_batch_size) == ("gae", 3, 512, 1024, 64, 16)


def test_a_flag_given_overrides_the_from_plan_even_when_it_equals_the_default():
    """--algo grpo over a PPO plan is GRPO (issue 25: "not given" was spelled "grpo"); --n 5 over n = 3 is 5."""
    base = apply_knobs(make_plan(), {"algorithm.adv_estimator": "gae", "rollout.n": 3})
    given = _request(SolveFlags(algo="grpo", n=5, train_batch_size=256), base)
    assert (given.algorithm, given.n, given.train_batch_size) == ("grpo", 5, 256)


def test_without_a_from_plan_the_defaults_apply_and_ppo_is_gae():
    request = _request(SolveFlags(prompt_len=512, response_len=512, algo="PPO"))
    assert (request.algorithm, request.n, request.train_batch_size, request.base) == ("gae", 5, 256, None)
    with pytest.raises(PlanError) as error:
        _request(SolveFlags(response_len=512))
    assert error.value.field == "--prompt-len"


def test_max_response_len_replaces_the_from_plans_response_length():
    base = make_plan()
    request = _request(SolveFlags(max_response_len=800), base)
    assert (request.response_len, request.max_response_len) == (None, 800)


@pytest.mark.parametrize(("flags", "field"), [
    ({"gpus": 0}, "--gpus"), ({"top": -1}, "--top"), ({"expected_response_len": 0}, "--expected-response-len"),
    ({"device": "tpu"}, "--device"), ({"device": "cpu", "gpu": "h100-80g"}, "--device"),
    ({"gpu": "h100-80g", "gpu_mem": "80"}, "--gpu-mem"), ({"algo": "dpo"}, "--algo"), ({"lora": "big"}, "--lora"),
    ({"rollout": "tgi"}, "--rollout"), ({"objective": "cost"}, "--objective"),
])
def test_flags_are_checked_at_construction_naming_the_flag(flags, field):
    with pytest.raises(PlanError) as error:
        SolveFlags(**flags)
    assert error.value.field == field and error.value.fix


def test_a_mean_length_above_its_maximum_is_refused():
    with pytest.raises(PlanError) as error:
        _request(SolveFlags(prompt_len=512, response_len=512, expected_response_len=600))
    assert error.value.field == "--expected-response-len"


def test_gpu_cluster_splits_the_count_into_nodes_and_assumes_the_typical_host_ram():
    gpu = GpuSpec(name="test-gpu", memory_gib=80.0)
    choice = gpu_cluster(SolveFlags(gpus=16), gpu, host_gib=None)
    assert (choice.cluster.nodes, choice.cluster.gpus_per_node) == (2, 8) and choice.host_note
    given = gpu_cluster(SolveFlags(gpus=4), gpu, host_gib=256.0)
    assert (given.cluster.nodes, given.cluster.gpus_per_node, given.cluster.host_memory_gib) == (1, 4, 256.0)
    assert given.host_note is None
    with pytest.raises(PlanError) as error:
        gpu_cluster(SolveFlags(gpus=12, gpus_per_node=8), gpu, host_gib=None)
    assert error.value.field == "--gpus"


def test_rollout_engines_auto_prices_both_on_gpus_and_a_cpu_plan_refuses_sglang():
    assert rollout_engines(SolveFlags(rollout="auto"), None, {}) == ("vllm", "sglang")
    assert rollout_engines(SolveFlags(rollout="auto", device="cpu"), None, {}) == ("vllm",)
    assert rollout_engines(SolveFlags(), None, {"rollout.name": "sglang"}) == ("sglang",)
    with pytest.raises(PlanError):
        rollout_engines(SolveFlags(device="cpu"), None, {"rollout.name": "sglang"})


def test_trtllm_is_priced_only_when_asked_and_a_cpu_plan_refuses_it():
    """--rollout auto races vLLM and SGLang; TensorRT-LLM's decode has no measured constants of its own."""
    assert "trtllm" not in rollout_engines(SolveFlags(rollout="auto"), None, {})
    assert rollout_engines(SolveFlags(rollout="trtllm"), None, {}) == ("trtllm",)
    with pytest.raises(PlanError) as raised:
        rollout_engines(SolveFlags(rollout="trtllm", device="cpu"), None, {})
    assert "TensorRT-LLM plans are for verl on GPUs" in raised.value.message


@pytest.mark.parametrize("flag,name", [(flag, name) for flag, name, _ in COUNT_FLAGS])
@pytest.mark.parametrize("value", [0, -8])
def test_a_count_below_one_names_the_flag_and_what_leaving_it_out_means(flag, name, value):
    """Issue 35 item 10: `--gpus -8` said to leave --gpus out "for the default", and --gpus has none. Each count
    flag's fix says what leaving it out gives, or when it may be left out."""
    with pytest.raises(PlanError) as refused:
        SolveFlags(**{name: value})
    error = refused.value
    assert error.field == flag and f"got {value}" in error.message
    assert "for the default" not in error.fix
    assert "without it" in error.fix or "may be left out only" in error.fix


def test_a_recipe_from_plan_needs_algo_and_is_then_solved_for_verls_ppo_trainer():
    from rlplan.planner.plan import AlgorithmSection

    base = make_plan().evolve(algorithm=AlgorithmSection(recipe="sppo"))
    with pytest.raises(PlanError) as raised:
        _request(SolveFlags(), base)
    assert raised.value.field == "--from" and "--algo" in raised.value.fix
    assert _request(SolveFlags(algo="grpo"), base).algorithm == "grpo"
