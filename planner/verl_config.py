"""The Hydra config a verl command composes, as far as an import needs it: which trainer config it builds on, and
the values a recipe's or example's own config files set on top of it.

verl resolves `--config-path` relative to the Python file that declares `@hydra.main` (`verl/trainer/main_ppo.py`:
`./config` is `verl/trainer/config`; a recipe module's own folder for `-m recipe.dapo.main_dapo`), or takes it
absolute; `--config-name` (else the module's own `config_name`) names `<path>/<name>.yaml`. Its `defaults` list
(entries composed in order, `_self_` where it stands, at the end when it is absent, `group@package: option`
entries under their package) and `hydra.searchpath` (`file://` relative to the folder the command runs in,
`pkg://` a package under it) are followed here. verl's own trainer configs (`ppo_trainer`,
`ppo_megatron_trainer`) are not read: the key table (verl_keys.py) holds their defaults. Pure: the caller passes
the function that reads a file.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from typing import Any

from attrs import frozen

from rlplan.planner.verl_keys import format_value

TextReader = Callable[[str], "str | None"]
BASE_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")
_MAIN_PPO = "verl.trainer.main_ppo"
_MAX_DEPTH = 8


@frozen(kw_only=True)
class TrainerConfig:
    """What the command's config is: its name, the file it was read from ("" when none was readable), the verl
    trainer config it builds on ("" when unknown), the values its own files set (dotted key -> Hydra value
    text, interpolations kept as written) and what could not be followed."""

    name: str
    path: str
    base: str
    values: tuple[tuple[str, str], ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def is_verls_own(self) -> bool:
        return self.name in BASE_CONFIGS

    @property
    def readable(self) -> bool:
        return self.is_verls_own or bool(self.path)


def _strip_yaml(name: str) -> str:
    return name[: -len(".yaml")] if name.endswith(".yaml") else name


def _hydra_main_arguments(source: str) -> dict[str, str]:
    """config_path / config_name of a module's `@hydra.main(...)` (string literals only)."""
    match = re.search(r"@hydra\.main\((.*?)\)", source, re.DOTALL)
    if not match:
        return {}
    return {key: value for key, value in re.findall(r"(config_path|config_name)\s*=\s*[\"']([^\"']*)[\"']",
                                                     match.group(1))}


def _load_yaml(text: str) -> Any:
    import yaml  # lazily: only an import of a recipe config reads YAML

    class _Loader(yaml.SafeLoader):
        pass

    # OmegaConf reads values as YAML 1.2-ish: `1e-6` is a float there, a string in PyYAML's 1.1 resolver.
    _Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$"),
        list("-+0123456789"),
    )
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


class _Composer:
    def __init__(self, read: TextReader, cwd: str) -> None:
        self.read = read
        self.cwd = cwd
        self.base = ""
        self.problems: list[str] = []
        self.files: list[str] = []

    def _search_dirs(self, data: dict[str, Any], here: str) -> list[str]:
        hydra = data.get("hydra") if isinstance(data.get("hydra"), dict) else {}
        dirs = [here]
        for entry in (hydra or {}).get("searchpath") or []:
            entry = str(entry)
            if entry.startswith("file://"):
                dirs.append(posixpath.normpath(posixpath.join(self.cwd, entry[len("file://") :])))
            elif entry.startswith("pkg://"):
                dirs.append(posixpath.join(self.cwd, *entry[len("pkg://") :].split(".")))
        return dirs

    def compose_file(self, path: str, depth: int = 0) -> dict[str, Any] | None:
        text = self.read(path)
        if text is None:
            return None
        try:
            data = _load_yaml(text)
        except Exception as error:  # yaml.YAMLError and its kin: a broken file is one named problem
            self.problems.append(f"{path} is not YAML rlplan can read ({type(error).__name__})")
            return None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.problems.append(f"{path} is not a mapping of keys")
            return None
        self.files.append(path)
        return self._compose(data, posixpath.dirname(path), depth)

    def _compose(self, data: dict[str, Any], here: str, depth: int) -> dict[str, Any]:
        defaults = data.get("defaults") or []
        own = {key: value for key, value in data.items() if key not in ("defaults", "hydra")}
        dirs = self._search_dirs(data, here)
        if not isinstance(defaults, list):
            defaults = []
        if "_self_" not in defaults:
            defaults = [*defaults, "_self_"]
        merged: dict[str, Any] = {}
        for entry in defaults:
            if entry == "_self_":
                _merge(merged, own)
                continue
            part = self._default(entry, dirs, depth)
            if part is not None:
                package, values = part
                _merge(merged, _nest_at(package, values))
        return merged

    def _default(self, entry: Any, dirs: list[str], depth: int) -> tuple[str, dict[str, Any]] | None:
        if isinstance(entry, str):
            group, option, package = "", _strip_yaml(entry.strip()), ""
        elif isinstance(entry, dict) and len(entry) == 1:
            (key, option), = entry.items()
            if option is None:
                return None
            key = str(key).removeprefix("override ").strip()
            group, _, package = key.partition("@")
            option = _strip_yaml(str(option))
            package = package if package else group.replace("/", ".")
        else:
            self.problems.append(f"a defaults entry rlplan does not read: {entry!r}")
            return None
        if not group and option in BASE_CONFIGS:
            self.base = option
            return None
        if depth >= _MAX_DEPTH:
            self.problems.append(f"defaults nest deeper than {_MAX_DEPTH} files at {option}")
            return None
        relative = posixpath.join(group, option) + ".yaml" if group else option + ".yaml"
        for folder in dirs:
            composed = self.compose_file(posixpath.join(folder, relative), depth + 1)
            if composed is not None:
                return ("" if package in ("_global_", "_here_") else package), composed
        self.problems.append(f"its defaults entry {relative} is in none of {', '.join(dirs)}")
        return None


