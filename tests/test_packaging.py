"""The wheel holds every module: setup.py finds the packages, and nothing in the source folders lies outside one.

A hand-kept package list once left out `rlplan.planner.memory` and `rlplan.planner.steptime`, and every command of
a `pip install .` died on import while the editable installs the tests ran under worked. CI builds the wheel and
the sdist and runs the CLI from each in a clean venv (`nox -s wheel`); these tests hold the list to the tree.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_module():
    spec = importlib.util.spec_from_file_location("rlplan_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package_of(folder: Path, package_dirs: dict[str, str]) -> str:
    for name, top in package_dirs.items():
        top_path = ROOT / top
        if folder == top_path or top_path in folder.parents:
            return ".".join([name, *folder.relative_to(top_path).parts])
    raise AssertionError(f"{folder} is under no mapped folder")


def test_every_source_folder_with_python_files_is_a_listed_package():
    setup = _setup_module()
    listed = set(setup.rlplan_packages())
    for top in setup.PACKAGE_DIRS.values():
        for module in (ROOT / top).rglob("*.py"):
            folder = module.parent
            assert (folder / "__init__.py").exists(), f"{folder} holds {module.name} but no __init__.py"
            assert _package_of(folder, setup.PACKAGE_DIRS) in listed, f"{folder} is not in setup.py's packages"


def test_every_data_file_the_code_reads_is_package_data():
    """templates/*.j2 and presets/*.toml are read through importlib.resources: the wheel must carry them."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, folder in (("rlplan.templates", "templates"), ("rlplan.presets", "presets")):
        data = [path for path in (ROOT / folder).iterdir() if path.is_file() and path.suffix != ".py"]
        assert data, f"{folder} has no data files"
        for path in data:
            assert any(path.match(pattern) for pattern in patterns[package]), f"{path} is not package data"
