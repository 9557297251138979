"""The shared attrs validators (planner/validators.py) and the did-you-mean hint (planner/errors.py)."""

from __future__ import annotations

import math

import pytest
from attrs import field, frozen
from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError, did_you_mean
from rlplan.planner.validators import MAX_PLAN_NUMBER, at_least, field_check


@frozen(kw_only=True)
class Section:
    size: int | None = field(default=None, validator=at_least(1, "demo"))
    share: float = field(default=0.5, validator=field_check("demo", lambda v: 0 < v <= 1, "got {value} for {name}.",
                                                             "set {field} in (0, 1]"))


@pytest.mark.parametrize("bad", [0, -3, math.nan, math.inf])
def test_at_least_names_the_dotted_field_and_rejects_nan_and_infinity(bad):
    with pytest.raises(PlanError) as raised:
        Section(size=bad)
    assert raised.value.field == "demo.size" and "set demo.size to a value >= 1" == raised.value.fix


def test_at_least_accepts_an_unset_optional_knob_and_the_minimum():
    assert Section().size is None and Section(size=1).size == 1


def test_field_check_formats_field_name_and_value_into_message_and_fix():
    with pytest.raises(PlanError) as raised:
        Section(share=2.0)
    assert (raised.value.field, raised.value.message, raised.value.fix) == (
        "demo.share", "got 2.0 for share.", "set demo.share in (0, 1]")


def test_did_you_mean_offers_the_closest_key_with_its_prefix_else_the_valid_keys():
    assert did_you_mean("lenght", ["length", "width"], prefix="data.") == "did you mean `data.length`?"
    assert did_you_mean("zzz", ["width", "length"]) == "valid keys here: length, width"
    assert did_you_mean("zzz", ["width"], otherwise="see the docs") == "see the docs"


@given(st.integers(min_value=MAX_PLAN_NUMBER + 1, max_value=10**6000))
def test_at_least_refuses_every_number_past_the_plan_maximum_naming_field_and_range(value):
    """Issue 41: 2**63 - 1 prompts or a 4,000-digit rank enter no plan (they crashed the step-time model later)."""
    with pytest.raises(PlanError) as raised:
        Section(size=value)
    assert raised.value.field == "demo.size" and "at most 16,777,216" in raised.value.message
    assert len(raised.value.message) < 250  # the value is echoed cut short (str() of 4,300+ digits would raise)


@pytest.mark.parametrize("bad", [True, "8", 10**400])
def test_gpu_and_cluster_numbers_refuse_bools_strings_and_ints_past_floats_range(bad):
    from rlplan.planner.hardware import Cluster, GpuSpec

    with pytest.raises(PlanError):
        Cluster(gpu=GpuSpec(name="x", memory_gib=80), nodes=bad)
