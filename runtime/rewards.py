"""Rule-based rewards: a scorer per data_source, or one user function named in the plan.

Every scorer has verl's signature, (data_source, solution_str, ground_truth, extra_info)
-> float or a dict with "score", so a verl reward function works here unchanged.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from attrs import field, frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import RewardSection
from rlplan.runtime.tiny import TOY_DATA_SOURCE, toy_score

Scorer = Callable[[str, str, Any, "dict[str, Any] | None"], "float | dict[str, Any]"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_AFTER_HASHES = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def extract_final_number(text: str) -> float | None:
    """GSM8K's answer convention: the number after "####", else the last number in the text."""
    marked = _AFTER_HASHES.search(text)
    candidates = [marked.group(1)] if marked else _NUMBER.findall(text)
    if not candidates:
        return None
    try:
        return float(candidates[-1].replace(",", ""))
    except ValueError:
        return None


def gsm8k_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float:
    """1.0 when the final number of the answer equals the reference number, else 0.0."""
    answer = extract_final_number(solution_str)
    expected = (
        ground_truth if isinstance(ground_truth, int | float) else extract_final_number(str(ground_truth))
    )
    if answer is None or expected is None:
        return 0.0
    return 1.0 if math.isclose(answer, float(expected), rel_tol=0.0, abs_tol=1e-6) else 0.0


def toy_copy_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float:
    return toy_score(solution_str, str(ground_truth))


# verl's names for GSM8K (openai/gsm8k) plus the short name.
BUILTIN_SCORERS: Mapping[str, Scorer] = {
    "openai/gsm8k": gsm8k_score,
    "gsm8k": gsm8k_score,
    TOY_DATA_SOURCE: toy_copy_score,
}


def load_user_function(spec: str) -> Scorer:
    """Import "package.module:function" (plan.reward.function)."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise PlanError(
            field="reward.function",
            message=f"{spec!r} is not of the form 'module:function'.",
            fix="set reward.function to e.g. 'my_rewards:compute_score' (the module must be importable)",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise PlanError(
            field="reward.function",
            message=f"module {module_name!r} cannot be imported ({error}).",
            fix="install the module or add its folder to PYTHONPATH on every node",
        ) from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise PlanError(
            field="reward.function",
            message=f"module {module_name!r} has no callable {function_name!r}.",
            fix=f"define {function_name}(data_source, solution_str, ground_truth, extra_info) in {module_name}",
        )
    return function


def _as_score(value: Any, source: str) -> float:
    """A scorer's result as a float: a number, or a dict carrying "score"."""
    if isinstance(value, Mapping):
        if "score" not in value:
            raise PlanError(
                field="reward.function",
                message=f"{source} returned a dict without 'score' (keys: {sorted(value)}).",
                fix="return a float, or a dict with a 'score' entry",
            )
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanError(
            field="reward.function",
            message=f"{source} returned {type(value).__name__}, not a number.",
            fix="return a float, or a dict with a 'score' entry",
        )
    return float(value)


@frozen
class RewardFunction:
    """Scores responses: the user function when the plan names one, else by data_source."""

    user_function: Scorer | None = None
    user_function_name: str = ""
    scorers: Mapping[str, Scorer] = field(factory=lambda: dict(BUILTIN_SCORERS))

    @classmethod
    def from_plan(cls, reward: RewardSection) -> RewardFunction:
        if reward.function:
            return cls(user_function=load_user_function(reward.function), user_function_name=reward.function)
        return cls()

    def check_sources(self, data_sources: set[str]) -> None:
        """Fail before training when a dataset's data_source has no scorer."""
        if self.user_function is not None:
            return
        unknown = sorted(data_sources - set(self.scorers))
        if unknown:
            raise PlanError(
                field="reward.function",
                message=(
                    f"no built-in scorer for data_source {', '.join(map(repr, unknown))} "
                    f"(built in: {', '.join(sorted(self.scorers))})."
                ),
                fix="set reward.function = 'module:function' to score these prompts",
            )

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
    ) -> float:
        if self.user_function is not None:
            result = self.user_function(data_source, solution_str, ground_truth, extra_info)
            return _as_score(result, f"reward.function {self.user_function_name!r}")
        self.check_sources({data_source})
        return _as_score(
            self.scorers[data_source](data_source, solution_str, ground_truth, extra_info), data_source
        )
