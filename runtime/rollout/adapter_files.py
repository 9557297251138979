"""Files vLLM loads weights from: a peft adapter directory, or a safetensors weights directory."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _json_ready(value: Any) -> Any:
    """peft's config dicts hold sets and enums; adapter_config.json needs plain JSON."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(_json_ready(item) for item in value)
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item) for item in value]
    return value


def write_peft_adapter(directory: Path, tensors: dict[str, torch.Tensor], peft_config: dict) -> Path:
    """Write what peft's save_pretrained writes: adapter_model.safetensors and adapter_config.json."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()},
        str(directory / "adapter_model.safetensors"),
    )
    (directory / "adapter_config.json").write_text(json.dumps(_json_ready(dict(peft_config)), indent=1))
    return directory


def write_safetensors_weights(directory: Path, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors},
        str(directory / "model.safetensors"),
    )
    return directory
