"""plan.toml <-> Plan (planner/planfile.py)."""

from __future__ import annotations

import tomllib

import attrs
import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.plan import Prediction
from rlplan.planner.planfile import plan_from_toml, plan_to_dict, plan_to_toml
from tests.planner.plans import make_plan

KNOB_VALUES = {
    "model.lora.rank": st.integers(0, 512),
    "model.gradient_checkpointing": st.booleans(),
    "model.activation_offload": st.booleans(),
    "actor.param_offload": st.booleans(),
    "actor.optimizer_offload": st.booleans(),
    "actor.use_dynamic_bsz": st.booleans(),
    "actor.ppo_max_token_len_per_gpu": st.integers(1, 1 << 20),
    "actor.lr": st.floats(0, 1, allow_nan=False),
    "actor.clip_ratio_high": st.floats(0, 10, allow_nan=False),
    "rollout.gpu_memory_utilization": st.floats(0.01, 1.0, allow_nan=False),
    "rollout.tensor_model_parallel_size": st.integers(1, 64),
    "rollout.max_model_len": st.integers(1, 1 << 20),
    "rollout.sleep_level": st.sampled_from([1, 2]),
    "rollout.load_format": st.sampled_from(["dummy", "safetensors", "auto"]),
    "data.train_files": st.lists(st.text(max_size=30), max_size=3).map(tuple),
    "trainer.experiment_name": st.text(max_size=40),
    "passthrough": st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=20), max_size=4),
}


@st.composite
def plans(draw):
    chosen = draw(st.dictionaries(st.sampled_from(sorted(KNOB_VALUES)), st.none(), max_size=len(KNOB_VALUES)))
    overrides = {key: draw(KNOB_VALUES[key]) for key in chosen}
    passthrough = overrides.pop("passthrough", None)
    plan = make_plan(overrides=overrides)
    if passthrough is not None:
        plan = plan.evolve(passthrough=passthrough)
    if draw(st.booleans()):
        plan = plan.evolve(prediction=Prediction(
            gpu_peak_gib=draw(st.floats(0, 1e4, allow_nan=False)), host_peak_gib=1.5, step_time_s=0.1,
            phase_peak_gib={"actor_update": 12.25}, phase_seconds={"rollout": 3.0},
        ))
    return plan


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_toml_round_trip_is_exact(plan):
    assert plan_from_toml(plan_to_toml(plan)) == plan


@settings(max_examples=120, deadline=None)
@given(st.text(max_size=400))
def test_fuzzed_text_never_raises_anything_but_plan_error(text):
    try:
        plan_from_toml(text)
    except PlanError as error:
        assert error.field and error.message


VALID = plan_to_toml(make_plan())
LINES = VALID.splitlines()


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(LINES) - 1),
                          st.one_of(st.just(""), st.text(max_size=30), st.sampled_from(
                              ["x = 1", "n = -3", 'n = "five"', "[actr]", "ppo_mini_batch_size = 0",
                               "gpu_memory_utilization = 1.5", "lora = 3", "rank = true", "[model.arch]",
                               "hidden_size = 0", "num_kv_heads = 5", "schema_version = 9"]))),
                min_size=1, max_size=4))
def test_mutated_plan_files_never_raise_anything_but_plan_error(edits):
    lines = list(LINES)
    for index, replacement in edits:
        lines[index] = replacement
    try:
        plan_from_toml("\n".join(lines))
    except PlanError as error:
        assert error.field and error.message


# (what the edit does, the text it replaces, its replacement, the field the error names, words its fix holds)
BAD_EDITS = [
    ("misspelled key", "param_offload = false", "param_ofload = false", "actor.param_ofload", "actor.param_offload"),
    ("misspelled section", "[actor]", "[actr]", "actr", "actor"),
    ("string for an int", "ppo_mini_batch_size = 16", 'ppo_mini_batch_size = "16"', "actor.ppo_mini_batch_size", ""),
    ("negative batch", "train_batch_size = 64", "train_batch_size = -4", "data.train_batch_size", ">= 1"),
    ("future schema", "schema_version = 1", "schema_version = 2", "schema_version", ""),
]


@pytest.mark.parametrize(("old", "new", "field", "fix_words"), [case[1:] for case in BAD_EDITS],
                         ids=[case[0] for case in BAD_EDITS])
def test_a_bad_edit_names_its_field_and_a_fix(old, new, field, fix_words):
    with pytest.raises(PlanError) as caught:
        plan_from_toml(VALID.replace(old, new, 1))
    assert caught.value.field == field
    assert fix_words in caught.value.fix


