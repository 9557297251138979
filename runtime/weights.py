"""Weights out of the sharded trainer, named the way Hugging Face (and so vLLM) names them.

One generator walks the FSDP2 model and yields `(hf_name, full_tensor)` pairs,
gathering one tensor at a time, or with `layered` one decoder layer at a time
(a single all-gather per layer instead of one per parameter). Every rank must
run the generator to the end, because each gather is a collective; only the
ranks that keep the tensors (rank 0 for a sync) need to hold on to them.

Modes:
- merged: LoRA folded into the base weight, W + B A (alpha / r); the adapter keys vanish;
- base: the frozen base weights only (what a rollout engine needs once before adapter syncs);
- adapter-only: `adapter_tensors`, the peft state dict of the LoRA weights.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from attrs import frozen

from rlplan.planner.phases import SyncMode

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

PEFT_PREFIX = "base_model.model."
BASE_LAYER = ".base_layer"
LORA_MARKER = "lora_"

def hf_name(name: str) -> str | None:
    """The Hugging Face name of a trainer parameter, or None for a LoRA tensor (not part of the base model)."""
    if LORA_MARKER in name:
        return None
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX) :]
    return name.replace(BASE_LAYER, "")


def full(tensor: Tensor) -> Tensor:
    """The whole tensor behind a DTensor shard (a collective), or the tensor itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _lora_layer(model: nn.Module, parameter_name: str) -> nn.Module | None:
    """The peft LoRA module owning `...<module>.base_layer.weight`, if it is one."""
    suffix = BASE_LAYER + ".weight"
    if not parameter_name.endswith(suffix):
        return None
    module = model.get_submodule(parameter_name[: -len(suffix)])
    return module if hasattr(module, "lora_A") else None


def _merged_weight(layer: nn.Module, base_weight: Tensor, read: Callable[[Tensor], Tensor]) -> Tensor:
    """W + B A scaling for every active adapter of a peft LoRA linear layer."""
    merged = base_weight.float()
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        lora_a = read(layer.lora_A[adapter].weight).float()
        lora_b = read(layer.lora_B[adapter].weight).float()
        merged = merged + (lora_b @ lora_a) * layer.scaling[adapter]
    return merged.to(base_weight.dtype)


def _named_in_module_order(model: nn.Module) -> list[tuple[str, Tensor]]:
    return list(model.named_parameters())


def _layer_groups(model: nn.Module, names: list[str]) -> list[tuple[nn.Module | None, list[str]]]:
    """Parameter names grouped by the FSDP-sharded decoder layer holding them (None: outside any layer)."""
    from torch.distributed.fsdp import FSDPModule

    layer_prefixes = [
        (prefix + ".", module)
        for prefix, module in model.named_modules()
        if prefix and isinstance(module, FSDPModule) and hasattr(module, "self_attn")
    ]
    groups: list[tuple[nn.Module | None, list[str]]] = []
    for name in names:
        owner = next((module for prefix, module in layer_prefixes if name.startswith(prefix)), None)
        if groups and groups[-1][0] is owner:
            groups[-1][1].append(name)
        else:
            groups.append((owner, [name]))
    return groups


def iter_hf_weights(
    model: nn.Module, *, mode: SyncMode = SyncMode.MERGED, layered: bool = False, dtype: torch.dtype | None = None,
    to_cpu: bool = True,
) -> Iterator[tuple[str, Tensor]]:
    """(hf_name, full tensor) for every base-model parameter, in the model's order.

    mode: MERGED folds any adapter into its base weight; BASE leaves it out (ADAPTER is not a full-weight mode).
    """
    if mode == SyncMode.ADAPTER:
        raise ValueError("iter_hf_weights streams full weights: SyncMode.ADAPTER goes through adapter_tensors")
    parameters = dict(_named_in_module_order(model))
    if layered:
        groups = _layer_groups(model, list(parameters))
    else:
        groups = [(None, list(parameters))]
    for layer, names in groups:
        if layer is not None:
            # One all-gather for the whole layer; the registered parameters become the unsharded ones.
            layer.unshard()
            current = dict(model.named_parameters())
            # The unsharded storage is freed again by reshard(): hand out copies, never views of it.
            read = lambda tensor: tensor.detach().clone()  # noqa: E731
        else:
            current = parameters
            read = full
        for name in names:
            target = hf_name(name)
            if target is None:
                continue
            tensor = read(current[name])
            lora = _lora_layer(model, name) if mode == SyncMode.MERGED else None
            if lora is not None:
                tensor = _merged_weight(lora, tensor, read)
            tensor = tensor.detach()
            if dtype is not None:
                tensor = tensor.to(dtype)
            yield target, (tensor.cpu() if to_cpu else tensor)
        if layer is not None:
            layer.reshard()


@frozen
class TensorSpec:
    """A tensor's shape and dtype: enough to plan shards before gathering anything."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def hf_weight_layout(model: nn.Module, *, dtype: torch.dtype | None = None) -> dict[str, TensorSpec]:
    """What `iter_hf_weights` will yield, in its order, as shapes: a DTensor knows its global shape."""
    layout = {}
    for name, parameter in _named_in_module_order(model):
        target = hf_name(name)
        if target is not None:
            layout[target] = TensorSpec(shape=tuple(parameter.shape), dtype=dtype or parameter.dtype)
    return layout


def adapter_tensors(model: nn.Module, *, to_cpu: bool = True) -> dict[str, Tensor]:
    """The LoRA weights as peft's state dict (`...q_proj.lora_A.weight`), the format `save_pretrained` writes."""
    from peft import get_peft_model_state_dict

    gathered = {name: full(p).detach() for name, p in model.named_parameters() if LORA_MARKER in name}
    if to_cpu:
        gathered = {name: t.cpu() for name, t in gathered.items()}
    return get_peft_model_state_dict(model, state_dict=gathered)


def adapter_config(model: nn.Module) -> dict[str, object]:
    """The active adapter's adapter_config.json contents, JSON-ready."""
    config = model.peft_config[model.active_adapter].to_dict()
    return json.loads(json.dumps(config, default=lambda value: sorted(value) if isinstance(value, set) else str(value)))
