"""presets/*.toml through package_data: the same data as tomllib's parse, cold and from the JSON copy."""

from __future__ import annotations

import sys
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from rlplan.planner import package_data
from rlplan.planner.package_data import package_toml

FILES = sorted(path.name for path in resources.files("rlplan.presets").iterdir() if path.name.endswith(".toml"))


@pytest.mark.parametrize("filename", FILES)
def test_the_json_copy_gives_back_exactly_what_tomllib_parses(filename, monkeypatch, tmp_path):
    parsed = tomllib.loads(resources.files("rlplan.presets").joinpath(filename).read_text(encoding="utf-8"))
    copy = tmp_path / "__pycache__" / f"{filename}.x.json"
    monkeypatch.setattr(package_data, "_cache_path", lambda resource, name, text: copy)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert package_toml(filename) == parsed  # parsed, the copy written
    assert copy.is_file()
    monkeypatch.setattr(package_data.tomllib, "loads", _no_parse)
    assert package_toml(filename) == parsed  # read from the copy


def _no_parse(text: str) -> None:
    raise AssertionError("parsed again although the copy was there")


def test_no_copy_is_written_under_dont_write_bytecode_and_an_edited_file_gets_a_new_name(monkeypatch, tmp_path):
    cache_path = package_data._cache_path
    copy = tmp_path / "__pycache__" / "models.toml.x.json"
    monkeypatch.setattr(package_data, "_cache_path", lambda resource, name, text: copy)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    package_toml("models.toml")
    assert not copy.exists()
    first = cache_path(Path("/p/models.toml"), "models.toml", "a = 1")
    assert first != cache_path(Path("/p/models.toml"), "models.toml", "a = 2")
    assert first is not None and first.parent == Path("/p/__pycache__")


def test_data_json_cannot_give_back_is_not_copied(tmp_path):
    copy = tmp_path / "d.toml.x.json"
    package_data._write_copy(copy, tomllib.loads("when = 1979-05-27\nnan = nan\n"))
    assert not copy.exists()
    package_data._write_copy(copy, {"a": [1, 2.0, "x"]})
    assert copy.is_file()
