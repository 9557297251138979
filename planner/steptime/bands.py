"""How wrong the step-time model is out of sample, per verl timing key: the band `compare` and `solve --top`
print beside each phase's seconds.

The one owner of the step-time model's measured error.  `presets/steptime_accuracy.toml` holds, for each
backend's protocol of benchmarks/steptime_holdout.py, each timing key's largest under- and over-prediction
when its run's sweep or log was left out of the fit (docs/accuracy.md section 5a); that script's `--write`
regenerates it with the section, so the bands follow the model.  A key no run measured takes the widest band
of its backend, and a backend without a protocol the widest of any; both say so (`runs` 0).
"""

from __future__ import annotations

import functools
import math

import attrs
from attrs import frozen

from rlplan.planner.package_data import package_toml
from rlplan.planner.plan import Plan
from rlplan.planner.steptime.step import VERL_TIMING_OF_PHASE

BANDS_FILE = "steptime_accuracy.toml"


@frozen(kw_only=True)
class TimeBand:
    """The range of predicted / measured - 1 seen on comparable runs out of sample: the measured seconds lay
    between predicted / (1 + over) and predicted / (1 - under)."""

    under: float = attrs.field(validator=[attrs.validators.ge(0.0), attrs.validators.lt(1.0)])
    over: float = attrs.field(validator=attrs.validators.ge(0.0))
    # Runs that back it (0: none measured this key; the band is the widest one, as said above).
    runs: int = attrs.field(validator=attrs.validators.ge(0))

    def text(self) -> str:
        return f"-{100 * self.under:.0f} % / +{100 * self.over:.0f} %"

    def seconds(self, predicted: float) -> tuple[float, float]:
        """The measured seconds a prediction of `predicted` stood for on those runs: (low, high)."""
        return predicted / (1.0 + self.over), predicted / (1.0 - self.under)

    def holds(self, predicted: float, measured: float) -> bool:
        low, high = self.seconds(predicted)
        return low <= measured <= high

    def to_json(self) -> dict[str, float | int]:
        return {"under": round(self.under, 4), "over": round(self.over, 4), "runs": self.runs}


@functools.cache
def _bands() -> dict[str, dict[str, TimeBand]]:
    return {backend: {key: TimeBand(under=row["under"], over=row["over"], runs=row["runs"])
                      for key, row in keys.items()}
            for backend, keys in package_toml(BANDS_FILE).items()}


def _widest(bands: dict[str, TimeBand]) -> TimeBand:
    return TimeBand(under=max(b.under for b in bands.values()), over=max(b.over for b in bands.values()), runs=0)


def backend_of(plan: Plan) -> str:
    """The protocol a plan's trainer is judged by (benchmarks/steptime_holdout.py PROTOCOLS)."""
    return "megatron" if plan.is_megatron else "fsdp"


def time_band(plan: Plan, timing_key: str) -> TimeBand:
    """The out-of-sample band of one verl timing key (gen, old_log_prob, ..., step) for the plan's backend."""
    bands = _bands()
    own = bands.get(backend_of(plan))
    if own is None:
        return _widest({f"{backend}.{key}": band for backend, rows in bands.items() for key, band in rows.items()})
    return own.get(timing_key) or _widest(own)


def phase_band(plan: Plan, phase: str) -> TimeBand:
    """The band of one phase of `predict_step_time` (a Phase name, "offload", "reward", "adv", or "step")."""
    return time_band(plan, VERL_TIMING_OF_PHASE.get(str(phase), str(phase)))


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
