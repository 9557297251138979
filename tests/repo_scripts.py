"""The repository's scripts (benchmarks/, examples/regenerate.py) loaded as modules, for the tests that run
their code: they are files beside the package, not importable modules."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative_path: str) -> ModuleType:
    """The module a script of the repository defines (e.g. "benchmarks/steptime_sweeps.py"), executed once per call."""
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
