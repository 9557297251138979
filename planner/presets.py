"""Built-in model and GPU presets, and the resolution of a user's --model / --gpu to them.

The presets are package data (presets/models.toml, presets/gpus.toml), parsed once per
process. Resolution is pure: the CLI reads a local config.json and passes its dictionary in.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from pathlib import PurePath
from typing import Any

import attrs
from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import GpuSpec
from rlplan.planner.hf_config import architecture_from_hf_config
from rlplan.planner.package_data import package_toml

# An unknown GPU given only by its memory: assume A100-class compute and PCIe-only links, so
# step-time estimates err slow rather than promise what the card may not have.
CUSTOM_GPU_BF16_TFLOPS = 312.0
CUSTOM_GPU_HBM_GBPS = 1555.0
CUSTOM_GPU_PCIE_GBPS = 25.0
CUSTOM_GPU_INTRANODE_GBPS = 25.0

# A Hugging Face repo id (ORG/NAME), as opposed to a local path.
HUB_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")

_MODEL_PRESET_KEYS = ("repo_ids", "repo_overrides", "published_params_b", "published_active_params_b")


def _optional_float(value: Any) -> float | None:
    # Not attrs.converters.optional(float): attrs reads a converter's signature, and a builtin's costs a tokenize
    # pass (its regexes compiled on first use) at import, a tenth of a whole `rlplan solve` process.
    return None if value is None else float(value)


@frozen(kw_only=True)
class ModelPreset:
    """A named architecture and the Hugging Face repos that ship it."""

    name: str
    arch: Architecture
    # The first repo is the one a bare preset name stands for.
    repo_ids: tuple[str, ...]
    published_params_b: float | None = attrs.field(default=None, converter=_optional_float)
    published_active_params_b: float | None = attrs.field(default=None, converter=_optional_float)
    # (repo id, ((field, value), ...)): listed repos whose config.json differs from `arch`
    # in a field that changes no weight shape, e.g. a base release's longer context.
    repo_overrides: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def __attrs_post_init__(self) -> None:
        # Shipped data, not user input: a broken table is a bug, found by the preset tests.
        if not self.repo_ids:
            raise ValueError(f"model preset {self.name!r} lists no repo ids")
        listed = {repo_id.lower() for repo_id in self.repo_ids}
        for repo_id, _ in self.repo_overrides:
            if repo_id.lower() not in listed:
                raise ValueError(f"model preset {self.name!r} overrides {repo_id!r}, which it does not list")
            self.arch_for(repo_id)

    @property
    def default_repo_id(self) -> str:
        return self.repo_ids[0]

    def arch_for(self, repo_id: str) -> Architecture:
        """The architecture of one listed repo (case-insensitive)."""
        for listed, overrides in self.repo_overrides:
            if listed.lower() == repo_id.lower():
                return attrs.evolve(self.arch, **dict(overrides))
        return self.arch


@frozen(kw_only=True)
class ResolvedModel:
    """What --model named: a display name, where the weights come from, and the shapes."""

    name: str
    # A hub repo id, or the local directory / config.json path the user gave.
    path: str
    arch: Architecture


def _read_package_toml(filename: str) -> dict[str, Any]:
    return package_toml(filename)


def _model_preset(name: str, table: dict[str, Any]) -> ModelPreset:
    arch_fields = {key: value for key, value in table.items() if key not in _MODEL_PRESET_KEYS}
    overrides = table.get("repo_overrides", {})
    return ModelPreset(
        name=name,
        arch=Architecture(**arch_fields),
        repo_ids=tuple(table["repo_ids"]),
        published_params_b=table.get("published_params_b"),
        published_active_params_b=table.get("published_active_params_b"),
        repo_overrides=tuple((repo, tuple(fields.items())) for repo, fields in overrides.items()),
    )


@functools.cache
def _model_tables() -> dict[str, dict[str, Any]]:
    return _read_package_toml("models.toml")


@functools.cache
def _model_presets() -> dict[str, ModelPreset]:
    return {name: _model_preset(name, table) for name, table in _model_tables().items() if "unsupported" not in table}


@functools.cache
def unsupported_models() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Releases rlplan recognises and refuses: lower-case name -> (the reason, their repo ids)."""
    return {name: (table["unsupported"], tuple(table["repo_ids"]))
            for name, table in _model_tables().items() if "unsupported" in table}


def model_presets() -> dict[str, ModelPreset]:
    """Every built-in model preset, by lower-case name, in file order."""
    return dict(_model_presets())


