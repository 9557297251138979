"""The search-space boundary (planner/solver/space.py): the loop reaches a backend only through SEARCH_SPACES, every
strategy has a space, and the knobs a space searches are read from its choice's fields."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import attrs
import pytest

from rlplan.planner import solver
from rlplan.planner.hardware import Cluster
from rlplan.planner.knobs import knob_value
from rlplan.planner.plan import ActorSection, ModelSection
from rlplan.planner.presets import resolve_gpu, resolve_model
from rlplan.planner.solver import SEARCH_SPACES, SolveRequest, SolveStrategy, searched_knobs, solve
from rlplan.planner.solver.choices import knob_keys, pins_allow
from rlplan.planner.solver.fsdp import TrainingChoice
from rlplan.planner.solver.megatron import MegatronChoice
from rlplan.planner.solver.space import plan_space
from tests.planner.plans import make_plan

SOLVER = Path(solver.__file__).parent
SPACE_MODULES = {"rlplan.planner.solver.fsdp", "rlplan.planner.solver.megatron"}
# The modules of the search itself: they reach a backend only through space.py.
LOOP_MODULES = ("search", "solve", "budgets", "rollout", "workload", "request", "choices")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("module", LOOP_MODULES)
def test_the_search_loop_imports_no_search_space(module):
    """Invariant: a new backend is a module beside fsdp.py and megatron.py and an entry in SEARCH_SPACES, not a
    branch in the loop."""
    assert not _imports(SOLVER / f"{module}.py") & SPACE_MODULES


def test_the_loop_modules_are_all_but_the_spaces_and_their_registry():
    modules = {path.stem for path in SOLVER.glob("*.py")} - {"__init__", "space", "fsdp", "megatron"}
    assert modules == set(LOOP_MODULES)
    assert "rlplan.planner.solver.space" in _imports(SOLVER / "search.py")


def test_every_strategy_has_a_search_space_and_every_plan_strategy_one_space():
    assert set(typing.get_args(SolveStrategy)) - {"auto"} == set(SEARCH_SPACES)
    plan_strategies = typing.get_args(typing.get_type_hints(ActorSection)["strategy"])
    for strategy in plan_strategies:
        assert [name for name, space in SEARCH_SPACES.items() if strategy in space.strategies], strategy
    assert plan_space(make_plan(overrides={"actor.strategy": "megatron"})) is SEARCH_SPACES["megatron"]


@pytest.mark.parametrize("choice_type", [TrainingChoice, MegatronChoice])
def test_every_field_of_a_choice_sets_a_plan_knob_that_exists(choice_type):
    plan = make_plan(overrides={"actor.strategy": "megatron"} if choice_type is MegatronChoice else {})
    keys = knob_keys(choice_type)
    assert len(keys) == len(attrs.fields(choice_type)) == len(set(keys))
    for key in keys:
        knob_value(plan, key)  # raises for a key the plan does not have


def test_the_searched_knobs_of_a_megatron_plan_are_its_choices_fields_and_include_vpp():
    plan = make_plan(overrides={"actor.strategy": "megatron"})
    knobs = list(searched_knobs(plan))
    assert knobs[:len(knob_keys(MegatronChoice))] == list(knob_keys(MegatronChoice))
    assert "actor.megatron.virtual_pipeline_model_parallel_size" in knobs
    assert not [key for key in knobs if key.startswith("actor.") and ".megatron." not in key
                and key.split(".")[1] in {"param_offload", "fsdp_size", "ulysses_sequence_parallel_size"}]


def test_a_pin_allows_only_the_choices_with_its_value_including_one_spelled_differently_in_the_plan():
    choice = MegatronChoice(lora_rank=0, tensor=2, pipeline=1, context=1, expert=1, expert_tensor=None,
                            param_offload=False, optimizer_offload=False, recompute=True)
    assert pins_allow(choice, {"actor.megatron.tensor_model_parallel_size": 2, "unrelated.key": 1})
    assert not pins_allow(choice, {"actor.megatron.tensor_model_parallel_size": 4})
    assert pins_allow(choice, {"actor.megatron.recompute_granularity": "full"})
    assert not pins_allow(choice, {"actor.megatron.recompute_granularity": None})


def test_no_two_candidates_of_a_megatron_solve_show_the_same_knobs():
    """The VPP duplicate of `solve --top` (issue 38): two candidates that differ only in VPP showed the same knobs
    while the Megatron knobs were listed by hand without it."""
    moe = resolve_model("qwen3-30b-a3b")
    request = SolveRequest(model=ModelSection(name=moe.name, path=moe.path, arch=moe.arch),
                           cluster=Cluster(gpu=resolve_gpu("h100-80g"), nodes=2, gpus_per_node=8,
                                           host_memory_gib=2048.0),
                           prompt_len=1024, response_len=4096, train_batch_size=128, n=8, strategy="megatron")
    result = solve(request, keep=8)
    assert result.best is not None
    shown = [tuple(searched_knobs(c.plan).items()) for c in (result.best, *result.runners_up)]
    vpp = {dict(knobs)["actor.megatron.virtual_pipeline_model_parallel_size"] for knobs in shown}
    assert len(shown) == len(set(shown)) > 4 and len(vpp) > 1
