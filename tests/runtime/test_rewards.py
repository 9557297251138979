"""Reward scorers: GSM8K exact match, the toy task, and user functions by import path."""

from __future__ import annotations

import sys
import types

import pytest

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import RewardSection
from rlplan.runtime.rewards import RewardFunction, extract_final_number, gsm8k_score
from rlplan.runtime.tiny import TOY_DATA_SOURCE


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("She has 3 apples, then 5. #### 8", 8.0),
        ("so the answer is 1,234.", 1234.0),
        ("first 3 then -4.5", -4.5),
        ("#### 72\nlater 5", 72.0),
        ("no digits here", None),
    ],
)
def test_extract_final_number(text, number):
    assert extract_final_number(text) == number


@pytest.mark.parametrize(
    ("solution", "truth", "score"),
    [
        ("Natalia sold 48 + 24 = 72 clips. #### 72", "72", 1.0),
        ("The total is 72.0", "#### 72", 1.0),
        ("The total is 71", "72", 0.0),
        ("I do not know", "72", 0.0),
        ("#### 1,000", 1000, 1.0),
    ],
)
def test_gsm8k_score_compares_the_final_number(solution, truth, score):
    assert gsm8k_score("openai/gsm8k", solution, truth) == score


def test_registry_dispatches_on_data_source():
    reward = RewardFunction.from_plan(RewardSection())
    assert reward("openai/gsm8k", "#### 4", "4") == 1.0
    assert reward(TOY_DATA_SOURCE, "b", "b") == 1.0
    assert reward(TOY_DATA_SOURCE, "z", "b") == 0.0


def test_unknown_data_source_names_reward_function_and_the_source():
    reward = RewardFunction.from_plan(RewardSection())
    with pytest.raises(PlanError) as raised:
        reward.check_sources({"openai/gsm8k", "my/dataset"})
    assert raised.value.field == "reward.function"
    assert "'my/dataset'" in raised.value.message and "module:function" in raised.value.fix


@pytest.fixture
def user_module(monkeypatch):
    module = types.ModuleType("rlplan_test_user_rewards")
    module.as_float = lambda data_source, solution_str, ground_truth, extra_info: float(
        solution_str == ground_truth
    )
    module.as_dict = lambda data_source, solution_str, ground_truth, extra_info: {"score": 0.5, "acc": True}
    module.no_score = lambda data_source, solution_str, ground_truth, extra_info: {"acc": True}
    module.not_callable = 3
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


def test_user_function_takes_verls_signature_and_may_return_a_dict(user_module):
    as_float = RewardFunction.from_plan(RewardSection(function=f"{user_module}:as_float"))
    assert as_float("anything", "x", "x", {}) == 1.0
    as_dict = RewardFunction.from_plan(RewardSection(function=f"{user_module}:as_dict"))
    assert as_dict("anything", "x", "y", None) == 0.5
    as_dict.check_sources({"unknown/source"})  # a user function scores every data_source


@pytest.mark.parametrize(
    "spec", ["no_colon_here", "rlplan_no_such_module_xyz:score", "{module}:missing", "{module}:not_callable"]
)
def test_bad_user_function_is_a_plan_error_on_reward_function(user_module, spec):
    with pytest.raises(PlanError) as raised:
        RewardFunction.from_plan(RewardSection(function=spec.format(module=user_module)))
    assert raised.value.field == "reward.function" and raised.value.fix


def test_user_function_result_without_score_is_a_plan_error(user_module):
    reward = RewardFunction.from_plan(RewardSection(function=f"{user_module}:no_score"))
    with pytest.raises(PlanError, match="without 'score'"):
        reward("s", "x", "y", None)