@functools.cache
def _gpu_tables() -> dict[str, dict[str, Any]]:
    return _read_package_toml("gpus.toml")


# Keys of a GPU table that describe the preset, not the GpuSpec: its other names and its typical host.
_GPU_TABLE_ONLY_KEYS = frozenset({"aliases", "host_memory_gib", "host_memory_gpus", "host_memory_source"})


@functools.cache
def _gpu_presets() -> dict[str, GpuSpec]:
    return {
        name: GpuSpec(name=name, **{key: value for key, value in table.items() if key not in _GPU_TABLE_ONLY_KEYS})
        for name, table in _gpu_tables().items()
    }


# A GPU without a preset (--gpu-mem): host RAM as a PCIe server of 8 cards is often built.
CUSTOM_GPU_HOST = (1024.0, 8, "a PCIe server with 8 cards: 1 TiB is common (no single reference)")


@frozen(kw_only=True)
class HostAssumption:
    """The host RAM per node `solve` assumes when --host-mem is not given, and where the figure comes from."""

    gib: float
    source: str

    def describe(self) -> str:
        return f"{self.gib:g} GiB of host RAM per node assumed ({self.source})"


def typical_host_memory(gpu: GpuSpec, gpus_per_node: int) -> HostAssumption:
    """The host RAM typical for a node of `gpus_per_node` GPUs of this kind: the preset's figure scaled per GPU."""
    table = _gpu_tables().get(gpu.name, {})
    node_gib, node_gpus, source = (table["host_memory_gib"], table["host_memory_gpus"], table["host_memory_source"]
                                   ) if "host_memory_gib" in table else CUSTOM_GPU_HOST
    gib = float(node_gib) * gpus_per_node / int(node_gpus)
    scaled = "" if gpus_per_node == node_gpus else f", scaled to {gpus_per_node} GPU{'s' * (gpus_per_node > 1)}"
    return HostAssumption(gib=round(gib, 1), source=f"{source}{scaled}")


def gpu_presets() -> dict[str, GpuSpec]:
    """Every built-in GPU, by its canonical name (e.g. "H100-80G"), in file order."""
    return dict(_gpu_presets())


# --- models ------------------------------------------------------------------


@functools.cache
def _repo_index() -> dict[str, tuple[str, str]]:
    """Lower-case repo id, and repo name without its organisation, -> (preset name, repo id).

    A bare repo name that two presets list resolves through neither.
    """
    full: dict[str, tuple[str, str]] = {}
    bare: dict[str, set[tuple[str, str]]] = {}
    for preset in _model_presets().values():
        for repo_id in preset.repo_ids:
            full[repo_id.lower()] = (preset.name, repo_id)
            bare.setdefault(repo_id.rpartition("/")[2].lower(), set()).add((preset.name, repo_id))
    unique_bare = {name: next(iter(hits)) for name, hits in bare.items() if len(hits) == 1}
    return {**unique_bare, **full}


# A suffix naming a context length ("-1M", "-128k") marks a release whose config.json differs
# from its base's in max_position_embeddings: never a variant of the shorter preset.
_CONTEXT_SUFFIX = re.compile(r"-\d+(\.\d+)?[km](-|$)")


def _listed_repo_for(key: str) -> tuple[str, str] | None:
    """The listed repo `key` names, exactly or as a suffixed variant ("...-Instruct-AWQ")."""
    index = _repo_index()
    if key in index:
        return index[key]
    # The longest listed name that `key` extends at a "-" boundary: "qwen2.5-7b-instruct-awq"
    # extends both "qwen2.5-7b" and "qwen2.5-7b-instruct", and the longer one is the variant's base.
    prefixes = [listed for listed in index if key.startswith(listed + "-")]
    if not prefixes:
        return None
    base = max(prefixes, key=len)
    return None if _CONTEXT_SUFFIX.search(key[len(base):]) else index[base]


def _refused_model(key: str) -> PlanError | None:
    """The refusal for a release rlplan recognises but does not model, named by preset or repo id."""
    for name, (reason, repo_ids) in unsupported_models().items():
        names = {name, *(repo.lower() for repo in repo_ids), *(repo.rpartition("/")[2].lower() for repo in repo_ids)}
        if key in names or any(key.startswith(listed + "-") for listed in names):
            return PlanError(
                field="model",
                message=f"{name} ({repo_ids[0]}) is not supported: {reason}.",
                fix="plan a supported model (`rlplan presets models`); rlplan refuses rather than mis-cost the memory",
            )
    return None


