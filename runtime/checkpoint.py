"""Checkpoints that are either complete or invisible.

A checkpoint for step N is written into `<output_dir>/checkpoints/.tmp-step-N`:
- every rank writes its shards with torch.distributed.checkpoint (model and
  optimizer through the distributed state-dict functions, so Adam moments are
  kept, and the LR scheduler and RNG states per rank);
- rank 0 adds the exported weights: the LoRA adapter written by peft's
  `save_pretrained` (`adapter/`, loadable with `PeftModel.from_pretrained`), or the
  full model as Hugging Face sharded safetensors with an index (`hf/`, loadable with
  `from_pretrained`), written one shard at a time;
- the controller writes `trainer_state.json` (step, data-loader position) last
  and renames the directory to `step-N`.

Only `step-N` directories holding `trainer_state.json` count as checkpoints, so a
crash at any point leaves at most a `.tmp-*` directory that resume ignores and
the next save replaces.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlplan.planner.phases import SyncMode

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.optim.lr_scheduler import LRScheduler

CHECKPOINTS = "checkpoints"
STAGING_PREFIX = ".tmp-step-"
COMPLETE_PREFIX = "step-"
TRAINER_STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_root(output_dir: str | os.PathLike[str]) -> Path:
    return Path(output_dir) / CHECKPOINTS


def staging_dir(output_dir: str | os.PathLike[str], step: int) -> Path:
    return checkpoint_root(output_dir) / f"{STAGING_PREFIX}{step}"


def complete_dir(output_dir: str | os.PathLike[str], step: int) -> Path:
    return checkpoint_root(output_dir) / f"{COMPLETE_PREFIX}{step}"


def complete_checkpoints(output_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint, oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and (entry / TRAINER_STATE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_complete_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    found = complete_checkpoints(output_dir)
    return found[-1][1] if found else None


def read_trainer_state(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / TRAINER_STATE).read_text())


def begin_checkpoint(output_dir: str | os.PathLike[str], step: int) -> Path:
    """A fresh staging directory for step N (a leftover from a crashed save is discarded)."""
    staging = staging_dir(output_dir, step)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def commit_checkpoint(
    output_dir: str | os.PathLike[str], step: int, trainer_state: dict[str, Any], keep: int | None = None
) -> Path:
    """Write the controller's state last, make it durable, then rename staging -> step-N in one move."""
    staging = staging_dir(output_dir, step)
    (staging / TRAINER_STATE).write_text(json.dumps({**trainer_state, "step": step}, indent=2, sort_keys=True))
    _fsync_tree(staging)
    final = complete_dir(output_dir, step)
    if final.exists():
        shutil.rmtree(final)
    os.rename(staging, final)
    if keep is not None:
        for _, old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


# --- per-rank sharded state --------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_training_state(directory: Path, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler, rank: int) -> None:
    """Collective: every rank writes its model and optimizer shards, plus its own scheduler and RNG."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory / name))
    torch.save(
        {"scheduler": scheduler.state_dict(), "rng": rng_state()},
        directory / name / f"rank-{rank}.pt",
    )


def load_training_state(directory: Path, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler, rank: int) -> None:
    """Collective: restore what `save_training_state` wrote, in place."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(directory / name))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    extra = torch.load(directory / name / f"rank-{rank}.pt", weights_only=False)
    scheduler.load_state_dict(extra["scheduler"])
    set_rng_state(extra["rng"])


# --- exports usable outside rlplan ---------------------------------------------------------------


def export_adapter(directory: Path, model: nn.Module, rank: int) -> None:
    """Collective gather of the LoRA weights; rank 0 writes them with peft's own `save_pretrained`."""
    from rlplan.runtime.weights import LORA_MARKER, full

    # The sharded adapter is gathered on every rank (a collective); peft picks the adapter keys out of
    # the gathered tensors, so what it writes is what `PeftModel.from_pretrained` reads.
    gathered = {name: full(p).detach().cpu() for name, p in model.named_parameters() if LORA_MARKER in name}
    if rank != 0:
        return
    # save_embedding_layers=False: "auto" looks the base model up on the Hub to see if its vocabulary grew,
    # and the runtime never resizes it.
    model.save_pretrained(str(directory / "adapter"), state_dict=gathered, save_embedding_layers=False)


# Hugging Face's own default shard size (save_pretrained, save_torch_state_dict).
HF_MAX_SHARD_SIZE = "5GB"


def export_hf_model(directory: Path, model: nn.Module, source_dir: str, rank: int, dtype: torch.dtype | None = None,
                    max_shard_size: int | str = HF_MAX_SHARD_SIZE) -> None:
    """Collective gather; rank 0 writes the merged model as HF sharded safetensors beside the source's config.

    huggingface_hub plans the shards and the index (`model-0000i-of-0000N.safetensors` +
    `model.safetensors.index.json`, or one `model.safetensors` when it fits one shard) from the
    tensors' shapes, before anything is gathered; rank 0 then writes each shard as soon as its last
    tensor arrives, so it holds one shard at a time, never the whole model.
    """
    from huggingface_hub import constants, split_state_dict_into_shards_factory
    from safetensors.torch import save_file

    from rlplan.runtime.weights import hf_weight_layout, iter_hf_weights

    layout = hf_weight_layout(model, dtype=dtype)
    split = split_state_dict_into_shards_factory(
        layout, get_storage_size=lambda spec: spec.nbytes, max_shard_size=max_shard_size,
        filename_pattern=constants.SAFETENSORS_WEIGHTS_FILE_PATTERN,
    )
    target = directory / "hf"
    if rank == 0:
        target.mkdir(parents=True, exist_ok=True)
    pending: dict[str, dict[str, Any]] = {}
    for name, tensor in iter_hf_weights(model, mode=SyncMode.MERGED, dtype=dtype):
        if rank != 0:
            continue
        filename = split.tensor_to_filename[name]
        shard = pending.setdefault(filename, {})
        shard[name] = tensor.contiguous()
        if len(shard) == len(split.filename_to_tensors[filename]):
            save_file(pending.pop(filename), str(target / filename), metadata={"format": "pt"})
    if rank != 0:
        return
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (target / constants.SAFETENSORS_INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
    for entry in Path(source_dir).iterdir():
        if entry.is_file() and (entry.suffix in (".json", ".jinja", ".txt", ".model")
                                and entry.name != constants.SAFETENSORS_INDEX_FILE):
            shutil.copy2(entry, target / entry.name)
