"""House rules of the whole source tree, checked rather than promised.

A function past ~a screen gets split by what its parts do (docs/architecture.md): no function or method in
planner/ or runtime/ is longer than MAX_FUNCTION_LINES unless it is listed in LONG_FUNCTIONS with the reason it
stays whole. A module past MAX_FILE_LINES gets split by what it is about (issue 38: rules.py and solver.py became
packages), unless it is listed in LONG_FILES with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 120

MAX_FILE_LINES = 1000

# "folder/module.py::function" -> why it is not split. Keep it short.
LONG_FUNCTIONS: dict[str, str] = {}
# "folder/module.py" -> why it is not split. Keep it short.
LONG_FILES: dict[str, str] = {}


def _function_lengths(paths: list[Path], root: Path = ROOT) -> dict[str, int]:
    """Every function and method in `paths` by "path::name" (nested ones too), with its lines from its first
    decorator (or its `def`) to its last line."""
    lengths: dict[str, int] = {}
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                assert node.end_lineno is not None
                key = f"{path.relative_to(root).as_posix()}::{node.name}"
                lengths[key] = max(lengths.get(key, 0), node.end_lineno - first + 1)
    return lengths


def _source_lengths() -> dict[str, int]:
    return _function_lengths(sorted(path for folder in ("planner", "runtime") for path in (ROOT / folder).rglob("*.py")))


def test_no_function_is_longer_than_a_screen_unless_listed_with_a_reason():
    long = {name: lines for name, lines in _source_lengths().items() if lines > MAX_FUNCTION_LINES}
    unlisted = {name: lines for name, lines in long.items() if name not in LONG_FUNCTIONS}
    assert unlisted == {}, f"split these by what their parts do, or list them with a reason: {unlisted}"


def test_every_listed_long_function_exists_is_still_long_and_says_why():
    lengths = _source_lengths()
    for name, reason in LONG_FUNCTIONS.items():
        assert lengths.get(name, 0) > MAX_FUNCTION_LINES, f"{name} is gone or short now: drop it from the list"
        assert reason.strip(), f"{name} needs its reason"


def test_the_length_check_counts_decorators_and_nested_functions(tmp_path):
    """The check itself can fail: a decorated method and a nested function are measured to their last line."""
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = tmp_path / "module.py"
    source.write_text(f"class A:\n    @staticmethod\n    def long():\n{body}\n\n"
                      "def outer():\n    def inner():\n        return 1\n    return inner\n", encoding="utf-8")
    lengths = _function_lengths([source], root=tmp_path)
    assert lengths == {"module.py::long": MAX_FUNCTION_LINES + 2, "module.py::outer": 4, "module.py::inner": 2}


def _product_files(root: Path = ROOT) -> list[Path]:
    """The product's source: every Python file of planner/ and runtime/."""
    return sorted(path for folder in ("planner", "runtime") for path in (root / folder).rglob("*.py"))


def _file_lengths(paths: list[Path], root: Path = ROOT) -> dict[str, int]:
    return {path.relative_to(root).as_posix(): len(path.read_text(encoding="utf-8").splitlines()) for path in paths}


def test_no_product_file_is_longer_than_max_file_lines_unless_listed_with_a_reason():
    long = {name: lines for name, lines in _file_lengths(_product_files()).items() if lines > MAX_FILE_LINES}
    unlisted = {name: lines for name, lines in long.items() if name not in LONG_FILES}
    assert unlisted == {}, f"split these by what they are about, or list them with a reason: {unlisted}"


def test_every_listed_long_file_exists_is_still_long_and_says_why():
    lengths = _file_lengths(_product_files())
    for name, reason in LONG_FILES.items():
        assert lengths.get(name, 0) > MAX_FILE_LINES, f"{name} is gone or short now: drop it from the list"
        assert reason.strip(), f"{name} needs its reason"


def test_the_file_check_counts_every_line_of_every_module_below_the_folders(tmp_path):
    """The check itself can fail: a nested module's lines are all counted, the last one without a newline too."""
    nested = tmp_path / "planner" / "sub"
    nested.mkdir(parents=True)
    (nested / "big.py").write_text("x = 1\n" * MAX_FILE_LINES + "y = 2", encoding="utf-8")
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "small.py").write_text("z = 3\n", encoding="utf-8")
    assert _file_lengths(_product_files(tmp_path), root=tmp_path) == {
        "planner/sub/big.py": MAX_FILE_LINES + 1, "runtime/small.py": 1}
