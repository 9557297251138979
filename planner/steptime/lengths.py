"""The workload's lengths a step is priced at: mean prompt and response tokens, and the log-normal response
length distribution a batch draws from (docs/steptime.md, "Lengths")."""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import attrs
from attrs import frozen

from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile

_NORMAL = NormalDist()


@frozen(kw_only=True)
class Lengths:
    """Mean prompt and response tokens, and the response length distribution a batch draws from.

    Responses are log-normal of shape `sigma`, cut at `response_max` (verl stops a response there), with
    `log_median` chosen so that the cut distribution's mean is `response_mean`, the mean a run reports;
    sigma 0 is every response at its mean (ignore_eos: the maximum).
    """

    prompt_mean: float
    response_mean: float
    response_max: int
    sigma: float
    log_median: float = attrs.field()

    @log_median.default
    def _log_median_for_the_mean(self) -> float:
        if self.sigma <= 0.0 or self.response_mean >= self.response_max:
            return math.log(max(self.response_mean, 1.0))
        return _log_median_of_capped_mean(self.response_mean, self.response_max, self.sigma)

    @property
    def sequence_mean(self) -> float:
        return self.prompt_mean + self.response_mean

    def survival(self, tokens: float) -> float:
        """P(a response is longer than `tokens`)."""
        if tokens >= self.response_max:
            return 0.0
        if self.sigma <= 0.0:
            return 1.0 if tokens < self.response_mean else 0.0
        if tokens <= 0:
            return 1.0
        return 1.0 - _NORMAL.cdf((math.log(tokens) - self.log_median) / self.sigma)

    def longest_of(self, count: float) -> float:
        """The expected longest response of `count` (its 1 - 1/(count + 1) quantile), at most the maximum."""
        if self.sigma <= 0.0 or count <= 1:
            return min(float(self.response_max), self.response_mean)
        z = _NORMAL.inv_cdf(1.0 - 1.0 / (count + 1.0))
        return min(float(self.response_max), math.exp(self.log_median + self.sigma * z))

    @property
    def running_response(self) -> float:
        """Mean tokens generated so far by a running sequence: long responses run longer, so the mean in
        flight is E[L^2] / 2E[L] = mean x exp(sigma^2) / 2 for a log-normal, at most half the maximum."""
        return min(self.response_mean * math.exp(self.sigma**2) / 2, self.response_max / 2)


def _capped_mean(log_median: float, cap: float, sigma: float) -> float:
    """E[min(L, cap)] of a log-normal L with median exp(log_median) and shape sigma."""
    log_cap = math.log(cap)
    below = math.exp(log_median + sigma**2 / 2) * _NORMAL.cdf((log_cap - log_median - sigma**2) / sigma)
    return below + cap * (1.0 - _NORMAL.cdf((log_cap - log_median) / sigma))


@functools.lru_cache(maxsize=256)
def _log_median_of_capped_mean(mean: float, cap: float, sigma: float) -> float:
    """The log-median whose log-normal, cut at `cap`, has mean `mean` (< cap), by bisection: the mean rises
    with the median."""
    low, high = math.log(mean) - sigma**2 / 2 - 1.0, math.log(cap) + 4 * sigma
    for _ in range(40):
        middle = (low + high) / 2
        if _capped_mean(middle, cap, sigma) < mean:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _mean_length(expected: int | None, observed: int, maximum: int, fraction: float) -> float:
    if expected is not None:
        return float(min(expected, maximum))
    if observed > 0:
        return float(min(observed, maximum))
    return max(1.0, fraction * maximum)


def workload_lengths(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> Lengths:
    """The plan's lengths: stated means, else the profile's observed ones, else a fraction of the maxima."""
    data = plan.data
    prompt = _mean_length(data.expected_prompt_length, profile.observed_prompt_length, data.max_prompt_length,
                          profile.unstated_length_fraction)
    if plan.rollout.ignore_eos:
        return Lengths(prompt_mean=prompt, response_mean=float(data.max_response_length),
                       response_max=data.max_response_length, sigma=0.0)
    response = _mean_length(data.expected_response_length, profile.observed_response_length,
                            data.max_response_length, profile.unstated_length_fraction)
    return Lengths(prompt_mean=prompt, response_mean=response, response_max=data.max_response_length,
                   sigma=profile.response_length_sigma)
