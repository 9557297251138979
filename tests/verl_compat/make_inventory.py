"""Write presets/verl_inventory.json: every key of verl's trainer configs and every advantage estimator, per release.

The facts come from verl's own sources at each release, never from rlplan's memory of them:

- keys: Hydra composes the release's `verl/trainer/config/ppo_trainer.yaml` (the FSDP trainer) and
  `ppo_megatron_trainer.yaml` (Megatron) from that release's config folder, with no overrides, exactly as
  `@hydra.main(config_name=...)` does at start-up; every leaf of the composed config (and every empty mapping,
  which only a `+key.sub=...` extends) is a key that release's command line accepts as `key=value`. Its default is
  the value as written (an interpolation stays `${...}`).
- estimators: the `AdvantageEstimator` enum (verl/trainer/ppo/ray_trainer.py up to 0.4.0, core_algos.py from
  0.4.1) and the names `register_adv_est(...)` registers (core_algos.py from 0.4.1), read with `ast`.

A release is read from a verl git directory at its tag (`v<release>`, e.g. from the search tool's
`fetch github:volcengine/verl`), or, where that directory lacks the tag, from the release's wheel (`pip download
--no-deps verl==<release>`: the wheel holds the same config folder and modules). Which one, and the files read,
are written beside the facts.

Usage (needs hydra-core and PyYAML; nothing of verl is imported):

    python tests/verl_compat/make_inventory.py --git /path/to/verl.git --wheels /path/to/wheel-dir \
        [--write presets/verl_inventory.json]

Without --write it compares with the committed file and exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rlplan.planner.stack import VERL_RELEASES  # noqa: E402
from rlplan.planner.verl_inventory import INVENTORY_FILE, TRAINER_CONFIGS  # noqa: E402

CONFIG_DIR = "verl/trainer/config"
ESTIMATOR_FILES = ("verl/trainer/ppo/ray_trainer.py", "verl/trainer/ppo/core_algos.py")


class ReleaseSource:
    """One release's files: a git tag, or a wheel."""

    def __init__(self, release: str, git_dir: Path | None, wheel_dir: Path | None) -> None:
        self.release = release
        self.tag = f"v{release}"
        self.git_dir = git_dir if git_dir is not None and self._has_tag(git_dir) else None
        self.wheel: Path | None = None
        if self.git_dir is None and wheel_dir is not None:
            self.wheel = next(iter(sorted(wheel_dir.glob(f"verl-{release}-*.whl"))), None)
        if self.git_dir is None and self.wheel is None:
            raise SystemExit(f"verl {release}: no tag {self.tag} in --git and no verl-{release}-*.whl in --wheels")

    def _has_tag(self, git_dir: Path) -> bool:
        done = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "--verify", "-q", f"{self.tag}^{{commit}}"],
                              capture_output=True, text=True)
        return done.returncode == 0

    @property
    def described(self) -> str:
        if self.git_dir is not None:
            commit = subprocess.run(["git", "--git-dir", str(self.git_dir), "rev-parse", f"{self.tag}^{{commit}}"],
                                    capture_output=True, text=True, check=True).stdout.strip()
            return f"volcengine/verl tag {self.tag} ({commit})"
        assert self.wheel is not None
        return f"PyPI wheel {self.wheel.name}"

    def paths(self, folder: str) -> list[str]:
        if self.git_dir is not None:
            out = subprocess.run(["git", "--git-dir", str(self.git_dir), "ls-tree", "-r", "--name-only", self.tag,
                                  folder], capture_output=True, text=True, check=True).stdout
            return out.split()
        assert self.wheel is not None
        with zipfile.ZipFile(self.wheel) as archive:
            return [name for name in archive.namelist() if name.startswith(folder + "/")]

    def read(self, path: str) -> str | None:
        if self.git_dir is not None:
            done = subprocess.run(["git", "--git-dir", str(self.git_dir), "show", f"{self.tag}:{path}"],
                                  capture_output=True, text=True)
            return done.stdout if done.returncode == 0 else None
        assert self.wheel is not None
        with zipfile.ZipFile(self.wheel) as archive:
            return archive.read(path).decode() if path in archive.namelist() else None


_CONFIG_DIRS: dict[str, tempfile.TemporaryDirectory[str]] = {}


