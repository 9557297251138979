"""How far the memory model's predictions have been from measurements: the error band shown beside a number.

Provisional (issue 23 owns this module): one band for every plan and phase, taken from docs/accuracy.md's
measured rows (section 1, the tracker-measured training steps): no row under-predicted by more than 2 %,
none over-predicted by more than 5 %. Issue 23 replaces it with bands per phase and plan kind.
"""

from __future__ import annotations

from attrs import field, frozen

from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.validators import field_check

_fraction = field_check("error_band", lambda value: 0.0 <= value < 1.0, "must lie in [0, 1), got {value}.",
                        "state the band as a fraction, e.g. 0.02")


@frozen
class ErrorBand:
    # >= 0: the largest fraction by which the prediction fell BELOW the measurement on comparable rows.
    under: float = field(validator=_fraction)
    # >= 0: the largest fraction by which it fell ABOVE.
    over: float = field(validator=_fraction)
    rows: int
    basis: str

    def highest_actual_gib(self, predicted_gib: float) -> float:
        """The largest measurement the band allows for a prediction: predicted / (1 - under)."""
        return predicted_gib / (1.0 - self.under)

    def describe(self) -> str:
        return (f"-{100 * self.under:.0f} % / +{100 * self.over:.0f} % over {self.rows} measured rows ({self.basis})")


# docs/accuracy.md section 1: 17 rows, largest under-prediction -0.0 %, largest over-prediction +3.2 %,
# stated as the 2 % / 5 % bounds every row is checked against.
_MEASURED_BAND = ErrorBand(under=0.02, over=0.05, rows=17,
                           basis="docs/accuracy.md section 1, tracker-measured training steps")


def peak_error_band(plan: Plan, phase: Phase) -> ErrorBand:
    """The band of the phase's predicted peak (provisional: the same for every plan and phase)."""
    del plan, phase
    return _MEASURED_BAND
