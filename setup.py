"""Package discovery for the fixed top-level folders (planner/, runtime/, templates/, presets/).

The design card fixes those folders at the top of the repository and their import names under `rlplan`;
pyproject.toml's `packages.find` cannot add a prefix to what it finds, and a hand-kept list once missed
`rlplan.planner.memory` and `rlplan.planner.steptime` (a wheel whose every command died on import). So the
list is derived here: every folder with an `__init__.py` under each mapped folder is a package, found the
way setuptools finds them. `tests/test_packaging.py` holds the list to the tree; CI builds a wheel and an
sdist and runs the CLI from each in a clean venv.
"""

from __future__ import annotations

from setuptools import find_packages, setup

# Import name -> folder. The data-only folders (templates, presets) are packages too: they are read
# through importlib.resources.
PACKAGE_DIRS = {
    "rlplan.planner": "planner",
    "rlplan.runtime": "runtime",
    "rlplan.templates": "templates",
    "rlplan.presets": "presets",
}


def rlplan_packages() -> list[str]:
    packages = []
    for name, folder in PACKAGE_DIRS.items():
        packages.append(name)
        packages.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return sorted(packages)


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__; tests import it
    setup(package_dir=PACKAGE_DIRS, packages=rlplan_packages())