def _local_model_name(spec: str) -> str:
    path = PurePath(spec)
    return (path.parent if path.name == "config.json" else path).name or spec


def _unknown_model(spec: str) -> PlanError:
    presets = _model_presets()
    candidates = {name: name for name in presets} | {key: hit[0] for key, hit in _repo_index().items()}
    close = difflib.get_close_matches(spec.strip().lower(), list(candidates), n=8, cutoff=0.6)
    nearest = list(dict.fromkeys(candidates[match] for match in close))[:4]
    hint = f" Nearest presets: {', '.join(nearest)}." if nearest else ""
    return PlanError(
        field="model",
        message=f"{spec!r} is neither a built-in preset nor a Hugging Face repo id a preset lists.{hint}",
        fix=(
            "pick a preset from `rlplan presets models`, or point --model at a local model directory "
            "(or its config.json) so its architecture is read from config.json; for a hub model (e.g. an RL "
            "fine-tune of a listed base), fetch just its config: `huggingface-cli download ORG/NAME config.json "
            "--local-dir DIR`, then pass --model DIR"
        ),
    )


def resolve_model(spec: str, local_config: dict[str, Any] | None = None) -> ResolvedModel:
    """Resolve --model: a preset name, a listed repo id (or a suffixed variant of one), or a local config.

    `local_config` is the parsed config.json the CLI found at `spec`; when given it wins, since
    the user's own file is the truth about their checkpoint.
    """
    if local_config is not None:
        return ResolvedModel(
            name=_local_model_name(spec),
            path=spec,
            arch=architecture_from_hf_config(local_config, source=spec),
        )
    key = spec.strip().lower()
    refused = _refused_model(key)
    if refused is not None:
        raise refused
    presets = _model_presets()
    if key in presets:
        preset = presets[key]
        return ResolvedModel(name=preset.name, path=preset.default_repo_id, arch=preset.arch)
    listed = _listed_repo_for(key)
    if listed is None:
        raise _unknown_model(spec)
    preset_name, repo_id = listed
    return ResolvedModel(name=preset_name, path=spec.strip(), arch=presets[preset_name].arch_for(repo_id))


# --- GPUs --------------------------------------------------------------------


def _gpu_key(name: str) -> str:
    """Spelling-insensitive form: "NVIDIA H100 80GB HBM3" and "nvidia_h100_80g_hbm3" agree."""
    key = re.sub(r"[\s_]+", "-", name.strip().lower())
    return re.sub(r"(\d)gb\b", r"\1g", key)


@functools.cache
def _gpu_index() -> dict[str, tuple[str, ...]]:
    """Spelling-insensitive name or alias -> the presets it names (two or more: ambiguous)."""
    index: dict[str, list[str]] = {}
    for name, table in _gpu_tables().items():
        for alias in (name, *table.get("aliases", ())):
            named = index.setdefault(_gpu_key(alias), [])
            if name not in named:
                named.append(name)
    return {key: tuple(names) for key, names in index.items()}


def resolve_gpu(name: str) -> GpuSpec:
    """Resolve --gpu / cluster.gpu: a preset name or alias, in any case."""
    names = _gpu_index().get(_gpu_key(name), ())
    if len(names) == 1:
        return _gpu_presets()[names[0]]
    if names:
        message = f"{name!r} could mean {' or '.join(names)}."
        fix = f"name one of {', '.join(names)}, or give the memory with --gpu-mem GiB"
    else:
        message = f"{name!r} is not a built-in GPU. Known GPUs: {', '.join(gpu_presets())}."
        fix = "use one of those names, or describe the GPU by its usable memory with --gpu-mem GiB"
    raise PlanError(field="cluster.gpu", message=message, fix=fix)


# Bytes per unit a --gpu-mem value may carry; a bare number is GiB.
_MEMORY_UNITS = {"": 2**30, "g": 2**30, "gi": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "ti": 2**40,
                 "tib": 2**40, "tb": 10**12, "m": 2**20, "mi": 2**20, "mib": 2**20, "mb": 10**6}
# No accelerator has less or more than this; a bare number above it is almost surely MiB (nvidia-smi's unit).
GPU_MEMORY_GIB_RANGE = (1.0, 2048.0)


def _amount_and_unit(raw: str) -> tuple[float, str]:
    """(number, lower-case unit) of `80GB`; NaN when the number is not one."""
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    return value, raw[len(number):].strip().lower()


