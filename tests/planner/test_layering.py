"""The planner's layering, checked rather than promised: the pure planner modules never print and never
import the runtime or the heavy libraries; the commands layer imports the runtime only inside a command."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PLANNER = Path(__file__).resolve().parents[2] / "planner"


def _planner_module_path(name: str) -> Path:
    """A planner module by its dotted name below rlplan.planner: "rules", "memory" (a package), "memory.fsdp"."""
    path = PLANNER.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _planner_module_names() -> list[str]:
    """Every module of the planner, subpackages' modules included (memory.fsdp), a package by its own name."""
    names = []
    for path in PLANNER.rglob("*.py"):
        parts = path.relative_to(PLANNER).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.append(".".join(parts))
    return names


# The commands layer is its folder, planner/commands/: the typer entry and the modules that read files, print and
# pick exit codes.
COMMANDS_LAYER = frozenset(name for name in _planner_module_names() if name.split(".")[0] == "commands")
PURE_MODULES = sorted(name for name in _planner_module_names() if name not in COMMANDS_LAYER)
HEAVY = ("torch", "vllm", "ray", "transformers")


def _tree(name: str) -> ast.Module:
    return ast.parse(_planner_module_path(name).read_text(encoding="utf-8"))


def _imported_modules(node: ast.AST) -> list[str]:
    names: list[str] = []
    for child in ast.walk(node):
        if isinstance(child, ast.Import):
            names.extend(alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module:
            names.append(child.module)
    return names


def _output_calls(tree: ast.Module) -> list[str]:
    """Lines that print: print(...), anything.print(...) (a rich console), sys.stdout/sys.stderr.write(...)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "print":
            found.append(f"line {node.lineno}: print(")
        elif isinstance(func, ast.Attribute) and func.attr == "print":
            found.append(f"line {node.lineno}: .print(")
        elif (isinstance(func, ast.Attribute) and func.attr == "write" and isinstance(func.value, ast.Attribute)
              and func.value.attr in ("stdout", "stderr")):
            found.append(f"line {node.lineno}: {func.value.attr}.write(")
    return found


def test_the_pure_modules_are_all_but_the_commands_layer():
    assert {"solver", "rules", "memory", "memory.fsdp", "plan", "report", "verl_import"} <= set(PURE_MODULES)
    assert {"commands.cli", "commands.entry", "commands.commands_io", "commands.solve_commands"} <= COMMANDS_LAYER
    assert all(_planner_module_path(name).is_file() for name in COMMANDS_LAYER)


@pytest.mark.parametrize("name", PURE_MODULES)
def test_a_pure_planner_module_never_prints(name):
    assert _output_calls(_tree(name)) == []


@pytest.mark.parametrize("name", PURE_MODULES)
def test_a_pure_planner_module_never_imports_the_runtime_or_typer_anywhere(name):
    """Also not inside a function: a pure module that reached for the runtime (or the command line) would tie
    the planner to it. (hf_config.py may import transformers inside its config reader: the import-time test below
    checks that no heavy library loads with a module.)"""
    found = [module for module in _imported_modules(_tree(name))
             if module.startswith("rlplan.runtime") or module.split(".")[0] == "typer"]
    assert found == []


@pytest.mark.parametrize("name", PURE_MODULES)
def test_a_pure_planner_module_never_imports_the_commands_layer(name):
    """The commands folder is the one door: the pure planner is imported by it, never the other way."""
    found = [module for module in _imported_modules(_tree(name)) if module.startswith("rlplan.planner.commands")]
    assert found == []


def test_the_output_check_finds_printing():
    tree = ast.parse("import sys\ndef f(console):\n    print(1)\n    console.print(2)\n    sys.stderr.write('x')\n")
    assert len(_output_calls(tree)) == 3


def test_the_commands_layer_imports_the_runtime_only_inside_a_command():
    """Module-level imports only: `rlplan solve` must not load the runtime (run, demo, measure, calibrate and
    solve --verify import it inside their functions)."""
    for name in sorted(COMMANDS_LAYER):
        top_level = [module for statement in _tree(name).body for module in _imported_modules(statement)
                     if not isinstance(statement, (ast.FunctionDef, ast.ClassDef))]
        assert not [m for m in top_level if m.startswith("rlplan.runtime") or m.split(".")[0] in HEAVY], name


def test_no_command_module_imports_the_typer_entry():
    """cli.py imports the other command modules inside its typer functions; what they share lives in
    commands_io.py, knobs.py, platform.py and this_machine.py, so imports go one way and no cycle is left
    (interop_commands.py and cli.py used to import each other)."""
    # entry.py is the console script in front of cli.py: it loads cli.py, inside its one function.
    importers = [name for name in sorted(COMMANDS_LAYER - {"commands.cli", "commands.entry"})
                 if "rlplan.planner.commands.cli" in _imported_modules(_tree(name))]
    assert importers == []


def test_no_runtime_module_imports_the_typer_entry():
    """cli.py imports the runtime commands inside its typer functions; what they share with the planner's
    commands (commands_io, this_machine, platform) is imported from there, never from cli.py."""
    runtime = PLANNER.parent / "runtime"
    importers = [str(path.relative_to(runtime)) for path in sorted(runtime.rglob("*.py"))
                 if "rlplan.planner.commands.cli" in _imported_modules(ast.parse(path.read_text(encoding="utf-8")))]
    assert importers == []


def test_importing_each_planner_module_loads_no_runtime_and_no_heavy_library():
    """In a fresh interpreter, each planner module in turn: what it newly loaded of rlplan.runtime, torch,
    vLLM, Ray or transformers, named after the module that loaded it."""
    modules = [f"rlplan.planner.{name}" for name in PURE_MODULES + sorted(COMMANDS_LAYER)]
    code = (
        "import importlib, json, sys\n"
        f"heavy = {HEAVY!r}\n"
        "def loaded():\n"
        "    return {m for m in sys.modules if m.startswith('rlplan.runtime') or m.split('.')[0] in heavy}\n"
        "found = {}\n"
        f"for name in {modules!r}:\n"
        "    before = loaded()\n"
        "    importlib.import_module(name)\n"
        "    new = sorted(loaded() - before)\n"
        "    if new:\n"
        "        found[name] = new\n"
        "print(json.dumps(found))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == {}


ROOT = PLANNER.parent
PACKAGE_FOLDERS = {"planner": "rlplan.planner", "runtime": "rlplan.runtime"}


def _rlplan_modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGE_FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """Every rlplan module -> the rlplan modules it imports anywhere (inside functions too)."""
    modules = _rlplan_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
            # `from rlplan.x import name` may name a module or an attribute: keep the longest module it names.
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append([*stack[stack.index(target):], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_two_rlplan_modules_import_each_other_even_inside_functions():
    """A cycle hidden in a function-level import still ties two modules into one (issue 25: varlen attention and
    Ulysses once did); the layer that needs both imports both."""
    # Package __init__ modules re-export their package: they are not part of a module's own dependencies.
    modules = _rlplan_modules()
    graph = {name: {t for t in targets if modules[t].name != "__init__.py"} for name, targets in _import_graph().items()}
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