def _merge(into: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _nest_at(package: str, values: dict[str, Any]) -> dict[str, Any]:
    for part in reversed([part for part in package.split(".") if part]):
        values = {part: values}
    return values


def _value_text(value: Any) -> str:
    """A YAML value as Hydra override text; an interpolation stays as written."""
    if isinstance(value, str) and "${" in value:
        return value
    if isinstance(value, list):
        return "[" + ",".join(_value_text(item) for item in value) + "]"
    return format_value(value)


def _flatten(values: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    flat: list[tuple[str, str]] = []
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.extend(_flatten(value, dotted + "."))
        elif str(key) != "_target_":
            flat.append((dotted, _value_text(value)))
    return flat


def _module_defaults(module: str, cwd: str | None, read: TextReader) -> tuple[str, dict[str, str]]:
    """The folder of the module's file and its @hydra.main config_path / config_name (empty when unreadable)."""
    module_file = posixpath.join(cwd or ".", *module.split(".")) + ".py"
    folder = posixpath.dirname(module_file)
    if module == _MAIN_PPO:
        return folder, {"config_path": "config", "config_name": "ppo_trainer"}
    source = read(module_file) if cwd is not None else None
    return folder, (_hydra_main_arguments(source) if source is not None else {})


def trainer_config(module: str, config_path: str | None, config_name: str | None, cwd: str | None,
                   read: TextReader) -> TrainerConfig:
    """The config the command composes: read when its file is readable from `cwd` (where `python -m` runs)."""
    folder, declared = _module_defaults(module, cwd, read)
    name = _strip_yaml(config_name or declared.get("config_name", "") or "")
    if not name:
        return TrainerConfig(name="", path="", base="", problems=(f"{module}'s config name is unknown here",))
    if name in BASE_CONFIGS or cwd is None:
        return TrainerConfig(name=name, path="", base=name if name in BASE_CONFIGS else "")
    path_text = config_path if config_path is not None else declared.get("config_path")
    if path_text is None:
        return TrainerConfig(name=name, path="", base="", problems=(f"{module}'s config path is unknown here",))
    directory = posixpath.normpath(posixpath.join(folder, path_text))
    file = posixpath.join(directory, name + ".yaml")
    composer = _Composer(read, cwd)
    composed = composer.compose_file(file)
    if composed is None:
        return TrainerConfig(name=name, path="", base="", problems=(*composer.problems, f"{file} is not readable"))
    return TrainerConfig(name=name, path=file, base=composer.base, values=tuple(_flatten(composed)),
                         problems=tuple(composer.problems))


def source_tree_defaults(cwd: str, read: TextReader, backend: str, keys: tuple[str, ...]) -> dict[str, str]:
    """What the verl source tree in `cwd` gives `keys` in its own trainer config (`verl/trainer/config/
    ppo_trainer.yaml`, or `ppo_megatron_trainer.yaml`, composed with its defaults list); a key it does not set, or
    an unreadable file, gives nothing. A tree between releases can default a switch its release number does not
    (stack.LEGACY_WORKER_SWITCH)."""
    name = BASE_CONFIGS[1] if backend == "megatron" else BASE_CONFIGS[0]
    composed = _Composer(read, cwd).compose_file(posixpath.join(cwd, "verl", "trainer", "config", name + ".yaml"))
    if composed is None:
        return {}
    return {key: value for key, value in _flatten(composed) if key in keys}