def config_dir(source: ReleaseSource) -> Path:
    """The release's config folder, written out once per process."""
    if source.release not in _CONFIG_DIRS:
        folder = tempfile.TemporaryDirectory(prefix=f"verl-{source.release}-config-")
        for path in source.paths(CONFIG_DIR):
            if path.endswith(".yaml"):
                target = Path(folder.name, path[len(CONFIG_DIR) + 1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(source.read(path) or "")
        _CONFIG_DIRS[source.release] = folder
    return Path(_CONFIG_DIRS[source.release].name)


def composed(source: ReleaseSource, config_name: str, overrides: list[str] | tuple[str, ...] = ()
             ) -> dict[str, Any] | None:
    """The release's trainer config as Hydra composes it with these command-line overrides (values as written);
    None where the release has no such config. Hydra's refusal of an override is raised."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    folder = config_dir(source)
    if not (folder / f"{config_name}.yaml").is_file():
        return None
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        config = compose(config_name=config_name, overrides=list(overrides))
    container = OmegaConf.to_container(config, resolve=False)
    assert isinstance(container, dict)
    return container


def leaves(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf; an empty mapping is a leaf (`{}`), a list is one value."""
    for name, value in node.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            yield from leaves(value, key + ".")
        else:
            yield key, value


def _enum_values(tree: ast.Module) -> dict[str, str]:
    """AdvantageEstimator's members: NAME -> value."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "AdvantageEstimator":
            return {target.id: statement.value.value
                    for statement in node.body if isinstance(statement, ast.Assign)
                    and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)
                    for target in statement.targets if isinstance(target, ast.Name)}
    return {}


def _registered(tree: ast.Module, members: dict[str, str]) -> set[str]:
    """The names `@register_adv_est(...)` registers: a string, or an AdvantageEstimator member."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_adv_est" and node.args):
            argument = node.args[0]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                names.add(argument.value)
            elif isinstance(argument, ast.Attribute) and argument.attr in members:
                names.add(members[argument.attr])
    return names


def estimators(source: ReleaseSource) -> tuple[list[str], list[str]]:
    """(the estimator names the release accepts, the files they were read in)."""
    found: set[str] = set()
    files: list[str] = []
    members: dict[str, str] = {}
    trees = {path: ast.parse(text) for path in ESTIMATOR_FILES if (text := source.read(path)) is not None}
    for path, tree in trees.items():
        if values := _enum_values(tree):
            members = values
            found.update(values.values())
            files.append(path)
    for path, tree in trees.items():
        if registered := _registered(tree, members):
            found.update(registered)
            if path not in files:
                files.append(path)
    return sorted(found), files


def spans(present: dict[str, Any]) -> list[list[Any]]:
    """[since, before, default] runs over VERL_RELEASES: a new run where the key appears or its default changes;
    `before` is the first release after the run (None: still there in the newest read)."""
    runs: list[list[Any]] = []
    for index, release in enumerate(VERL_RELEASES):
        if release not in present:
            continue
        value = present[release]
        if runs and runs[-1][1] == release and runs[-1][2] == value:
            runs[-1][1] = VERL_RELEASES[index + 1] if index + 1 < len(VERL_RELEASES) else None
            continue
        runs.append([release, VERL_RELEASES[index + 1] if index + 1 < len(VERL_RELEASES) else None, value])
    return runs


def _name_spans(present: set[str]) -> list[list[str | None]]:
    return [run[:2] for run in spans({release: None for release in present})]


def inventory(git_dir: Path | None, wheel_dir: Path | None) -> dict[str, Any]:
    releases: dict[str, Any] = {}
    keys: dict[str, dict[str, dict[str, Any]]] = {backend: {} for backend in TRAINER_CONFIGS}
    estimator_releases: dict[str, set[str]] = {}
    for release in VERL_RELEASES:
        source = ReleaseSource(release, git_dir, wheel_dir)
        record: dict[str, Any] = {"source": source.described}
        for backend, config_name in TRAINER_CONFIGS.items():
            config = composed(source, config_name)
            if config is None:
                continue
            record[backend] = f"{CONFIG_DIR}/{config_name}.yaml (composed by hydra)"
            for key, value in leaves(config):
                keys[backend].setdefault(key, {})[release] = value
        names, files = estimators(source)
        record["estimators"] = files
        for name in names:
            estimator_releases.setdefault(name, set()).add(release)
        releases[release] = record
        print(f"verl {release}: {source.described}: " + ", ".join(
            f"{sum(release in k for k in keys[b].values())} {b} keys" for b in TRAINER_CONFIGS)
            + f", {len(names)} estimators", file=sys.stderr)
    return {
        "about": "verl's trainer-config keys and advantage estimators per release, read from verl's own sources; "
                 "written by tests/verl_compat/make_inventory.py, do not edit. keys: backend -> key -> "
                 "[[since, before, default], ...] (since inclusive, before exclusive, None: still there in the "
                 "newest release read; a new run where the default changes).",
        "releases": releases,
        "estimators": {name: _name_spans(present) for name, present in sorted(estimator_releases.items())},
        "keys": {backend: {key: spans(present) for key, present in sorted(table.items())}
                 for backend, table in keys.items()},
    }


def dumped(data: dict[str, Any]) -> str:
    """One key per line, so a diff between two inventories reads key by key."""
    lines = ["{"]
    for section_index, (section, value) in enumerate(data.items()):
        comma = "," if section_index < len(data) - 1 else ""
        if section != "keys":
            lines.append(f"  {json.dumps(section)}: {json.dumps(value, sort_keys=False)}{comma}")
            continue
        lines.append('  "keys": {')
        for backend_index, (backend, table) in enumerate(value.items()):
            lines.append(f"    {json.dumps(backend)}: {{")
            for key_index, (key, runs) in enumerate(table.items()):
                lines.append(f"      {json.dumps(key)}: {json.dumps(runs)}" + ("," if key_index < len(table) - 1 else ""))
            lines.append("    }" + ("," if backend_index < len(value) - 1 else ""))
        lines.append("  }" + comma)
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git", type=Path, help="a verl git directory (bare or not) with the release tags")
    parser.add_argument("--wheels", type=Path, help="a folder of verl wheels, for releases --git has no tag of")
    parser.add_argument("--write", type=Path, help="write the inventory here (else compare with the committed one)")
    args = parser.parse_args()
    text = dumped(inventory(args.git, args.wheels))
    if args.write:
        args.write.write_text(text)
        return 0
    committed = (ROOT / "presets" / INVENTORY_FILE).read_text()
    if committed != text:
        print(f"presets/{INVENTORY_FILE} differs from what verl's sources give; rerun with --write", file=sys.stderr)
        return 1
    print(f"presets/{INVENTORY_FILE} agrees with verl's sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