def parse_memory_amount(text: str | float, flag: str) -> float:
    """GiB from `512`, `512GiB`, `550GB`, `4096MiB` or `0.5TiB` (a bare number is GiB), for any amount >= 0."""
    raw = str(text).strip()
    value, unit = _amount_and_unit(raw)
    if unit not in _MEMORY_UNITS or not math.isfinite(value) or value < 0:
        raise PlanError(field=flag, message=f"{raw[:40]!r} is not an amount of memory.",
                        fix=f"pass GiB or a unit, e.g. {flag} 512 (GiB), {flag} 512GiB or {flag} 550GB")
    return value * _MEMORY_UNITS[unit] / 2**30


def parse_host_memory(text: str | None, flag: str = "--host-mem") -> float | None:
    """--host-mem: GiB per node, or with a unit as --gpu-mem takes (512GiB, 550GB); None when not given."""
    if text is None:
        return None
    gib = parse_memory_amount(text, flag)
    if gib <= 0:
        raise PlanError(field=flag, message=f"must be a positive amount of host RAM per node, got {text!r}.",
                        fix=f"pass the RAM of one node, e.g. {flag} 512GiB")
    return gib


def parse_gpu_memory(text: str | float, flag: str = "--gpu-mem") -> float:
    """GiB from `80`, `79.18GiB`, `80GB`, `81559MiB` (as nvidia-smi prints it) or `0.5TiB`."""
    raw = str(text).strip()
    value, unit = _amount_and_unit(raw)
    if unit not in _MEMORY_UNITS or not math.isfinite(value):
        raise PlanError(field=flag, message=f"{raw[:40]!r} is not an amount of memory.",
                        fix=f"pass the memory the driver reports, e.g. {flag} 79.18 (GiB), {flag} 81559MiB or {flag} 80GB")
    gib = value * _MEMORY_UNITS[unit] / 2**30
    low, high = GPU_MEMORY_GIB_RANGE
    if not low <= gib <= high:
        hint = (f"; {value:g} looks like MiB, as nvidia-smi prints it: pass {flag} {value:g}MiB"
                if not unit and high < value <= high * 1024 else "")
        raise PlanError(field=flag, message=f"{gib:g} GiB is not the memory of one GPU (expected {low:g} to {high:g} GiB).",
                        fix=f"pass the memory of one GPU in GiB, or with a unit (80GB, 81559MiB){hint}")
    return gib


def custom_gpu(memory_gib: float, *, bf16_tflops: float | None = None, hbm_gbps: float | None = None) -> GpuSpec:
    """A GPU known by its usable memory (--gpu-mem); speeds the user does not give are modest defaults
    (an A100 40GB's), which `defaulted_speeds` names so the user can be told."""
    memory_gib = parse_gpu_memory(memory_gib)
    for flag, value in (("--gpu-tflops", bf16_tflops), ("--gpu-bandwidth", hbm_gbps)):
        if value is not None and not (math.isfinite(value) and 0 < value <= 1e6):
            raise PlanError(field=flag, message=f"must be a positive, finite number, got {value}.",
                            fix=f"pass the datasheet's figure, e.g. {flag} {989 if flag == '--gpu-tflops' else 3350}")
    return GpuSpec(
        name=f"custom-{memory_gib:g}g",
        memory_gib=memory_gib,
        bf16_tflops=CUSTOM_GPU_BF16_TFLOPS if bf16_tflops is None else bf16_tflops,
        hbm_gbps=CUSTOM_GPU_HBM_GBPS if hbm_gbps is None else hbm_gbps,
        pcie_gbps=CUSTOM_GPU_PCIE_GBPS,
        intranode_gbps=CUSTOM_GPU_INTRANODE_GBPS,
    )


def defaulted_speeds(bf16_tflops: float | None, hbm_gbps: float | None) -> str:
    """The sentence telling a --gpu-mem user which speeds step times assume; empty when both were given."""
    missing = [f"{CUSTOM_GPU_BF16_TFLOPS:g} BF16 TFLOPS (--gpu-tflops)" if bf16_tflops is None else "",
               f"{CUSTOM_GPU_HBM_GBPS:g} GB/s memory bandwidth (--gpu-bandwidth)" if hbm_gbps is None else ""]
    missing = [item for item in missing if item]
    if not missing:
        return ""
    return ("step times assume the default " + " and ".join(missing)
            + " for this GPU (an A100 40GB's); pass its datasheet figures for real estimates")