def test_malformed_toml_is_a_plan_error():
    with pytest.raises(PlanError) as caught:
        plan_from_toml("[actor\n")
    assert "not valid TOML" in caught.value.message


def test_schema_version_is_written():
    assert tomllib.loads(VALID)["schema_version"] == 1


def test_none_values_are_omitted_and_come_back_as_defaults():
    data = plan_to_dict(make_plan())
    assert "ppo_micro_batch_size" not in data["actor"]  # the deprecated global stays unset
    assert apply_knobs(make_plan(), {}) == make_plan()


def test_rope_scaling_is_written_only_for_a_model_that_has_it_and_reads_back():
    plain = make_plan()
    assert not any(key.startswith("rope_") for key in plan_to_dict(plain)["model"]["arch"])
    arch = attrs.evolve(plain.model.arch, rope_scaling_type="yarn", rope_scaling_factor=4.0,
                        rope_original_max_position_embeddings=32768)
    scaled = plain.evolve(model=attrs.evolve(plain.model, arch=arch))
    written = plan_to_dict(scaled)["model"]["arch"]
    assert (written["rope_scaling_type"], written["rope_scaling_factor"]) == ("yarn", 4.0)
    assert plan_from_toml(plan_to_toml(scaled)) == scaled


def _choice_fields() -> list[tuple[str, tuple]]:
    """Every fixed-choice (Literal) field of the plan, as (dotted key, allowed values)."""
    import typing

    import attrs as attrs_module

    from rlplan.planner.plan import Plan

    found = []

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for attribute in attrs_module.fields(cls):
            hint = hints[attribute.name]
            if typing.get_origin(hint) is typing.Literal:
                found.append((f"{prefix}{attribute.name}", typing.get_args(hint)))
            elif attrs_module.has(hint):
                walk(hint, f"{prefix}{attribute.name}.")

    walk(Plan, "")
    return found


@pytest.mark.parametrize(("key", "allowed"), _choice_fields())
def test_a_value_outside_a_choice_names_every_allowed_value_in_plain_words(key, allowed):
    """Invariant: no error shows Python's typing (`typing.Literal[...]`); each lists the values TOML accepts."""
    data = tomllib.loads(plan_to_toml(make_plan()))
    *sections, name = key.split(".")
    table = data
    for section in sections:
        table = table.setdefault(section, {})
    table[name] = "no-such-choice" if isinstance(allowed[0], str) else 0
    with pytest.raises(PlanError) as error:
        plan_from_toml(tomli_w.dumps(data))
    text = error.value.paragraph()
    assert error.value.field == key and "typing" not in text and "Literal" not in text
    for value in allowed:
        assert (f'"{value}"' if isinstance(value, str) else str(value)) in error.value.fix


def test_a_plans_own_text_reads_back_without_building_the_strict_reader(monkeypatch):
    from rlplan.planner import planfile

    plans = [make_plan(), make_plan(overrides={"actor.strategy": "megatron", "actor.megatron.pipeline_model_parallel_size": 2,
                                               "actor.megatron.optimizer_cpu_offload": True})]

    def no_reader():
        raise AssertionError("the strict reader was built for a plan's own text")

    monkeypatch.setattr(planfile, "_converter", no_reader)
    for plan in plans:
        planfile.check_reads_back(plan, plan_to_toml(plan), source="the solved plan")


@pytest.mark.parametrize("pin", [{"actor.ppo_micro_batch_size_per_gpu": 2.5}, {"actor.param_offload": 1},
                                 {"data.train_batch_size": 2**64}, {"model.name": 3}])
def test_a_value_the_strict_reader_refuses_fails_the_read_back_as_reading_the_file_does(pin):
    """The fast path never passes what plan_from_toml refuses: the same PlanError, field and all."""
    from rlplan.planner.planfile import check_reads_back

    plan = make_plan().evolve(**_evolved(make_plan(), pin))
    text = plan_to_toml(plan)
    with pytest.raises(PlanError) as read:
        plan_from_toml(text, source="the solved plan")
    with pytest.raises(PlanError) as checked:
        check_reads_back(plan, text, source="the solved plan")
    assert checked.value.paragraph() == read.value.paragraph()


def _evolved(plan, pin):
    """Sections with a value set past their validators (as a pin could), for the read-back to catch."""
    import attrs

    (dotted, value), = pin.items()
    section, name = dotted.split(".")
    changed = attrs.evolve(getattr(plan, section))
    object.__setattr__(changed, name, value)
    return {section: changed}
