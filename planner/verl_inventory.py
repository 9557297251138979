"""What each verl release's own config accepts: its trainer-config keys and its advantage estimators, as data.

presets/verl_inventory.json is written by tests/verl_compat/make_inventory.py from verl's sources at each release
(Hydra's composition of that release's `ppo_trainer` / `ppo_megatron_trainer`, its `AdvantageEstimator` enum and
registry), with the tag or wheel and the files each release was read from. This module reads it (no torch, no
verl) and answers: does release X have key K (on the FSDP or the Megatron trainer), from which release to which,
with which default; which estimators does X accept. verl_keys.py dates its keys with it, render and the solver
ask it what a target release has; nobody else reads the file.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

from rlplan.planner.package_data import package_file
from rlplan.planner.stack import in_range, parse_version

INVENTORY_FILE = "verl_inventory.json"
TrainerBackend = Literal["fsdp", "megatron"]
# The trainer config each backend's workers read (verl/trainer/config/<name>.yaml).
TRAINER_CONFIGS: dict[TrainerBackend, str] = {"fsdp": "ppo_trainer", "megatron": "ppo_megatron_trainer"}
# A key's runs over the releases: (since, before, default), since inclusive, before exclusive (None: open).
Run = tuple[str, str | None, Any]

@functools.cache
def _data() -> dict[str, Any]:
    text = package_file("rlplan.presets", INVENTORY_FILE).read_text(encoding="utf-8")
    return json.loads(text)

def releases_read() -> tuple[str, ...]:
    """The releases the inventory was read at, oldest first."""
    return tuple(_data()["releases"])

def release_source(release: str) -> dict[str, Any]:
    """Where a release's facts were read: {"source": tag or wheel, "fsdp"/"megatron": file, "estimators": files}."""
    return dict(_data()["releases"][release])

def key_runs(key: str, backend: TrainerBackend = "fsdp") -> tuple[Run, ...]:
    """The key's runs in that backend's trainer config (empty: no release read has it)."""
    return tuple((run[0], run[1], run[2]) for run in _data()["keys"][backend].get(key, ()))

def all_keys(backend: TrainerBackend = "fsdp") -> frozenset[str]:
    return frozenset(_data()["keys"][backend])

def _read_release(version: str) -> str:
    """The release read whose facts hold for `version`: the newest read release not after it (a patch release
    between two read ones has the older one's config), the oldest for a version older than all."""
    release = parse_version(version)
    read = releases_read()
    known = [name for name in read if parse_version(name) <= release]
    return known[-1] if known else read[0]

@functools.lru_cache(maxsize=4096)
def has_key(version: str, key: str, backend: TrainerBackend = "fsdp") -> bool:
    """Whether verl `version`'s trainer config of that backend has the key."""
    release = _read_release(version)
    return any(in_range(release, since, before) for since, before, _ in key_runs(key, backend))

@functools.cache
def keys_of(version: str, backend: TrainerBackend = "fsdp") -> frozenset[str]:
    """Every key verl `version`'s trainer config of that backend accepts as `key=value`."""
    release = _read_release(version)
    return frozenset(key for key, runs in _data()["keys"][backend].items()
                     if any(in_range(release, since, before) for since, before, _ in runs))

def default_of(version: str, key: str, backend: TrainerBackend = "fsdp") -> Any:
    """The key's default as verl `version`'s YAML writes it; KeyError where that release lacks the key."""
    release = _read_release(version)
    for since, before, default in key_runs(key, backend):
        if in_range(release, since, before):
            return default
    raise KeyError(f"verl {version} has no {key}")

def estimator_runs(name: str) -> tuple[tuple[str, str | None], ...]:
    return tuple((run[0], run[1]) for run in _data()["estimators"].get(name, ()))

def estimators_of(version: str) -> frozenset[str]:
    """The advantage estimators verl `version` accepts (its AdvantageEstimator enum and registry)."""
    release = _read_release(version)
    return frozenset(name for name, runs in _data()["estimators"].items()
                     if any(in_range(release, since, before) for since, before in runs))

def all_estimators() -> tuple[str, ...]:
    """Every estimator some release read accepts, sorted."""
    return tuple(sorted(_data()["estimators"]))


def supported_releases_text() -> str:
    """What `rlplan --version` says of the verl releases a plan can target (`--verl-version`)."""
    read = releases_read()
    return (f"verl releases planned for (--verl-version; each release's own keys and estimators read into "
            f"presets/{INVENTORY_FILE}): {', '.join(read)}; a patch release between two has the older one's keys")
