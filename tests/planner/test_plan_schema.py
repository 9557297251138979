"""The generated JSON Schema accepts what plan_from_toml accepts and rejects what it refuses."""

from __future__ import annotations

import json
import math
import tomllib
from typing import Any

import pytest

from rlplan.planner.commands.cli import app
from rlplan.planner.plan import ModelSection
from rlplan.planner.plan_schema import DRAFT, SCHEMA_FILE_NAME, plan_json_schema
from rlplan.planner.planfile import plan_from_toml, plan_to_dict, plan_to_toml
from rlplan.planner.solver import SolveRequest, solve
from tests.planner.plans import QWEN25_7B, make_plan

_TYPE_CHECKS = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: not isinstance(v, bool) and (isinstance(v, int) or isinstance(v, float) and v.is_integer()),
    "number": lambda v: not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v),
    "null": lambda v: v is None,
}


def schema_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """A validator for the subset of draft 2020-12 that plan_json_schema emits (jsonschema is not a test dependency)."""
    if "anyOf" in schema:
        return [] if any(not schema_errors(option, value, path) for option in schema["anyOf"]) else [
            f"{path}: matches none of anyOf"]
    kinds = schema.get("type")
    if kinds is not None and not any(_TYPE_CHECKS[kind](value) for kind in ([kinds] if isinstance(kinds, str) else kinds)):
        return [f"{path}: {value!r} is not {kinds}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} is not one of {schema['enum']}"]
    errors: list[str] = []
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{path}[{index}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{path}.{key}: required" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(properties[key], item, f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}.{key}: unknown key")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += schema_errors(schema["additionalProperties"], item, f"{path}.{key}")
    return errors


@pytest.fixture(scope="module")
def solved_plan_data() -> dict[str, Any]:
    # gae: the solved plan carries a critic section and a prediction, so more of the schema is exercised.
    result = solve(SolveRequest(model=ModelSection(name="qwen2.5-7b", arch=QWEN25_7B), cluster=make_plan().cluster,
                                algorithm="gae", prompt_len=1024, response_len=1024, train_batch_size=64, n=4))
    assert result.best is not None
    return tomllib.loads(plan_to_toml(result.best.plan))


def test_schema_is_draft_2020_12_and_closed_at_every_level():
    schema = plan_json_schema()
    assert schema["$schema"] == DRAFT
    assert schema["additionalProperties"] is False
    assert schema["properties"]["rollout"]["additionalProperties"] is False
    assert schema["properties"]["model"]["properties"]["arch"]["additionalProperties"] is False


def test_schema_accepts_a_solved_plan_as_toml_reads_it(solved_plan_data):
    assert schema_errors(plan_json_schema(), solved_plan_data) == []


def test_schema_accepts_a_plan_with_every_optional_field_set():
    data = plan_to_dict(make_plan())
    data["data"]["expected_response_length"] = 256
    data["critic"]["enable"] = True
    data["passthrough"] = {"trainer.logger": "['console']"}
    assert schema_errors(plan_json_schema(), data) == []


def test_schema_rejects_an_unknown_key_as_plan_from_dict_does(solved_plan_data):
    data = json.loads(json.dumps(solved_plan_data))
    data["actor"]["param_ofload"] = True
    assert schema_errors(plan_json_schema(), data) == [".actor.param_ofload: unknown key"]


@pytest.mark.parametrize(("section", "key", "value"), [("rollout", "name", "trt_llm"), ("rollout", "sleep_level", 3)])
def test_schema_rejects_a_value_outside_a_literal(solved_plan_data, section, key, value):
    data = json.loads(json.dumps(solved_plan_data))
    data[section][key] = value
    assert schema_errors(plan_json_schema(), data) == [f".{section}.{key}: {value!r} is not one of "
                                                       f"{plan_json_schema()['properties'][section]['properties'][key]['enum']}"]


def test_schema_rejects_an_estimator_outside_its_literal_and_takes_none_beside_a_recipe(solved_plan_data):
    data = json.loads(json.dumps(solved_plan_data))
    data["algorithm"]["adv_estimator"] = "ppo"
    assert schema_errors(plan_json_schema(), data) == [".algorithm.adv_estimator: matches none of anyOf"]
    estimator = plan_json_schema()["properties"]["algorithm"]["properties"]["adv_estimator"]
    assert {"type": "null"} in estimator["anyOf"] and "grpo" in estimator["anyOf"][0]["enum"]
    data["algorithm"] = {"recipe": "spin"}
    assert schema_errors(plan_json_schema(), data) == []


def test_schema_rejects_a_wrong_type_and_a_missing_required_key(solved_plan_data):
    data = json.loads(json.dumps(solved_plan_data))
    data["rollout"]["max_num_seqs"] = "many"
    del data["data"]["train_batch_size"]
    assert sorted(schema_errors(plan_json_schema(), data)) == [".data.train_batch_size: required",
                                                               ".rollout.max_num_seqs: 'many' is not integer"]


def test_schema_defaults_are_the_plan_class_defaults():
    rollout = plan_json_schema()["properties"]["rollout"]["properties"]
    assert rollout["gpu_memory_utilization"]["default"] == 0.5
    assert rollout["load_format"]["default"] == "dummy"
    lora = plan_json_schema()["properties"]["model"]["properties"]["lora"]["properties"]
    assert lora["target_modules"] == {"type": "array", "items": {"type": "string"}, "default": ["all-linear"]}


def test_written_plans_name_the_schema_on_their_first_line_and_still_round_trip():
    plan = make_plan()
    text = plan_to_toml(plan)
    assert text.splitlines()[0] == f"#:schema ./{SCHEMA_FILE_NAME}"
    assert plan_from_toml(text) == plan


def test_schema_command_writes_the_generated_schema(tmp_path):
    from typer.testing import CliRunner

    path = tmp_path / SCHEMA_FILE_NAME
    result = CliRunner().invoke(app, ["schema", "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(path.read_text()) == plan_json_schema()
    printed = CliRunner().invoke(app, ["schema"])
    assert json.loads(printed.stdout) == plan_json_schema()
